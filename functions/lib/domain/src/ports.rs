//! The ports: one small trait per capability the use cases need from the outside world.
//!
//! Every method documents its contract: what is atomic, what is idempotent, and what a
//! caller may assume after an error. Errors are [`StoreError`]: `Transient` may be
//! retried by the caller, `Permanent` may not. Business refusals are return values.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::buyer_orders::{BuyerOrdersCursor, BuyerOrdersPage};
use crate::challenge::{ChallengeRefusal, ChallengeWork, IssuedChallenge, SolvedChallenge};
use crate::control::{ControlWrite, SaleAudit};
use crate::error::StoreError;
use crate::fulfilment::{BuyerCursor, OrderPage};
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{Order, OrderMessage, OrderStatus, ReleaseReason, Reservation};
use crate::payment::{
    CancelOutcome, CaptureOutcome, FollowedMoney, OrderPayment, Payment, PaymentId, RefundProgress,
};
use crate::price::Price;
use crate::sale::{Sale, SaleCursor, SalePage, StockCounts};

/// The time. A port so tests can stand still or jump.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Where the domain's new identifiers come from. A ULID is a time and 80 random bits,
/// so, like the time ([`Clock`]), it is a port: a run that fixes both from a seed
/// replays exactly.
pub trait IdSource: Send + Sync {
    /// A new ULID, unique, and ordered by the time it carries.
    fn ulid(&self) -> ulid::Ulid;
}

/// The system's identifiers: the wall clock and the thread's random numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemIds;

impl IdSource for SystemIds {
    fn ulid(&self) -> ulid::Ulid {
        ulid::Ulid::new()
    }
}

/// Waiting between tries. A port so tests need not wait (or can count the waits).
#[async_trait]
pub trait Pause: Send + Sync {
    async fn pause(&self, how_long: std::time::Duration);
}

/// The proof-of-work challenge before the grab path (see [`crate::challenge`]). Both
/// methods are CPU only: no I/O, nothing stored, so a refused solution costs no call to
/// anything.
pub trait ProofOfWork: Send + Sync {
    /// A fresh challenge for `user` in `sale`, asking about `work` derivations, issued
    /// `now` and valid until `expires_at`, signed so that only this service's
    /// challenges verify.
    fn issue(
        &self,
        sale: &SaleId,
        user: &UserId,
        work: ChallengeWork,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> IssuedChallenge;

    /// Whether `solution` (the protocol's JSON: the challenge and its solution) solves a
    /// challenge this service issued to `user` for `sale`, unexpired at `now`.
    /// Deterministic: the same solution verifies the same way, naming the same
    /// challenge, every time until it expires.
    fn verify(
        &self,
        solution: &serde_json::Value,
        sale: &SaleId,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Result<SolvedChallenge, ChallengeRefusal>;
}

/// Sales and their definitions.
#[async_trait]
pub trait SaleCatalog: Send + Sync {
    /// Creates the sale and all its stock shards (each holding [`Sale::shard_stock`]).
    /// The sale becomes visible at once and only with every shard in place: a create
    /// that fails part way leaves no sale, and another create of the same id (a retry,
    /// with this definition or another) completes it. Returns `Ok(false)`, writing no
    /// shard, when a sale with this id exists, and also when another create of this id
    /// overtook this one and made (or will make) the sale. Not idempotent by design: a
    /// retried create of a sale that was made answers `false`.
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError>;

    /// The sale, or `None`, as stored now. Sales are immutable but for their control,
    /// so any copy is current but for that.
    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError>;

    /// Moves the sale's control to `change.action`'s target, if it is now one the action
    /// applies to, and adds `change` to the sale's audit trail: both or neither, in one
    /// write. Otherwise writes nothing and answers the control it found (or that there
    /// is no sale). Not idempotent by design: the same change again is refused, since
    /// the control is then the target, which is how a repeat is told from a change.
    async fn control_sale(
        &self,
        sale_id: &SaleId,
        change: &SaleAudit,
    ) -> Result<ControlWrite, StoreError>;

    /// The sale's audit trail, newest first: at most `limit` (at least one) entries. A
    /// strongly consistent read, for admins.
    async fn audit_trail(
        &self,
        sale_id: &SaleId,
        limit: usize,
    ) -> Result<Vec<SaleAudit>, StoreError>;

    /// Every sale whose `ends_at` is at or after `cutoff`: those that may still have
    /// open holds. A read for the reconciler, never on the hot path; on AWS it may lag
    /// a just-created sale by the index's propagation delay, which only delays its
    /// first reconciliation.
    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError>;

    /// One page of every sale, the latest-ending first, then by id (descending): at
    /// most `limit` (at least one), starting after `after` when given. A read for
    /// admins; on AWS, of an index that may lag a just-created sale by its propagation
    /// delay. Sales are immutable but for their control, so pages read at different times
    /// list the same sales.
    async fn list_sales(
        &self,
        after: Option<&SaleCursor>,
        limit: usize,
    ) -> Result<SalePage, StoreError>;
}

/// The orders a shard recorded as holding its units, at one moment, by fingerprint:
/// what lets a grab find its own take on a shard it knows is empty, in memory. A shard
/// seen empty gains no take until a unit comes back to it, so the takers seen with an
/// empty shard are all it has, until the gate's next recheck.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardTakers {
    fingerprints: Vec<u64>,
    /// When the latest of these takes was written: see [`ShardTakers::latest_take`].
    latest_take: Option<DateTime<Utc>>,
}

impl ShardTakers {
    /// The takers, when their times do not matter.
    pub fn of<'a>(orders: impl IntoIterator<Item = &'a OrderId>) -> Self {
        let mut fingerprints: Vec<u64> = orders.into_iter().map(OrderId::random_bits).collect();
        fingerprints.sort_unstable();
        fingerprints.dedup();
        Self {
            fingerprints,
            latest_take: None,
        }
    }

    /// The takers, each with when its take was written.
    pub fn of_takes<'a>(takes: impl IntoIterator<Item = (&'a OrderId, DateTime<Utc>)>) -> Self {
        let takes: Vec<_> = takes.into_iter().collect();
        Self {
            latest_take: takes.iter().map(|(_, at)| *at).max(),
            ..Self::of(takes.iter().map(|(order, _)| *order))
        }
    }

    /// When the youngest take was written. Reserved as take then hold (a hot shard), a
    /// take comes before its hold, and a hold refused (the buyer at their limit) undoes
    /// its take: so a shard empty with a young
    /// take may have that unit back a moment later, and "sold out" is not yet final.
    pub fn latest_take(&self) -> Option<DateTime<Utc>> {
        self.latest_take
    }

    /// Whether `order` is among them. Fingerprints are 64 random bits of the order id,
    /// so a false "yes" is as rare as two orders sharing them, and costs one refused
    /// write at most.
    pub fn include(&self, order: &OrderId) -> bool {
        self.fingerprints
            .binary_search(&order.random_bits())
            .is_ok()
    }

    pub fn len(&self) -> usize {
        self.fingerprints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fingerprints.is_empty()
    }
}

/// One shard as a single read saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardState {
    pub available: u64,
    pub takers: ShardTakers,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveRefusal {
    /// This shard has no stock left; others may. With the orders that hold its units,
    /// as the refusal saw them.
    ShardEmpty(ShardTakers),
    /// The user already holds or bought `per_user_limit` units of this sale.
    LimitReached,
    /// A hold for this very order exists already: the grab is a retry of one that
    /// committed. Checked before the limit and the shard.
    AlreadyHeld,
    /// Another transaction held the shard or the user's item (DynamoDB's
    /// `TransactionConflict`): nothing was written and nothing was decided, so the
    /// same reservation may be tried at once on another shard, or on this one a moment
    /// later.
    Contended,
}

/// What happened to a hold that was asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// This call made the change.
    Applied,
    /// The order had already reached this final status; nothing changed.
    AlreadySettled(OrderStatus),
    /// The hold does not exist (never reserved, or the reservation is unknown).
    Unknown,
}

/// A unit a stock shard records as taken by an order: who took it, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    pub shard: u16,
    pub order_id: OrderId,
    pub user_id: UserId,
    pub taken_at: DateTime<Utc>,
}

impl Take {
    /// The order a take no hold accounts for stands for once it is voided: reserved and
    /// lapsed at the instant of the take, on its shard.
    pub fn as_lapsed_reservation(&self) -> Reservation {
        Reservation {
            order_id: self.order_id.clone(),
            sale_id: self.order_id.sale_id().clone(),
            user_id: self.user_id.clone(),
            shard: self.shard,
            created_at: self.taken_at,
            expires_at: self.taken_at,
            // Nothing was sold: the void records no price.
            price: None,
        }
    }
}

/// What [`StockLedger::return_take`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeReturn {
    /// This call gave the unit back to its shard.
    Returned,
    /// An open or paid hold on the same shard accounts for the take (now): it stays.
    Accounted,
    /// The unit was back already (a release, an undo, or an earlier call).
    AlreadyReturned,
}

/// Stock shards and the per-user holds on them. This is the hot path.
///
/// A reservation is the brief's transaction: the *take* (one unit out of a shard with
/// `available > 0`, recorded by order id) and the *hold* on the user's item, both or
/// neither. A store whose transactions cancel each other on a hot item (DynamoDB's
/// `TransactionConflict`) may reserve there as two conditional writes instead, the take
/// then the hold, which queue where transactions cancel. The shard records each take by
/// order id, so every step is idempotent, and a crash between those two writes leaves a
/// take no hold accounts for, which the order's next reserve on that shard finishes, or
/// [`StockLedger::unaccounted_takes`] finds and [`StockLedger::return_take`] gives back.
#[async_trait]
pub trait StockLedger: Send + Sync {
    /// Takes one unit from `shard` for `reservation` and records the reservation as a
    /// `reserved` hold on the user's item: atomically, or (on a hot shard) the take then
    /// the hold, undoing the take if the hold is refused.
    ///
    /// The shard must have stock (`available > 0`) and the user must hold fewer than
    /// `sale.per_user_limit` open or paid units and have cancelled or let lapse fewer
    /// than [`MAX_ABANDONED_HOLDS`](crate::sale::MAX_ABANDONED_HOLDS) holds of this
    /// sale; either limit answers `LimitReached` and leaves the stock as it was. Write
    /// contention is not waited out here: it answers `Contended` at once, so the caller
    /// can try a shard that is free instead of queueing on a busy one. Idempotent per
    /// order id: once a hold for `reservation.order_id` exists (in any status), another
    /// call takes nothing for good and answers `AlreadyHeld`, so a caller that cannot
    /// tell whether a timed-out call committed may simply call again, on the same shard
    /// (where a take that landed is found and finished) or another (where the shard's
    /// take is undone, or left to `return_take`). [`StoreError::Unavailable`] only when
    /// nothing was sent, the take included: a refusal after the take is `Transient`.
    ///
    /// The take records when it was written (see [`ShardTakers::latest_take`]), not
    /// when the order was made: a grab may wait out contention for most of its budget
    /// before it takes, and the hold and any undo follow the take, not the grab's start.
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError>;

    /// Units left in each shard, index = shard, in one read that writes nothing, for
    /// the public sale page. It may lag the latest grabs and releases by
    /// a moment (an eventually consistent read on AWS), so it is never used to decide a
    /// grab: at most it makes the gate try a shard's write (whose condition decides)
    /// or wait one more interval before trying it.
    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError>;

    /// Every shard's stock with the orders holding its units (index = shard), in one
    /// read that writes nothing: the sold-out gate's recheck (at most once per process
    /// per interval). Like `availability` it may lag and never decides a grab, but each
    /// shard's two parts come from one version of it.
    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError>;

    /// The shards whose takers include `order`, read consistently now: where its path's
    /// requests took units, held or not. Writes nothing. An implementation whose
    /// [`StockLedger::shard_states`] may lag must override this.
    async fn shards_taken_by(&self, sale: &Sale, order: &OrderId) -> Result<Vec<u16>, StoreError> {
        Ok((0..sale.shards)
            .zip(self.shard_states(sale).await?)
            .filter(|(_, state)| state.takers.include(order))
            .map(|(shard, _)| shard)
            .collect())
    }

    /// Ends an open hold and gives its unit back to its shard: one transaction on the
    /// user's and the order's items records the order as `reason.final_status()`, then
    /// a conditional write on the shard removes the order's take. Only an open hold
    /// (`reserved`) can be released, so the stock comes back at most
    /// once: a repeated or late call answers `AlreadySettled` and, if the shard still
    /// records the take (a release that died between its writes), gives it back. The
    /// hold stays, with its final status and no longer counted against the limit, so
    /// the order id can never be reserved again.
    async fn release(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError>;

    /// Gives back `reservation`'s take on `shard`, if there is one, for an order whose
    /// hold is on another shard: no reserve can record a hold for it on `shard` any
    /// more, so the unit is free. Whether a take was given back. Idempotent.
    async fn drop_superseded_take(
        &self,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError>;

    /// The takes on `sale`'s shards that no open or paid hold on the same shard
    /// accounts for: a reserve between its two writes, or one that died there; a take
    /// a retry on another shard superseded; a release that died before its shard
    /// write. A read for the reconciler that may lag the latest writes, so each take
    /// is checked again by [`StockLedger::return_take`] before it is given back.
    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError>;

    /// Gives `take`'s unit back unless, read consistently now, an open or paid hold on
    /// its shard accounts for it. If the order has no hold at all, first records one,
    /// settled as `expired`, so that a reserve still on its way cannot record it
    /// after the unit went back: its hold write is refused as `AlreadyHeld`.
    /// Idempotent.
    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError>;
}

/// What [`OrderPayments::record_payment`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentRecorded {
    /// The order recorded another state of its payment before: this call changed it.
    Changed,
    /// The order records this state of its payment already.
    Unchanged,
    /// Not the order's payment, no such order, or another final state recorded before.
    Refused,
}

impl PaymentRecorded {
    /// Whether the order records the state now.
    pub fn is_recorded(self) -> bool {
        self != Self::Refused
    }
}

/// What [`OrderPayments::pay_with`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayOutcome {
    /// Paid by this call: it sold the unit. (A store's own resend of the call, after an
    /// answer lost on the way, is the same call; a call that failed with its write
    /// applied is not, and the next settlement finds the order `Settled(Paid)`.)
    Paid,
    /// Another call settled the order first: paid it (with the same payment: a page's
    /// confirm racing Stripe's webhook), cancelled it or let it expire.
    Settled(OrderStatus),
    /// The hold is still open but its payment window has closed.
    WindowClosed,
    /// There is no such hold, or the payment is not the order's.
    Unknown,
}

/// Orders: the durable record of each reservation's fate. The grab's hold is the order
/// from the moment it is reserved; nothing writes it again until it settles.
#[async_trait]
pub trait OrderBook: Send + Sync {
    /// The user's order and the reservation behind it, read consistently. Another
    /// user's order is `None`, exactly like a missing one.
    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError>;

    /// The reservation behind every open (`reserved`) hold of the sale. A read for the
    /// reconciler; like [`OrderBook::count`] it may lag the latest writes on AWS, which
    /// is harmless because every action the reconciler takes on a hold is conditional
    /// on the hold's current state.
    async fn open_holds(&self, sale: &Sale) -> Result<Vec<Reservation>, StoreError>;

    /// Counts every unit of the sale by where it is, for reconciliation. A read of
    /// every hold and order of the sale, so for admins, not for the hot path.
    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError>;

    /// One page of every order of the sale, buyer by buyer in the store's fixed order
    /// (each buyer's stats bucket, then the buyer; a buyer's orders by id): the orders
    /// of at most `limit` (at least one) buyers, starting after the buyer `after` names.
    /// Each order as [`OrderBook::find`] answers it. A page may hold fewer buyers than
    /// `limit`, even none (a store bounds the reads of one page), and still name a
    /// `next`; `next` is `None` once no buyer follows. A read for admins; on AWS through
    /// `gsi1`, which may lag the last writes by its propagation delay.
    async fn sale_orders(
        &self,
        sale: &Sale,
        after: Option<&BuyerCursor>,
        limit: usize,
    ) -> Result<OrderPage, StoreError>;

    /// One page of `user`'s own orders in every sale, newest first: the sales in which
    /// the user holds or held an order, the latest first by when their first hold there
    /// was recorded (then by sale id, the greater first), each with all the user's
    /// orders there, newest first (by `created_at`, then by id, the greater first).
    /// At most `limit` (at least one) sales a page, after the sale `after` names; a
    /// page may be empty and still name a `next`. Only the user's: it is keyed by the
    /// user, like [`OrderBook::find`]. On AWS through `gsi2`, which may lag the last
    /// writes by its propagation delay.
    async fn buyer_orders(
        &self,
        user: &UserId,
        after: Option<&BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<BuyerOrdersPage, StoreError>;
}

/// The orders queue between the grab and the order consumer.
#[async_trait]
pub trait OrderQueue: Send + Sync {
    /// Sends the held order for the consumer. Deduplicated by
    /// [`OrderMessage::deduplication_id`], so a repeated send does not produce a second
    /// message (within the queue's dedup window).
    /// At-least-once delivery: the consumer must be idempotent.
    async fn enqueue(&self, message: &OrderMessage) -> Result<(), StoreError>;
}

/// Timers that release unpaid orders.
#[async_trait]
pub trait ReleaseScheduler: Send + Sync {
    /// Arranges for the release function to receive `reservation` once, at
    /// `reservation.expires_at`. Idempotent by order id: if the timer exists already,
    /// this succeeds without creating a second.
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError>;

    /// Removes the timer if it is still there. A missing timer is success. Best effort
    /// by design: a timer that fires anyway finds the order settled and does nothing.
    async fn cancel_release(&self, order_id: &OrderId) -> Result<(), StoreError>;
}

/// Users barred from every sale (scalpers, bots), managed by admins. Admin writes are
/// rare and the grab reads the whole list only through a per-process cache
/// ([`crate::service::CachedBlocklist`]), never once per request.
#[async_trait]
pub trait Blocklist: Send + Sync {
    /// Adds the user. Idempotent: blocking a user who is blocked already succeeds and
    /// changes nothing.
    async fn block(&self, user: &UserId) -> Result<(), StoreError>;

    /// Removes the user. Idempotent: unblocking a user who is not blocked succeeds and
    /// changes nothing.
    async fn unblock(&self, user: &UserId) -> Result<(), StoreError>;

    /// Every blocked user, each once, in no particular order: a read of the whole list,
    /// for caching. It may lag a block or unblock made a moment before (the store's
    /// read consistency), which a cache refreshed every few seconds lags anyway.
    async fn blocked(&self) -> Result<Vec<UserId>, StoreError>;
}

/// A payment provider: the buyer's money for one order, authorised on the buyer's side
/// (the page confirms the payment with the provider's script) and moved only by
/// [`PaymentProvider::capture`], which a settlement calls once the order is paid on our
/// side. Every call is safe to retry after an error in doubt (a timeout): a capture or
/// a cancel of a payment already captured or cancelled answers what it is, a refund
/// gives back only what no refund covers, and an opening is a new payment each time,
/// of which the order records one ([`OrderPayments::attach_payment`]). `StoreError::Transient` is a provider that did not answer or asked to slow
/// down; `Permanent` is a request it will never take (a wrong key, a malformed id).
#[async_trait]
pub trait PaymentProvider: Send + Sync {
    /// A payment of `order`, bought by `buyer`, for `price`, to be captured manually
    /// and naming the order and the buyer in its metadata (what finds the order's hold
    /// from an event about the payment). Each call opens a new payment (no idempotency
    /// key: a provider that replays a failure to a retry would cost the buyer the
    /// unit); a caller records one payment's id on the order
    /// ([`OrderPayments::attach_payment`]), withdraws any other it opened, and reads the
    /// recorded one with [`PaymentProvider::payment`] rather than open another.
    async fn open(
        &self,
        order: &OrderId,
        buyer: &UserId,
        price: Price,
    ) -> Result<Payment, StoreError>;

    /// The payment as the provider has it now; `None` if it has no such payment.
    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError>;

    /// Moves the authorised money. Captured already: the same answer, nothing moves
    /// twice.
    async fn capture(&self, id: &PaymentId) -> Result<CaptureOutcome, StoreError>;

    /// Releases the authorisation, so no money moves. Cancelled already: the same
    /// answer.
    async fn cancel(&self, id: &PaymentId) -> Result<CancelOutcome, StoreError>;

    /// Gives back the money of `payment` (read captured just before) that no refund
    /// covers: one that succeeded or is on its way. A refund that failed or was cancelled
    /// covers nothing, so what it covered is refunded again, up to
    /// [`crate::payment::MAX_FAILED_REFUNDS`] failures; once refunds cover all of it,
    /// asking again asks nothing of the provider. Answers how much is back, and how
    /// much on its way, counting a refund made by this call.
    async fn refund(&self, payment: &Payment) -> Result<RefundProgress, StoreError>;

    /// How much of `payment`'s captured money has gone back, from the refunds the
    /// provider lists: a read, which refunds nothing.
    async fn refunds(&self, payment: &Payment) -> Result<RefundProgress, StoreError>;
}

/// What [`OrderPayments::attach_payment`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentAttach {
    /// The payment is the order's, recorded by this call or an earlier one.
    Attached,
    /// The order records another payment already: that one is the order's.
    Taken(PaymentId),
    /// The order is no longer open, so no payment may start for it.
    Settled(OrderStatus),
    /// There is no such hold.
    Unknown,
}

/// The buyer's payment of each order, as the order records it: one payment per order,
/// and the state a settlement last read of it. Every write is conditional on the hold,
/// so a settlement racing the timeout, a cancel or another settlement changes nothing
/// twice, and none of them is in doubt after an error: each may simply be sent again.
#[async_trait]
pub trait OrderPayments: Send + Sync {
    /// Records `payment` as the order's, in state `open`: one conditional write, only on
    /// an open hold that records no payment yet, so one order never has two. Sending
    /// the same payment again answers `Attached`.
    async fn attach_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<PaymentAttach, StoreError>;

    /// The money's side of pay against timeout: marks the open hold `paid` with
    /// `payment` in its state (`authorised`: its capture is pending; `captured`),
    /// atomically with the order's item, if the window is still open at `now` and
    /// `payment` is the order's. One conditional write on the hold, as a cancel's and
    /// the timeout's are, so exactly one of this, a cancel and the timeout wins.
    /// Idempotent: an order paid already answers `Paid`.
    async fn pay_with(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
        now: DateTime<Utc>,
    ) -> Result<PayOutcome, StoreError>;

    /// Records the state a settlement read of the order's payment, if `payment.id` is
    /// the order's and the state recorded is not another final one
    /// ([`is_final`](crate::payment::PaymentState::is_final)): a stale read recorded late undoes nothing. The
    /// order's status does not change. Whether this call changed the recorded state,
    /// found it recorded already, or was refused: a change is made once, so what it
    /// moved (a capture) is counted once however many settlements race. Idempotent.
    async fn record_payment(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
    ) -> Result<PaymentRecorded, StoreError>;

    /// Moves a cancelled or expired order whose payment was captured, and then
    /// refunded, to `refunded`, atomically with its item, if `payment` is the order's
    /// and is recorded captured (the settlement records it before it refunds).
    /// Whether the order is `refunded` now (by this call or an earlier one).
    async fn record_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<bool, StoreError>;

    /// Moves a `refunded` order back to `from`, the status it was refunded from
    /// ([`Order::refunded_from`]), atomically with its item, if `payment` is the order's:
    /// its refund failed after it had succeeded (the card's bank could not take it), so
    /// the money is not back after all. The payment stays recorded captured, so the
    /// order is unsettled again: a settlement refunds it again, and the reconciler finds
    /// it. Whether the order is in `from` now (by this call or an earlier one).
    async fn reopen_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        from: OrderStatus,
    ) -> Result<bool, StoreError>;

    /// Moves a `paid` order whose payment is recorded cancelled (its authorisation
    /// lapsed or was cancelled at the provider before a capture got through: the money
    /// can never be taken) to `payment_failed` and gives its unit back: one transaction
    /// on the user's and the order's items, if `payment` is the order's, then a
    /// conditional write on the shard that removes the order's take, as
    /// [`StockLedger::release`] does (a death between the two leaves a take no open or
    /// paid hold accounts for, which the reconciler gives back). The hold stops counting
    /// against the buyer's limit and counts as abandoned, as a lapsed hold does.
    /// Whether this call moved it (`false`: it was `payment_failed` already, or is no
    /// paid order whose payment is recorded cancelled), so that each failure is counted
    /// once. Idempotent: a call again gives back a take an earlier one left.
    async fn fail_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Follows the order's money past what the sale's own reads reach: an entry in an
    /// index of only the orders whose money a settlement left unsettled (a capture to
    /// retry, a refund on its way or to be made again, an authorisation to release),
    /// which the reconciler reads whatever the sale's age, until a settlement finishes
    /// the money. A card's authorisation lasts 7 days and a refund may fail days after
    /// it succeeded, long after the sale ended. One write keyed by the order, the first
    /// `since` kept and its version raised.
    async fn follow_money(
        &self,
        reservation: &Reservation,
        since: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Stops following the order's money, as `read` found it followed: its settlement
    /// is finished. One conditional delete: a settlement that followed it again since
    /// the read (a refund that failed after, say) keeps it followed. Idempotent.
    async fn unfollow_money(&self, read: &FollowedMoney) -> Result<(), StoreError>;

    /// Every order whose money is followed. One read of the index, whose size is the
    /// number of payments left unsettled, not of sales or orders, so the reconciler's
    /// cost does not grow with old sales.
    async fn followed_money(&self) -> Result<Vec<FollowedMoney>, StoreError>;

    /// The sale's orders whose payment a settlement has not finished
    /// ([`OrderPayment::needs_settling`]): open with a payment; paid with a payment
    /// recorded authorised or cancelled; cancelled or expired with a payment not recorded cancelled. A read for the reconciler, which may lag the
    /// latest writes like [`OrderBook::open_holds`]; every settlement reads the order
    /// again and acts only through the conditional writes above.
    async fn unsettled_payments(
        &self,
        sale: &Sale,
    ) -> Result<Vec<(Order, Reservation)>, StoreError>;
}

/// The provider's events a webhook processed, remembered long enough to outlast the
/// provider's redeliveries, so a redelivered event is acknowledged without acting twice.
/// Processing itself is idempotent (a settlement reads the payment afresh), so this only
/// spares the provider and the store the repeated work.
#[async_trait]
pub trait ProviderEvents: Send + Sync {
    /// Whether `event_id` was recorded processed, read consistently.
    async fn was_processed(&self, event_id: &str) -> Result<bool, StoreError>;

    /// Records `event_id` processed at `now`, with one conditional put that expires on
    /// its own after [`PROCESSED_EVENT_RETENTION`]. Whether this call recorded it
    /// (`false`: another delivery did first).
    async fn record_processed(
        &self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
}

/// How long a processed event is remembered: Stripe redelivers an event for up to
/// three days, and a reordered delivery comes within those.
pub const PROCESSED_EVENT_RETENTION: chrono::Duration = chrono::Duration::days(30);
