//! In-memory fakes of every port, faithful to the contracts in [`crate::ports`], for
//! domain tests and for handler tests that do not need the real services. [`contract`]
//! holds the scenarios that show them faithful, played on `DynamoStore` too.

pub mod contract;
pub mod history;
pub mod simulation;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};

use crate::buyer_orders::{BuyerOrdersCursor, BuyerOrdersPage};
use crate::challenge::{ChallengeRefusal, ChallengeWork, IssuedChallenge, SolvedChallenge};
use crate::control::{ControlWrite, SaleAudit};
use crate::error::StoreError;
use crate::fulfilment::{BuyerCursor, OrderPage};
use crate::ids::{OrderId, SaleId, UserId};
use crate::order::{Order, OrderMessage, OrderStatus, ReleaseReason, Reservation};
use crate::payment::{
    CancelOutcome, CaptureOutcome, FollowedMoney, OrderPayment, Payment, PaymentId, PaymentState,
    Refund, RefundProgress, RefundStatus,
};
use crate::ports::{
    Blocklist, Clock, IdSource, OrderBook, OrderPayments, OrderQueue, Pause, PayOutcome,
    PaymentAttach, PaymentProvider, PaymentRecorded, ProofOfWork, ProviderEvents, ReleaseScheduler,
    ReserveRefusal, SaleCatalog, Settlement, ShardState, ShardTakers, StockLedger, Take,
    TakeReturn,
};
use crate::price::Price;
use crate::sale::{
    MAX_ABANDONED_HOLDS, PriceDraft, Sale, SaleCursor, SaleDraft, SalePage, StockCounts,
};

/// A sale for a test, in place of a `SaleDraft` literal in each: `stock` units on
/// `shards` shards of the sale `phone-launch` ("Phone launch") at 1,299.00 EUR, an
/// hour long from 2026-01-01 00:00 UTC, a 900 s payment window and the default
/// per-user limit. A test changes what it is about, then takes the
/// [`SaleBuilder::draft`] for the use case or the validated [`SaleBuilder::build`] for
/// a store.
pub fn sale(stock: i64, shards: i64) -> SaleBuilder {
    let starts_at = DateTime::from_timestamp(1_767_225_600, 0).expect("2026-01-01 is a valid time");
    SaleBuilder {
        draft: SaleDraft {
            sale_id: Some("phone-launch".to_owned()),
            name: "Phone launch".to_owned(),
            price: PriceDraft {
                amount: 129_900,
                currency: "EUR".to_owned(),
            },
            stock,
            starts_at,
            ends_at: starts_at + Duration::hours(1),
            per_user_limit: None,
            payment_timeout_secs: Some(900),
            shards: Some(shards),
            challenge_work: None,
            reserve: None,
        },
    }
}

/// See [`sale`].
#[derive(Debug, Clone)]
pub struct SaleBuilder {
    draft: SaleDraft,
}

impl SaleBuilder {
    pub fn id(mut self, sale_id: &str) -> Self {
        self.draft.sale_id = Some(sale_id.to_owned());
        self
    }

    /// At `amount` minor units of `currency`.
    pub fn priced(mut self, amount: i64, currency: &str) -> Self {
        self.draft.price = PriceDraft {
            amount,
            currency: currency.to_owned(),
        };
        self
    }

    /// A challenge of `work` before each grab path.
    pub fn challenge_work(mut self, work: i64) -> Self {
        self.draft.challenge_work = Some(work);
        self
    }

    /// Reserving as `path` says.
    pub fn reserve(mut self, path: crate::sale::ReservePath) -> Self {
        self.draft.reserve = Some(path.name().to_owned());
        self
    }

    /// No id: the use case generates one.
    pub fn generated_id(mut self) -> Self {
        self.draft.sale_id = None;
        self
    }

    pub fn named(mut self, name: &str) -> Self {
        self.draft.name = name.to_owned();
        self
    }

    /// Starts at `starts_at`, as long as before.
    pub fn starting_at(mut self, starts_at: DateTime<Utc>) -> Self {
        let length = self.draft.ends_at - self.draft.starts_at;
        self.draft.starts_at = starts_at;
        self.draft.ends_at = starts_at + length;
        self
    }

    pub fn lasting(mut self, length: Duration) -> Self {
        self.draft.ends_at = self.draft.starts_at + length;
        self
    }

    pub fn per_user_limit(mut self, limit: i64) -> Self {
        self.draft.per_user_limit = Some(limit);
        self
    }

    pub fn payment_window_secs(mut self, secs: i64) -> Self {
        self.draft.payment_timeout_secs = Some(secs);
        self
    }

    /// Anything else, on the draft itself (a field left unset, say).
    pub fn with(mut self, change: impl FnOnce(&mut SaleDraft)) -> Self {
        change(&mut self.draft);
        self
    }

    pub fn draft(self) -> SaleDraft {
        self.draft
    }

    /// The sale, validated as the create use case validates it.
    pub fn build(self) -> Sale {
        Sale::from_draft(self.draft).expect("a test's sale is valid")
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A clock that moves only when told.
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(now: DateTime<Utc>) -> Self {
        Self(Mutex::new(now))
    }

    pub fn advance(&self, by: Duration) {
        *locked(&self.0) += by;
    }

    pub fn set(&self, now: DateTime<Utc>) {
        *locked(&self.0) = now;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *locked(&self.0)
    }
}

/// Identifiers from a seed: ULIDs of the clock's time and the seed's random bits
/// (xorshift64), so that a run with the same seed and times draws the same ones.
pub struct SeededIds {
    clock: Arc<dyn Clock>,
    state: Mutex<u64>,
}

impl SeededIds {
    pub fn new(seed: u64, clock: Arc<dyn Clock>) -> Self {
        // splitmix64 of the seed: neighbouring seeds start far apart, and xorshift's
        // state must not be 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self {
            clock,
            state: Mutex::new((z ^ (z >> 31)).max(1)),
        }
    }

    fn next(&self) -> u64 {
        let mut state = locked(&self.state);
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }
}

impl IdSource for SeededIds {
    fn ulid(&self) -> ulid::Ulid {
        let millis = u64::try_from(self.clock.now().timestamp_millis()).unwrap_or(0);
        let random = (u128::from(self.next()) << 64 | u128::from(self.next())) & ((1 << 80) - 1);
        ulid::Ulid::from_parts(millis, random)
    }
}

#[derive(Debug, Default, Clone)]
struct State {
    sales: HashMap<SaleId, Sale>,
    shards: HashMap<(SaleId, u16), u64>,
    /// Units each user holds or bought, per sale: what the per-user limit counts.
    active: HashMap<(SaleId, UserId), u32>,
    /// Holds each user cancelled or let lapse, per sale.
    abandoned: HashMap<(SaleId, UserId), u32>,
    /// The open or paid holds, by order.
    holds: HashMap<OrderId, (Reservation, OrderStatus)>,
    /// Order items: created by the consumer, `pay_with` or release.
    orders: HashMap<OrderId, (Reservation, OrderStatus)>,
    /// When each expired order's release committed.
    expired_at: HashMap<OrderId, DateTime<Utc>>,
    /// When each paid order's pay committed.
    paid_at: HashMap<OrderId, DateTime<Utc>>,
    /// The status each refunded order was refunded from.
    refunded_from: HashMap<OrderId, OrderStatus>,
    /// Units taken from a shard by a reserve that never recorded its hold, by order
    /// and shard: the fake's `reserve` is atomic, so only [`InMemoryStore::leave_take`]
    /// and a take of [`InMemoryStore::take`] not yet held make them.
    loose_takes: HashMap<(OrderId, u16), Take>,
    /// Each order's payment, as [`OrderPayments`] records it.
    payments: HashMap<OrderId, OrderPayment>,
    /// The orders whose money is followed, with their buyer, since when, and version.
    followed_money: BTreeMap<OrderId, (UserId, DateTime<Utc>, u64)>,
    /// The provider events recorded processed.
    processed_events: HashSet<String>,
    /// Each sale's audit trail, oldest first.
    audits: HashMap<SaleId, Vec<SaleAudit>>,
    /// When each buyer's first hold in each sale was recorded: where the sale goes in
    /// the buyer's list of orders (a voided take is no hold, and sets none).
    first_holds: HashMap<(SaleId, UserId), DateTime<Utc>>,
}

impl State {
    /// The order `held` is in `status`, with what the store recorded about it.
    fn order_of(&self, held: &Reservation, status: OrderStatus) -> Order {
        let id = &held.order_id;
        Order {
            expired_at: self.expired_at.get(id).copied(),
            paid_at: self.paid_at.get(id).copied(),
            payment: self.payments.get(id).cloned(),
            refunded_from: self.refunded_from.get(id).copied(),
            ..Order::from_reservation(held, status)
        }
    }

    /// Whether `user` holds or bought `sale.per_user_limit` units of the sale, or has let
    /// [`MAX_ABANDONED_HOLDS`] holds of it go: a hold refused as `LimitReached`.
    fn at_a_limit(&self, sale: &Sale, user: &UserId) -> bool {
        let buyer = (sale.sale_id.clone(), user.clone());
        self.active.get(&buyer).copied().unwrap_or(0) >= sale.per_user_limit
            || self.abandoned.get(&buyer).copied().unwrap_or(0) >= MAX_ABANDONED_HOLDS
    }

    /// Records `reservation`'s hold, open, and counts it against the buyer's limit.
    fn hold(&mut self, reservation: &Reservation) {
        let buyer = (reservation.sale_id.clone(), reservation.user_id.clone());
        *self.active.entry(buyer.clone()).or_default() += 1;
        self.first_holds
            .entry(buyer)
            .or_insert(reservation.created_at);
        self.holds.insert(
            reservation.order_id.clone(),
            (reservation.clone(), OrderStatus::Reserved),
        );
    }

    /// Sets the order's status on its hold and its order item alike, as the store's
    /// transactions do.
    fn settle(&mut self, id: &OrderId, status: OrderStatus) {
        if let Some((held, held_status)) = self.holds.get_mut(id) {
            *held_status = status;
            let held = held.clone();
            self.orders.insert(id.clone(), (held, status));
        }
    }

    /// Ends the order's hold in `status`, as [`Self::settle`] does, and gives its unit
    /// back: the shard's stock, and the buyer's limit, which counts it abandoned.
    fn end_giving_the_unit_back(&mut self, id: &OrderId, status: OrderStatus) {
        let Some((held, _)) = self.holds.get(id).cloned() else {
            return;
        };
        let buyer = (held.sale_id.clone(), held.user_id.clone());
        *self.active.entry(buyer.clone()).or_default() -= 1;
        *self.abandoned.entry(buyer).or_default() += 1;
        *self.shards.entry((held.sale_id, held.shard)).or_default() += 1;
        self.settle(id, status);
    }

    /// Whether the order records `payment` as its own, in `state`.
    fn payment_in(&self, id: &OrderId, payment: &PaymentId, state: PaymentState) -> bool {
        self.payments
            .get(id)
            .is_some_and(|recorded| &recorded.id == payment && recorded.state == state)
    }

    fn payment_is(&self, id: &OrderId, payment: &PaymentId) -> bool {
        self.payments
            .get(id)
            .is_some_and(|recorded| &recorded.id == payment)
    }

    /// The orders holding a unit of the shard: open or paid holds on it, and takes that
    /// never got their hold. The fake's reserve takes and holds at once, at no time of
    /// its own, so a held take is dated by its order: it can never be undone anyway.
    fn takers_of(&self, sale_id: &SaleId, shard: u16) -> ShardTakers {
        let holding = self
            .holds
            .iter()
            .filter(|(_, (held, status))| {
                &held.sale_id == sale_id
                    && held.shard == shard
                    && (status.is_open() || *status == OrderStatus::Paid)
            })
            .map(|(order, (held, _))| (order, held.created_at));
        let loose = self
            .loose_takes
            .values()
            .filter(|take| take.order_id.sale_id() == sale_id && take.shard == shard)
            .map(|take| (&take.order_id, take.taken_at));
        ShardTakers::of_takes(holding.chain(loose))
    }
}

/// Sales, stock and orders in one mutex: every operation is trivially atomic.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    state: Mutex<State>,
    /// Counts `reserve` calls, so tests can prove that the gate spared the store.
    pub reserve_calls: AtomicUsize,
    /// Counts `availability` reads (the sale page's and the sold-out gate's).
    pub availability_reads: AtomicUsize,
    /// Counts `find` reads (a retried grab's lookup of its order, among others).
    pub find_calls: AtomicUsize,
    /// `find` reads still to fail transiently, as a read timing out would.
    failing_finds: AtomicUsize,
    /// `record_payment` writes still to fail transiently, with nothing written.
    failing_payment_records: AtomicUsize,
    /// `record_processed` writes still to fail transiently, with nothing written.
    failing_event_records: AtomicUsize,
}

impl InMemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a reservation as `reserved` without taking a unit, as a take with no
    /// stock condition would on an empty shard: an oversell, planted for the simulation's
    /// checker to catch.
    pub fn force_hold(&self, _sale: &Sale, reservation: &Reservation) {
        locked(&self.state).hold(reservation);
    }

    /// Records a reservation as `reserved` with its unit taken, as a grab whose queue
    /// message was lost would leave it (no timer): the reconciler's case.
    pub fn strand(&self, sale: &Sale, reservation: &Reservation) {
        let mut state = locked(&self.state);
        *state
            .shards
            .entry((sale.sale_id.clone(), reservation.shard))
            .or_default() -= 1;
        state.hold(reservation);
    }

    /// Takes a unit from `take.shard` with no hold behind it, as a reserve that died
    /// between its take and its hold leaves it: `return_take`'s case.
    pub fn leave_take(&self, sale: &Sale, take: Take) {
        let mut state = locked(&self.state);
        *state
            .shards
            .entry((sale.sale_id.clone(), take.shard))
            .or_default() -= 1;
        state
            .loose_takes
            .insert((take.order_id.clone(), take.shard), take);
    }

    /// Gives back a take [`InMemoryStore::leave_take`] left, as the store's reserve
    /// undoes a take whose hold was refused.
    pub fn undo_take(&self, sale: &Sale, take: &Take) {
        let mut state = locked(&self.state);
        if state
            .loose_takes
            .remove(&(take.order_id.clone(), take.shard))
            .is_some()
        {
            *state
                .shards
                .entry((sale.sale_id.clone(), take.shard))
                .or_default() += 1;
        }
    }

    /// A reserve's first write as take then hold (`DynamoStore`'s path on a hot shard):
    /// one unit out of `shard` for the order, recorded with when it was written, unless
    /// the shard is empty. A take of the order the shard records already (loose, or
    /// accounted for by the order's hold there) is found, not repeated: `Ok(false)`.
    pub fn take(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
        now: DateTime<Utc>,
    ) -> Result<bool, ReserveRefusal> {
        let mut state = locked(&self.state);
        let order = &reservation.order_id;
        let accounted = state.holds.get(order).is_some_and(|(held, status)| {
            held.shard == shard && (status.is_open() || *status == OrderStatus::Paid)
        });
        if accounted || state.loose_takes.contains_key(&(order.clone(), shard)) {
            return Ok(false);
        }
        let available = state
            .shards
            .entry((sale.sale_id.clone(), shard))
            .or_default();
        if *available == 0 {
            return Err(ReserveRefusal::ShardEmpty(
                state.takers_of(&sale.sale_id, shard),
            ));
        }
        *available -= 1;
        state.loose_takes.insert(
            (order.clone(), shard),
            Take {
                shard,
                order_id: order.clone(),
                user_id: reservation.user_id.clone(),
                taken_at: now,
            },
        );
        Ok(true)
    }

    /// A reserve's second write as take then hold: the hold on the buyer's item, within
    /// the limits, unless the order has a hold already. A hold refused (the limit, or
    /// the order held elsewhere or settled) undoes the take, as `DynamoStore`'s does;
    /// the order's own hold on this shard answers `AlreadyHeld` and keeps it.
    pub fn hold_taken(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<(), ReserveRefusal> {
        let mut state = locked(&self.state);
        let order = &reservation.order_id;
        let refusal = match state.holds.get(order) {
            Some((held, status))
                if held.shard == shard && (status.is_open() || *status == OrderStatus::Paid) =>
            {
                return Err(ReserveRefusal::AlreadyHeld);
            }
            Some(_) => ReserveRefusal::AlreadyHeld,
            None if state.at_a_limit(sale, &reservation.user_id) => ReserveRefusal::LimitReached,
            None => {
                state.loose_takes.remove(&(order.clone(), shard));
                state.hold(reservation);
                return Ok(());
            }
        };
        if state.loose_takes.remove(&(order.clone(), shard)).is_some() {
            *state
                .shards
                .entry((sale.sale_id.clone(), shard))
                .or_default() += 1;
        }
        Err(refusal)
    }

    /// Ends a paid order as `reason` says and gives its unit back, as a release that
    /// ignored `paid` would: a bug planted for the simulation's checker. Whether the
    /// order was paid.
    pub fn end_paid_giving_the_unit_back(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
    ) -> bool {
        let mut state = locked(&self.state);
        let paid = state
            .holds
            .get(&reservation.order_id)
            .is_some_and(|(_, status)| *status == OrderStatus::Paid);
        if paid {
            state.end_giving_the_unit_back(&reservation.order_id, reason.final_status());
        }
        paid
    }

    /// Every hold of `sale` ever recorded, in any status, by order id.
    pub fn holds_of(&self, sale: &SaleId) -> Vec<(Reservation, OrderStatus)> {
        let state = locked(&self.state);
        let mut holds: Vec<_> = state
            .holds
            .values()
            .filter(|(held, _)| &held.sale_id == sale)
            .cloned()
            .collect();
        holds.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
        holds
    }

    /// The buyer of `sale` with the most units held or bought, and how many, read from
    /// the holds themselves (not the limit's own counts).
    pub fn most_units_of_one_buyer(&self, sale: &SaleId) -> Option<(UserId, u32)> {
        let state = locked(&self.state);
        let mut units: HashMap<&UserId, u32> = HashMap::new();
        for (held, status) in state.holds.values() {
            if &held.sale_id == sale && matches!(status, OrderStatus::Reserved | OrderStatus::Paid)
            {
                *units.entry(&held.user_id).or_default() += 1;
            }
        }
        units
            .into_iter()
            .max_by(|(a, a_units), (b, b_units)| a_units.cmp(b_units).then(a.cmp(b)))
            .map(|(user, units)| (user.clone(), units))
    }

    /// A copy of the store as it is now: what an index that lags reads later.
    pub fn snapshot(&self) -> Self {
        Self {
            state: Mutex::new(locked(&self.state).clone()),
            ..Self::default()
        }
    }

    /// `unaccounted_takes` as `DynamoStore` reads it through a lagging index: the
    /// shards' takes read now, less those that the holds in `index` (a snapshot from a
    /// moment ago) account for.
    pub fn takes_unaccounted_in(&self, sale: &Sale, index: &InMemoryStore) -> Vec<Take> {
        let state = locked(&self.state);
        let held = state
            .holds
            .values()
            .filter(|(held, status)| {
                held.sale_id == sale.sale_id && (status.is_open() || *status == OrderStatus::Paid)
            })
            .map(|(held, _)| Take {
                shard: held.shard,
                order_id: held.order_id.clone(),
                user_id: held.user_id.clone(),
                taken_at: held.created_at,
            });
        let loose = state
            .loose_takes
            .values()
            .filter(|take| take.order_id.sale_id() == &sale.sale_id)
            .cloned();
        let indexed = locked(&index.state);
        let mut takes: Vec<Take> = held
            .chain(loose)
            .filter(|take| {
                !indexed
                    .holds
                    .get(&take.order_id)
                    .is_some_and(|(held, status)| {
                        held.shard == take.shard
                            && (status.is_open() || *status == OrderStatus::Paid)
                    })
            })
            .collect();
        takes.sort_by(|a, b| (&a.order_id, a.shard).cmp(&(&b.order_id, b.shard)));
        takes
    }

    /// How many units of `sale` are out of their shards with no hold behind them.
    pub fn loose_take_count(&self, sale: &SaleId) -> u64 {
        locked(&self.state)
            .loose_takes
            .values()
            .filter(|take| take.order_id.sale_id() == sale)
            .count() as u64
    }

    /// `order`'s takes that no hold accounts for, on any shard.
    pub fn loose_takes_of(&self, order: &OrderId) -> Vec<Take> {
        locked(&self.state)
            .loose_takes
            .values()
            .filter(|take| take.order_id == *order)
            .cloned()
            .collect()
    }

    /// Makes the next `count` `record_payment` writes fail transiently, writing nothing.
    pub fn fail_next_payment_records(&self, count: usize) {
        self.failing_payment_records.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` `record_processed` writes fail transiently, writing nothing.
    pub fn fail_next_event_records(&self, count: usize) {
        self.failing_event_records.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` `find` reads fail transiently.
    pub fn fail_next_finds(&self, count: usize) {
        self.failing_finds.store(count, Ordering::SeqCst);
    }

    pub fn shard_available(&self, sale_id: &SaleId, shard: u16) -> u64 {
        locked(&self.state)
            .shards
            .get(&(sale_id.clone(), shard))
            .copied()
            .unwrap_or(0)
    }

    pub fn order_count(&self) -> usize {
        locked(&self.state).orders.len()
    }
}

#[async_trait]
impl SaleCatalog for InMemoryStore {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        let mut state = locked(&self.state);
        if state.sales.contains_key(&sale.sale_id) {
            return Ok(false);
        }
        for shard in 0..sale.shards {
            state.shards.insert(
                (sale.sale_id.clone(), shard),
                u64::from(sale.shard_stock(shard)),
            );
        }
        state.sales.insert(sale.sale_id.clone(), sale.clone());
        Ok(true)
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        Ok(locked(&self.state).sales.get(sale_id).cloned())
    }

    async fn control_sale(
        &self,
        sale_id: &SaleId,
        change: &SaleAudit,
    ) -> Result<ControlWrite, StoreError> {
        let mut state = locked(&self.state);
        let Some(sale) = state.sales.get_mut(sale_id) else {
            return Ok(ControlWrite::NoSale);
        };
        if !change.action.applies_to().contains(&sale.control) {
            return Ok(ControlWrite::Refused {
                current: sale.control,
            });
        }
        sale.control = change.action.target();
        state
            .audits
            .entry(sale_id.clone())
            .or_default()
            .push(change.clone());
        Ok(ControlWrite::Changed)
    }

    async fn audit_trail(
        &self,
        sale_id: &SaleId,
        limit: usize,
    ) -> Result<Vec<SaleAudit>, StoreError> {
        let state = locked(&self.state);
        Ok(state
            .audits
            .get(sale_id)
            .map(|trail| trail.iter().rev().take(limit.max(1)).cloned().collect())
            .unwrap_or_default())
    }

    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        let mut sales: Vec<Sale> = locked(&self.state)
            .sales
            .values()
            .filter(|sale| sale.ends_at >= cutoff)
            .cloned()
            .collect();
        sales.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
        Ok(sales)
    }

    async fn list_sales(
        &self,
        after: Option<&SaleCursor>,
        limit: usize,
    ) -> Result<SalePage, StoreError> {
        // DynamoDB's order on the index's sort key, `{end}#{id}`: the end, then the id's
        // bytes; descending.
        let place = |ends_at: DateTime<Utc>, sale_id: &SaleId| (ends_at, sale_id.to_string());
        let mut sales: Vec<Sale> = locked(&self.state)
            .sales
            .values()
            .filter(|sale| {
                after.is_none_or(|cursor| {
                    place(sale.ends_at, &sale.sale_id) < place(cursor.ends_at, &cursor.sale_id)
                })
            })
            .cloned()
            .collect();
        sales.sort_by_key(|sale| std::cmp::Reverse(place(sale.ends_at, &sale.sale_id)));
        let limit = limit.max(1);
        let more = sales.len() > limit;
        sales.truncate(limit);
        let next = more.then(|| sales.last().map(SaleCursor::after)).flatten();
        Ok(SalePage { sales, next })
    }
}

#[async_trait]
impl StockLedger for InMemoryStore {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        self.reserve_calls.fetch_add(1, Ordering::SeqCst);
        let mut state = locked(&self.state);
        let shard_key = (sale.sale_id.clone(), shard);
        if state.holds.contains_key(&reservation.order_id) {
            return Ok(Err(ReserveRefusal::AlreadyHeld));
        }
        // A take of this order's that never got its hold: finished here, as the store's
        // reserve finds and finishes it.
        let finishing = state
            .loose_takes
            .contains_key(&(reservation.order_id.clone(), shard));
        let at_a_limit = state.at_a_limit(sale, &reservation.user_id);
        if finishing {
            state
                .loose_takes
                .remove(&(reservation.order_id.clone(), shard));
            if at_a_limit {
                // The hold is refused, so its take is undone, as the store's is.
                *state.shards.entry(shard_key).or_default() += 1;
                return Ok(Err(ReserveRefusal::LimitReached));
            }
            state.hold(reservation);
            return Ok(Ok(()));
        }
        if state.shards.get(&shard_key).copied().unwrap_or(0) == 0 {
            return Ok(Err(ReserveRefusal::ShardEmpty(
                state.takers_of(&sale.sale_id, shard),
            )));
        }
        if at_a_limit {
            return Ok(Err(ReserveRefusal::LimitReached));
        }
        *state.shards.entry(shard_key).or_default() -= 1;
        state.hold(reservation);
        Ok(Ok(()))
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        self.availability_reads.fetch_add(1, Ordering::SeqCst);
        Ok((0..sale.shards)
            .map(|shard| self.shard_available(&sale.sale_id, shard))
            .collect())
    }

    async fn release(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        match state.holds.get(id).map(|(_, status)| *status) {
            Some(status) if status.is_open() => {
                if reason == ReleaseReason::Expired {
                    state.expired_at.insert(id.clone(), now);
                }
                state.end_giving_the_unit_back(id, reason.final_status());
                Ok(Settlement::Applied)
            }
            Some(status) => Ok(Settlement::AlreadySettled(status)),
            None => Ok(state
                .orders
                .get(id)
                .map_or(Settlement::Unknown, |(_, status)| {
                    Settlement::AlreadySettled(*status)
                })),
        }
    }

    async fn drop_superseded_take(
        &self,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        let mut state = locked(&self.state);
        let loose = state
            .loose_takes
            .remove(&(reservation.order_id.clone(), shard))
            .is_some();
        if loose {
            *state
                .shards
                .entry((reservation.sale_id.clone(), shard))
                .or_default() += 1;
        }
        Ok(loose)
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        self.availability_reads.fetch_add(1, Ordering::SeqCst);
        let state = locked(&self.state);
        Ok((0..sale.shards)
            .map(|shard| ShardState {
                available: state
                    .shards
                    .get(&(sale.sale_id.clone(), shard))
                    .copied()
                    .unwrap_or(0),
                takers: state.takers_of(&sale.sale_id, shard),
            })
            .collect())
    }

    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError> {
        let state = locked(&self.state);
        let mut takes: Vec<Take> = state
            .loose_takes
            .values()
            .filter(|take| take.order_id.sale_id() == &sale.sale_id)
            .cloned()
            .collect();
        takes.sort_by(|a, b| (&a.order_id, a.shard).cmp(&(&b.order_id, b.shard)));
        Ok(takes)
    }

    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError> {
        let mut state = locked(&self.state);
        match state.holds.get(&take.order_id) {
            Some((held, status))
                if held.shard == take.shard
                    && (status.is_open() || *status == OrderStatus::Paid) =>
            {
                return Ok(TakeReturn::Accounted);
            }
            Some(_) => {}
            // No hold at all: voided first, whether or not the unit is still out, so a
            // reserve on its way finds a settled hold (`AlreadyHeld`). An expired order
            // like any other: found, counted, and settled for pay and release.
            None => {
                let voided = take.as_lapsed_reservation();
                state.holds.insert(
                    take.order_id.clone(),
                    (voided.clone(), OrderStatus::Expired),
                );
                state
                    .orders
                    .insert(take.order_id.clone(), (voided, OrderStatus::Expired));
                state.expired_at.insert(take.order_id.clone(), now);
            }
        }
        if state
            .loose_takes
            .remove(&(take.order_id.clone(), take.shard))
            .is_none()
        {
            return Ok(TakeReturn::AlreadyReturned);
        }
        *state
            .shards
            .entry((take.order_id.sale_id().clone(), take.shard))
            .or_default() += 1;
        Ok(TakeReturn::Returned)
    }
}

#[async_trait]
impl OrderBook for InMemoryStore {
    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError> {
        self.find_calls.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.failing_finds) {
            return Err(StoreError::transient("find", InjectedFailure));
        }
        let state = locked(&self.state);
        let found = state
            .holds
            .get(order_id)
            .or_else(|| state.orders.get(order_id));
        Ok(found
            .filter(|(held, _)| &held.user_id == user)
            .map(|(held, status)| (state.order_of(held, *status), held.clone())))
    }

    /// Buyers in DynamoStore's order: their bucket, then their id's bytes (the index's
    /// sort key is `USER#{id}`); a buyer's orders by id.
    async fn sale_orders(
        &self,
        sale: &Sale,
        after: Option<&BuyerCursor>,
        limit: usize,
    ) -> Result<OrderPage, StoreError> {
        let state = locked(&self.state);
        let mut buyers: BTreeMap<(u16, String), Vec<Order>> = BTreeMap::new();
        for (held, status) in state.holds.values() {
            if held.sale_id != sale.sale_id {
                continue;
            }
            let place = (sale.bucket_of(&held.user_id), held.user_id.to_string());
            let read_already = after.is_some_and(|cursor| match &cursor.after {
                Some(user) => place <= (cursor.bucket, user.clone()),
                None => place.0 < cursor.bucket,
            });
            if read_already {
                continue;
            }
            buyers
                .entry(place)
                .or_default()
                .push(state.order_of(held, *status));
        }
        let more = buyers.len() > limit.max(1);
        let mut orders = Vec::new();
        let mut last = None;
        for ((bucket, user), mut theirs) in buyers.into_iter().take(limit.max(1)) {
            theirs.sort_by(|a, b| a.order_id.cmp(&b.order_id));
            orders.extend(theirs);
            last = Some((bucket, user));
        }
        let next = last.filter(|_| more).map(|(bucket, user)| BuyerCursor {
            bucket,
            after: Some(user),
        });
        Ok(OrderPage { orders, next })
    }

    /// In DynamoStore's order: the sales by the buyer's first hold there, then by id,
    /// the latest first; in each, the buyer's orders by `created_at`, then by id, the
    /// latest first.
    async fn buyer_orders(
        &self,
        user: &UserId,
        after: Option<&BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<BuyerOrdersPage, StoreError> {
        let state = locked(&self.state);
        let mut sales: Vec<(DateTime<Utc>, SaleId)> = state
            .first_holds
            .iter()
            .filter(|((_, buyer), _)| buyer == user)
            .map(|((sale_id, _), held_at)| (*held_at, sale_id.clone()))
            .filter(|place| {
                after.is_none_or(|cursor| *place < (cursor.held_at, cursor.sale_id.clone()))
            })
            .collect();
        sales.sort_unstable_by(|a, b| b.cmp(a));
        let more = sales.len() > limit.max(1);
        sales.truncate(limit.max(1));
        let mut orders = Vec::new();
        for (_, sale_id) in &sales {
            let mut theirs: Vec<(&Reservation, OrderStatus)> = state
                .holds
                .values()
                .filter(|(held, _)| &held.sale_id == sale_id && &held.user_id == user)
                .map(|(held, status)| (held, *status))
                .collect();
            theirs.sort_unstable_by(|(a, _), (b, _)| {
                (b.created_at, &b.order_id).cmp(&(a.created_at, &a.order_id))
            });
            orders.extend(
                theirs
                    .into_iter()
                    .map(|(held, status)| state.order_of(held, status)),
            );
        }
        let next = sales
            .last()
            .filter(|_| more)
            .map(|(held_at, sale_id)| BuyerOrdersCursor {
                held_at: *held_at,
                sale_id: sale_id.clone(),
            });
        Ok(BuyerOrdersPage { orders, next })
    }

    async fn open_holds(&self, sale: &Sale) -> Result<Vec<Reservation>, StoreError> {
        let state = locked(&self.state);
        let mut holds: Vec<Reservation> = state
            .holds
            .values()
            .filter(|(held, status)| held.sale_id == sale.sale_id && status.is_open())
            .map(|(held, _)| held.clone())
            .collect();
        holds.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        Ok(holds)
    }

    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError> {
        let state = locked(&self.state);
        let mut counts = StockCounts {
            available: (0..sale.shards)
                .map(|shard| {
                    state
                        .shards
                        .get(&(sale.sale_id.clone(), shard))
                        .copied()
                        .unwrap_or(0)
                })
                .sum(),
            ..StockCounts::default()
        };
        // Every order of the sale has its hold, in its status now.
        for (held, status) in state
            .holds
            .values()
            .filter(|(held, _)| held.sale_id == sale.sale_id)
        {
            counts.add(*status, state.payments.get(&held.order_id));
        }
        Ok(counts)
    }
}

#[async_trait]
impl OrderPayments for InMemoryStore {
    async fn attach_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<PaymentAttach, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        let Some((_, status)) = state.holds.get(id) else {
            return Ok(PaymentAttach::Unknown);
        };
        let status = *status;
        match state.payments.get(id) {
            Some(recorded) if &recorded.id == payment => Ok(PaymentAttach::Attached),
            Some(recorded) => Ok(PaymentAttach::Taken(recorded.id.clone())),
            None if !status.is_open() => Ok(PaymentAttach::Settled(status)),
            None => {
                state.payments.insert(
                    id.clone(),
                    OrderPayment {
                        id: payment.clone(),
                        state: PaymentState::Open,
                    },
                );
                Ok(PaymentAttach::Attached)
            }
        }
    }

    async fn pay_with(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
        now: DateTime<Utc>,
    ) -> Result<PayOutcome, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        let Some((held, status)) = state.holds.get(id) else {
            return Ok(PayOutcome::Unknown);
        };
        let (status, expires_at) = (*status, held.expires_at);
        match status {
            open if open.is_open() => {
                if !state.payment_is(id, &payment.id) {
                    return Ok(PayOutcome::Unknown);
                }
                if now >= expires_at {
                    return Ok(PayOutcome::WindowClosed);
                }
                state.payments.insert(id.clone(), payment.clone());
                state.paid_at.insert(id.clone(), now);
                state.settle(id, OrderStatus::Paid);
                Ok(PayOutcome::Paid)
            }
            settled => Ok(PayOutcome::Settled(settled)),
        }
    }

    async fn record_payment(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
    ) -> Result<PaymentRecorded, StoreError> {
        if take_one(&self.failing_payment_records) {
            return Err(StoreError::transient("record_payment", InjectedFailure));
        }
        let mut state = locked(&self.state);
        let Some(recorded) = state.payments.get_mut(&reservation.order_id) else {
            return Ok(PaymentRecorded::Refused);
        };
        if recorded.id != payment.id {
            return Ok(PaymentRecorded::Refused);
        }
        if recorded.state == payment.state {
            return Ok(PaymentRecorded::Unchanged);
        }
        if recorded.state.is_final() {
            return Ok(PaymentRecorded::Refused);
        }
        recorded.state = payment.state;
        Ok(PaymentRecorded::Changed)
    }

    async fn record_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<bool, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        if !state.payment_in(id, payment, PaymentState::Captured) {
            return Ok(false);
        }
        match state.holds.get(id).map(|(_, status)| *status) {
            Some(OrderStatus::Refunded) => Ok(true),
            Some(status) if status.can_become(OrderStatus::Refunded) => {
                state.refunded_from.insert(id.clone(), status);
                state.settle(id, OrderStatus::Refunded);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn reopen_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        from: OrderStatus,
    ) -> Result<bool, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        if !state.payment_is(id, payment) {
            return Ok(false);
        }
        match state.holds.get(id).map(|(_, status)| *status) {
            Some(OrderStatus::Refunded) if state.refunded_from.get(id) == Some(&from) => {
                state.refunded_from.remove(id);
                state.settle(id, from);
                Ok(true)
            }
            Some(status) => Ok(status == from && from.can_become(OrderStatus::Refunded)),
            None => Ok(false),
        }
    }

    async fn fail_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        _now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut state = locked(&self.state);
        let id = &reservation.order_id;
        if !state.payment_in(id, payment, PaymentState::Cancelled) {
            return Ok(false);
        }
        match state.holds.get(id) {
            Some((held, OrderStatus::Paid)) if held.shard == reservation.shard => {
                state.end_giving_the_unit_back(id, OrderStatus::PaymentFailed);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn follow_money(
        &self,
        reservation: &Reservation,
        since: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        locked(&self.state)
            .followed_money
            .entry(reservation.order_id.clone())
            .or_insert((reservation.user_id.clone(), since, 0))
            .2 += 1;
        Ok(())
    }

    async fn unfollow_money(&self, read: &FollowedMoney) -> Result<(), StoreError> {
        let mut state = locked(&self.state);
        if state
            .followed_money
            .get(&read.order_id)
            .is_some_and(|(_, _, version)| *version == read.version)
        {
            state.followed_money.remove(&read.order_id);
        }
        Ok(())
    }

    async fn followed_money(&self) -> Result<Vec<FollowedMoney>, StoreError> {
        Ok(locked(&self.state)
            .followed_money
            .iter()
            .map(|(order_id, (buyer, since, version))| FollowedMoney {
                order_id: order_id.clone(),
                buyer: buyer.clone(),
                since: *since,
                version: *version,
            })
            .collect())
    }

    async fn unsettled_payments(
        &self,
        sale: &Sale,
    ) -> Result<Vec<(Order, Reservation)>, StoreError> {
        let state = locked(&self.state);
        let mut unsettled: Vec<(Order, Reservation)> = state
            .holds
            .iter()
            .filter(|(_, (held, _))| held.sale_id == sale.sale_id)
            .filter_map(|(id, (held, status))| {
                let payment = state.payments.get(id)?;
                payment
                    .needs_settling(*status)
                    .then(|| (state.order_of(held, *status), held.clone()))
            })
            .collect();
        unsettled.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
        Ok(unsettled)
    }
}

#[async_trait]
impl ProviderEvents for InMemoryStore {
    async fn was_processed(&self, event_id: &str) -> Result<bool, StoreError> {
        Ok(locked(&self.state).processed_events.contains(event_id))
    }

    async fn record_processed(
        &self,
        event_id: &str,
        _now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        if take_one(&self.failing_event_records) {
            return Err(StoreError::transient("record_processed", InjectedFailure));
        }
        Ok(locked(&self.state)
            .processed_events
            .insert(event_id.to_owned()))
    }
}

/// Pays the order by card, as a settlement does once the buyer's money moved: attaches
/// a payment named after the order (`pi_card_<order id>`,
/// [`OrderPayments::attach_payment`]), or takes the payment the order records already,
/// and marks the order paid with it, captured ([`OrderPayments::pay_with`]), at `now`.
/// `pay_with` is asked whatever the attach answered, so the answer is the order's:
/// `Paid` (by this call or an earlier one), `WindowClosed`, `Settled(status)` for a
/// released order, `Unknown` for no hold. A call whose window closed leaves the payment
/// attached to the still open order.
pub async fn pay_by_card<S: OrderPayments + ?Sized>(
    store: &S,
    reservation: &Reservation,
    now: DateTime<Utc>,
) -> Result<PayOutcome, StoreError> {
    let card = PaymentId::new(format!("pi_card_{}", reservation.order_id));
    let id = match store.attach_payment(reservation, &card).await? {
        PaymentAttach::Taken(recorded) => recorded,
        PaymentAttach::Attached | PaymentAttach::Settled(_) | PaymentAttach::Unknown => card,
    };
    let payment = OrderPayment {
        id,
        state: PaymentState::Captured,
    };
    store.pay_with(reservation, &payment, now).await
}

/// Pauses that do not wait, each recorded; with a clock, each moves it on by as long,
/// as a real pause would.
#[derive(Debug, Default)]
pub struct RecordedPauses {
    pub pauses: Mutex<Vec<std::time::Duration>>,
    clock: Option<Arc<ManualClock>>,
}

impl RecordedPauses {
    /// Pauses that move `clock` on.
    pub fn advancing(clock: Arc<ManualClock>) -> Self {
        Self {
            pauses: Mutex::default(),
            clock: Some(clock),
        }
    }

    pub fn taken(&self) -> Vec<std::time::Duration> {
        locked(&self.pauses).clone()
    }
}

#[async_trait]
impl Pause for RecordedPauses {
    async fn pause(&self, how_long: std::time::Duration) {
        locked(&self.pauses).push(how_long);
        if let Some(clock) = &self.clock {
            clock.advance(Duration::from_std(how_long).unwrap_or(Duration::MAX));
        }
    }
}

/// What a [`ScriptedLedger`] does with one reserve call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveScript {
    /// Passes it to the ledger behind.
    Pass,
    /// Answers `Contended` without asking the ledger behind, as DynamoDB cancels a
    /// transaction that met another one on its items.
    Contend,
    /// Fails transiently without asking the ledger behind: nothing was written, but
    /// the caller cannot know that.
    FailBefore,
    /// Passes it to the ledger behind, then fails transiently: it committed, and the
    /// caller cannot know that (a lost answer, an attempt that timed out).
    CommitThenFail,
    /// Refused before it is sent, as an open circuit breaker refuses it: nothing was
    /// written, and the caller knows it.
    NotAttempted,
}

/// A ledger that plays a script over reserve calls, one step per call in call order,
/// then passes every call once the script is played out; other calls pass.
pub struct ScriptedLedger {
    inner: Arc<dyn StockLedger>,
    script: Mutex<VecDeque<ReserveScript>>,
    /// The shard of every reserve call, in call order.
    pub shards_tried: Mutex<Vec<u16>>,
    /// How many of the next reads of the shards fail transiently.
    failing_reads: AtomicUsize,
    /// How many of the next give-backs of a superseded take fail transiently.
    failing_give_backs: AtomicUsize,
}

impl ScriptedLedger {
    pub fn new(
        inner: Arc<dyn StockLedger>,
        script: impl IntoIterator<Item = ReserveScript>,
    ) -> Self {
        Self {
            inner,
            script: Mutex::new(script.into_iter().collect()),
            shards_tried: Mutex::new(Vec::new()),
            failing_reads: AtomicUsize::new(0),
            failing_give_backs: AtomicUsize::new(0),
        }
    }

    /// The next `give_backs` give-backs of a superseded take fail transiently, with
    /// nothing written.
    pub fn fail_next_give_backs(&self, give_backs: usize) {
        self.failing_give_backs.store(give_backs, Ordering::SeqCst);
    }

    /// The next `reads` reads of the shards fail transiently, as a throttled or timed
    /// out read does.
    pub fn fail_next_reads(&self, reads: usize) {
        self.failing_reads.store(reads, Ordering::SeqCst);
    }

    pub fn tried(&self) -> Vec<u16> {
        locked(&self.shards_tried).clone()
    }
}

/// Counts one off `left`, if any is left.
fn take_one(left: &AtomicUsize) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
        left.checked_sub(1)
    })
    .is_ok()
}

#[async_trait]
impl StockLedger for ScriptedLedger {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        locked(&self.shards_tried).push(shard);
        let step = locked(&self.script)
            .pop_front()
            .unwrap_or(ReserveScript::Pass);
        match step {
            ReserveScript::Pass => self.inner.reserve(sale, shard, reservation).await,
            ReserveScript::Contend => Ok(Err(ReserveRefusal::Contended)),
            ReserveScript::FailBefore => Err(StoreError::transient("reserve", InjectedFailure)),
            ReserveScript::NotAttempted => Err(StoreError::unavailable(
                "reserve",
                std::time::Duration::from_secs(2),
                InjectedFailure,
            )),
            ReserveScript::CommitThenFail => {
                // Whatever it answered, the caller hears only the failure.
                let _answer = self.inner.reserve(sale, shard, reservation).await?;
                Err(StoreError::transient("reserve", InjectedFailure))
            }
        }
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        self.inner.availability(sale).await
    }

    async fn release(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        self.inner.release(reservation, reason, now).await
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        if take_one(&self.failing_reads) {
            return Err(StoreError::transient("shard_states", InjectedFailure));
        }
        self.inner.shard_states(sale).await
    }

    async fn drop_superseded_take(
        &self,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        if take_one(&self.failing_give_backs) {
            return Err(StoreError::transient(
                "drop_superseded_take",
                InjectedFailure,
            ));
        }
        self.inner.drop_superseded_take(reservation, shard).await
    }

    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError> {
        self.inner.unaccounted_takes(sale).await
    }

    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError> {
        self.inner.return_take(take, now).await
    }
}

/// A ledger whose every call fails, transiently or permanently: for proving how a
/// caller answers a store it cannot reach.
#[derive(Debug, Clone, Copy)]
pub struct FailingLedger {
    pub transient: bool,
}

impl FailingLedger {
    fn error(self, operation: &'static str) -> StoreError {
        injected_store_failure(self.transient, operation)
    }
}

/// A store failure of the given kind, caused by an [`InjectedFailure`].
pub fn injected_store_failure(transient: bool, operation: &'static str) -> StoreError {
    if transient {
        StoreError::transient(operation, InjectedFailure)
    } else {
        StoreError::permanent(operation, InjectedFailure)
    }
}

#[async_trait]
impl StockLedger for FailingLedger {
    async fn reserve(
        &self,
        _sale: &Sale,
        _shard: u16,
        _reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        Err(self.error("reserve"))
    }

    async fn availability(&self, _sale: &Sale) -> Result<Vec<u64>, StoreError> {
        Err(self.error("availability"))
    }

    async fn release(
        &self,
        _reservation: &Reservation,
        _reason: ReleaseReason,
        _now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        Err(self.error("release"))
    }

    async fn shard_states(&self, _sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        Err(self.error("shard_states"))
    }

    async fn drop_superseded_take(
        &self,
        _reservation: &Reservation,
        _shard: u16,
    ) -> Result<bool, StoreError> {
        Err(self.error("drop_superseded_take"))
    }

    async fn unaccounted_takes(&self, _sale: &Sale) -> Result<Vec<Take>, StoreError> {
        Err(self.error("unaccounted_takes"))
    }

    async fn return_take(
        &self,
        _take: &Take,
        _now: DateTime<Utc>,
    ) -> Result<TakeReturn, StoreError> {
        Err(self.error("return_take"))
    }
}

/// A queue that records what was sent, and can be told to fail.
#[derive(Debug, Default)]
pub struct RecordingQueue {
    pub sent: Mutex<Vec<OrderMessage>>,
    pub fail: std::sync::atomic::AtomicBool,
}

#[derive(Debug, thiserror::Error)]
#[error("the fake is set to fail")]
pub struct InjectedFailure;

#[async_trait]
impl OrderQueue for RecordingQueue {
    async fn enqueue(&self, message: &OrderMessage) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::transient("enqueue", InjectedFailure));
        }
        locked(&self.sent).push(message.clone());
        Ok(())
    }
}

/// Release timers by order id, as Scheduler keeps them by name.
#[derive(Debug, Default)]
pub struct RecordingScheduler {
    pub timers: Mutex<HashMap<OrderId, Reservation>>,
    pub created: AtomicUsize,
}

#[async_trait]
impl ReleaseScheduler for RecordingScheduler {
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let mut timers = locked(&self.timers);
        if !timers.contains_key(&reservation.order_id) {
            self.created.fetch_add(1, Ordering::SeqCst);
            timers.insert(reservation.order_id.clone(), reservation.clone());
        }
        Ok(())
    }

    async fn cancel_release(&self, order_id: &OrderId) -> Result<(), StoreError> {
        locked(&self.timers).remove(order_id);
        Ok(())
    }
}

/// The blocklist in memory. Counts whole-list reads, so tests can prove the grab's
/// cache spares the store, and can be told to fail.
#[derive(Debug, Default)]
pub struct InMemoryBlocklist {
    users: Mutex<BTreeSet<UserId>>,
    pub reads: AtomicUsize,
    pub fail: std::sync::atomic::AtomicBool,
}

impl InMemoryBlocklist {
    pub fn new() -> Self {
        Self::default()
    }

    fn refuse_if_failing(&self, operation: &'static str) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::transient(operation, InjectedFailure));
        }
        Ok(())
    }
}

#[async_trait]
impl Blocklist for InMemoryBlocklist {
    async fn block(&self, user: &UserId) -> Result<(), StoreError> {
        self.refuse_if_failing("block")?;
        locked(&self.users).insert(user.clone());
        Ok(())
    }

    async fn unblock(&self, user: &UserId) -> Result<(), StoreError> {
        self.refuse_if_failing("unblock")?;
        locked(&self.users).remove(user);
        Ok(())
    }

    async fn blocked(&self) -> Result<Vec<UserId>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.refuse_if_failing("blocked")?;
        Ok(locked(&self.users).iter().cloned().collect())
    }
}

/// A [`ProofOfWork`] whose challenges are plain JSON (`{"id", "sale", "user",
/// "issued", "expires"}`) and whose solution is the challenge with `"solved": true`.
/// It checks what the real one checks (issuer, buyer and sale, expiry, solved) with no
/// work, and counts verifications.
#[derive(Debug, Default)]
pub struct PlainChallenges {
    issued: AtomicUsize,
    verified: AtomicUsize,
}

impl PlainChallenges {
    /// The solution of `challenge`, as a buyer who did the work would send it.
    pub fn solve(challenge: &IssuedChallenge) -> serde_json::Value {
        let mut solution = challenge.0.clone();
        solution["solved"] = serde_json::Value::Bool(true);
        solution
    }

    pub fn verifications(&self) -> usize {
        self.verified.load(Ordering::SeqCst)
    }
}

impl ProofOfWork for PlainChallenges {
    fn issue(
        &self,
        sale: &SaleId,
        user: &UserId,
        work: ChallengeWork,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> IssuedChallenge {
        let id = self.issued.fetch_add(1, Ordering::SeqCst);
        IssuedChallenge(serde_json::json!({
            "issuer": "plain",
            "id": id,
            "sale": sale.as_str(),
            "user": user.as_str(),
            "work": work.derivations(),
            "issued": now.timestamp(),
            "expires": expires_at.timestamp(),
        }))
    }

    fn verify(
        &self,
        solution: &serde_json::Value,
        sale: &SaleId,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Result<SolvedChallenge, ChallengeRefusal> {
        self.verified.fetch_add(1, Ordering::SeqCst);
        let text = |key: &str| solution.get(key).and_then(serde_json::Value::as_str);
        let number = |key: &str| solution.get(key).and_then(serde_json::Value::as_i64);
        let (Some(id), Some(issued), Some(expires)) =
            (number("id"), number("issued"), number("expires"))
        else {
            return Err(ChallengeRefusal::Malformed);
        };
        if text("issuer") != Some("plain") {
            return Err(ChallengeRefusal::Forged);
        }
        if now.timestamp() >= expires {
            return Err(ChallengeRefusal::Expired);
        }
        if text("sale") != Some(sale.as_str()) || text("user") != Some(user.as_str()) {
            return Err(ChallengeRefusal::NotYours);
        }
        if solution.get("solved") != Some(&serde_json::Value::Bool(true)) {
            return Err(ChallengeRefusal::Unsolved);
        }
        let mut challenge_id = [0u8; 16];
        challenge_id[..8].copy_from_slice(&id.to_be_bytes());
        Ok(SolvedChallenge {
            challenge_id,
            issued_at: DateTime::from_timestamp(issued, 0).ok_or(ChallengeRefusal::Malformed)?,
        })
    }
}

/// A fault [`FaultyProvider`] plays on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderFault {
    /// The call fails transiently and does nothing (a provider that did not answer).
    NoAnswer,
    /// The call acts, then fails transiently (its answer was lost on the way back).
    AnswerLost,
}

/// What [`FakePaymentProvider`] keeps of one payment.
#[derive(Debug, Clone)]
struct FakePayment {
    payment: Payment,
    /// Its refunds, oldest first.
    refunds: Vec<Refund>,
}

#[derive(Debug, Default)]
struct ProviderState {
    payments: HashMap<PaymentId, FakePayment>,
}

/// A payment provider in memory, with Stripe's rules for a manually captured
/// PaymentIntent: a capture moves the money once, a cancelled payment cannot be
/// captured, a captured one cannot be cancelled, and only captured money can be
/// refunded, never more of it than a refund that succeeded or is on its way leaves. A
/// refund begins as [`FakePaymentProvider::refunds_begin`] says (succeeded, unless a
/// test makes it pending or failed) and moves on when a test says
/// ([`FakePaymentProvider::refund_becomes`]), as a card's bank moves Stripe's. The buyer's side ([`FakePaymentProvider::authorise`]) is played by
/// tests; faults come from wrapping it in a [`FaultyProvider`]. Counts the money's
/// movements, so a test can show nothing moved twice.
#[derive(Debug, Default)]
pub struct FakePaymentProvider {
    state: Mutex<ProviderState>,
    /// Whether an authorisation captures at once, as an integration set to automatic
    /// capture does.
    pub automatic_capture: std::sync::atomic::AtomicBool,
    /// Captures that moved money.
    pub captures: AtomicUsize,
    /// Authorisations released.
    pub cancellations: AtomicUsize,
    /// Refunds made.
    pub refunds: AtomicUsize,
    /// The status each new refund begins in: succeeded unless a test says.
    refunds_begin: Mutex<Option<RefundStatus>>,
}

impl FakePaymentProvider {
    pub fn new() -> Self {
        Self::default()
    }

    /// The buyer confirms the payment with a good card: authorised, or captured at once
    /// under automatic capture. Only an open payment can be confirmed.
    pub fn authorise(&self, id: &PaymentId) -> bool {
        let automatic = self.automatic_capture.load(Ordering::SeqCst);
        let mut state = locked(&self.state);
        match state.payments.get_mut(id) {
            Some(fake) if fake.payment.state == PaymentState::Open => {
                fake.payment.state = if automatic {
                    self.captures.fetch_add(1, Ordering::SeqCst);
                    PaymentState::Captured
                } else {
                    PaymentState::Authorised
                };
                true
            }
            _ => false,
        }
    }

    /// Every payment with its refunds, by id.
    pub fn all(&self) -> Vec<(Payment, Vec<Refund>)> {
        let mut all: Vec<_> = locked(&self.state)
            .payments
            .values()
            .map(|fake| (fake.payment.clone(), fake.refunds.clone()))
            .collect();
        all.sort_by(|a, b| a.0.id.as_str().cmp(b.0.id.as_str()));
        all
    }

    /// The payment as the provider has it, for assertions.
    pub fn state_of(&self, id: &PaymentId) -> Option<PaymentState> {
        locked(&self.state)
            .payments
            .get(id)
            .map(|fake| fake.payment.state)
    }

    /// The newest refund made of the payment, if any.
    pub fn refund_of(&self, id: &PaymentId) -> Option<Refund> {
        locked(&self.state)
            .payments
            .get(id)
            .and_then(|fake| fake.refunds.last().cloned())
    }

    /// New refunds begin in `status` (Stripe's `pending` for a bank that takes its
    /// time, say).
    pub fn refunds_begin(&self, status: RefundStatus) {
        *locked(&self.refunds_begin) = Some(status);
    }

    /// The newest refund of the payment moves to `status`, as the card's bank decides.
    pub fn refund_becomes(&self, id: &PaymentId, status: RefundStatus) -> bool {
        let mut state = locked(&self.state);
        match state
            .payments
            .get_mut(id)
            .and_then(|fake| fake.refunds.last_mut())
        {
            Some(refund) => {
                refund.status = status;
                true
            }
            None => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the provider refuses this request: {0}")]
pub struct ProviderRefused(&'static str);

fn fake_payment<'a>(
    state: &'a mut ProviderState,
    operation: &'static str,
    id: &PaymentId,
) -> Result<&'a mut FakePayment, StoreError> {
    state
        .payments
        .get_mut(id)
        .ok_or_else(|| StoreError::permanent(operation, ProviderRefused("no such payment")))
}

#[async_trait]
impl PaymentProvider for FakePaymentProvider {
    async fn open(
        &self,
        order: &OrderId,
        buyer: &UserId,
        price: Price,
    ) -> Result<Payment, StoreError> {
        // No idempotency key, as the Stripe adapter sends none: every open is a new
        // payment, and the order's conditional attach keeps one.
        let mut state = locked(&self.state);
        let id = PaymentId::new(format!("pi_fake_{}", state.payments.len() + 1));
        let payment = Payment {
            id: id.clone(),
            order_id: Some(order.clone()),
            buyer: Some(buyer.clone()),
            amount: price.stripe_amount(),
            currency: price.currency().stripe_code(),
            state: PaymentState::Open,
            client_secret: format!("{id}_secret"),
        };
        state.payments.insert(
            id,
            FakePayment {
                payment: payment.clone(),
                refunds: Vec::new(),
            },
        );
        Ok(payment)
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        Ok(locked(&self.state)
            .payments
            .get(id)
            .map(|fake| fake.payment.clone()))
    }

    async fn capture(&self, id: &PaymentId) -> Result<CaptureOutcome, StoreError> {
        let mut state = locked(&self.state);
        let fake = fake_payment(&mut state, "capture", id)?;
        Ok(match fake.payment.state {
            PaymentState::Authorised => {
                fake.payment.state = PaymentState::Captured;
                self.captures.fetch_add(1, Ordering::SeqCst);
                CaptureOutcome::Captured(fake.payment.clone())
            }
            PaymentState::Captured => CaptureOutcome::AlreadyCaptured(fake.payment.clone()),
            PaymentState::Open | PaymentState::Cancelled => {
                CaptureOutcome::NotCapturable(fake.payment.clone())
            }
        })
    }

    async fn cancel(&self, id: &PaymentId) -> Result<CancelOutcome, StoreError> {
        let mut state = locked(&self.state);
        let fake = fake_payment(&mut state, "cancel", id)?;
        Ok(match fake.payment.state {
            PaymentState::Open | PaymentState::Authorised => {
                fake.payment.state = PaymentState::Cancelled;
                self.cancellations.fetch_add(1, Ordering::SeqCst);
                CancelOutcome::Cancelled(fake.payment.clone())
            }
            PaymentState::Cancelled => CancelOutcome::AlreadyCancelled(fake.payment.clone()),
            PaymentState::Captured => CancelOutcome::AlreadyCaptured(fake.payment.clone()),
        })
    }

    async fn refund(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        let begins = locked(&self.refunds_begin).unwrap_or(RefundStatus::Succeeded);
        let mut state = locked(&self.state);
        let fake = fake_payment(&mut state, "refund", &payment.id)?;
        if fake.payment.state != PaymentState::Captured {
            // Stripe: a PaymentIntent with no successful charge has nothing to refund.
            return Err(StoreError::permanent(
                "refund",
                ProviderRefused("nothing captured to refund"),
            ));
        }
        let before = RefundProgress::of(fake.payment.amount, &fake.refunds, false);
        let Some(amount) = before.to_refund() else {
            return Ok(before);
        };
        let refund = Refund {
            id: format!("re_fake_{}_{}", payment.id.as_str(), fake.refunds.len() + 1),
            payment: payment.id.clone(),
            amount,
            status: begins,
        };
        fake.refunds.push(refund);
        self.refunds.fetch_add(1, Ordering::SeqCst);
        Ok(RefundProgress::of(fake.payment.amount, &fake.refunds, true))
    }

    async fn refunds(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        let mut state = locked(&self.state);
        let fake = fake_payment(&mut state, "refunds", &payment.id)?;
        Ok(RefundProgress::of(
            fake.payment.amount,
            &fake.refunds,
            false,
        ))
    }
}

/// Any [`PaymentProvider`] with faults injected per call, and, if asked, a random
/// number of yields to the runtime before and after each call, so that concurrent
/// settlements interleave their calls differently for each seed. Wraps the fake in
/// domain tests and Stripe's adapter in the drills.
pub struct FaultyProvider {
    inner: Arc<dyn PaymentProvider>,
    /// Faults still to play, by operation (`open`, `payment`, `capture`, `cancel`,
    /// `refund`), in order.
    faults: Mutex<HashMap<&'static str, VecDeque<ProviderFault>>>,
    /// xorshift64's state for the yields; 0: no yields.
    shuffle: Mutex<u64>,
}

impl FaultyProvider {
    pub fn new(inner: Arc<dyn PaymentProvider>) -> Self {
        Self {
            inner,
            faults: Mutex::default(),
            shuffle: Mutex::new(0),
        }
    }

    /// The same, yielding a random number of times (seeded) around each call.
    pub fn interleaved(inner: Arc<dyn PaymentProvider>, seed: u64) -> Self {
        Self {
            shuffle: Mutex::new(seed | 1),
            ..Self::new(inner)
        }
    }

    /// Plays `fault` on the next call of `operation` not yet faulted.
    pub fn inject(&self, operation: &'static str, fault: ProviderFault) {
        locked(&self.faults)
            .entry(operation)
            .or_default()
            .push_back(fault);
    }

    async fn shuffle(&self) {
        let yields = {
            let mut x = locked(&self.shuffle);
            if *x == 0 {
                return;
            }
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            *x % 4
        };
        for _ in 0..yields {
            yield_once().await;
        }
    }

    /// `call` as the operation `operation`, with its injected fault and the yields.
    async fn call<T>(
        &self,
        operation: &'static str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.shuffle().await;
        let fault = locked(&self.faults)
            .get_mut(operation)
            .and_then(VecDeque::pop_front);
        let answer = match fault {
            Some(ProviderFault::NoAnswer) => Err(StoreError::transient(operation, InjectedFailure)),
            Some(ProviderFault::AnswerLost) => call
                .await
                .and(Err(StoreError::transient(operation, InjectedFailure))),
            None => call.await,
        };
        self.shuffle().await;
        answer
    }
}

/// One yield to the runtime, without the domain depending on one: a future that is
/// pending once and wakes itself at once.
fn yield_once() -> impl std::future::Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |context| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
}

#[async_trait]
impl PaymentProvider for FaultyProvider {
    async fn open(
        &self,
        order: &OrderId,
        buyer: &UserId,
        price: Price,
    ) -> Result<Payment, StoreError> {
        self.call("open", self.inner.open(order, buyer, price))
            .await
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        self.call("payment", self.inner.payment(id)).await
    }

    async fn capture(&self, id: &PaymentId) -> Result<CaptureOutcome, StoreError> {
        self.call("capture", self.inner.capture(id)).await
    }

    async fn cancel(&self, id: &PaymentId) -> Result<CancelOutcome, StoreError> {
        self.call("cancel", self.inner.cancel(id)).await
    }

    async fn refund(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        self.call("refund", self.inner.refund(payment)).await
    }

    async fn refunds(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        self.call("refunds", self.inner.refunds(payment)).await
    }
}
