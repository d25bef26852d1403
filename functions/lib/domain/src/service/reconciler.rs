//! The reconciler: the safety net under the happy path.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::error::{AppError, StoreError};
use crate::ids::OrderId;
use crate::order::{OrderStatus, ReleaseReason, Reservation};
use crate::payment::FollowedMoney;
#[cfg(doc)]
use crate::ports::OrderPayments;
use crate::ports::{Clock, OrderBook, SaleCatalog, Settlement, StockLedger, TakeReturn};
use crate::sale::{MAX_PAYMENT_TIMEOUT_SECS, Sale};
use crate::service::{PaymentService, Settled};

/// What one reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub sales: usize,
    pub open_holds: usize,
    /// Holds past their deadline that no timer had released, released here.
    pub expired: usize,
    /// Holds an action failed on; the next pass tries them again.
    pub failed: usize,
    /// Sales whose open holds could not be read; the next pass tries them again.
    pub failed_sales: usize,
    /// Units a shard recorded as taken with no hold behind them (a reserve that died
    /// between its writes, a release that died before its shard write), given back.
    pub takes_returned: usize,
    /// Orders whose payment was left unsettled, settled here.
    pub payments_settled: usize,
    /// Of those, the open ones this pass sold: a settlement that failed (its money
    /// followed) and is finished here, the order's window still open. Each is counted in
    /// `orders_paid` here, as the api counts the ones its settlements sell.
    pub orders_paid: Vec<OrderId>,
    /// Of those, the ones whose money this pass captured.
    pub captures: usize,
    /// Captures asked of orders already paid on our side (a capture that had failed).
    pub capture_retries: usize,
    /// Captures that failed again: the order stays paid with its capture pending.
    pub capture_failures: usize,
    /// Authorisations released for orders that ended.
    pub authorisations_cancelled: usize,
    /// Money captured for orders that ended, given back.
    pub refunds: usize,
    /// Paid orders whose authorisation was gone before their capture, moved to
    /// `payment_failed` with their unit back in stock.
    pub captures_refused: usize,
    /// Settlements that failed; the next pass tries them again.
    pub payment_failures: usize,
    /// Orders whose money is followed after the pass, unsettled still, whatever their
    /// sale's age: a capture to retry, a refund on its way or failing.
    pub money_unsettled: usize,
    /// How long the oldest of them has been unsettled, in seconds (0 for none).
    pub money_unsettled_oldest_secs: i64,
    /// Whether the pass read the followed money: without payments, or when the read
    /// failed, the two counts above say nothing.
    pub money_unsettled_known: bool,
}

impl ReconcileReport {
    fn count_settlement(&mut self, settled: &Settled) {
        self.payments_settled += 1;
        let moves = settled.moves;
        if moves.paid {
            self.orders_paid.push(settled.order_id.clone());
        }
        for (moved, counter) in [
            (moves.captured, &mut self.captures),
            (moves.capture_retried, &mut self.capture_retries),
            (moves.capture_failed, &mut self.capture_failures),
            (moves.cancelled, &mut self.authorisations_cancelled),
            (moves.refunded, &mut self.refunds),
            (moves.payment_failed, &mut self.captures_refused),
        ] {
            *counter += usize::from(moved);
        }
    }
}

/// The safety net under the happy path (the seeds' reconciliation). A grab can commit
/// and then lose its queue message (the function timed out or crashed in between, or
/// the commit's answer was lost), so no timer is ever set, and a timer can be lost;
/// either would strand a unit for good. The buyer of such a hold can still pay it (pay
/// needs no timer), so each pass only releases the open holds past their deadline by
/// `timer_grace`: the unit comes back that much late, and nothing is sent again. A unit
/// a shard records as taken that no hold accounts for, taken longer than `take_grace`
/// ago, goes back to its shard (a reserve takes, then holds: a grab that died in
/// between leaves such a take). Every action is conditional on the hold's state, so a
/// pass racing the normal path changes nothing twice.
///
/// With `payments`, each pass also settles the payments left unsettled (see
/// [`OrderPayments::unsettled_payments`]): a paid order whose money is still only
/// authorised (its capture failed, or is in flight), at once; any other once the
/// order's window has closed `timer_grace` ago (until then the buyer's page
/// and the provider's webhook settle it). Through the same [`PaymentService::settle`]
/// as every other trigger. A sale leaves the pass's reach soon after its end, but money
/// does not settle on the sale's clock (an authorisation lasts 7 days, a refund can fail
/// days later): every settlement that leaves money unsettled follows it
/// ([`OrderPayments::follow_money`]), and each pass settles the followed ones too, at a
/// cost of the payments left unsettled, never of the sales.
pub struct Reconciler {
    pub catalog: Arc<dyn SaleCatalog>,
    pub orders: Arc<dyn OrderBook>,
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
    /// How long past its deadline a hold may stay open before its timer counts as lost.
    pub timer_grace: Duration,
    /// How old a take no hold accounts for must be before it goes back: past the life
    /// of the grab path that made it ([`DEFAULT_TAKE_GRACE`]). Until then a request of
    /// that path may still come (a buyer retrying a 503 through a minute of 429s, say)
    /// and finish it; returned earlier, the take's order is voided and that buyer,
    /// who may well have been first, is told their path is used up.
    pub take_grace: Duration,
    /// The settlement of payments; `None` where no payment provider is configured.
    pub payments: Option<Arc<PaymentService>>,
}

/// A grab path's life plus a minute: a take's `taken_at` is when it was written, after
/// the path was issued, so no request of the path can arrive after this, nor any
/// reserve of one still be between its two writes.
pub const DEFAULT_TAKE_GRACE: Duration =
    Duration::seconds(crate::grab::GRAB_PATH_LIFETIME.num_seconds() + 60);

impl Reconciler {
    pub async fn run(&self) -> Result<ReconcileReport, AppError> {
        let now = self.clock.now();
        // A hold made at a sale's last instant lives at most the longest payment
        // window past the end.
        let longest_window = Duration::seconds(i64::from(MAX_PAYMENT_TIMEOUT_SECS));
        let cutoff = now - longest_window - self.timer_grace;
        let mut report = ReconcileReport::default();
        // Each order this pass settled, and whether its money is still unsettled.
        let mut settled_here = HashMap::new();
        for sale in self.catalog.sales_ending_after(cutoff).await? {
            report.sales += 1;
            // One sale whose holds cannot be read must not leave every other sale's
            // stuck holds unrepaired; the next pass tries it again.
            let holds = match self.orders.open_holds(&sale).await {
                Ok(holds) => holds,
                Err(error) => {
                    report.failed_sales += 1;
                    tracing::error!(
                        sale_id = %sale.sale_id,
                        error = &error as &dyn std::error::Error,
                        "reading a sale's open holds failed"
                    );
                    continue;
                }
            };
            self.return_unaccounted_takes(&sale, now, &mut report).await;
            self.release_stuck_holds(holds, now, &mut report).await;
            self.settle_left_payments(&sale, now, &mut report, &mut settled_here)
                .await;
        }
        self.settle_followed_money(&settled_here, now, &mut report)
            .await;
        Ok(report)
    }

    /// Releases the holds whose timer should have released them by now.
    async fn release_stuck_holds(
        &self,
        holds: Vec<Reservation>,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) {
        for reservation in holds {
            report.open_holds += 1;
            match self.release_if_stuck(&reservation, now).await {
                Ok(true) => report.expired += 1,
                Ok(false) => {}
                Err(error) => {
                    report.failed += 1;
                    tracing::error!(
                        order_id = %reservation.order_id,
                        error = &error as &dyn std::error::Error,
                        "reconciliation of a stuck hold failed"
                    );
                }
            }
        }
    }

    /// Settles the sale's orders whose payment was left unsettled, once they are due.
    async fn settle_left_payments(
        &self,
        sale: &Sale,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
        settled_here: &mut HashMap<OrderId, bool>,
    ) {
        let Some(payments) = &self.payments else {
            return;
        };
        let unsettled = match payments.payments.unsettled_payments(sale).await {
            Ok(unsettled) => unsettled,
            Err(error) => {
                report.failed_sales += 1;
                tracing::error!(
                    sale_id = %sale.sale_id,
                    error = &error as &dyn std::error::Error,
                    "reading a sale's unsettled payments failed"
                );
                return;
            }
        };
        for (order, reservation) in unsettled {
            let capture_pending = order.status == OrderStatus::Paid;
            if !capture_pending && now - order.expires_at < self.timer_grace {
                continue;
            }
            match payments.settle(&order.order_id, &reservation.user_id).await {
                Ok(settled) => {
                    tracing::warn!(order_id = %order.order_id, ?settled, "settled a payment left unsettled");
                    report.count_settlement(&settled);
                    settled_here.insert(
                        order.order_id.clone(),
                        settled.outcome.leaves_money_unsettled(),
                    );
                }
                Err(error) => {
                    report.payment_failures += 1;
                    settled_here.insert(order.order_id.clone(), true);
                    tracing::error!(
                        order_id = %order.order_id,
                        error = &error as &dyn std::error::Error,
                        "settling a payment left unsettled failed"
                    );
                }
            }
        }
    }

    /// Settles the followed orders ([`OrderPayments::follow_money`]), whatever their
    /// sale's age, but for those this pass left unsettled already (`settled_here`:
    /// whether each one's money is still unsettled), and stops following each once its
    /// settlement is finished. Reports how many are still followed, and the oldest.
    async fn settle_followed_money(
        &self,
        settled_here: &HashMap<OrderId, bool>,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) {
        let Some(payments) = &self.payments else {
            return;
        };
        let followed = match payments.payments.followed_money().await {
            Ok(followed) => {
                report.money_unsettled_known = true;
                followed
            }
            Err(error) => {
                report.payment_failures += 1;
                tracing::error!(
                    error = &error as &dyn std::error::Error,
                    "reading the followed payments failed"
                );
                return;
            }
        };
        for money in followed {
            // Settled once a pass: one this pass settled already is decided by that
            // settlement. (A follow between it and the read above would be unfollowed
            // with it, but its sale is in reach: the next pass settles it again, and
            // follows it if still unsettled.)
            let unsettled = match settled_here.get(&money.order_id) {
                Some(unsettled) => *unsettled,
                None => match payments.settle(&money.order_id, &money.buyer).await {
                    Ok(settled) => {
                        report.count_settlement(&settled);
                        tracing::warn!(order_id = %money.order_id, ?settled, "settled a followed payment");
                        settled.outcome.leaves_money_unsettled()
                    }
                    // No such order: nothing to follow.
                    Err(AppError::OrderNotFound) => false,
                    Err(error) => {
                        report.payment_failures += 1;
                        tracing::error!(order_id = %money.order_id, error = &error as &dyn std::error::Error, "settling a followed payment failed");
                        true
                    }
                },
            };
            if !unsettled {
                self.unfollow(payments, &money, report).await;
                continue;
            }
            report.money_unsettled += 1;
            let age = (now - money.since).num_seconds().max(0);
            report.money_unsettled_oldest_secs = report.money_unsettled_oldest_secs.max(age);
        }
    }

    async fn unfollow(
        &self,
        payments: &PaymentService,
        money: &FollowedMoney,
        report: &mut ReconcileReport,
    ) {
        if let Err(error) = payments.payments.unfollow_money(money).await {
            report.payment_failures += 1;
            tracing::error!(order_id = %money.order_id, error = &error as &dyn std::error::Error, "unfollowing a settled payment failed");
        }
    }

    /// Gives back the sale's takes that no hold accounts for, once they are older than
    /// any reserve still between its two writes.
    async fn return_unaccounted_takes(
        &self,
        sale: &Sale,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) {
        let takes = match self.ledger.unaccounted_takes(sale).await {
            Ok(takes) => takes,
            Err(error) => {
                report.failed_sales += 1;
                tracing::error!(
                    sale_id = %sale.sale_id,
                    error = &error as &dyn std::error::Error,
                    "reading a sale's unaccounted takes failed"
                );
                return;
            }
        };
        for take in takes {
            if now - take.taken_at < self.take_grace {
                continue;
            }
            match self.ledger.return_take(&take, now).await {
                Ok(TakeReturn::Returned) => {
                    report.takes_returned += 1;
                    tracing::warn!(order_id = %take.order_id, shard = take.shard, "gave back a unit no hold accounted for");
                }
                Ok(TakeReturn::Accounted | TakeReturn::AlreadyReturned) => {}
                Err(error) => {
                    report.failed += 1;
                    tracing::error!(
                        order_id = %take.order_id,
                        error = &error as &dyn std::error::Error,
                        "returning an unaccounted take failed"
                    );
                }
            }
        }
    }

    /// Releases a hold its timer should have released `timer_grace` ago; whether this
    /// call released it.
    async fn release_if_stuck(
        &self,
        reservation: &Reservation,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        if now - reservation.expires_at < self.timer_grace {
            return Ok(false);
        }
        let settled = self
            .ledger
            .release(reservation, ReleaseReason::Expired, now)
            .await?;
        tracing::warn!(order_id = %reservation.order_id, ?settled, "released a hold no timer released");
        Ok(settled == Settlement::Applied)
    }
}
