//! The buyer's money for an order: opening its one payment, and settling it.
//!
//! A settlement is the one place where money and units meet. Every trigger (the page's
//! "I paid", the provider's webhook, the reconciler) runs the same [`PaymentService::settle`],
//! which reads the payment from the provider, never from the caller, and then:
//!
//! ```text
//!   order \ payment   open        authorised                 captured
//!   reserved          wait        pay_with ─won─► capture    pay_with ─won─► done
//!                                          └lost─► as below             └lost─► as below
//!   paid              (anomaly)   capture (a pending one)     record it
//!   paid, the payment cancelled (its authorisation lapsed): payment_failed, the unit back
//!   cancelled/expired cancel it   cancel it                  refund what no refund covers
//!   refunded                                                 reopen it if its refund failed
//! ```
//! An ended order becomes `refunded` only once refunds that succeeded cover all of its
//! money: a refund on its way (`pending`) leaves it to a later settlement (the refund's
//! event, or the reconciler), and one that failed or was cancelled is made again.
//! The write that marks the order paid is the same conditional write that picks pay
//! against the timeout and a cancel, so money is captured only for an order that won,
//! and money that moved for an order that lost goes back. Every provider call is
//! idempotent, so two settlements racing each other move nothing twice.

use std::sync::Arc;

use super::orders::settled_error;
use crate::error::AppError;
use crate::ids::{OrderId, UserId};
use crate::order::{Order, OrderStatus, ReleaseReason, Reservation};
use crate::payment::{
    CancelOutcome, CaptureOutcome, OrderPayment, Payment, PaymentId, PaymentState,
};
use crate::ports::{
    Clock, OrderBook, OrderPayments, PayOutcome, PaymentAttach, PaymentProvider, PaymentRecorded,
    ProviderEvents, Settlement as Release, StockLedger,
};

/// Where an order's money stands after a settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    /// The buyer has not authorised the payment yet; the order is still open.
    AwaitingBuyer,
    /// Paid, and the money captured.
    Paid,
    /// Paid on our side, the unit sold, but the capture did not go through (or its
    /// record did not follow): a later settlement captures it (or records it).
    CapturePending,
    /// Paid on our side, but the provider will no longer capture the money. When the
    /// authorisation lapsed or was cancelled at the provider (the usual cause), the
    /// order is `payment_failed`, its unit back in stock; otherwise it stays paid, for
    /// an operator.
    CaptureRefused,
    /// The order ended (`cancelled` or `expired`) before the money: its authorisation is
    /// released (or the buyer never gave one), and no money moved.
    Voided(OrderStatus),
    /// The money moved for an order that had ended, and was given back.
    Refunded,
    /// The money moved for an order that had ended, and is not all back yet: a refund is
    /// on its way, or one failed and another was asked for. A later settlement (the
    /// refund's event, or the reconciler) finishes it.
    RefundPending,
}

impl SettleOutcome {
    /// Whether the order's money is left for a later settlement: a capture to retry,
    /// or a refund on its way or to make again.
    pub fn leaves_money_unsettled(self) -> bool {
        matches!(self, Self::CapturePending | Self::RefundPending)
    }

    /// The outcome as the API names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::AwaitingBuyer => "awaiting_buyer",
            Self::Paid => "paid",
            Self::CapturePending => "capture_pending",
            Self::CaptureRefused => "capture_refused",
            Self::Voided(_) => "voided",
            Self::Refunded => "refunded",
            Self::RefundPending => "refund_pending",
        }
    }
}

/// What one settlement did at the provider: for the metrics, each call counted where it
/// happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoneyMoves {
    /// This settlement found the order open and marked it paid: the unit is sold.
    pub paid: bool,
    /// This settlement recorded the paid order's money captured: the capture counted,
    /// once per order, whichever settlement's call moved it (a capture whose answer was
    /// lost is counted by the settlement that finds the money moved).
    pub captured: bool,
    /// This settlement asked for a capture of an order already paid on our side when it
    /// began: a retry of a capture that failed before, or one still in flight elsewhere
    /// (whether it went through now or not).
    pub capture_retried: bool,
    /// This settlement's capture failed.
    pub capture_failed: bool,
    /// This settlement released an authorisation.
    pub cancelled: bool,
    /// This settlement asked the provider for a refund of captured money.
    pub refunded: bool,
    /// This settlement found a refunded order's refund failed, and reopened the order.
    pub refund_reopened: bool,
    /// This settlement found a paid order's authorisation gone before its capture, and
    /// moved the order to `payment_failed`, its unit back in stock.
    pub payment_failed: bool,
}

/// A settlement's result: where the order's money stands, and what this call moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The order settled: the webhook's caller knows only the payment.
    pub order_id: OrderId,
    pub outcome: SettleOutcome,
    pub moves: MoneyMoves,
}

/// The buyer's payment of an order, from its opening to its settlement.
///
/// A settlement leaves the order's release timer be: the timer fires at the deadline,
/// finds the order paid and does nothing, and the scheduler deletes it once fired. So
/// the buyer's answer waits on no scheduler call, and the reconciler, which settles with
/// the same service, needs no scheduler at all.
pub struct PaymentService {
    pub orders: Arc<dyn OrderBook>,
    pub payments: Arc<dyn OrderPayments>,
    pub ledger: Arc<dyn StockLedger>,
    pub provider: Arc<dyn PaymentProvider>,
    pub clock: Arc<dyn Clock>,
}

impl PaymentService {
    /// The buyer's payment of their open order, opened at the provider the first time
    /// and recorded on the order with a conditional write, so that one order never has
    /// two payments: a payment opened by a call that lost that write is cancelled, and
    /// the order's own is answered.
    pub async fn open(&self, order_id: &OrderId, buyer: &UserId) -> Result<Payment, AppError> {
        let (order, reservation) = self.owned(order_id, buyer).await?;
        if !order.status.is_open() {
            return Err(settled_error(order.status));
        }
        if self.clock.now() >= order.expires_at {
            return Err(AppError::OrderExpired);
        }
        if let Some(recorded) = &order.payment {
            return self.read(&recorded.id).await;
        }
        let price = order.price.ok_or(AppError::NotPayable)?;
        let opened = self
            .provider
            .open(order_id, buyer, price)
            .await
            .map_err(AppError::Provider)?;
        match self
            .payments
            .attach_payment(&reservation, &opened.id)
            .await?
        {
            PaymentAttach::Attached => Ok(opened),
            PaymentAttach::Taken(theirs) => {
                self.withdraw(&opened).await;
                self.read(&theirs).await
            }
            PaymentAttach::Settled(status) => {
                self.withdraw(&opened).await;
                Err(settled_error(status))
            }
            PaymentAttach::Unknown => {
                self.withdraw(&opened).await;
                Err(AppError::OrderNotFound)
            }
        }
    }

    /// Settles the buyer's order from its payment as the provider has it now: the page's
    /// "I paid", and the reconciler's.
    pub async fn settle(&self, order_id: &OrderId, buyer: &UserId) -> Result<Settled, AppError> {
        let (order, reservation) = self.owned(order_id, buyer).await?;
        let recorded = order.payment.clone().ok_or(AppError::NoPayment)?;
        let payment = match self.read(&recorded.id).await {
            Ok(payment) => payment,
            Err(error) => return Err(self.followed_after(error, &reservation).await),
        };
        self.settle_with(order, reservation, payment).await
    }

    /// `error`, a settlement of `reservation`'s order failed on: its money is followed
    /// (best effort), so that a later pass settles it however long after the sale.
    async fn followed_after(&self, error: AppError, reservation: &Reservation) -> AppError {
        if let Err(follow) = self
            .payments
            .follow_money(reservation, self.clock.now())
            .await
        {
            tracing::error!(order_id = %reservation.order_id, error = &follow as &dyn std::error::Error, "following a payment whose settlement failed failed");
        }
        error
    }

    /// Settles the order a payment names, from the payment as the provider has it now:
    /// the webhook's, which knows only the payment. A payment that names no order of
    /// ours, or an order whose own payment is another, is refused and nothing changes;
    /// a cancelled one of those is a payment [`PaymentService::open`] withdrew.
    pub async fn settle_payment(&self, id: &PaymentId) -> Result<Settled, AppError> {
        let payment = self.read(id).await?;
        let (Some(order_id), Some(buyer)) = (&payment.order_id, &payment.buyer) else {
            return Err(AppError::OrderNotFound);
        };
        let (order, reservation) = self.owned(order_id, buyer).await?;
        if order.payment.as_ref().map(|recorded| &recorded.id) != Some(id) {
            return Err(if payment.state == PaymentState::Cancelled {
                AppError::PaymentWithdrawn
            } else {
                AppError::PaymentMismatch
            });
        }
        self.settle_with(order, reservation, payment).await
    }

    async fn settle_with(
        &self,
        order: Order,
        reservation: Reservation,
        payment: Payment,
    ) -> Result<Settled, AppError> {
        let price = order.price.ok_or(AppError::NotPayable)?;
        if !payment.is_for(&order.order_id, price) {
            return Err(AppError::PaymentMismatch);
        }
        let settlement = Settlement {
            service: self,
            reservation: &reservation,
            paid_before: order.status == OrderStatus::Paid,
            refunded_from: order.refunded_from,
            moves: MoneyMoves::default(),
        };
        // Money a settlement leaves unsettled, or fails on, is followed until one finishes
        // it, however long after the sale.
        let settled = match settlement.run(order.status, payment).await {
            Ok(settled) => settled,
            Err(error) => return Err(self.followed_after(error, &reservation).await),
        };
        if settled.outcome.leaves_money_unsettled()
            && let Err(error) = self
                .payments
                .follow_money(&reservation, self.clock.now())
                .await
        {
            // A settlement that sold the unit answers so all the same: its sale's
            // reconciler pass, which reaches every sale whose payment window is open,
            // settles a paid order's capture within a pass.
            if !settled.moves.paid {
                return Err(error.into());
            }
            tracing::error!(order_id = %reservation.order_id, error = &error as &dyn std::error::Error, "following a paid order's pending capture failed; the sale's reconciler pass settles it");
        }
        Ok(settled)
    }

    async fn owned(
        &self,
        order_id: &OrderId,
        buyer: &UserId,
    ) -> Result<(Order, Reservation), AppError> {
        // As `OrderService` finds it: written out, so that the IAM check, which reads
        // the services' calls on their ports, sees this one.
        self.orders
            .find(order_id, buyer)
            .await?
            .ok_or(AppError::OrderNotFound)
    }

    async fn read(&self, id: &PaymentId) -> Result<Payment, AppError> {
        self.provider
            .payment(id)
            .await
            .map_err(AppError::Provider)?
            .ok_or(AppError::PaymentMismatch)
    }

    /// Cancels a payment this call opened and the order did not take: best effort, since
    /// a payment nobody records can never be settled, and the provider lets an
    /// unconfirmed one lapse anyway.
    async fn withdraw(&self, payment: &Payment) {
        if let Err(error) = self.provider.cancel(&payment.id).await {
            tracing::warn!(payment = %payment.id, error = &error as &dyn std::error::Error, "could not cancel a payment the order did not take");
        }
    }
}

/// What the webhook did with one of the provider's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventHandled {
    /// The event's payment was settled (see [`Settled`]).
    Settled(Settled),
    /// The event was processed before: acknowledged, nothing done again.
    Duplicate,
    /// The event names no payment (not one a settlement cares about), or a payment
    /// that names no order of ours (Stripe sends every event of the account).
    Ignored,
    /// The payment names one of our orders but is not its own (another amount or
    /// currency, or the order records another payment): refused, nothing changed, and
    /// recorded so that its redeliveries are not refused again.
    Refused,
    /// The payment names one of our orders, is not its own, and is cancelled: one that
    /// [`PaymentService::open`] opened and withdrew when the order took another or had
    /// ended (a Pay at the deadline). No money, nothing to settle, and no alarm.
    Withdrawn,
}

/// The provider's webhook: each event settles the payment it names, at most once per
/// event id. The event's copy of the payment is never trusted (events come late and out
/// of order): the settlement reads the payment anew, so an event is only a reason to
/// settle now. An event is recorded processed only once handled, so one that failed is
/// handled again when the provider redelivers it; an ignored one is not recorded at all.
/// A record that fails does not fail the event: its redelivery, if any, settles again.
pub struct PaymentWebhook {
    pub payments: Arc<PaymentService>,
    pub events: Arc<dyn ProviderEvents>,
    pub clock: Arc<dyn Clock>,
}

impl PaymentWebhook {
    pub async fn handle(
        &self,
        event_id: &str,
        payment: Option<&PaymentId>,
    ) -> Result<EventHandled, AppError> {
        if self.events.was_processed(event_id).await? {
            return Ok(EventHandled::Duplicate);
        }
        let handled = match payment {
            None => EventHandled::Ignored,
            Some(id) => match self.payments.settle_payment(id).await {
                Ok(settled) => EventHandled::Settled(settled),
                // Stripe sends an account's every event to every endpoint: a payment
                // that names no order of this stack's (another stack or product on the
                // account) is none of its business.
                Err(AppError::OrderNotFound) => {
                    tracing::info!(event_id, payment = %id, "an event about no order of ours; ignored");
                    EventHandled::Ignored
                }
                Err(AppError::PaymentMismatch) => {
                    tracing::warn!(event_id, payment = %id, "an event's payment is not its order's own");
                    EventHandled::Refused
                }
                Err(AppError::PaymentWithdrawn) => {
                    tracing::info!(event_id, payment = %id, "an event about a payment the order did not take, withdrawn");
                    EventHandled::Withdrawn
                }
                Err(error) => return Err(error),
            },
        };
        // An ignored event changed nothing of ours, so there is nothing to do twice:
        // it writes nothing either (every stack on a Stripe account gets every event).
        // The event is handled whether or not the record follows: a redelivery only
        // settles again (a settlement is idempotent), and the answer keeps what this
        // one did (a sale it made is counted, once).
        if handled != EventHandled::Ignored
            && let Err(error) = self
                .events
                .record_processed(event_id, self.clock.now())
                .await
        {
            tracing::warn!(
                event_id,
                error = &error as &dyn std::error::Error,
                "recording an event processed failed; a redelivery settles it again, harmlessly"
            );
        }
        Ok(handled)
    }
}

/// One settlement of one order: the steps of the table in the module's doc.
struct Settlement<'a> {
    service: &'a PaymentService,
    reservation: &'a Reservation,
    /// Whether the order was paid before this settlement began: a capture now retries
    /// one that failed.
    paid_before: bool,
    /// A refunded order's status before its refund ([`Order::refunded_from`]).
    refunded_from: Option<OrderStatus>,
    moves: MoneyMoves,
}

impl Settlement<'_> {
    async fn run(mut self, status: OrderStatus, payment: Payment) -> Result<Settled, AppError> {
        let outcome = match status {
            OrderStatus::Reserved => self.pay_or_end(payment).await?,
            OrderStatus::Paid => self.finish_paid(payment).await?,
            OrderStatus::Cancelled | OrderStatus::Expired => {
                self.give_back(status, payment).await?
            }
            OrderStatus::Refunded => self.check_refund(payment).await?,
            OrderStatus::PaymentFailed => {
                // Again, so that a unit an earlier call failed to give back goes back.
                self.service
                    .payments
                    .fail_payment(self.reservation, &payment.id, self.service.clock.now())
                    .await?;
                SettleOutcome::CaptureRefused
            }
        };
        Ok(Settled {
            order_id: self.reservation.order_id.clone(),
            outcome,
            moves: self.moves,
        })
    }

    /// An open order: paid if its payment holds the money and the order wins the race
    /// against the timeout and a cancel; otherwise as the winner left it.
    async fn pay_or_end(&mut self, payment: Payment) -> Result<SettleOutcome, AppError> {
        if !matches!(
            payment.state,
            PaymentState::Authorised | PaymentState::Captured
        ) {
            // Open: the buyer has not confirmed. Cancelled while the order is open: only
            // the provider does that (an authorisation that lapsed), and the timeout
            // ends the order.
            return Ok(SettleOutcome::AwaitingBuyer);
        }
        let service = self.service;
        let now = service.clock.now();
        let seen = OrderPayment {
            id: payment.id.clone(),
            state: payment.state,
        };
        match service
            .payments
            .pay_with(self.reservation, &seen, now)
            .await?
        {
            PayOutcome::Paid => {
                self.moves.paid = true;
                // The unit is sold, whatever fails after: the answer says so (the sale is
                // counted once, here), and a later settlement finishes the capture.
                match self.finish_paid(payment).await {
                    Ok(outcome) => Ok(outcome),
                    Err(error) => {
                        tracing::warn!(order_id = %self.reservation.order_id, error = &error as &dyn std::error::Error, "the order is paid, its capture not finished; a later settlement finishes it");
                        Ok(SettleOutcome::CapturePending)
                    }
                }
            }
            PayOutcome::WindowClosed => {
                // The timer may lag: the unit goes back now, and the money with it.
                let status = match service
                    .ledger
                    .release(self.reservation, ReleaseReason::Expired, now)
                    .await?
                {
                    Release::Applied => OrderStatus::Expired,
                    Release::AlreadySettled(status) => status,
                    Release::Unknown => return Err(AppError::OrderNotFound),
                };
                self.after_losing(status, payment).await
            }
            PayOutcome::Settled(status) => self.after_losing(status, payment).await,
            PayOutcome::Unknown => Err(AppError::OrderNotFound),
        }
    }

    /// The order's pay write lost, to `status`: a paid order (another settlement won)
    /// is finished, an ended one gives the money back.
    async fn after_losing(
        &mut self,
        status: OrderStatus,
        payment: Payment,
    ) -> Result<SettleOutcome, AppError> {
        match status {
            OrderStatus::Paid => self.finish_paid(payment).await,
            OrderStatus::Refunded => Ok(SettleOutcome::Refunded),
            ended => self.give_back(ended, payment).await,
        }
    }

    /// A paid order: its money captured, once.
    async fn finish_paid(&mut self, payment: Payment) -> Result<SettleOutcome, AppError> {
        match payment.state {
            // Captured by an earlier settlement whose answer was lost, or whose record
            // did not follow: counted by whichever settlement records it.
            PaymentState::Captured => {
                self.record_capture(&payment).await?;
                Ok(SettleOutcome::Paid)
            }
            PaymentState::Authorised => self.capture(payment).await,
            PaymentState::Cancelled => self.fail(payment).await,
            // Paid, and the payment back to waiting for the buyer: not a state Stripe
            // moves a manually captured payment to, so for an operator. It is not
            // failed: the buyer could still confirm it.
            PaymentState::Open => {
                tracing::error!(order_id = %self.reservation.order_id, payment = %payment.id, "a paid order's payment holds no money and is open again");
                self.record(&payment).await?;
                Ok(SettleOutcome::CaptureRefused)
            }
        }
    }

    async fn capture(&mut self, payment: Payment) -> Result<SettleOutcome, AppError> {
        let service = self.service;
        self.moves.capture_retried = self.paid_before;
        match service.provider.capture(&payment.id).await {
            // Captured now, or another settlement's capture got there first.
            Ok(CaptureOutcome::Captured(captured) | CaptureOutcome::AlreadyCaptured(captured)) => {
                self.record_capture(&captured).await?;
                Ok(SettleOutcome::Paid)
            }
            Ok(CaptureOutcome::NotCapturable(refused)) => {
                tracing::error!(order_id = %self.reservation.order_id, payment = %refused.id, state = ?refused.state, "the provider refused to capture a paid order's money");
                if refused.state == PaymentState::Cancelled {
                    return self.fail(refused).await;
                }
                self.record(&refused).await?;
                Ok(SettleOutcome::CaptureRefused)
            }
            Err(error) => {
                self.moves.capture_failed = true;
                tracing::warn!(order_id = %self.reservation.order_id, payment = %payment.id, error = &error as &dyn std::error::Error, "capture failed; the order stays paid with its capture pending");
                Ok(SettleOutcome::CapturePending)
            }
        }
    }

    /// A paid order whose authorisation is gone (it lapsed, as a card's does after 7
    /// days, or was cancelled at the provider) before a capture got through: the money
    /// can never be taken, so the order is `payment_failed` and its unit goes back to
    /// stock, for another buyer while the sale lasts. Recorded first: the store fails
    /// only an order whose payment it holds cancelled.
    async fn fail(&mut self, payment: Payment) -> Result<SettleOutcome, AppError> {
        self.record(&payment).await?;
        if self
            .service
            .payments
            .fail_payment(self.reservation, &payment.id, self.service.clock.now())
            .await?
        {
            tracing::error!(order_id = %self.reservation.order_id, payment = %payment.id, "a paid order's authorisation is gone before its capture: the order's payment failed, its unit is back in stock");
            self.moves.payment_failed = true;
        }
        Ok(SettleOutcome::CaptureRefused)
    }

    /// An order that ended: no money may stay moved for it.
    async fn give_back(
        &mut self,
        status: OrderStatus,
        payment: Payment,
    ) -> Result<SettleOutcome, AppError> {
        let service = self.service;
        let payment = match payment.state {
            PaymentState::Cancelled => payment,
            PaymentState::Open | PaymentState::Authorised => {
                match service
                    .provider
                    .cancel(&payment.id)
                    .await
                    .map_err(AppError::Provider)?
                {
                    CancelOutcome::Cancelled(cancelled) => {
                        self.moves.cancelled = true;
                        cancelled
                    }
                    CancelOutcome::AlreadyCancelled(cancelled) => cancelled,
                    CancelOutcome::AlreadyCaptured(captured) => captured,
                }
            }
            PaymentState::Captured => payment,
        };
        if payment.state != PaymentState::Captured {
            self.record(&payment).await?;
            return Ok(SettleOutcome::Voided(status));
        }
        // Recorded first, so the stats show the late money until it is back.
        self.record(&payment).await?;
        let progress = service
            .provider
            .refund(&payment)
            .await
            .map_err(AppError::Provider)?;
        self.moves.refunded = progress.made_now;
        if !progress.is_complete() {
            return Ok(SettleOutcome::RefundPending);
        }
        service
            .payments
            .record_refund(self.reservation, &payment.id)
            .await?;
        Ok(SettleOutcome::Refunded)
    }

    /// A refunded order: still refunded while its refunds that succeeded cover its
    /// money. Stripe can fail a refund it reported succeeded (the card's bank cannot
    /// take it, `refund.failed`): the order goes back to where it was refunded from and
    /// is refunded again.
    async fn check_refund(&mut self, payment: Payment) -> Result<SettleOutcome, AppError> {
        let service = self.service;
        if payment.state != PaymentState::Captured {
            return Ok(SettleOutcome::Refunded);
        }
        let progress = service
            .provider
            .refunds(&payment)
            .await
            .map_err(AppError::Provider)?;
        if progress.is_complete() {
            return Ok(SettleOutcome::Refunded);
        }
        let Some(from) = self.refunded_from else {
            // Refunded before the order recorded where from: an operator's to mend.
            tracing::error!(order_id = %self.reservation.order_id, payment = %payment.id, "a refunded order's refund failed, and the order does not say what it was refunded from");
            return Ok(SettleOutcome::RefundPending);
        };
        if !service
            .payments
            .reopen_refund(self.reservation, &payment.id, from)
            .await?
        {
            return Ok(SettleOutcome::RefundPending);
        }
        tracing::warn!(order_id = %self.reservation.order_id, payment = %payment.id, "a refunded order's refund failed: reopened, refunding again");
        self.moves.refund_reopened = true;
        self.give_back(from, payment).await
    }

    async fn record(&self, payment: &Payment) -> Result<PaymentRecorded, AppError> {
        let seen = OrderPayment {
            id: payment.id.clone(),
            state: payment.state,
        };
        Ok(self
            .service
            .payments
            .record_payment(self.reservation, &seen)
            .await?)
    }

    /// Records a paid order's money captured: the settlement whose record changes the
    /// order to captured counts the capture, so it is counted once, even when the
    /// capture's answer was lost and a later settlement finds the money moved.
    async fn record_capture(&mut self, captured: &Payment) -> Result<(), AppError> {
        self.moves.captured = self.record(captured).await? == PaymentRecorded::Changed;
        Ok(())
    }
}
