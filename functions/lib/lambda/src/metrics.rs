//! The business metrics of the sale: one call per outcome, where the outcome is
//! decided, through the `metrics` facade. On Lambda the recorder is the CloudWatch
//! Embedded Metric Format collector that [`crate::telemetry::init`] installs (namespace
//! [`NAMESPACE`], the function's name as the `function` dimension, flushed once per
//! invocation); the local stack installs its own recorder over the same calls.
//!
//! Every label becomes a CloudWatch dimension, and every distinct set of dimension
//! values a billed metric, so labels take bounded values only: static reason codes,
//! and a sale id only once the outcome proves the sale exists (sales are created by
//! admins, so they are few). Never a user or order id.

use flashsale_domain::sale::StockCounts;
use flashsale_domain::{SaleAction, SaleId};
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "flashsale";

/// Dimension: the Lambda function's name (set once per process, not per call).
pub const FUNCTION: &str = "function";
/// Dimension: the sale, or [`UNKNOWN_SALE`].
pub const SALE_ID: &str = "sale_id";
/// Dimension: why a grab or a token request ended as it did.
pub const REASON: &str = "reason";
/// Dimension: the store operation (for transaction conflicts).
pub const OPERATION: &str = "operation";

/// The sale dimension of an outcome that does not prove the sale exists (a blocked
/// user, an unknown sale, a forged token): a caller-chosen id must not become a
/// dimension value.
pub const UNKNOWN_SALE: &str = "unknown";

/// Every grab request, once, by [`GrabOutcome::reason`].
pub const GRAB_OUTCOME: &str = "grab_outcome";
/// Grabs that ran at least one reserve transaction: what got past every in-memory layer.
pub const GRAB_REACHED_DATABASE: &str = "grab_reached_database";
/// Grab paths handed out.
pub const TOKENS_ISSUED: &str = "tokens_issued";
/// Token requests refused, by error code.
pub const TOKENS_REFUSED: &str = "tokens_refused";
/// `TransactionConflict` cancellations the store retried (emitted by the adapters).
pub const TRANSACTION_CONFLICTS_RETRIED: &str = "transaction_conflicts_retried";
/// Held orders whose release timer the consumer set.
pub const ORDERS_OPENED: &str = "orders_opened";
pub const ORDERS_PAID: &str = "orders_paid";
pub const ORDERS_CANCELLED: &str = "orders_cancelled";
/// Orders the release timer expired, their unit back in stock.
pub const ORDERS_EXPIRED: &str = "orders_expired";
/// Seconds between an order's payment deadline and the release that returned its unit.
pub const RELEASE_LAG: &str = "release_lag_seconds";
/// Overdue holds no timer released, released by the reconciler.
pub const RECONCILER_RELEASED: &str = "reconciler_released";
/// Units a shard recorded as taken with no hold behind them, given back by the
/// reconciler.
pub const RECONCILER_TAKES_RETURNED: &str = "reconciler_takes_returned";
/// Holds a reconciler action failed on (the next pass tries again).
pub const RECONCILER_FAILED: &str = "reconciler_failed";
/// Sales whose holds the reconciler could not read.
pub const RECONCILER_FAILED_SALES: &str = "reconciler_failed_sales";
/// Settlements of an order's payment that ended (the page's, the webhook's, the
/// reconciler's), each once.
pub const PAYMENTS_SETTLED: &str = "payments_settled";
/// Payments whose money a settlement captured, counted once per order by the settlement
/// that records it captured (after a lost answer, the one that finds it done).
pub const PAYMENT_CAPTURES: &str = "payment_captures";
/// Captures asked of orders already paid when their settlement began: a retry after a
/// failed capture, or a second trigger racing the first (only one moves money).
pub const PAYMENT_CAPTURE_RETRIES: &str = "payment_capture_retries";
/// Captures that failed: the order stays paid with its capture pending.
pub const PAYMENT_CAPTURE_FAILURES: &str = "payment_capture_failures";
/// Authorisations released because their order ended first: no money moved.
pub const PAYMENT_AUTHORISATIONS_CANCELLED: &str = "payment_authorisations_cancelled";
/// Money captured for an order that ended first, given back.
pub const PAYMENT_REFUNDS: &str = "payment_refunds";
/// Refunds that failed after Stripe reported them succeeded (the card's bank could not
/// take the money): the order was reopened and refunded again. The buyer was charged
/// and, for a while, told the money was back.
pub const PAYMENT_REFUNDS_FAILED: &str = "payment_refunds_failed";
/// Paid orders whose capture the provider refused for good, their authorisation gone
/// (lapsed after 7 days, or cancelled at the provider): the order is `payment_failed`,
/// its unit back in stock, and no money was taken for it.
pub const PAYMENT_CAPTURES_REFUSED: &str = "payment_captures_refused";
/// Settlements that failed (the next trigger, or the reconciler, tries again).
pub const PAYMENT_SETTLE_FAILURES: &str = "payment_settle_failures";
/// Provider events refused: signed, but about a payment that is no order's own (another
/// amount, currency or order). Any is worth a look: a misconfigured integration, or a
/// forged payment that got hold of the signing secret.
pub const PAYMENT_EVENTS_REFUSED: &str = "payment_events_refused";
pub const PAYMENTS_MISCONFIGURED: &str = "payments_misconfigured";
/// Operators' pauses, resumes and ends of a sale, by action.
pub const SALES_CONTROLLED: &str = "sales_controlled";
/// The dimension naming an operator's action on a sale.
pub const ACTION: &str = "action";
/// Units of a sale by state, as last counted by the reconciler (gauges).
pub const STOCK_AVAILABLE: &str = "stock_available";
pub const STOCK_RESERVED: &str = "stock_reserved";
pub const STOCK_PAID: &str = "stock_paid";
/// Paid orders of a sale whose money is not yet captured, and ended orders whose
/// captured money is not yet refunded, as last counted (gauges).
pub const PAYMENTS_CAPTURE_PENDING: &str = "payments_capture_pending";
pub const PAYMENTS_REFUND_PENDING: &str = "payments_refund_pending";
/// Orders whose money a settlement left unsettled, followed whatever their sale's
/// age, after each reconciler pass, and how long the oldest has been (gauges, no sale
/// dimension: they outlive the sales' own gauges).
pub const PAYMENTS_UNSETTLED: &str = "payments_unsettled";
pub const PAYMENTS_UNSETTLED_OLDEST: &str = "payments_unsettled_oldest";
/// Poison queue messages the consumer parked in the dead-letter queue.
pub const DLQ_PARKED: &str = "dlq_parked";

/// Declares each metric's unit, which CloudWatch keeps with the datapoints. Called
/// by whoever installs a recorder, after installing it.
pub fn describe() {
    for (name, what) in [
        (GRAB_OUTCOME, "grab requests by outcome"),
        (
            GRAB_REACHED_DATABASE,
            "grabs that ran a reserve transaction",
        ),
        (TOKENS_ISSUED, "grab paths handed out"),
        (TOKENS_REFUSED, "token requests refused"),
        (
            TRANSACTION_CONFLICTS_RETRIED,
            "transaction conflicts retried",
        ),
        (ORDERS_OPENED, "release timers set by the consumer"),
        (ORDERS_PAID, "orders paid"),
        (ORDERS_CANCELLED, "orders cancelled by their buyer"),
        (ORDERS_EXPIRED, "orders expired by their timer"),
        (RECONCILER_RELEASED, "overdue holds released"),
        (
            RECONCILER_TAKES_RETURNED,
            "taken units no hold accounted for, given back",
        ),
        (RECONCILER_FAILED, "holds a repair failed on"),
        (
            RECONCILER_FAILED_SALES,
            "sales whose holds could not be read",
        ),
        (DLQ_PARKED, "poison messages parked"),
        (PAYMENTS_SETTLED, "payment settlements done"),
        (PAYMENT_CAPTURES, "payments captured"),
        (PAYMENT_CAPTURE_RETRIES, "captures retried"),
        (PAYMENT_CAPTURE_FAILURES, "captures failed"),
        (
            PAYMENT_AUTHORISATIONS_CANCELLED,
            "authorisations released for ended orders",
        ),
        (PAYMENT_REFUNDS, "late money refunded"),
        (
            PAYMENT_REFUNDS_FAILED,
            "refunds that failed after they succeeded, made again",
        ),
        (
            PAYMENT_CAPTURES_REFUSED,
            "paid orders whose authorisation was gone before the capture, failed",
        ),
        (PAYMENT_SETTLE_FAILURES, "payment settlements failed"),
        (PAYMENT_EVENTS_REFUSED, "provider events refused"),
        (
            PAYMENTS_MISCONFIGURED,
            "payment calls and passes refused for a Stripe secret without usable keys",
        ),
        (
            SALES_CONTROLLED,
            "sales paused, resumed or ended by an operator",
        ),
    ] {
        describe_counter!(name, Unit::Count, what);
    }
    for (name, what) in [
        (STOCK_AVAILABLE, "units on sale"),
        (STOCK_RESERVED, "units held, awaiting payment"),
        (STOCK_PAID, "units sold"),
        (
            PAYMENTS_CAPTURE_PENDING,
            "paid orders whose money is not captured",
        ),
        (
            PAYMENTS_REFUND_PENDING,
            "ended orders whose money is not refunded",
        ),
        (
            PAYMENTS_UNSETTLED,
            "orders of any sale whose money is still unsettled",
        ),
    ] {
        describe_gauge!(name, Unit::Count, what);
    }
    describe_gauge!(
        PAYMENTS_UNSETTLED_OLDEST,
        Unit::Seconds,
        "how long the oldest unsettled payment has been so"
    );
    describe_histogram!(
        RELEASE_LAG,
        Unit::Seconds,
        "seconds from the payment deadline to the release"
    );
}

/// How one grab request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrabOutcome {
    /// A reserve transaction took a unit.
    Reserved,
    /// A retried grab path answered the order it already held.
    Resumed,
    /// Sold out, answered from the in-memory gate without a write.
    SoldOutGate,
    /// Sold out, answered by the database: every shard tried refused.
    SoldOutDatabase,
    /// Any other refusal, by its stable error code (`limit_reached`, `blocked`,
    /// `invalid_token`, `not_started`, `ended`, `unavailable`, ...).
    Refused(&'static str),
}

impl GrabOutcome {
    /// The `reason` dimension.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Resumed => "resumed",
            Self::SoldOutGate => "sold_out_gate",
            Self::SoldOutDatabase => "sold_out_database",
            Self::Refused(code) => code,
        }
    }

    /// Whether reaching this outcome required the sale to exist: only then is the
    /// caller's sale id a bounded dimension value.
    fn proves_the_sale(self) -> bool {
        match self {
            Self::Reserved | Self::Resumed | Self::SoldOutGate | Self::SoldOutDatabase => true,
            Self::Refused(code) => matches!(code, "limit_reached" | "not_started" | "ended"),
        }
    }
}

fn sale_label(sale_id: Option<&SaleId>, proven: bool) -> String {
    match sale_id {
        Some(sale_id) if proven => sale_id.to_string(),
        _ => UNKNOWN_SALE.to_owned(),
    }
}

/// One grab request's outcome (`sale_id` is `None` when the path's is malformed);
/// `reached_database` when it ran a reserve transaction.
pub fn grab(sale_id: Option<&SaleId>, outcome: GrabOutcome, reached_database: bool) {
    let sale = sale_label(sale_id, outcome.proves_the_sale());
    if reached_database {
        counter!(GRAB_REACHED_DATABASE, SALE_ID => sale.clone()).increment(1);
    }
    counter!(GRAB_OUTCOME, SALE_ID => sale, REASON => outcome.reason()).increment(1);
}

/// A grab path handed out (which proves the sale exists).
pub fn token_issued(sale_id: &SaleId) {
    counter!(TOKENS_ISSUED, SALE_ID => sale_id.to_string()).increment(1);
}

/// A token request refused, by error code.
pub fn token_refused(code: &'static str) {
    counter!(TOKENS_REFUSED, REASON => code).increment(1);
}

/// An order lifecycle step of a sale: [`ORDERS_OPENED`], [`ORDERS_PAID`],
/// [`ORDERS_CANCELLED`] or [`ORDERS_EXPIRED`]. The order exists, so its sale does.
pub fn order_step(step: &'static str, sale_id: &SaleId) {
    counter!(step, SALE_ID => sale_id.to_string()).increment(1);
}

/// An operator paused, resumed or ended a sale.
pub fn sale_controlled(action: SaleAction, sale_id: &SaleId) {
    counter!(SALES_CONTROLLED, ACTION => action.name(), SALE_ID => sale_id.to_string())
        .increment(1);
}

/// How late a release gave a unit back, in seconds after the payment deadline.
pub fn release_lag(sale_id: &SaleId, seconds: f64) {
    histogram!(RELEASE_LAG, SALE_ID => sale_id.to_string()).record(seconds);
}

/// What one reconciliation pass repaired or failed on. The EMF collector leaves zero
/// counts out, so a pass that repaired nothing writes no datapoint (alarms treat
/// missing data as fine).
pub fn reconciled(released: u64, takes_returned: u64, failed: u64, failed_sales: u64) {
    counter!(RECONCILER_RELEASED).increment(released);
    counter!(RECONCILER_TAKES_RETURNED).increment(takes_returned);
    counter!(RECONCILER_FAILED).increment(failed);
    counter!(RECONCILER_FAILED_SALES).increment(failed_sales);
}

/// What payment settlements did, summed over the settlements of an invocation (one for
/// the page's or the webhook's, a pass's worth for the reconciler's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PaymentMoves {
    pub settled: u64,
    pub captures: u64,
    pub capture_retries: u64,
    pub capture_failures: u64,
    pub authorisations_cancelled: u64,
    pub refunds: u64,
    pub refunds_failed: u64,
    pub captures_refused: u64,
    pub failures: u64,
}

impl PaymentMoves {
    /// One settlement that ended, and the money it moved.
    pub fn of_one(moves: &flashsale_domain::service::MoneyMoves) -> Self {
        Self {
            settled: 1,
            captures: u64::from(moves.captured),
            capture_retries: u64::from(moves.capture_retried),
            capture_failures: u64::from(moves.capture_failed),
            authorisations_cancelled: u64::from(moves.cancelled),
            refunds: u64::from(moves.refunded),
            refunds_failed: u64::from(moves.refund_reopened),
            captures_refused: u64::from(moves.payment_failed),
            failures: 0,
        }
    }
}

/// A provider event refused as no order's own.
pub fn payment_event_refused() {
    counter!(PAYMENT_EVENTS_REFUSED).increment(1);
}

/// A payment call, or a reconciler pass's settlements, refused because the Stripe
/// secret holds no usable keys.
pub fn payments_misconfigured() {
    counter!(PAYMENTS_MISCONFIGURED).increment(1);
}

/// Payment settlements, as counters (zero counts write nothing).
pub fn payments(moves: PaymentMoves) {
    for (name, count) in [
        (PAYMENTS_SETTLED, moves.settled),
        (PAYMENT_CAPTURES, moves.captures),
        (PAYMENT_CAPTURE_RETRIES, moves.capture_retries),
        (PAYMENT_CAPTURE_FAILURES, moves.capture_failures),
        (
            PAYMENT_AUTHORISATIONS_CANCELLED,
            moves.authorisations_cancelled,
        ),
        (PAYMENT_REFUNDS, moves.refunds),
        (PAYMENT_REFUNDS_FAILED, moves.refunds_failed),
        (PAYMENT_CAPTURES_REFUSED, moves.captures_refused),
        (PAYMENT_SETTLE_FAILURES, moves.failures),
    ] {
        counter!(name).increment(count);
    }
}

/// A sale's stock by state, as counted now.
pub fn stock(sale_id: &SaleId, counts: &StockCounts) {
    for (name, units) in [
        (STOCK_AVAILABLE, counts.available),
        (STOCK_RESERVED, counts.reserved),
        (STOCK_PAID, counts.paid),
        (PAYMENTS_CAPTURE_PENDING, counts.capture_pending),
        (PAYMENTS_REFUND_PENDING, counts.refund_pending),
    ] {
        // A gauge is an f64; stock counts are far below 2^53.
        gauge!(name, SALE_ID => sale_id.to_string()).set(units as f64);
    }
}

/// The money still unsettled after a reconciler pass, over every sale: how many
/// orders, and the oldest's age in seconds.
pub fn money_unsettled(orders: u64, oldest_secs: u64) {
    // A gauge is an f64; these are far below 2^53.
    gauge!(PAYMENTS_UNSETTLED).set(orders as f64);
    gauge!(PAYMENTS_UNSETTLED_OLDEST).set(oldest_secs as f64);
}

/// A poison message parked in the dead-letter queue.
pub fn dlq_parked() {
    counter!(DLQ_PARKED).increment(1);
}
