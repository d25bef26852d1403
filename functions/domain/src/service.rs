//! The use cases. Each service holds only the ports it needs, so each function builds
//! only the clients it uses.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::error::{AppError, StoreError};
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{Order, OrderStatus, ReleaseReason, Reservation};
use crate::ports::{
    Blocklist, Clock, OrderBook, PayOutcome, ReleaseScheduler, SaleCatalog, Settlement,
    StockLedger, TakeReturn,
};
use crate::sale::{MAX_PAYMENT_TIMEOUT_SECS, Sale, SaleDraft, SaleStats, SaleView};

// The hot path has a module of its own; its names stay reachable from here.
pub use crate::grab::{
    Attempt, ContentionPolicy, GRAB_PATH_LIFETIME, GrabOutcome, GrabPass, GrabReport, GrabService,
    SoldOutBy,
};

/// Sale administration and the public sale page.
pub struct SaleService {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub orders: Arc<dyn OrderBook>,
    pub clock: Arc<dyn Clock>,
}

impl SaleService {
    pub async fn create(&self, draft: SaleDraft) -> Result<Sale, AppError> {
        let sale = Sale::from_draft(draft)?;
        if self.catalog.create_sale(&sale).await? {
            Ok(sale)
        } else {
            Err(AppError::SaleExists)
        }
    }

    async fn sale(&self, sale_id: &SaleId) -> Result<Sale, AppError> {
        self.catalog
            .find_sale(sale_id)
            .await?
            .ok_or(AppError::SaleNotFound)
    }

    pub async fn view(&self, sale_id: &SaleId) -> Result<SaleView, AppError> {
        let sale = self.sale(sale_id).await?;
        let available = self.ledger.availability(&sale).await?.iter().sum();
        Ok(SaleView::new(&sale, available, self.clock.now()))
    }

    pub async fn stats(&self, sale_id: &SaleId) -> Result<SaleStats, AppError> {
        let sale = self.sale(sale_id).await?;
        let counts = self.orders.count(&sale).await?;
        Ok(SaleStats::reconcile(sale.stock_total, counts))
    }
}

/// The admins' blocklist of users barred from every sale.
pub struct BlocklistService {
    pub blocklist: Arc<dyn Blocklist>,
}

impl BlocklistService {
    /// Bars the user. Idempotent. Grabs notice within the grab's cache refresh interval.
    pub async fn block_user(&self, user: &UserId) -> Result<(), AppError> {
        Ok(self.blocklist.block(user).await?)
    }

    /// Lifts the bar. Idempotent: unblocking a user who is not blocked succeeds.
    pub async fn unblock_user(&self, user: &UserId) -> Result<(), AppError> {
        Ok(self.blocklist.unblock(user).await?)
    }

    /// Every blocked user, sorted, so the admin's view is stable.
    pub async fn blocked_users(&self) -> Result<Vec<UserId>, AppError> {
        let mut users = self.blocklist.blocked().await?;
        users.sort();
        users.dedup();
        Ok(users)
    }
}

/// What the consumer's step left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerSet {
    /// The order is held and its release timer is set (now or before).
    Set,
    /// Paid, cancelled or expired before the consumer came; no timer is needed.
    AlreadySettled(OrderStatus),
}

/// Orders after the grab: the consumer, the owner's pay and cancel, and the timeout.
pub struct OrderService {
    pub orders: Arc<dyn OrderBook>,
    pub ledger: Arc<dyn StockLedger>,
    pub scheduler: Arc<dyn ReleaseScheduler>,
    pub clock: Arc<dyn Clock>,
}

impl OrderService {
    async fn owned(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<(Order, Reservation), AppError> {
        self.orders
            .find(order_id, user)
            .await?
            .ok_or(AppError::OrderNotFound)
    }

    pub async fn get(&self, order_id: &OrderId, user: &UserId) -> Result<Order, AppError> {
        Ok(self.owned(order_id, user).await?.0)
    }

    /// The consumer's step: the held order's release timer is set. One read of the
    /// hold and no write: the grab's hold already is the order, so the table is not
    /// written for a unit between its grab and its settlement. The timer carries the
    /// hold's own reservation, whatever else the message says. Safe to repeat for the
    /// same reservation (the timer is idempotent by order id).
    pub async fn set_release_timer(&self, reservation: &Reservation) -> Result<TimerSet, AppError> {
        let held = self
            .orders
            .find(&reservation.order_id, &reservation.user_id)
            .await?;
        match held {
            // Only the hold this reservation made: a message naming another shard is
            // not what the grab committed.
            Some((order, held)) if held.shard == reservation.shard => {
                if !order.status.is_open() {
                    return Ok(TimerSet::AlreadySettled(order.status));
                }
                self.scheduler.schedule_release(&held).await?;
                Ok(TimerSet::Set)
            }
            _ => Err(AppError::OrderNotFound),
        }
    }

    pub async fn pay(&self, order_id: &OrderId, user: &UserId) -> Result<Order, AppError> {
        let (order, reservation) = self.owned(order_id, user).await?;
        if let Some(answer) = answer_if_settled(&order, OrderStatus::Paid) {
            return answer;
        }
        match self.orders.pay(&reservation, self.clock.now()).await? {
            PayOutcome::Paid => {
                self.forget_timer(order_id).await;
                Ok(Order {
                    status: OrderStatus::Paid,
                    ..order
                })
            }
            PayOutcome::WindowClosed => {
                // The timer may lag; the buyer must not wait on it to learn the outcome,
                // and the unit should be grabbable again now.
                self.ledger
                    .release(&reservation, ReleaseReason::Expired, self.clock.now())
                    .await?;
                Err(AppError::OrderExpired)
            }
            PayOutcome::Settled(status) => Err(settled_error(status)),
            PayOutcome::Unknown => Err(AppError::OrderNotFound),
        }
    }

    pub async fn cancel(&self, order_id: &OrderId, user: &UserId) -> Result<Order, AppError> {
        let (order, reservation) = self.owned(order_id, user).await?;
        if let Some(answer) = answer_if_settled(&order, OrderStatus::Cancelled) {
            return answer;
        }
        let now = self.clock.now();
        let reason = if now >= reservation.expires_at {
            ReleaseReason::Expired
        } else {
            ReleaseReason::Cancelled
        };
        let final_status = match self.ledger.release(&reservation, reason, now).await? {
            Settlement::Applied => reason.final_status(),
            Settlement::AlreadySettled(status) => status,
            Settlement::Unknown => return Err(AppError::OrderNotFound),
        };
        match final_status {
            OrderStatus::Cancelled => {
                self.forget_timer(order_id).await;
                Ok(Order {
                    status: OrderStatus::Cancelled,
                    ..order
                })
            }
            other => Err(settled_error(other)),
        }
    }

    async fn forget_timer(&self, order_id: &OrderId) {
        if let Err(error) = self.scheduler.cancel_release(order_id).await {
            // Harmless: the timer will fire, find the order settled, and do nothing.
            tracing::warn!(%order_id, error = &error as &dyn std::error::Error, "could not delete the release timer");
        }
    }
}

/// The release function's use case: the payment window closed, give the unit back.
pub struct ExpiryService {
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
}

impl ExpiryService {
    /// The release function's step, fired by the order's timer. Safe to repeat.
    pub async fn expire(&self, reservation: &Reservation) -> Result<Settlement, AppError> {
        if self.clock.now() < reservation.expires_at {
            return Err(AppError::NotYetDue);
        }
        Ok(self
            .ledger
            .release(reservation, ReleaseReason::Expired, self.clock.now())
            .await?)
    }
}

/// What one reconciliation pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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
        Ok(report)
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

/// The answer to pay or cancel (`wanted`) of an order read consistently, if it is
/// settled: a settled order never moves again, so no write can change the answer (a
/// retried call, or one after the timer fired). `None` while the order is open.
fn answer_if_settled(order: &Order, wanted: OrderStatus) -> Option<Result<Order, AppError>> {
    match order.status {
        status if status == wanted => Some(Ok(order.clone())),
        status if !status.is_open() => Some(Err(settled_error(status))),
        _ => None,
    }
}

fn settled_error(status: OrderStatus) -> AppError {
    match status {
        OrderStatus::Paid => AppError::OrderPaid,
        OrderStatus::Cancelled => AppError::OrderCancelled,
        _ => AppError::OrderExpired,
    }
}

/// A [`SaleCatalog`] that remembers the sales it has found. Sales never change after
/// creation, so the grab path reads each sale from the store once per process.
pub struct CachedCatalog<C> {
    inner: C,
    capacity: usize,
    sales: RwLock<HashMap<SaleId, Sale>>,
}

impl<C> CachedCatalog<C> {
    pub fn new(inner: C, capacity: usize) -> Self {
        Self {
            inner,
            capacity,
            sales: RwLock::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl<C: SaleCatalog> SaleCatalog for CachedCatalog<C> {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        self.inner.create_sale(sale).await
    }

    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        self.inner.sales_ending_after(cutoff).await
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        let cached = self
            .sales
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sale_id)
            .cloned();
        if cached.is_some() {
            return Ok(cached);
        }
        // Misses are not cached: a sale may be created after someone first asks for it.
        let found = self.inner.find_sale(sale_id).await?;
        if let Some(sale) = &found {
            let mut sales = self
                .sales
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if sales.len() >= self.capacity {
                sales.clear();
            }
            sales.insert(sale_id.clone(), sale.clone());
        }
        Ok(found)
    }
}

/// The blocklist as the grab sees it: a per-process snapshot of the whole list, read
/// from the store at most once per `refresh` interval, so checking a user costs no
/// read per request. A block takes effect within one interval of being written (plus
/// the time of the one read that refreshes it, during which the process's other
/// requests still answer from the old snapshot).
pub struct CachedBlocklist {
    inner: Arc<dyn Blocklist>,
    refresh: Duration,
    snapshot: RwLock<Option<Snapshot>>,
    /// Set while one request refreshes a stale snapshot, so concurrent requests answer
    /// from the stale one instead of all reading the store at once.
    refreshing: AtomicBool,
}

struct Snapshot {
    users: HashSet<UserId>,
    taken_at: DateTime<Utc>,
}

/// Clears the refreshing flag however the refresh ends, including when the request
/// is dropped mid-read.
struct RefreshTurn<'a>(&'a AtomicBool);

impl Drop for RefreshTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl CachedBlocklist {
    pub fn new(inner: Arc<dyn Blocklist>, refresh: Duration) -> Self {
        Self {
            inner,
            refresh,
            snapshot: RwLock::new(None),
            refreshing: AtomicBool::new(false),
        }
    }

    /// Whether `user` is blocked, as of a snapshot at most `refresh` old at `now`.
    ///
    /// The first call of the process must read the list: if that fails, the error is
    /// returned (there is nothing to answer from, and letting a blocked user through
    /// is the failure this exists to prevent). A later refresh that fails keeps the
    /// last snapshot, logs, and is tried again only after another interval, so a
    /// failing store is not read once per request either.
    pub async fn is_blocked(&self, user: &UserId, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let have_snapshot = match &*self.read_snapshot() {
            Some(snapshot) if now - snapshot.taken_at < self.refresh => {
                return Ok(snapshot.users.contains(user));
            }
            Some(_) => true,
            None => false,
        };
        let _turn = if have_snapshot {
            if self.refreshing.swap(true, Ordering::AcqRel) {
                return Ok(self.snapshot_contains(user));
            }
            Some(RefreshTurn(&self.refreshing))
        } else {
            None
        };
        match self.inner.blocked().await {
            Ok(users) => {
                let users: HashSet<UserId> = users.into_iter().collect();
                let blocked = users.contains(user);
                *self.write_snapshot() = Some(Snapshot {
                    users,
                    taken_at: now,
                });
                Ok(blocked)
            }
            Err(error) => {
                let mut snapshot = self.write_snapshot();
                let Some(snapshot) = snapshot.as_mut() else {
                    return Err(error);
                };
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    age_secs = (now - snapshot.taken_at).num_seconds(),
                    "could not refresh the blocklist; answering from the last snapshot"
                );
                snapshot.taken_at = now;
                Ok(snapshot.users.contains(user))
            }
        }
    }

    fn snapshot_contains(&self, user: &UserId) -> bool {
        self.read_snapshot()
            .as_ref()
            .is_some_and(|snapshot| snapshot.users.contains(user))
    }

    fn read_snapshot(&self) -> std::sync::RwLockReadGuard<'_, Option<Snapshot>> {
        self.snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_snapshot(&self) -> std::sync::RwLockWriteGuard<'_, Option<Snapshot>> {
        self.snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
