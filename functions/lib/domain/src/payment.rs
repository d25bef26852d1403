//! Payments as the domain sees them: a buyer's money for one order, authorised first and
//! moved only once the order is settled as paid on our side (see
//! [`crate::ports::PaymentProvider`]).
//!
//! The provider's own words (Stripe's PaymentIntent statuses) are kept to what decides
//! a settlement: whether the money is only held on the card, moved, or released.

use std::fmt;

use crate::ids::{OrderId, UserId};
use crate::order::OrderStatus;
use crate::price::Price;

/// The provider's id of one order's payment (Stripe's `pi_...`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PaymentId(String);

impl PaymentId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PaymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a payment stands, as far as a settlement cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentState {
    /// The buyer has not authorised it yet (no card, a card to confirm, 3-D Secure
    /// pending, or a bank still deciding): nothing to settle.
    Open,
    /// The card holds the amount; no money has moved. Capture moves it, cancel
    /// releases it.
    Authorised,
    /// The money moved (captured, by us or by an automatic-capture integration).
    Captured,
    /// Cancelled: the hold is released, no money moved.
    Cancelled,
}

impl PaymentState {
    pub const ALL: [Self; 4] = [
        Self::Open,
        Self::Authorised,
        Self::Captured,
        Self::Cancelled,
    ];

    /// The name a store records it by.
    pub fn name(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Authorised => "authorised",
            Self::Captured => "captured",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.name() == name)
    }

    /// Whether the provider never moves a payment out of this state (a refund leaves a
    /// captured payment captured).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Captured | Self::Cancelled)
    }
}

/// An order whose money a settlement left unsettled, followed past its sale's reach
/// ([`OrderPayments::follow_money`](crate::ports::OrderPayments::follow_money)): what
/// the reconciler needs to settle it again, and since when it has been unsettled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedMoney {
    pub order_id: OrderId,
    pub buyer: UserId,
    pub since: chrono::DateTime<chrono::Utc>,
    /// How many times it was followed: an unfollow decided on this read stops
    /// following only if no settlement has followed it again since.
    pub version: u64,
}

/// An order's payment as the order records it: which payment at the provider is the
/// order's (one per order, recorded once), and its state when a settlement last read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPayment {
    pub id: PaymentId,
    pub state: PaymentState,
}

impl OrderPayment {
    /// Whether an order in `status` with this payment still needs a settlement: open
    /// with a payment (the buyer may authorise it); paid with its money authorised and
    /// not yet captured (the capture is pending); cancelled or expired with its payment
    /// not seen cancelled (an authorisation to release, or money to give back); paid
    /// with its payment seen cancelled (an authorisation that lapsed: the order is to
    /// become `payment_failed`, its unit back). A refunded order is done, and so is one
    /// whose payment failed.
    pub fn needs_settling(&self, status: OrderStatus) -> bool {
        match status {
            OrderStatus::Reserved => true,
            OrderStatus::Paid => matches!(
                self.state,
                PaymentState::Authorised | PaymentState::Cancelled
            ),
            OrderStatus::Cancelled | OrderStatus::Expired => self.state != PaymentState::Cancelled,
            OrderStatus::Refunded | OrderStatus::PaymentFailed => false,
        }
    }
}

/// One order's payment at the provider. Its `Debug` leaves the client secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct Payment {
    pub id: PaymentId,
    /// The order the payment names (its metadata), if it names one.
    pub order_id: Option<OrderId>,
    /// The buyer the payment names (its metadata): with the order, the key of the
    /// order's hold, so that an event about the payment finds its order in one read.
    pub buyer: Option<UserId>,
    /// What it is for, in the provider's unit of its currency (Stripe's `amount`, see
    /// [`Price::stripe_amount`]): compared with the order's price before anything is
    /// settled.
    pub amount: u64,
    /// The currency as the provider writes it (`eur`).
    pub currency: String,
    pub state: PaymentState,
    /// What the page hands to the provider's script to confirm the payment. Secret to
    /// the buyer of the order: never logged.
    pub client_secret: String,
}

/// Everything but the client secret, which a log line must never carry: with it anyone
/// could confirm the buyer's payment from a page of their own.
impl fmt::Debug for Payment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payment")
            .field("id", &self.id)
            .field("order_id", &self.order_id)
            .field("buyer", &self.buyer)
            .field("amount", &self.amount)
            .field("currency", &self.currency)
            .field("state", &self.state)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

impl Payment {
    /// Whether this payment is for `order`, at `price`: its metadata, amount and
    /// currency all agree. A settlement acts on no payment that fails this.
    pub fn is_for(&self, order: &OrderId, price: Price) -> bool {
        self.order_id.as_ref() == Some(order)
            && self.amount == price.stripe_amount()
            && self.currency.eq_ignore_ascii_case(price.currency().code())
    }
}

/// What [`crate::ports::PaymentProvider::capture`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureOutcome {
    /// The money moved, by this call.
    Captured(Payment),
    /// The money had moved before this call (an earlier capture, or the provider's own
    /// automatic capture): nothing moved now.
    AlreadyCaptured(Payment),
    /// It cannot be captured: never authorised, or cancelled (by us, or by the
    /// provider once the authorisation lapsed).
    NotCapturable(Payment),
}

/// What [`crate::ports::PaymentProvider::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// No money moved and none will: cancelled by this call.
    Cancelled(Payment),
    /// Cancelled before this call.
    AlreadyCancelled(Payment),
    /// The money moved already: only a refund gives it back.
    AlreadyCaptured(Payment),
}

/// Where one refund stands at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStatus {
    /// On its way: the provider or the card's bank has not finished it, or it waits on
    /// an action (Stripe's `pending` and `requires_action`).
    Pending,
    /// The money is back with the buyer (Stripe's `succeeded`). Stripe may still turn a
    /// succeeded refund into a failed one later, when the card's bank cannot take it.
    Succeeded,
    /// No money went back (Stripe's `failed` and `canceled`): it counts for nothing, and
    /// what it covered is refunded again.
    Failed,
}

/// A refund of a payment's captured money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The provider's id of the refund (Stripe's `re_...`).
    pub id: String,
    pub payment: PaymentId,
    /// In the provider's unit, as [`Payment::amount`].
    pub amount: u64,
    pub status: RefundStatus,
}

/// How many refunds of one payment may fail before no more are made on its own: a card
/// whose bank sends every refund back would otherwise be refunded again and again. The
/// order stays `refund_pending`, counted and alarmed, for an operator.
pub const MAX_FAILED_REFUNDS: usize = 3;

/// How much of a captured payment's money has gone back, from every refund of it the
/// provider lists: [`crate::ports::PaymentProvider::refund`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundProgress {
    /// What was captured, in the provider's unit.
    pub captured: u64,
    /// What refunds that succeeded gave back.
    pub succeeded: u64,
    /// What refunds still on their way cover.
    pub pending: u64,
    /// How many refunds failed or were cancelled.
    pub failed: usize,
    /// Whether the call that answered made a refund (`false`: the refunds listed
    /// already covered the money, and nothing was asked of the provider now).
    pub made_now: bool,
}

impl RefundProgress {
    /// The progress that `refunds` (of a payment that captured `captured`) make.
    pub fn of(captured: u64, refunds: &[Refund], made_now: bool) -> Self {
        let total = |status: RefundStatus| {
            refunds
                .iter()
                .filter(|refund| refund.status == status)
                .map(|refund| refund.amount)
                .sum()
        };
        Self {
            captured,
            succeeded: total(RefundStatus::Succeeded),
            pending: total(RefundStatus::Pending),
            failed: refunds
                .iter()
                .filter(|refund| refund.status == RefundStatus::Failed)
                .count(),
            made_now,
        }
    }

    /// All of the captured money is back: the order is refunded.
    pub fn is_complete(&self) -> bool {
        self.succeeded >= self.captured
    }

    /// What no refund that succeeded or is on its way covers: what a new refund asks
    /// for.
    pub fn uncovered(&self) -> u64 {
        self.captured
            .saturating_sub(self.succeeded.saturating_add(self.pending))
    }

    /// What a refund made now would ask for, if one is to be made: money no refund
    /// covers, and fewer than [`MAX_FAILED_REFUNDS`] refunds failed.
    pub fn to_refund(&self) -> Option<u64> {
        let uncovered = self.uncovered();
        (uncovered > 0 && self.failed < MAX_FAILED_REFUNDS).then_some(uncovered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47: `Payment`'s derived `Debug` printed the client secret into any log line
    /// or panic that showed a payment.
    #[test]
    fn a_payments_debug_never_shows_its_client_secret() {
        let payment = Payment {
            id: PaymentId::new("pi_1"),
            order_id: None,
            buyer: None,
            amount: 129_900,
            currency: "eur".to_owned(),
            state: PaymentState::Open,
            client_secret: "pi_1_secret_TOPSECRET".to_owned(),
        };
        let shown = format!("{payment:?} {payment:#?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(
            shown.contains("pi_1") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
