//! The sale's rules, end to end, on the in-memory fakes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_domain::challenge::ChallengeRefusal;
use flashsale_domain::gate::SoldOutGate;
use flashsale_domain::ports::{Clock, PayOutcome, Settlement};
use flashsale_domain::sale::MAX_ABANDONED_HOLDS;
use flashsale_domain::service::{
    Attempt, BlocklistService, CachedBlocklist, ContentionPolicy, ExpiryService, GrabService,
    OrderService, SaleService, TimerSet,
};
use flashsale_domain::testing;
use flashsale_domain::testing::{
    InMemoryBlocklist, InMemoryStore, ManualClock, PlainChallenges, RecordedPauses, RecordingQueue,
    RecordingScheduler, SeededIds,
};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{
    AppError, OrderMessage, OrderStatus, Sale, SaleAction, SaleControl, SaleId, UserId,
};

const SECRET: &[u8] = b"an-hmac-key-of-at-least-32-bytes!";

/// How often the grab rereads the blocklist in these tests.
const BLOCKLIST_REFRESH: Duration = Duration::seconds(5);

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 11, 0, 0, 0).unwrap()
}

struct World {
    store: Arc<InMemoryStore>,
    queue: Arc<RecordingQueue>,
    scheduler: Arc<RecordingScheduler>,
    blocklist: Arc<InMemoryBlocklist>,
    clock: Arc<ManualClock>,
    challenges: Arc<PlainChallenges>,
    sales: SaleService,
    admin: BlocklistService,
    grabs: GrabService,
    orders: OrderService,
    expiry: ExpiryService,
}

impl World {
    /// The operator pauses, resumes or ends the sale.
    async fn control(
        &self,
        sale: &SaleId,
        action: SaleAction,
    ) -> Result<flashsale_domain::control::Controlled, AppError> {
        self.sales.control(sale, action, &operator()).await
    }

    fn new() -> Self {
        let store = Arc::new(InMemoryStore::new());
        let queue = Arc::new(RecordingQueue::default());
        let scheduler = Arc::new(RecordingScheduler::default());
        let blocklist = Arc::new(InMemoryBlocklist::new());
        let clock = Arc::new(ManualClock::new(start() - Duration::minutes(10)));
        let clock_port: Arc<dyn Clock> = clock.clone();
        let challenges = Arc::new(PlainChallenges::default());
        Self {
            sales: SaleService {
                catalog: store.clone(),
                ledger: store.clone(),
                orders: store.clone(),
                clock: clock_port.clone(),
                ids: Arc::new(SeededIds::new(11, clock_port.clone())),
            },
            grabs: GrabService {
                catalog: store.clone(),
                ledger: store.clone(),
                orders: store.clone(),
                queue: queue.clone(),
                clock: clock_port.clone(),
                ids: Arc::new(SeededIds::new(7, clock_port.clone())),
                signer: GrabTokenSigner::new(SECRET).unwrap(),
                challenges: challenges.clone(),
                gate: SoldOutGate::new(Duration::seconds(1)),
                blocked_users: CachedBlocklist::new(blocklist.clone(), BLOCKLIST_REFRESH),
                pause: Arc::new(RecordedPauses::advancing(clock.clone())),
                contention: ContentionPolicy::DEFAULT,
            },
            admin: BlocklistService {
                blocklist: blocklist.clone(),
            },
            orders: OrderService {
                orders: store.clone(),
                catalog: store.clone(),
                ledger: store.clone(),
                scheduler: scheduler.clone(),
                clock: clock_port.clone(),
            },
            expiry: ExpiryService {
                ledger: store.clone(),
                clock: clock_port,
            },
            store,
            queue,
            scheduler,
            blocklist,
            clock,
            challenges,
        }
    }

    async fn sale(&self, stock: i64, shards: i64, per_user_limit: i64) -> SaleId {
        self.create_sale(testing::sale(stock, shards).per_user_limit(per_user_limit))
            .await
            .sale_id
    }

    /// `sale` under an id of its own, starting at [`start`], created as an admin would.
    async fn create_sale(&self, sale: testing::SaleBuilder) -> Sale {
        self.sales
            .create(sale.generated_id().starting_at(start()).draft())
            .await
            .unwrap()
    }

    async fn grab(
        &self,
        sale: &SaleId,
        user: &str,
    ) -> Result<flashsale_domain::Reservation, AppError> {
        let token = self.token(sale, user).await?;
        self.grab_with(sale, user, &token).await
    }

    async fn token(&self, sale: &SaleId, user: &str) -> Result<String, AppError> {
        let pass = self
            .grabs
            .issue_pass(sale, &UserId::parse(user).unwrap(), None)
            .await?;
        Ok(pass.grab_path.rsplit('/').next().unwrap().to_owned())
    }

    async fn grab_with(
        &self,
        sale: &SaleId,
        user: &str,
        token: &str,
    ) -> Result<flashsale_domain::Reservation, AppError> {
        self.grabs
            .grab(sale, token, &UserId::parse(user).unwrap(), Attempt::First)
            .await
            .into_answer()
    }

    /// The same path again, marked as a retry, as a client whose answer was lost does.
    async fn retry_with(
        &self,
        sale: &SaleId,
        user: &str,
        token: &str,
    ) -> Result<flashsale_domain::Reservation, AppError> {
        self.grabs
            .grab(sale, token, &UserId::parse(user).unwrap(), Attempt::Retry)
            .await
            .into_answer()
    }

    /// Every call the grab could make to the store or the queue, by kind.
    fn store_calls(&self) -> [usize; 4] {
        [
            self.store.reserve_calls.load(Ordering::SeqCst),
            self.store.find_calls.load(Ordering::SeqCst),
            self.store.availability_reads.load(Ordering::SeqCst),
            self.queue.sent.lock().unwrap().len(),
        ]
    }
}

fn operator() -> UserId {
    user("operator")
}

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// Issue 48, part: time and ids come only from ports. Two worlds on the same seed and
/// clock create the same sale and hand out the same grab paths, in the same order, so a
/// run replays from its seed; another seed, paths to other orders. (The sale service
/// and the grab drew `Ulid::new()` themselves before.)
#[tokio::test]
async fn the_same_seed_and_time_create_the_same_sale_and_hand_out_the_same_grab_paths() {
    let paths = |seed: u64| async move {
        let mut world = World::new();
        world.grabs.ids = Arc::new(SeededIds::new(seed, world.clock.clone()));
        let sale = world.sale(10, 1, 1).await;
        world.clock.set(start());
        let mut paths = Vec::new();
        for buyer in ["alice", "bob", "alice"] {
            paths.push(world.token(&sale, buyer).await.unwrap());
            world.clock.advance(Duration::milliseconds(3));
        }
        (sale, paths)
    };
    let (sale, first) = paths(42).await;
    assert_eq!((sale.clone(), first.clone()), paths(42).await);
    let (same_sale, other) = paths(43).await;
    assert_eq!(same_sale, sale, "the sale's ids come from their own seed");
    let order = |token: &String| token.split('.').nth(1).unwrap().to_owned();
    for (mine, theirs) in first.iter().zip(&other) {
        assert_ne!(order(mine), order(theirs), "`{{expiry}}.{{order}}.{{tag}}`");
    }
    assert_eq!(
        first
            .iter()
            .map(order)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3,
        "each path names its own order: {first:?}"
    );
}

#[tokio::test]
async fn before_the_start_no_grab_path_is_handed_out() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    assert!(matches!(
        world.grabs.issue_pass(&sale, &user("u"), None).await,
        Err(AppError::NotStarted)
    ));
    // One second of lead is allowed, for clients whose clocks run slightly behind.
    world.clock.set(start() - Duration::milliseconds(900));
    assert!(
        world
            .grabs
            .issue_pass(&sale, &user("u"), None)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_grab_before_the_start_is_not_started_even_with_a_valid_token() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start() - Duration::milliseconds(500));
    let pass = world
        .grabs
        .issue_pass(&sale, &user("u"), None)
        .await
        .unwrap();
    let token = pass.grab_path.rsplit('/').next().unwrap();
    assert!(matches!(
        world
            .grabs
            .grab(&sale, token, &user("u"), Attempt::First)
            .await
            .into_answer(),
        Err(AppError::NotStarted)
    ));
}

#[tokio::test]
async fn after_the_end_token_and_grab_say_ended() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start() + Duration::hours(2));
    assert!(matches!(world.grab(&sale, "u").await, Err(AppError::Ended)));
}

/// The grab's message for a hold its first try made.
fn first_try(reservation: &flashsale_domain::Reservation) -> OrderMessage {
    OrderMessage {
        reservation: reservation.clone(),
        retried: false,
    }
}

#[tokio::test]
async fn another_users_token_is_invalid() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    let pass = world
        .grabs
        .issue_pass(&sale, &user("alice"), None)
        .await
        .unwrap();
    let token = pass.grab_path.rsplit('/').next().unwrap();
    assert!(matches!(
        world
            .grabs
            .grab(&sale, token, &user("mallory"), Attempt::First)
            .await
            .into_answer(),
        Err(AppError::InvalidToken)
    ));
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn when_stock_is_gone_grab_returns_sold_out() {
    let world = World::new();
    let sale = world.sale(3, 1, 1).await;
    world.clock.set(start());
    for buyer in ["a", "b", "c"] {
        world.grab(&sale, buyer).await.unwrap();
    }
    assert!(matches!(
        world.grab(&sale, "d").await,
        Err(AppError::SoldOut)
    ));
    assert_eq!(world.queue.sent.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn after_sell_out_first_attempts_cost_no_store_or_queue_call_at_all() {
    let world = World::new();
    let sale = world.sale(2, 2, 1).await;
    world.clock.set(start());
    world.grab(&sale, "a").await.unwrap();
    world.grab(&sale, "b").await.unwrap();
    // The first loser learns each shard is empty, at most one write per shard.
    assert!(matches!(
        world.grab(&sale, "c").await,
        Err(AppError::SoldOut)
    ));
    let tokens: Vec<String> = late_buyers_tokens(&world, &sale, 100).await;
    let before = world.store_calls();
    for (late, token) in tokens.iter().enumerate() {
        assert!(matches!(
            world.grab_with(&sale, &format!("late-{late}"), token).await,
            Err(AppError::SoldOut)
        ));
    }
    assert_eq!(
        world.store_calls(),
        before,
        "[reserve, find, availability, sent]"
    );
}

/// Grab paths for `count` buyers `late-0`.., fetched before the counting starts.
async fn late_buyers_tokens(world: &World, sale: &SaleId, count: usize) -> Vec<String> {
    let mut tokens = Vec::with_capacity(count);
    for late in 0..count {
        tokens.push(world.token(sale, &format!("late-{late}")).await.unwrap());
    }
    tokens
}

#[tokio::test]
async fn a_marked_retry_after_sell_out_reads_once_and_gets_its_order_back() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let token = world.token(&sale, "a").await.unwrap();
    // The grab commits, but suppose its answer never reached the buyer.
    let lost = world.grab_with(&sale, "a", &token).await.unwrap();
    assert!(matches!(
        world.grab(&sale, "b").await,
        Err(AppError::SoldOut)
    ));
    let [reserves, finds, reads, sent] = world.store_calls();

    let retry = world.retry_with(&sale, "a", &token).await.unwrap();
    assert_eq!(retry, lost);
    // One read on the buyer's own key, no write; the order is sent again, which the
    // queue deduplicates by order id.
    assert_eq!(world.store_calls(), [reserves, finds + 1, reads, sent + 1]);

    // A marked retry of a path that never took a unit: still one read, then sold out.
    let never = world.token(&sale, "c").await.unwrap();
    assert!(matches!(
        world.retry_with(&sale, "c", &never).await,
        Err(AppError::SoldOut)
    ));
    assert_eq!(world.store_calls(), [reserves, finds + 2, reads, sent + 1]);
}

#[tokio::test]
async fn released_stock_is_grabbable_again_once_the_gate_rechecks() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    assert!(matches!(
        world.grab(&sale, "b").await,
        Err(AppError::SoldOut)
    ));
    world
        .orders
        .cancel(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    let writes = world.store.reserve_calls.load(Ordering::SeqCst);
    // b's refusal saw a's take young enough to be undone, and read the shards once.
    let reads = world.store.availability_reads.load(Ordering::SeqCst);

    // Within the interval the gate trusts its mark: refused without a call.
    assert!(matches!(
        world.grab(&sale, "b").await,
        Err(AppError::SoldOut)
    ));
    assert_eq!(world.store.availability_reads.load(Ordering::SeqCst), reads);

    // Past it, the next grab makes the one read of the interval, which reopens the
    // shard, and takes the unit; the grab after it finds the shard empty with c's take
    // too young to be final, and reads once more before it says so.
    world.clock.advance(Duration::seconds(2));
    world.grab(&sale, "c").await.unwrap();
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst),
        reads + 1
    );
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), writes + 1);
    assert!(matches!(
        world.grab(&sale, "b").await,
        Err(AppError::SoldOut)
    ));
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst),
        reads + 2
    );
}

#[tokio::test]
async fn a_sold_out_sale_costs_one_read_per_recheck_interval_however_many_grabs() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    world.grab(&sale, "a").await.unwrap();
    assert!(matches!(
        world.grab(&sale, "b").await,
        Err(AppError::SoldOut)
    ));
    let tokens = late_buyers_tokens(&world, &sale, 40).await;
    let [reserves, finds, reads, sent] = world.store_calls();
    for interval in 1..=4 {
        world.clock.advance(Duration::milliseconds(1100));
        for (late, token) in tokens.iter().enumerate().skip(10 * (interval - 1)).take(10) {
            assert!(matches!(
                world.grab_with(&sale, &format!("late-{late}"), token).await,
                Err(AppError::SoldOut)
            ));
        }
        assert_eq!(
            world.store_calls(),
            [reserves, finds, reads + interval, sent]
        );
    }
}

#[tokio::test]
async fn a_buyer_who_abandons_too_many_reservations_reaches_the_limit() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    for _ in 0..MAX_ABANDONED_HOLDS {
        let reservation = world.grab(&sale, "a").await.unwrap();
        world
            .orders
            .cancel(&reservation.order_id, &user("a"))
            .await
            .unwrap();
    }
    assert!(matches!(
        world.grab(&sale, "a").await,
        Err(AppError::LimitReached)
    ));
    // Every unit is back for everyone else.
    assert_eq!(world.store.shard_available(&sale, 0), 10);
    world.grab(&sale, "b").await.unwrap();
}

#[tokio::test]
async fn a_user_cannot_exceed_the_per_user_limit() {
    let world = World::new();
    let sale = world.sale(10, 2, 2).await;
    world.clock.set(start());
    world.grab(&sale, "a").await.unwrap();
    world.grab(&sale, "a").await.unwrap();
    assert!(matches!(
        world.grab(&sale, "a").await,
        Err(AppError::LimitReached)
    ));
}

#[tokio::test]
async fn when_the_home_shard_is_empty_the_grab_takes_stock_from_another() {
    let world = World::new();
    // Four shards of one unit each: four buyers must all succeed whatever their hash.
    let sale = world.sale(4, 4, 1).await;
    world.clock.set(start());
    for buyer in ["a", "b", "c", "d"] {
        world.grab(&sale, buyer).await.unwrap();
    }
    let stats = world.sales.stats(&sale).await.unwrap();
    assert_eq!(stats.counts.available, 0);
    assert_eq!(stats.counts.reserved, 4);
    assert!(stats.consistent);
}

#[tokio::test]
async fn a_failed_enqueue_still_answers_the_hold_and_a_retry_sends_it_again() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let token = world.token(&sale, "a").await.unwrap();
    world.queue.fail.store(true, Ordering::SeqCst);
    // The unit is the buyer's: the hand-over is the system's job, not theirs.
    let reserved = world.grab_with(&sale, "a", &token).await.unwrap();
    assert_eq!(world.store.shard_available(&sale, 0), 0);
    assert!(world.queue.sent.lock().unwrap().is_empty());

    world.queue.fail.store(false, Ordering::SeqCst);
    let resumed = world.retry_with(&sale, "a", &token).await.unwrap();
    assert_eq!(resumed, reserved);
    assert_eq!(
        world.queue.sent.lock().unwrap().as_slice(),
        [OrderMessage {
            reservation: resumed,
            retried: true
        }]
    );
    assert_eq!(world.store.shard_available(&sale, 0), 0);
}

#[tokio::test]
async fn the_consumer_sets_one_timer_however_often_it_is_delivered_and_writes_no_order() {
    let world = World::new();
    let sale = world.sale(5, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            world
                .orders
                .receive(&first_try(&reservation))
                .await
                .unwrap(),
            TimerSet::Set
        );
    }
    // The grab's hold is the order: the consumer only sets its timer.
    assert_eq!(world.store.order_count(), 0);
    assert_eq!(world.scheduler.created.load(Ordering::SeqCst), 1);
    let order = world
        .orders
        .get(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(order.status, OrderStatus::Reserved);
}

#[tokio::test]
async fn a_grabbed_order_keeps_the_sales_price_from_the_grab_to_its_settlement() {
    let world = World::new();
    let sale = world
        .create_sale(testing::sale(3, 1).priced(1_299, "JPY"))
        .await;
    let price = sale.price.expect("a created sale has a price");
    assert_eq!(
        world.sales.view(&sale.sale_id).await.unwrap().price,
        Some(price)
    );
    world.clock.set(start());
    let reservation = world.grab(&sale.sale_id, "a").await.unwrap();
    assert_eq!(reservation.price, Some(price), "copied by the grab");
    assert_eq!(
        world.queue.sent.lock().unwrap()[0].reservation.price,
        Some(price),
        "and sent on with the reservation"
    );
    let order = world
        .orders
        .get(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(order.price, Some(price));
    let cancelled = world
        .orders
        .cancel(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(
        (cancelled.status, cancelled.price),
        (OrderStatus::Cancelled, Some(price))
    );
}

#[tokio::test]
async fn a_sale_with_a_bad_price_is_refused_and_nothing_is_written() {
    let world = World::new();
    for (amount, currency, field) in [
        (0, "EUR", "price.amount"),
        (100_000_000, "EUR", "price.amount"),
        (100, "eur", "price.currency"),
        (100, "XTS", "price.currency"),
        (100, "HRK", "price.currency"),
    ] {
        let draft = testing::sale(3, 1)
            .id("priced")
            .priced(amount, currency)
            .draft();
        match world.sales.create(draft).await {
            Err(AppError::Invalid(error)) => assert_eq!(error.field, field, "{currency}"),
            other => panic!("{amount} {currency}: {other:?}"),
        }
    }
    assert!(matches!(
        world.sales.view(&SaleId::parse("priced").unwrap()).await,
        Err(AppError::SaleNotFound)
    ));
}

#[tokio::test]
async fn an_unpaid_order_expires_and_its_stock_comes_back_once() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    world
        .orders
        .receive(&first_try(&reservation))
        .await
        .unwrap();

    assert!(matches!(
        world.expiry.expire(&reservation).await,
        Err(AppError::NotYetDue)
    ));
    world.clock.set(reservation.expires_at);
    assert_eq!(
        world.expiry.expire(&reservation).await.unwrap(),
        Settlement::Applied
    );
    assert_eq!(
        world.expiry.expire(&reservation).await.unwrap(),
        Settlement::AlreadySettled(OrderStatus::Expired)
    );
    assert_eq!(world.store.shard_available(&sale, 0), 1);
    assert!(matches!(
        world.orders.cancel(&reservation.order_id, &user("a")).await,
        Err(AppError::OrderExpired)
    ));
    // The buyer may try again, as the limit counts only held and bought units.
    world.clock.advance(Duration::seconds(2));
    world.grab(&sale, "a").await.unwrap();
}

#[tokio::test]
async fn cancelling_after_the_window_closed_expires_the_order_at_once() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    world
        .orders
        .receive(&first_try(&reservation))
        .await
        .unwrap();
    world
        .clock
        .set(reservation.expires_at + Duration::seconds(1));
    // The timer may lag: the unit comes back now, expired rather than cancelled.
    assert!(matches!(
        world.orders.cancel(&reservation.order_id, &user("a")).await,
        Err(AppError::OrderExpired)
    ));
    assert_eq!(world.store.shard_available(&sale, 0), 1);
    let order = world
        .orders
        .get(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(order.status, OrderStatus::Expired);
}

#[tokio::test]
async fn cancelling_returns_stock_at_once_and_is_idempotent() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    // Before the consumer ran: the reservation alone is enough to cancel.
    let cancelled = world
        .orders
        .cancel(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(cancelled.status, OrderStatus::Cancelled);
    world
        .orders
        .cancel(&reservation.order_id, &user("a"))
        .await
        .unwrap();
    assert_eq!(world.store.shard_available(&sale, 0), 1);
    // The consumer arriving late opens nothing and sets no timer.
    assert_eq!(
        world
            .orders
            .receive(&first_try(&reservation))
            .await
            .unwrap(),
        TimerSet::AlreadySettled(OrderStatus::Cancelled)
    );
    assert_eq!(world.scheduler.created.load(Ordering::SeqCst), 0);
    let stats = world.sales.stats(&sale).await.unwrap();
    assert_eq!((stats.counts.cancelled, stats.counts.available), (1, 1));
    assert!(stats.consistent);
}

#[tokio::test]
async fn a_paid_order_cannot_be_cancelled() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    assert_eq!(
        testing::pay_by_card(&*world.store, &reservation, world.clock.now())
            .await
            .unwrap(),
        PayOutcome::Paid
    );
    assert!(matches!(
        world.orders.cancel(&reservation.order_id, &user("a")).await,
        Err(AppError::OrderPaid)
    ));
    assert_eq!(world.store.shard_available(&sale, 0), 0);
}

#[tokio::test]
async fn another_users_order_is_not_found() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();
    for attempt in [
        world
            .orders
            .get(&reservation.order_id, &user("b"))
            .await
            .map(|_| ()),
        world
            .orders
            .cancel(&reservation.order_id, &user("b"))
            .await
            .map(|_| ()),
    ] {
        assert!(matches!(attempt, Err(AppError::OrderNotFound)));
    }
    assert_eq!(world.store.shard_available(&sale, 0), 0);
}

#[tokio::test]
async fn creating_a_sale_twice_is_a_conflict_and_invalid_drafts_write_nothing() {
    let world = World::new();
    let draft = |stock, ends_offset_hours| {
        testing::sale(stock, 1)
            .id("fixed")
            .starting_at(start())
            .lasting(Duration::hours(ends_offset_hours))
            .with(|draft| {
                draft.shards = None;
                draft.payment_timeout_secs = None;
            })
            .draft()
    };
    // The last one ends in year 10000, which RFC 3339 cannot write back.
    let year_10000 = Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap();
    let hours_to_year_10000 = (year_10000 - start()).num_hours();
    for (stock, hours) in [
        (0, 1),
        (-5, 1),
        (1_000_001, 1),
        (10, 0),
        (10, -1),
        (10, hours_to_year_10000),
    ] {
        assert!(matches!(
            world.sales.create(draft(stock, hours)).await,
            Err(AppError::Invalid(_))
        ));
    }
    let sale_id = SaleId::parse("fixed").unwrap();
    assert!(matches!(
        world.sales.view(&sale_id).await,
        Err(AppError::SaleNotFound)
    ));
    let created = world.sales.create(draft(100, 1)).await.unwrap();
    assert_eq!(
        (created.per_user_limit, created.payment_timeout_secs),
        (1, 900)
    );
    assert!(matches!(
        world.sales.create(draft(100, 1)).await,
        Err(AppError::SaleExists)
    ));
}

#[tokio::test]
async fn the_sale_page_shows_the_phase_and_sold_out() {
    let world = World::new();
    let sale = world.sale(1, 1, 1).await;
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "upcoming");
    world.clock.set(start());
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "active");
    world.grab(&sale, "a").await.unwrap();
    let view = world.sales.view(&sale).await.unwrap();
    assert_eq!((view.status, view.stock_available), ("sold_out", 0));
    world.clock.set(start() + Duration::hours(1));
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "ended");
}

#[tokio::test]
async fn a_retried_grab_answers_the_same_order_and_takes_one_unit() {
    let world = World::new();
    let sale = world.sale(5, 1, 2).await;
    world.clock.set(start());
    let token = world.token(&sale, "a").await.unwrap();
    let first = world.grab_with(&sale, "a", &token).await.unwrap();
    let retry = world.retry_with(&sale, "a", &token).await.unwrap();
    assert_eq!(retry, first);
    // Even unmarked, the database's "already held" proves it a retry: same answer.
    let unmarked = world.grab_with(&sale, "a", &token).await.unwrap();
    assert_eq!(unmarked, first);
    assert_eq!(world.store.shard_available(&sale, 0), 4);
    // A second unit (the limit is 2) needs a second path.
    let second = world.grab(&sale, "a").await.unwrap();
    assert_ne!(second.order_id, first.order_id);
}

/// Issue 48 (the simulation, seed 1883965796400326): a grab held a unit and its
/// invocation died; the store was out for the whole payment window, so every retry
/// failed, and the hold lapsed. The next retry was told `InvalidToken`, and the buyer
/// never learnt that a unit had been theirs. A retry of a path whose order settled is
/// told the order's fate, whatever the sale's phase meanwhile.
#[tokio::test]
async fn a_retry_after_its_hold_lapsed_is_told_the_order_expired() {
    let world = World::new();
    // A window shorter than the path's lifetime: the path is still good when it lapses.
    let sale = world
        .create_sale(
            testing::sale(2, 1)
                .per_user_limit(1)
                .payment_window_secs(60),
        )
        .await
        .sale_id;
    world.clock.set(start());
    let token = world.token(&sale, "a").await.unwrap();
    let held = world.grab_with(&sale, "a", &token).await.unwrap();
    world.clock.set(held.expires_at);
    world.expiry.expire(&held).await.unwrap();

    assert!(matches!(
        world.retry_with(&sale, "a", &token).await,
        Err(AppError::OrderExpired)
    ));
    world
        .sales
        .control(&sale, SaleAction::Pause, &user("admin"))
        .await
        .unwrap();
    assert!(matches!(
        world.retry_with(&sale, "a", &token).await,
        Err(AppError::OrderExpired)
    ));
    assert_eq!(world.store.shard_available(&sale, 0), 2, "the unit is back");
}

#[tokio::test]
async fn a_grab_path_is_used_up_once_its_order_is_settled() {
    let world = World::new();
    let sale = world.sale(2, 1, 1).await;
    world.clock.set(start());
    let token = world.token(&sale, "a").await.unwrap();
    let first = world.grab_with(&sale, "a", &token).await.unwrap();
    world
        .orders
        .cancel(&first.order_id, &user("a"))
        .await
        .unwrap();
    // Its grab is told what became of the order, not that the path is invalid.
    assert!(matches!(
        world.grab_with(&sale, "a", &token).await,
        Err(AppError::OrderCancelled)
    ));
    assert_eq!(world.store.shard_available(&sale, 0), 2);
    // A fresh path works: the limit counts only open and paid units.
    world.grab(&sale, "a").await.unwrap();
}

#[tokio::test]
async fn a_blocked_user_gets_no_grab_path_and_their_earlier_path_reserves_nothing() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    // A path handed out before the block must not outlive it.
    let token = world.token(&sale, "scalper").await.unwrap();
    world.admin.block_user(&user("scalper")).await.unwrap();
    world.clock.advance(BLOCKLIST_REFRESH);

    assert!(matches!(
        world.token(&sale, "scalper").await,
        Err(AppError::Blocked)
    ));
    assert!(matches!(
        world.grab_with(&sale, "scalper", &token).await,
        Err(AppError::Blocked)
    ));
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
    assert!(world.queue.sent.lock().unwrap().is_empty());
    assert_eq!(world.store.shard_available(&sale, 0), 10);
    // Everyone else still buys.
    world.grab(&sale, "buyer").await.unwrap();
}

#[tokio::test]
async fn a_blocked_user_is_refused_even_for_a_sale_that_does_not_exist() {
    let world = World::new();
    world.admin.block_user(&user("bot")).await.unwrap();
    let unknown = SaleId::parse("no-such-sale").unwrap();
    // Refused before the sale is even looked up.
    assert!(matches!(
        world.grabs.issue_pass(&unknown, &user("bot"), None).await,
        Err(AppError::Blocked)
    ));
}

#[tokio::test]
async fn the_grab_reads_the_blocklist_at_most_once_per_refresh_interval() {
    let world = World::new();
    let sale = world.sale(1000, 4, 1).await;
    world.clock.set(start());
    for buyer in 0..50 {
        world.grab(&sale, &format!("buyer-{buyer}")).await.unwrap();
    }
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 1);

    world
        .clock
        .advance(BLOCKLIST_REFRESH - Duration::milliseconds(1));
    world.grab(&sale, "one-more").await.unwrap();
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 1);

    world.clock.advance(Duration::milliseconds(1));
    world.grab(&sale, "after-the-interval").await.unwrap();
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_block_takes_effect_within_one_refresh_interval() {
    let world = World::new();
    let sale = world.sale(10, 1, 2).await;
    world.clock.set(start());
    world.grab(&sale, "bot").await.unwrap();
    world.admin.block_user(&user("bot")).await.unwrap();
    // The snapshot this process took a moment ago does not know yet.
    world.grab(&sale, "bot").await.unwrap();
    world.clock.advance(BLOCKLIST_REFRESH);
    assert!(matches!(
        world.grab(&sale, "bot").await,
        Err(AppError::Blocked)
    ));
}

#[tokio::test]
async fn an_unblocked_user_can_grab_again_after_the_refresh() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    world.admin.block_user(&user("pardoned")).await.unwrap();
    assert!(matches!(
        world.grab(&sale, "pardoned").await,
        Err(AppError::Blocked)
    ));

    world.admin.unblock_user(&user("pardoned")).await.unwrap();
    world.clock.advance(BLOCKLIST_REFRESH);
    let reservation = world.grab(&sale, "pardoned").await.unwrap();
    assert_eq!(reservation.user_id, user("pardoned"));
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_last_snapshot_until_the_next_interval() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    world.admin.block_user(&user("bot")).await.unwrap();
    assert!(matches!(
        world.token(&sale, "bot").await,
        Err(AppError::Blocked)
    ));

    world.blocklist.fail.store(true, Ordering::SeqCst);
    world.clock.advance(BLOCKLIST_REFRESH);
    assert!(matches!(
        world.token(&sale, "bot").await,
        Err(AppError::Blocked)
    ));
    world.grab(&sale, "buyer").await.unwrap();
    // The failed read counts as this interval's read: a failing store is not asked on
    // every request.
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 2);

    world.blocklist.fail.store(false, Ordering::SeqCst);
    world.admin.unblock_user(&user("bot")).await.unwrap();
    world.clock.advance(BLOCKLIST_REFRESH);
    world.grab(&sale, "bot").await.unwrap();
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn with_no_snapshot_yet_a_failed_blocklist_read_is_a_transient_failure() {
    let world = World::new();
    let sale = world.sale(10, 1, 1).await;
    world.clock.set(start());
    world.blocklist.fail.store(true, Ordering::SeqCst);
    let refused = world.token(&sale, "anyone").await.unwrap_err();
    assert!(refused.is_retryable(), "{refused:?}");
    assert!(matches!(refused, AppError::Store(_)));
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_blocklist_is_sorted_and_block_and_unblock_are_idempotent() {
    let world = World::new();
    for name in ["zed", "amy", "zed"] {
        world.admin.block_user(&user(name)).await.unwrap();
    }
    world
        .admin
        .unblock_user(&user("never-blocked"))
        .await
        .unwrap();
    assert_eq!(
        world.admin.blocked_users().await.unwrap(),
        vec![user("amy"), user("zed")]
    );
    world.admin.unblock_user(&user("zed")).await.unwrap();
    world.admin.unblock_user(&user("zed")).await.unwrap();
    assert_eq!(
        world.admin.blocked_users().await.unwrap(),
        vec![user("amy")]
    );
}

#[tokio::test]
async fn the_consumer_times_the_hold_it_finds_and_refuses_a_message_naming_another_shard() {
    let world = World::new();
    let sale = world.sale(5, 2, 1).await;
    world.clock.set(start());
    let reservation = world.grab(&sale, "a").await.unwrap();

    // A message for this order on the other shard is not what the grab committed.
    let elsewhere = flashsale_domain::Reservation {
        shard: 1 - reservation.shard,
        ..reservation.clone()
    };
    assert!(matches!(
        world.orders.receive(&first_try(&elsewhere)).await,
        Err(AppError::OrderNotFound)
    ));
    assert_eq!(world.scheduler.created.load(Ordering::SeqCst), 0);

    // One whose deadline was tampered with still times the hold's own deadline.
    let later = flashsale_domain::Reservation {
        expires_at: reservation.expires_at + Duration::hours(1),
        ..reservation.clone()
    };
    assert_eq!(
        world.orders.receive(&first_try(&later)).await.unwrap(),
        TimerSet::Set
    );
    let timers = world.scheduler.timers.lock().unwrap();
    assert_eq!(timers.get(&reservation.order_id), Some(&reservation));
}

/// The grab path's token for `user` with `solution`, or why not.
async fn token_for(
    world: &World,
    sale: &SaleId,
    user_name: &str,
    solution: Option<&serde_json::Value>,
) -> Result<String, AppError> {
    let pass = world
        .grabs
        .issue_pass(sale, &user(user_name), solution)
        .await?;
    Ok(pass.grab_path.rsplit('/').next().unwrap().to_owned())
}

/// A sale of 3 units asking for a challenge, open now.
async fn challenged_sale(world: &World) -> SaleId {
    let sale = world
        .create_sale(testing::sale(3, 1).per_user_limit(3).challenge_work(50_000))
        .await;
    world.clock.set(start());
    sale.sale_id
}

#[tokio::test]
async fn a_sale_with_a_challenge_hands_out_a_grab_path_only_for_a_solution() {
    let world = World::new();
    let sale = challenged_sale(&world).await;
    assert!(matches!(
        world.grabs.issue_pass(&sale, &user("u"), None).await,
        Err(AppError::ChallengeRequired)
    ));
    let challenge = world
        .grabs
        .issue_challenge(&sale, &user("u"))
        .await
        .unwrap();
    assert_eq!(challenge.0["work"], 50_000);
    let unsolved = challenge.0.clone();
    assert!(matches!(
        token_for(&world, &sale, "u", Some(&unsolved)).await,
        Err(AppError::ChallengeRefused(ChallengeRefusal::Unsolved))
    ));
    let solution = PlainChallenges::solve(&challenge);
    assert!(matches!(
        token_for(&world, &sale, "mallory", Some(&solution)).await,
        Err(AppError::ChallengeRefused(ChallengeRefusal::NotYours))
    ));
    let token = token_for(&world, &sale, "u", Some(&solution))
        .await
        .unwrap();
    world.grab_with(&sale, "u", &token).await.unwrap();
}

#[tokio::test]
async fn a_replayed_solution_buys_the_same_order_never_a_second_unit() {
    let world = World::new();
    let sale = challenged_sale(&world).await;
    let challenge = world
        .grabs
        .issue_challenge(&sale, &user("u"))
        .await
        .unwrap();
    let solution = PlainChallenges::solve(&challenge);
    let mut orders = Vec::new();
    for _ in 0..3 {
        let token = token_for(&world, &sale, "u", Some(&solution))
            .await
            .unwrap();
        // A replay's first attempt finds the order held: the same one, answered again.
        let reservation = match world.grab_with(&sale, "u", &token).await {
            Ok(reservation) => reservation,
            Err(_) => world.retry_with(&sale, "u", &token).await.unwrap(),
        };
        orders.push(reservation.order_id);
    }
    assert!(
        orders.windows(2).all(|pair| pair[0] == pair[1]),
        "{orders:?}"
    );
    // Its limit is 3, but one solution bought one unit: two remain.
    assert_eq!(world.store.shard_available(&sale, 0), 2);
    // Another challenge buys another.
    let second = PlainChallenges::solve(
        &world
            .grabs
            .issue_challenge(&sale, &user("u"))
            .await
            .unwrap(),
    );
    let token = token_for(&world, &sale, "u", Some(&second)).await.unwrap();
    let another = world.grab_with(&sale, "u", &token).await.unwrap();
    assert_ne!(another.order_id, orders[0]);
}

#[tokio::test]
async fn a_wrong_solution_is_refused_before_anything_is_read() {
    let world = World::new();
    let sale = challenged_sale(&world).await;
    let forged =
        serde_json::json!({"issuer": "someone else", "id": 1, "issued": 0, "expires": i64::MAX});
    // Refused as forged, even for a sale that does not exist: the sale was never read.
    let unknown = SaleId::parse("no-such-sale").unwrap();
    assert!(matches!(
        token_for(&world, &unknown, "u", Some(&forged)).await,
        Err(AppError::ChallengeRefused(ChallengeRefusal::Forged))
    ));
    assert!(matches!(
        token_for(&world, &sale, "u", Some(&serde_json::json!("junk"))).await,
        Err(AppError::ChallengeRefused(ChallengeRefusal::Malformed))
    ));
    assert_eq!(world.challenges.verifications(), 2);
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_challenge_opens_with_the_sale_and_only_for_a_sale_that_asks_one() {
    let world = World::new();
    let sale = challenged_sale(&world).await;
    world.clock.set(start() - Duration::minutes(5));
    assert!(matches!(
        world.grabs.issue_challenge(&sale, &user("u")).await,
        Err(AppError::NotStarted)
    ));
    world.clock.set(start());
    let expired = PlainChallenges::solve(
        &world
            .grabs
            .issue_challenge(&sale, &user("u"))
            .await
            .unwrap(),
    );
    world.clock.set(start() + Duration::minutes(6));
    assert!(matches!(
        token_for(&world, &sale, "u", Some(&expired)).await,
        Err(AppError::ChallengeRefused(ChallengeRefusal::Expired))
    ));
    let plain = world.sale(3, 1, 1).await;
    assert!(matches!(
        world.grabs.issue_challenge(&plain, &user("u")).await,
        Err(AppError::NoChallenge)
    ));
}

#[tokio::test]
async fn a_paused_sale_takes_no_grab_at_no_write_and_a_resumed_one_sells_on() {
    let world = World::new();
    let sale = world.sale(3, 1, 1).await;
    world.clock.set(start());
    let early_path = world.token(&sale, "early").await.unwrap();
    let held = world.grab_with(&sale, "early", &early_path).await.unwrap();
    let path_before_pause = world.token(&sale, "holder-of-a-path").await.unwrap();

    let paused = world.control(&sale, SaleAction::Pause).await.unwrap();
    assert_eq!(
        (paused.control, paused.changed),
        (SaleControl::Paused, true)
    );
    let calls = world.store_calls();
    assert!(matches!(
        world.token(&sale, "late").await,
        Err(AppError::Paused)
    ));
    assert!(matches!(
        world
            .grab_with(&sale, "holder-of-a-path", &path_before_pause)
            .await,
        Err(AppError::Paused)
    ));
    assert_eq!(world.store_calls(), calls, "refused before any reserve");
    // A marked retry of the grab that took the unit just before the pause (its answer
    // lost) gets that order back; an unmarked one is refused.
    assert_eq!(
        world.retry_with(&sale, "early", &early_path).await.unwrap(),
        held
    );
    assert!(matches!(
        world
            .retry_with(&sale, "holder-of-a-path", &path_before_pause)
            .await,
        Err(AppError::Paused)
    ));
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "paused");
    let again = world.control(&sale, SaleAction::Pause).await.unwrap();
    assert!(!again.changed, "a repeat changes nothing");

    // A hold taken before the pause stays payable.
    assert_eq!(
        testing::pay_by_card(&*world.store, &held, world.clock.now())
            .await
            .unwrap(),
        PayOutcome::Paid
    );

    world.control(&sale, SaleAction::Resume).await.unwrap();
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "active");
    world
        .grab_with(&sale, "holder-of-a-path", &path_before_pause)
        .await
        .expect("the path still works once resumed");
    world.grab(&sale, "late").await.expect("sells on");
    assert!(matches!(
        world.grab(&sale, "too-late").await,
        Err(AppError::SoldOut)
    ));
    let stats = world.sales.stats(&sale).await.unwrap();
    assert_eq!((stats.counts.paid, stats.counts.reserved), (1, 2));
    assert!(stats.consistent);

    let trail = world.sales.audit(&sale, 10).await.unwrap().entries;
    let actions: Vec<_> = trail.iter().map(|entry| entry.action).collect();
    assert_eq!(actions, [SaleAction::Resume, SaleAction::Pause]);
    assert!(trail.iter().all(|entry| entry.by == operator()));
}

#[tokio::test]
async fn an_ended_sale_takes_no_grab_keeps_its_holds_payable_and_never_reopens() {
    let world = World::new();
    let sale = world.sale(5, 1, 1).await;
    world.clock.set(start());
    let held = world.grab(&sale, "a").await.unwrap();
    let ended = world.control(&sale, SaleAction::End).await.unwrap();
    assert_eq!((ended.control, ended.changed), (SaleControl::Ended, true));
    assert!(matches!(world.grab(&sale, "b").await, Err(AppError::Ended)));
    assert_eq!(world.sales.view(&sale).await.unwrap().status, "ended");
    for action in [SaleAction::Pause, SaleAction::Resume] {
        assert!(matches!(
            world.control(&sale, action).await,
            Err(AppError::Ended)
        ));
    }
    assert!(!world.control(&sale, SaleAction::End).await.unwrap().changed);
    assert_eq!(world.sales.audit(&sale, 10).await.unwrap().entries.len(), 1);
    assert_eq!(
        testing::pay_by_card(&*world.store, &held, world.clock.now())
            .await
            .unwrap(),
        PayOutcome::Paid,
        "a hold taken before the end is still paid"
    );

    // A sale over by its window is ended already: no pause, and ending it records nothing.
    let over = world.sale(5, 1, 1).await;
    world.clock.set(start() + Duration::hours(2));
    assert!(matches!(
        world.control(&over, SaleAction::Pause).await,
        Err(AppError::Ended)
    ));
    assert!(!world.control(&over, SaleAction::End).await.unwrap().changed);
    assert!(
        world
            .sales
            .audit(&over, 10)
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    assert!(matches!(
        world
            .control(&SaleId::parse("no-such-sale").unwrap(), SaleAction::Pause)
            .await,
        Err(AppError::SaleNotFound)
    ));
}
