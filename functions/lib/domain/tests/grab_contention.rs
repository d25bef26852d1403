//! The grab under contention and lost answers, on the in-memory fakes: a contended
//! shard is left for a free one at once, a crowd that contends everywhere pauses with
//! jitter and goes round again, and a reserve whose outcome is unknown is resolved
//! before the buyer hears anything.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_domain::gate::SoldOutGate;
use flashsale_domain::ports::{
    Clock, OrderBook, ReserveRefusal, SaleCatalog, Settlement, ShardState, StockLedger, Take,
    TakeReturn,
};
use flashsale_domain::service::{
    Attempt, CachedBlocklist, ContentionPolicy, GrabOutcome, GrabReport, GrabService, SoldOutBy,
};
use flashsale_domain::testing;
use flashsale_domain::testing::{
    InMemoryBlocklist, InMemoryStore, ManualClock, PlainChallenges, RecordedPauses, RecordingQueue,
    ReserveScript, ScriptedLedger, SeededIds,
};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{
    AppError, OrderId, OrderMessage, OrderStatus, ReleaseReason, Sale, StoreError, UserId,
};

use ReserveScript::{CommitThenFail, Contend, FailBefore, NotAttempted};

const SECRET: &[u8] = b"an-hmac-key-of-at-least-32-bytes!";

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 11, 0, 0, 0).unwrap()
}

struct World {
    store: Arc<InMemoryStore>,
    ledger: Arc<ScriptedLedger>,
    queue: Arc<RecordingQueue>,
    pauses: Arc<RecordedPauses>,
    clock: Arc<ManualClock>,
    grabs: GrabService,
    sale: Sale,
}

impl World {
    /// A sale of `stock` on `shards`, its reserves played through `script`.
    async fn new(stock: i64, shards: i64, script: impl IntoIterator<Item = ReserveScript>) -> Self {
        Self::over(stock, shards, script, |store, _| store).await
    }

    /// As [`World::new`], the script playing over the ledger `ledger` makes of the store
    /// and the clock.
    async fn over(
        stock: i64,
        shards: i64,
        script: impl IntoIterator<Item = ReserveScript>,
        ledger: impl FnOnce(Arc<InMemoryStore>, Arc<ManualClock>) -> Arc<dyn StockLedger>,
    ) -> Self {
        let store = Arc::new(InMemoryStore::new());
        let sale = testing::sale(stock, shards)
            .id("phone")
            .starting_at(start())
            .per_user_limit(1)
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        let manual_clock = Arc::new(ManualClock::new(start()));
        let ledger = Arc::new(ScriptedLedger::new(
            ledger(store.clone(), manual_clock.clone()),
            script,
        ));
        let queue = Arc::new(RecordingQueue::default());
        let pauses = Arc::new(RecordedPauses::advancing(manual_clock.clone()));
        let clock: Arc<dyn Clock> = manual_clock.clone();
        let grabs = GrabService {
            catalog: store.clone(),
            ledger: ledger.clone(),
            orders: store.clone(),
            queue: queue.clone(),
            ids: Arc::new(SeededIds::new(7, clock.clone())),
            clock,
            pause: pauses.clone(),
            signer: GrabTokenSigner::new(SECRET).unwrap(),
            challenges: Arc::new(PlainChallenges::default()),
            gate: SoldOutGate::new(Duration::seconds(1)),
            blocked_users: CachedBlocklist::new(
                Arc::new(InMemoryBlocklist::new()),
                Duration::seconds(5),
            ),
            contention: ContentionPolicy::DEFAULT,
        };
        Self {
            store,
            ledger,
            queue,
            pauses,
            clock: manual_clock,
            grabs,
            sale,
        }
    }

    async fn grab(&self, user: &str) -> GrabReport {
        let user = UserId::parse(user).unwrap();
        let pass = self
            .grabs
            .issue_pass(&self.sale.sale_id, &user, None)
            .await
            .unwrap();
        let token = pass.grab_path.rsplit('/').next().unwrap();
        self.grabs
            .grab(&self.sale.sale_id, token, &user, Attempt::First)
            .await
    }

    /// `user`'s grab, committed: the path, and the reservation it made.
    async fn committed(&self, user: &UserId) -> (String, flashsale_domain::Reservation) {
        let (token, _) = self.path_of(user).await;
        let first = self
            .grabs
            .grab(&self.sale.sale_id, &token, user, Attempt::First)
            .await;
        let reservation = reserved(&first).clone();
        (token, reservation)
    }

    /// A grab path for `user`, and the order it names.
    async fn path_of(&self, user: &UserId) -> (String, OrderId) {
        let pass = self
            .grabs
            .issue_pass(&self.sale.sale_id, user, None)
            .await
            .unwrap();
        let token = pass.grab_path.rsplit('/').next().unwrap().to_owned();
        let order_id = self
            .grabs
            .signer
            .verify(&token, &self.sale.sale_id, user, start())
            .expect("a valid path");
        (token, order_id)
    }

    /// Whether every unit taken from a shard is accounted for by a hold.
    async fn no_stray_takes(&self) -> bool {
        self.ledger
            .unaccounted_takes(&self.sale)
            .await
            .unwrap()
            .is_empty()
    }

    fn available(&self) -> u64 {
        (0..self.sale.shards)
            .map(|shard| self.store.shard_available(&self.sale.sale_id, shard))
            .sum()
    }

    /// Reserves `order` on `shard` in the store itself, as a request this test does not
    /// play would.
    async fn hold(&self, order: &OrderId, user: &UserId, shard: u16) {
        let reservation = flashsale_domain::Reservation {
            order_id: order.clone(),
            sale_id: self.sale.sale_id.clone(),
            user_id: user.clone(),
            shard,
            created_at: start(),
            expires_at: self.sale.payment_deadline(start()),
            price: self.sale.price,
        };
        let reserved = self.store.reserve(&self.sale, shard, &reservation).await;
        assert!(matches!(reserved, Ok(Ok(()))), "{reserved:?}");
    }

    fn order_of(&self, user: &str) -> Vec<u16> {
        self.sale
            .shard_order(&UserId::parse(user).unwrap())
            .collect()
    }
}

fn reserved(report: &GrabReport) -> &flashsale_domain::Reservation {
    match &report.outcome {
        Ok(GrabOutcome::Reserved(reservation)) => reservation,
        other => panic!("expected a fresh reservation, got {other:?}"),
    }
}

#[tokio::test]
async fn a_contended_shard_is_left_for_the_next_at_once() {
    let world = World::new(8, 4, [Contend]).await;
    let report = world.grab("alice").await;
    let reservation = reserved(&report);
    let order = world.order_of("alice");
    assert_eq!(world.ledger.tried(), order[..2]);
    assert_eq!(reservation.shard, order[1]);
    assert_eq!((report.reserves, report.contended), (2, 1));
    assert!(
        world.pauses.taken().is_empty(),
        "no wait while a shard was free"
    );
    assert_eq!(world.available(), 7);
}

#[tokio::test]
async fn after_a_few_contended_shards_the_grab_pauses_and_goes_on_where_it_left_off() {
    let world = World::new(8, 4, [Contend; 4]).await;
    let report = world.grab("alice").await;
    let reservation = reserved(&report);
    let order = world.order_of("alice");
    // Two contended, pause; the two not reached yet, contended, pause; then the first.
    assert_eq!(
        world.ledger.tried(),
        [order[0], order[1], order[2], order[3], order[0]]
    );
    assert_eq!(reservation.shard, order[0]);
    assert_eq!((report.reserves, report.contended), (5, 4));
    let pauses = world.pauses.taken();
    assert_eq!(pauses.len(), 2);
    assert!(pauses[0] <= ContentionPolicy::DEFAULT.pause_base);
    assert!(pauses[1] <= 2 * ContentionPolicy::DEFAULT.pause_base);
    assert_eq!(world.available(), 7);
}

#[tokio::test]
async fn contention_that_outlasts_every_walk_is_a_transient_failure_that_took_nothing() {
    let walks = ContentionPolicy::DEFAULT.max_walks;
    let world = World::new(8, 2, vec![Contend; 2 * walks as usize]).await;
    let report = world.grab("alice").await;
    assert_eq!(report.contended, 2 * walks);
    match &report.outcome {
        Err(error) => assert!(error.is_retryable(), "{error:?}"),
        other => panic!("expected a transient failure, got {other:?}"),
    }
    assert_eq!(world.pauses.taken().len(), walks as usize - 1);
    assert_eq!(world.available(), 8);
    assert!(world.queue.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_reserve_that_committed_but_lost_its_answer_is_answered_reserved() {
    let world = World::new(8, 4, [CommitThenFail]).await;
    let report = world.grab("alice").await;
    let reservation = reserved(&report).clone();
    assert_eq!(
        report.reserves, 1,
        "one reserve, then a read, no second write"
    );
    assert_eq!(world.available(), 7);
    assert_eq!(
        world.queue.sent.lock().unwrap().as_slice(),
        [OrderMessage {
            reservation: reservation.clone(),
            retried: false
        }]
    );
    let (order, _) = world
        .store
        .find(&reservation.order_id, &reservation.user_id)
        .await
        .unwrap()
        .expect("held");
    assert_eq!(order.status, OrderStatus::Reserved);
}

#[tokio::test]
async fn a_reserve_that_failed_before_committing_is_tried_again_and_takes_one_unit() {
    let world = World::new(8, 4, [FailBefore]).await;
    let report = world.grab("alice").await;
    let reservation = reserved(&report);
    let order = world.order_of("alice");
    // Nothing was held when the buyer's item was read, so the same shard is asked
    // again: a take that landed there would be found and finished, not stranded.
    assert_eq!(reservation.shard, order[0]);
    assert_eq!(world.ledger.tried(), [order[0], order[0]]);
    assert_eq!(world.available(), 7);
}

#[tokio::test]
async fn a_lost_answer_then_an_empty_sale_is_told_sold_out_only_after_a_definite_answer() {
    // One unit, taken by bob; alice's first reserve fails before committing.
    let world = World::new(1, 1, [ReserveScript::Pass, FailBefore]).await;
    reserved(&world.grab("bob").await);
    let report = world.grab("alice").await;
    assert_eq!(
        report.outcome.as_ref().ok(),
        Some(&GrabOutcome::SoldOut(SoldOutBy::Database))
    );
    // The failed attempt, then the one whose answer (empty) is definite.
    assert_eq!(report.reserves, 2);
}

#[tokio::test]
async fn the_gate_and_the_database_each_say_sold_out_in_their_own_name() {
    let world = World::new(1, 1, []).await;
    reserved(&world.grab("bob").await);
    let by_database = world.grab("carol").await;
    assert_eq!(
        by_database.outcome.as_ref().ok(),
        Some(&GrabOutcome::SoldOut(SoldOutBy::Database))
    );
    assert_eq!(by_database.reserves, 1);
    let by_gate = world.grab("dave").await;
    assert_eq!(
        by_gate.outcome.as_ref().ok(),
        Some(&GrabOutcome::SoldOut(SoldOutBy::Gate))
    );
    assert_eq!(by_gate.reserves, 0);
    assert!(matches!(by_gate.into_answer(), Err(AppError::SoldOut)));
}

/// Issue 48 (the simulation, seed 48640, clocks skewed): a grab committed and its
/// invocation died; the page's retry reached a function whose clock was 2 s behind, which
/// read the sale as not started and refused it, and the buyer never learnt of the unit
/// held. A marked retry gets its order back whatever the sale's phase on its clock.
#[tokio::test]
async fn a_retry_on_a_function_whose_clock_is_before_the_start_gets_its_order_back() {
    let world = World::new(1, 1, []).await;
    let user = UserId::parse("alice").unwrap();
    let (token, reservation) = world.committed(&user).await;
    world.clock.set(start() - Duration::seconds(2));
    let again = world
        .grabs
        .grab(&world.sale.sale_id, &token, &user, Attempt::Retry)
        .await;
    assert_eq!(again.outcome.ok(), Some(GrabOutcome::Resumed(reservation)));
    // A first try there is told the sale has not started, as before.
    let bob = UserId::parse("bob").unwrap();
    let pass = world
        .grabs
        .issue_pass(&world.sale.sale_id, &bob, None)
        .await;
    assert!(matches!(pass, Err(AppError::NotStarted)), "{pass:?}");
}

#[tokio::test]
async fn a_retry_of_a_path_that_committed_is_resumed_not_sold_out() {
    let world = World::new(1, 1, []).await;
    let user = UserId::parse("alice").unwrap();
    let (token, reservation) = world.committed(&user).await;
    // Bob finds it empty, and the gate learns so.
    assert!(matches!(
        world.grab("bob").await.into_answer(),
        Err(AppError::SoldOut)
    ));
    // Sold out now; a marked retry reads once and gets its order back.
    let again = world
        .grabs
        .grab(&world.sale.sale_id, &token, &user, Attempt::Retry)
        .await;
    assert_eq!(again.outcome.ok(), Some(GrabOutcome::Resumed(reservation)));
    assert_eq!(again.reserves, 0);
    assert_eq!(world.ledger.availability(&world.sale).await.unwrap(), [0]);
}

#[tokio::test]
async fn a_table_that_keeps_failing_is_answered_unavailable_after_two_unknown_outcomes() {
    let world = World::new(8, 4, [FailBefore, FailBefore]).await;
    let report = world.grab("alice").await;
    match &report.outcome {
        Err(error) => assert!(error.is_retryable(), "{error:?}"),
        other => panic!("expected a transient failure, got {other:?}"),
    }
    assert_eq!(report.reserves, 2, "no more load on a failing table");
    assert_eq!(world.available(), 8);
}

#[tokio::test]
async fn a_take_whose_hold_never_landed_is_finished_by_the_buyers_next_request_not_sold_out() {
    // One unit. Alice's earlier request took it and died (or lost its answers) before
    // recording her hold; her path's order is in the shard's takers, not on her item.
    let world = World::new(1, 1, []).await;
    let alice = UserId::parse("alice").unwrap();
    let (token, order_id) = world.path_of(&alice).await;
    let token = token.as_str();
    world.store.leave_take(
        &world.sale,
        Take {
            shard: 0,
            order_id: order_id.clone(),
            user_id: alice.clone(),
            taken_at: start(),
        },
    );
    // Bob finds the shard empty; the gate learns so, with who holds its unit.
    assert_eq!(
        world.grab("bob").await.outcome.ok(),
        Some(GrabOutcome::SoldOut(SoldOutBy::Database))
    );
    // Carol, with nothing taken, is refused from memory.
    let carol = world.grab("carol").await;
    assert_eq!(
        (carol.outcome.ok(), carol.reserves),
        (Some(GrabOutcome::SoldOut(SoldOutBy::Gate)), 0)
    );

    // Alice sends her path again without saying it is a retry: the gate points her to
    // the shard her take is on, and one reserve there records her hold.
    let again = world
        .grabs
        .grab(&world.sale.sale_id, token, &alice, Attempt::First)
        .await;
    let reservation = reserved(&again);
    assert_eq!(reservation.order_id, order_id);
    assert_eq!(again.reserves, 1);
    assert_eq!(world.available(), 0, "the one unit, taken once");
    let (order, _) = world
        .store
        .find(&order_id, &alice)
        .await
        .unwrap()
        .expect("her order");
    assert_eq!(order.status, OrderStatus::Reserved);
    assert!(world.no_stray_takes().await);
}

/// Alice's first shard is contended, and the reserve on her second is lost twice: her
/// grab answers 503, with a take of hers perhaps on that second shard. The lost reserve
/// did take its unit, late; the hold never landed. Her id, path and order.
async fn alice_gave_up_in_doubt(world: &World) -> (UserId, String, OrderId) {
    let order = world.order_of("alice");
    let alice = UserId::parse("alice").unwrap();
    let (token, order_id) = world.path_of(&alice).await;
    let first = world
        .grabs
        .grab(&world.sale.sale_id, &token, &alice, Attempt::First)
        .await;
    assert!(first.outcome.is_err_and(|error| error.is_retryable()));
    assert_eq!(world.ledger.tried(), [order[0], order[1], order[1]]);
    world.store.leave_take(
        &world.sale,
        Take {
            shard: order[1],
            order_id: order_id.clone(),
            user_id: alice.clone(),
            taken_at: start(),
        },
    );
    (alice, token, order_id)
}

#[tokio::test]
async fn a_path_whose_grab_gave_up_in_doubt_goes_back_to_that_shard_first_not_to_a_stocked_one() {
    let world = World::new(8, 4, [Contend, FailBefore, FailBefore]).await;
    let (alice, token, _) = alice_gave_up_in_doubt(&world).await;
    let order = world.order_of("alice");
    let token = token.as_str();

    // Her client sends the path again, as curl would, without the retry header. Her
    // first shard has stock, but a unit taken there would be a second one: the grab
    // goes back to where it left off, and finishes the take it finds.
    let again = world
        .grabs
        .grab(&world.sale.sale_id, token, &alice, Attempt::First)
        .await;
    let reservation = reserved(&again);
    assert_eq!(reservation.shard, order[1]);
    assert_eq!(again.reserves, 1);
    assert_eq!(world.ledger.tried()[3..], [order[1]]);
    assert_eq!(world.available(), 7, "one unit, taken once");
    assert!(world.no_stray_takes().await);
}

#[tokio::test]
async fn a_path_back_from_doubt_after_its_sale_sold_out_gives_back_the_take_its_twin_superseded() {
    // Meanwhile the other send of her double click held her order on a third shard, and
    // the rest of the stock sold.
    let world = World::new(4, 4, [Contend, FailBefore, FailBefore]).await;
    let (alice, token, order_id) = alice_gave_up_in_doubt(&world).await;
    let order = world.order_of("alice");
    let token = token.as_str();
    world.hold(&order_id, &alice, order[2]).await;
    for (shard, buyer) in [(order[0], "bob"), (order[3], "carol")] {
        let buyer = UserId::parse(buyer).unwrap();
        let (_, their_order) = world.path_of(&buyer).await;
        world.hold(&their_order, &buyer, shard).await;
    }
    let states = world.store.shard_states(&world.sale).await.unwrap();
    world.grabs.gate.apply(&world.sale.sale_id, states, start());

    // Her client's retry: the gate calls the sale sold out, and her order is held. She
    // is told so, and the take on the shard her grab doubted goes back for the next
    // buyer rather than waiting for the reconciler.
    let again = world
        .grabs
        .grab(&world.sale.sale_id, token, &alice, Attempt::Retry)
        .await;
    match &again.outcome {
        Ok(GrabOutcome::Resumed(reservation)) => assert_eq!(reservation.shard, order[2]),
        other => panic!("expected her held order, got {other:?}"),
    }
    assert_eq!(world.available(), 1, "the superseded take is back");
    assert!(world.no_stray_takes().await);
}

#[tokio::test]
async fn a_read_that_fails_after_a_lost_reserve_does_not_end_the_grab() {
    // The reserve committed but its answer was lost; the read that would tell fails
    // too. The grab asks the reserve again on the same shard, which finds the hold.
    let world = World::new(8, 4, [CommitThenFail]).await;
    world.store.fail_next_finds(1);
    let report = world.grab("alice").await;
    let order = world.order_of("alice");
    assert_eq!(world.ledger.tried(), [order[0], order[0]]);
    match &report.outcome {
        Ok(GrabOutcome::Resumed(reservation)) => assert_eq!(reservation.shard, order[0]),
        other => panic!("expected the held order, got {other:?}"),
    }
    assert_eq!(world.available(), 7);
}

/// A pause that, the first time it is taken, does what another grab does meanwhile.
struct MeanwhileAtFirstPause {
    meanwhile: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
    pauses: RecordedPauses,
}

#[async_trait::async_trait]
impl flashsale_domain::ports::Pause for MeanwhileAtFirstPause {
    async fn pause(&self, how_long: std::time::Duration) {
        self.pauses.pause(how_long).await;
        if let Some(meanwhile) = self.meanwhile.lock().unwrap().take() {
            meanwhile();
        }
    }
}

/// One unit, taken by another buyer's second order a moment ago: its hold has not
/// landed, and may yet be refused for that buyer's limit.
async fn a_sale_with_a_young_take(taken_at: DateTime<Utc>) -> (World, Take) {
    let world = World::new(1, 1, []).await;
    let take = Take {
        shard: 0,
        order_id: OrderId::new(world.sale.sale_id.clone()),
        user_id: UserId::parse("eve").unwrap(),
        taken_at,
    };
    world.store.leave_take(&world.sale, take.clone());
    (world, take)
}

#[tokio::test]
async fn a_unit_whose_take_is_undone_while_a_refused_grab_waits_is_sold_to_that_grab() {
    let (mut world, take) = a_sale_with_a_young_take(start()).await;
    let pause = Arc::new(MeanwhileAtFirstPause {
        meanwhile: std::sync::Mutex::new(None),
        pauses: RecordedPauses::default(),
    });
    let (store, sale) = (world.store.clone(), world.sale.clone());
    *pause.meanwhile.lock().unwrap() = Some(Box::new(move || store.undo_take(&sale, &take)));
    world.grabs.pause = pause.clone();
    let reads_before = world.store.availability_reads.load(Ordering::SeqCst);

    let report = world.grab("bob").await;
    let reservation = reserved(&report);
    assert_eq!(reservation.shard, 0);
    assert_eq!(report.reserves, 2, "refused, then the unit that came back");
    assert_eq!(
        pause.pauses.taken(),
        [std::time::Duration::from_secs(1)],
        "until the take is past its undo window"
    );
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst) - reads_before,
        1,
        "one read of the shards, no write, told the unit was back"
    );
    assert_eq!(world.available(), 0);
}

#[tokio::test]
async fn a_young_take_that_stays_is_sold_out_after_one_wait_and_one_read() {
    let (world, _) = a_sale_with_a_young_take(start() - Duration::milliseconds(400)).await;
    let reads_before = world.store.availability_reads.load(Ordering::SeqCst);
    let report = world.grab("bob").await;
    assert_eq!(
        (report.outcome.as_ref().ok(), report.reserves),
        (Some(&GrabOutcome::SoldOut(SoldOutBy::Database)), 1)
    );
    assert_eq!(
        world.pauses.taken(),
        [std::time::Duration::from_millis(600)]
    );
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst) - reads_before,
        1
    );
    // The next grab is refused from memory, with no wait.
    let next = world.grab("carol").await;
    assert_eq!(
        (next.outcome.ok(), next.reserves),
        (Some(GrabOutcome::SoldOut(SoldOutBy::Gate)), 0)
    );
    assert_eq!(world.pauses.taken().len(), 1);
}

#[tokio::test]
async fn a_shard_whose_takes_are_past_their_undo_window_is_sold_out_at_once() {
    let (world, _) = a_sale_with_a_young_take(start() - Duration::seconds(2)).await;
    let report = world.grab("bob").await;
    assert_eq!(
        (report.outcome.ok(), report.reserves),
        (Some(GrabOutcome::SoldOut(SoldOutBy::Database)), 1)
    );
    assert!(world.pauses.taken().is_empty());
}

#[tokio::test]
async fn the_wait_for_an_undo_ends_one_window_past_the_grabs_budget() {
    // A take whose undo window (3 s here) outlasts the grab's budget: the grab, begun at
    // 0.2 s, waits until the take is past its window at 3 s (2.8 s), inside its budget
    // plus one window, then reads once: the take stayed, so the sale is sold out.
    let (mut world, _) = a_sale_with_a_young_take(start()).await;
    let clock = Arc::new(ManualClock::new(start()));
    world.grabs.clock = clock.clone();
    let bob = UserId::parse("bob").unwrap();
    let (token, _) = world.path_of(&bob).await;
    world.grabs.contention.budget = Duration::milliseconds(2500);
    world.grabs.contention.undo_window = Duration::seconds(3);
    clock.set(start() + Duration::milliseconds(200));
    let pauses = Arc::new(RecordedPauses::advancing(clock.clone()));
    world.grabs.pause = pauses.clone();
    let report = world
        .grabs
        .grab(&world.sale.sale_id, &token, &bob, Attempt::First)
        .await;
    assert_eq!(
        (report.outcome.ok(), report.reserves),
        (Some(GrabOutcome::SoldOut(SoldOutBy::Database)), 1)
    );
    assert_eq!(pauses.taken(), [std::time::Duration::from_millis(2800)]);
}

/// A sale whose one young take is undone while a refused grab waits for it, and another
/// buyer's take, its hold not landed yet, empties the shard again: the read finds a take
/// younger than the one waited for.
async fn a_younger_take_meanwhile(budget: Duration) -> (World, Arc<MeanwhileAtFirstPause>) {
    let (mut world, first) = a_sale_with_a_young_take(start()).await;
    world.grabs.contention.budget = budget;
    let pause = Arc::new(MeanwhileAtFirstPause {
        meanwhile: std::sync::Mutex::new(None),
        pauses: RecordedPauses::advancing(world.clock.clone()),
    });
    let (store, sale, clock) = (world.store.clone(), world.sale.clone(), world.clock.clone());
    *pause.meanwhile.lock().unwrap() = Some(Box::new(move || {
        store.undo_take(&sale, &first);
        store.leave_take(
            &sale,
            Take {
                shard: 0,
                order_id: OrderId::new(sale.sale_id.clone()),
                user_id: UserId::parse("frank").unwrap(),
                taken_at: clock.now(),
            },
        );
    }));
    world.grabs.pause = pause.clone();
    (world, pause)
}

#[tokio::test]
async fn a_younger_take_the_read_finds_is_waited_for_too() {
    let (world, pause) = a_younger_take_meanwhile(ContentionPolicy::DEFAULT.budget).await;
    let reads_before = world.store.availability_reads.load(Ordering::SeqCst);
    let report = world.grab("bob").await;
    assert_eq!(
        report.outcome.ok(),
        Some(GrabOutcome::SoldOut(SoldOutBy::Database)),
        "frank's take stayed: sold out, from the table"
    );
    assert_eq!(
        pause.pauses.taken(),
        [std::time::Duration::from_secs(1); 2],
        "one window for each take"
    );
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst) - reads_before,
        2
    );
}

#[tokio::test]
async fn a_take_still_young_at_the_last_look_is_answered_503_not_sold_out() {
    // The grab's last look is one undo window past its budget (0.5 s here): frank's take,
    // a second old by then, may still be given back, so "sold out" is not known.
    let (world, _) = a_younger_take_meanwhile(Duration::milliseconds(500)).await;
    let report = world.grab("bob").await;
    let error = report
        .outcome
        .expect_err("a unit may still come back: not sold out");
    assert!(error.is_retryable(), "a 503 the buyer retries: {error:?}");
    assert_eq!(world.available(), 0);
}

#[tokio::test]
async fn a_grab_that_finds_every_shard_empty_waits_for_this_processs_takes_in_flight() {
    // Another grab of this process has a reserve in flight on the one shard: its take
    // emptied it, the gate marked it so, and its hold will be refused (its order is held
    // elsewhere), so the take goes back before that reserve answers. A grab arriving
    // meanwhile must not be told "sold out" from memory: it waits for the reserve to
    // land, then takes the unit.
    let world = World::new(1, 1, []).await;
    let (sale_id, shards) = (world.sale.sale_id.clone(), world.sale.shards);
    let take = Take {
        shard: 0,
        order_id: OrderId::new(sale_id.clone()),
        user_id: UserId::parse("eve").unwrap(),
        taken_at: start(),
    };
    world.store.leave_take(&world.sale, take.clone());
    let gate = world.grabs.gate.clone();
    let cap = ContentionPolicy::DEFAULT.max_takes_in_flight_per_shard;
    let in_flight = gate.admit(&sale_id, shards, 0, cap).expect("a slot");
    gate.mark_empty(
        &sale_id,
        shards,
        0,
        flashsale_domain::ports::ShardTakers::of([&take.order_id]),
        start(),
    );
    let pause = Arc::new(MeanwhileAtFirstPause {
        meanwhile: std::sync::Mutex::new(None),
        pauses: RecordedPauses::default(),
    });
    let (store, sale) = (world.store.clone(), world.sale.clone());
    *pause.meanwhile.lock().unwrap() = Some(Box::new(move || {
        // The reserve in flight lands: its take goes back, the shard is marked, the slot
        // freed, as `take_in` does.
        store.undo_take(&sale, &take);
        gate.mark_stocked(&sale.sale_id, sale.shards, 0);
        drop(in_flight);
    }));
    let mut world = world;
    world.grabs.pause = pause.clone();

    let report = world.grab("bob").await;
    assert_eq!(reserved(&report).shard, 0);
    assert_eq!(report.reserves, 1, "no write until the unit was back");
    assert_eq!(pause.pauses.taken().len(), 1, "one look after the first");
    assert_eq!(world.available(), 0);
    assert!(world.no_stray_takes().await);
}

/// Takes in flight on a shard, held as another grab of this process would hold them.
fn crowd(world: &World, shard: u16) -> Vec<flashsale_domain::gate::TakeSlot> {
    let cap = ContentionPolicy::DEFAULT.max_takes_in_flight_per_shard;
    (0..cap)
        .map(|_| {
            world
                .grabs
                .gate
                .admit(&world.sale.sale_id, world.sale.shards, shard, cap)
                .expect("room under the cap")
        })
        .collect()
}

#[tokio::test]
async fn the_cap_of_takes_in_flight_on_one_shard_is_counted_and_freed() {
    let world = World::new(8, 2, []).await;
    let cap = ContentionPolicy::DEFAULT.max_takes_in_flight_per_shard;
    let gate = &world.grabs.gate;
    let slots = crowd(&world, 0);
    assert!(gate.admit(&world.sale.sale_id, 2, 0, cap).is_none());
    assert!(
        gate.admit(&world.sale.sale_id, 2, 1, cap).is_some(),
        "another shard has room"
    );
    drop(slots);
    assert!(gate.admit(&world.sale.sale_id, 2, 0, cap).is_some());
}

#[tokio::test]
async fn a_shard_at_the_cap_is_passed_over_for_one_with_room_without_a_write() {
    let world = World::new(8, 4, []).await;
    let order = world.order_of("alice");
    let _crowd = crowd(&world, order[0]);
    let report = world.grab("alice").await;
    assert_eq!(reserved(&report).shard, order[1]);
    assert_eq!(
        world.ledger.tried(),
        order[1..2],
        "no write to the crowded shard"
    );
    assert!(world.pauses.taken().is_empty());
    assert_eq!(world.available(), 7);
}

/// A pause during which the other grabs' takes in flight finish.
#[derive(Default)]
struct CrowdLeaves {
    crowd: std::sync::Mutex<Vec<flashsale_domain::gate::TakeSlot>>,
    pauses: std::sync::Mutex<Vec<std::time::Duration>>,
}

#[async_trait::async_trait]
impl flashsale_domain::ports::Pause for CrowdLeaves {
    async fn pause(&self, how_long: std::time::Duration) {
        self.pauses.lock().unwrap().push(how_long);
        self.crowd.lock().unwrap().clear();
    }
}

#[tokio::test]
async fn with_every_shard_at_the_cap_the_grab_waits_for_a_slot_and_spends_no_walk() {
    let mut world = World::new(8, 2, []).await;
    let leaves = Arc::new(CrowdLeaves::default());
    leaves.crowd.lock().unwrap().extend(crowd(&world, 0));
    leaves.crowd.lock().unwrap().extend(crowd(&world, 1));
    world.grabs.pause = leaves.clone();
    let report = world.grab("alice").await;
    reserved(&report);
    assert_eq!(
        report.reserves, 1,
        "nothing written while every shard was at the cap"
    );
    let pauses = leaves.pauses.lock().unwrap().clone();
    assert_eq!(pauses.len(), 1);
    assert!(pauses[0] <= ContentionPolicy::DEFAULT.slot_wait);
    assert_eq!(world.available(), 7);
    assert!(world.no_stray_takes().await);
}

#[tokio::test]
async fn a_reserve_refused_unsent_is_answered_at_once_with_nothing_read_or_in_doubt() {
    let world = World::new(8, 4, [NotAttempted]).await;
    let user = UserId::parse("alice").unwrap();
    let (token, order_id) = world.path_of(&user).await;
    let report = world
        .grabs
        .grab(&world.sale.sale_id, &token, &user, Attempt::First)
        .await;
    match &report.outcome {
        Err(AppError::Store(error)) => {
            assert!(error.was_not_attempted(), "{error:?}");
            assert_eq!(error.retry_after(), Some(std::time::Duration::from_secs(2)));
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert_eq!(report.reserves, 1, "one reserve, refused; no walk on");
    assert!(world.pauses.taken().is_empty());
    assert_eq!(
        world
            .grabs
            .gate
            .shard_taken_by(&world.sale.sale_id, world.sale.shards, &order_id),
        None,
        "nothing was sent, so nothing is in doubt"
    );
    assert_eq!(world.available(), 8);
}

#[tokio::test]
async fn a_read_that_fails_after_a_young_take_is_answered_503_not_sold_out() {
    let (world, _) = a_sale_with_a_young_take(start() - Duration::milliseconds(400)).await;
    world.ledger.fail_next_reads(1);
    let report = world.grab("bob").await;
    assert_eq!(report.reserves, 1);
    let error = report
        .outcome
        .expect_err("the shards could not be read: not known sold out");
    assert!(error.is_retryable(), "a 503 the buyer retries: {error:?}");
    // Once the take is past its window, the next grab is told what the table said.
    assert!(matches!(
        world.grab("bob").await.outcome,
        Ok(GrabOutcome::SoldOut(_))
    ));
}

#[tokio::test]
async fn a_unit_back_while_the_recheck_cannot_read_is_never_answered_sold_out_from_stale_marks() {
    // Found by the simulation (seed 48007): a store outage began just after a cancel
    // gave a unit back to a shard this process had seen empty. Every recheck failed,
    // each failure renewed the old mark, and the first grabs after the outage were told
    // "sold out" with the unit on the shard, 13 s after the shard was last seen.
    let world = World::new(1, 1, []).await;
    let alice = reserved(&world.grab("alice").await).clone();
    assert_eq!(
        world.grab("bob").await.outcome.ok(),
        Some(GrabOutcome::SoldOut(SoldOutBy::Database))
    );
    world
        .store
        .release(&alice, ReleaseReason::Cancelled, start())
        .await
        .unwrap();
    // Past the recheck interval, the grab that draws the recheck cannot read.
    world.clock.advance(Duration::seconds(2));
    world.ledger.fail_next_reads(1);
    let error = world
        .grab("carol")
        .await
        .outcome
        .expect_err("its marks are stale and the table did not answer");
    assert!(error.is_retryable(), "{error:?}");
    // The next grab of the interval has only the stale mark: a 503, and the failing
    // store is not read again within the interval.
    let reads_before = world.store.availability_reads.load(Ordering::SeqCst);
    world.clock.advance(Duration::milliseconds(500));
    let error = world
        .grab("dave")
        .await
        .outcome
        .expect_err("a mark older than the interval cannot say sold out");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst),
        reads_before,
        "one recheck an interval, failed or not"
    );
    // An interval after the failed read, the next grab rechecks, and gets the unit.
    world.clock.advance(Duration::milliseconds(600));
    reserved(&world.grab("erin").await);
}

#[tokio::test]
async fn a_walk_that_finds_its_shards_empty_does_not_answer_sold_out_on_another_shards_stale_mark()
{
    // Found by the simulation (seed 48425): after a store outage, a grab walked the
    // shards the gate had no mark on, found them empty, and answered "sold out" though
    // the one it skipped, marked empty 40 s before, had a unit back.
    let world = World::new(2, 2, []).await;
    let bob = UserId::parse("bob").unwrap();
    let order = world.order_of("bob");
    let (first, second) = (order[0], order[1]);
    let (token, _) = world.path_of(&bob).await;
    // The second shard was seen empty long ago and has its unit; the first is empty
    // now, which this process has not seen.
    world.grabs.gate.mark_empty(
        &world.sale.sale_id,
        world.sale.shards,
        second,
        Default::default(),
        start() - Duration::seconds(40),
    );
    let alice = UserId::parse("alice").unwrap();
    world
        .hold(&world.path_of(&alice).await.1, &alice, first)
        .await;
    // Alice's take is past its undo window: nothing to wait for.
    world.clock.advance(Duration::seconds(2));
    world.ledger.fail_next_reads(1);
    let report = world
        .grabs
        .grab(&world.sale.sale_id, &token, &bob, Attempt::First)
        .await;
    let error = report
        .outcome
        .expect_err("a shard was last seen 40 s ago: not known sold out");
    assert!(error.is_retryable(), "{error:?}");
    // An interval later, the recheck reads the unit and the retry takes it.
    world.clock.advance(Duration::milliseconds(1_100));
    let retried = world
        .grabs
        .grab(&world.sale.sale_id, &token, &bob, Attempt::Retry)
        .await;
    assert!(
        matches!(&retried.outcome, Ok(GrabOutcome::Reserved(held)) if held.shard == second),
        "{:?}",
        retried.outcome
    );
}

/// A store whose reserve answers arrive 200 ms after it read the shard, and which gives
/// `comes_back`'s unit back in between, after refusing a reserve as empty.
struct LateRefusals {
    store: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
    comes_back: Arc<std::sync::Mutex<Option<flashsale_domain::Reservation>>>,
}

#[async_trait::async_trait]
impl StockLedger for LateRefusals {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &flashsale_domain::Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        let answer = self.store.reserve(sale, shard, reservation).await;
        let back = self.comes_back.lock().unwrap().take();
        if let (Some(back), Ok(Err(ReserveRefusal::ShardEmpty(_)))) = (back, &answer) {
            let now = self.clock.now();
            self.store
                .release(&back, ReleaseReason::Cancelled, now)
                .await?;
        }
        self.clock.advance(Duration::milliseconds(200));
        answer
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        self.store.availability(sale).await
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        self.store.shard_states(sale).await
    }

    async fn release(
        &self,
        reservation: &flashsale_domain::Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        self.store.release(reservation, reason, now).await
    }

    async fn drop_superseded_take(
        &self,
        reservation: &flashsale_domain::Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        self.store.drop_superseded_take(reservation, shard).await
    }

    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError> {
        self.store.unaccounted_takes(sale).await
    }

    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError> {
        self.store.return_take(take, now).await
    }
}

#[tokio::test]
async fn a_shard_seen_empty_is_marked_as_of_when_the_reserve_was_sent_not_when_its_answer_came() {
    // Found by the simulation: a unit came back while a refusal was on its way, and the
    // gate, dating the mark by the answer, trusted it past the recheck interval of what
    // the store had seen: "sold out" 1.001 s after the unit was back.
    let comes_back = Arc::new(std::sync::Mutex::new(None));
    let slot = comes_back.clone();
    let world = World::over(1, 1, [], |store, clock| {
        Arc::new(LateRefusals {
            store,
            clock,
            comes_back: slot,
        })
    })
    .await;
    let alice = reserved(&world.grab("alice").await).clone();
    // Alice's take is past its undo window: nothing to wait for.
    world.clock.advance(Duration::seconds(2));
    let sent = world.clock.now();
    *comes_back.lock().unwrap() = Some(alice);
    assert_eq!(
        world.grab("bob").await.outcome.ok(),
        Some(GrabOutcome::SoldOut(SoldOutBy::Database)),
        "the shard was empty when the store read it"
    );
    // An interval after bob's reserve was sent, though not after its answer came: the
    // mark is stale, and the recheck finds alice's unit back.
    world.clock.set(sent + Duration::milliseconds(1_050));
    reserved(&world.grab("carol").await);
}

/// A sale of one unit on each of two shards, and bob's grab path, whose order is held
/// on the second shard of bob's order: its path, its order and bob's shard order.
async fn a_path_held_on_its_second_shard() -> (World, UserId, String, OrderId, Vec<u16>) {
    let world = World::new(2, 2, []).await;
    let bob = UserId::parse("bob").unwrap();
    let order: Vec<u16> = world.sale.shard_order(&bob).collect();
    let (token, order_id) = world.path_of(&bob).await;
    let held = flashsale_domain::Reservation {
        order_id: order_id.clone(),
        sale_id: world.sale.sale_id.clone(),
        user_id: bob.clone(),
        shard: order[1],
        created_at: start(),
        expires_at: world.sale.payment_deadline(start()),
        price: world.sale.price,
    };
    world
        .store
        .reserve(&world.sale, order[1], &held)
        .await
        .unwrap()
        .expect("held");
    (world, bob, token, order_id, order)
}

#[tokio::test]
async fn a_take_given_back_because_its_order_is_held_elsewhere_reopens_its_shard_in_the_gate() {
    // A double click: the path's order is held on one shard, and its other request took
    // a unit on another, a shard the gate had since seen empty. The hold is refused, the
    // take goes back, and the gate must know that shard has its unit again, or this
    // process answers "sold out" with a unit on it.
    let (world, bob, token, order_id, order) = a_path_held_on_its_second_shard().await;
    let held_on = order[1];
    let (gate, sale_id, shards) = (&world.grabs.gate, &world.sale.sale_id, world.sale.shards);
    gate.mark_empty(
        sale_id,
        shards,
        order[0],
        flashsale_domain::ports::ShardTakers::of([&order_id]),
        start(),
    );

    let report = world
        .grabs
        .grab(sale_id, &token, &bob, Attempt::First)
        .await;
    assert!(
        matches!(&report.outcome, Ok(GrabOutcome::Resumed(resumed)) if resumed.shard == held_on),
        "{report:?}"
    );
    assert!(
        gate.is_worth_a_write(sale_id, shards, order[0]),
        "the unit given back is there to sell"
    );
    assert_eq!(world.available(), 1);
    assert!(world.no_stray_takes().await);
}

#[tokio::test]
async fn a_superseded_take_whose_give_back_fails_is_given_back_by_the_next_grab_which_sells_it() {
    // A double click: the path's order is held on one shard, and its other request's
    // take on another shard was left in doubt there. Giving that take back fails: the
    // buyer is answered their hold, but the unit must not stay taken by no one until
    // the reconciler's grace, while the gate says sold out: the next grab gives it back.
    let (world, bob, token, order_id, order) = a_path_held_on_its_second_shard().await;
    let (held_on, taken_on) = (order[1], order[0]);
    world.store.leave_take(
        &world.sale,
        Take {
            shard: taken_on,
            order_id: order_id.clone(),
            user_id: bob.clone(),
            taken_at: start(),
        },
    );
    let (gate, sale_id, shards) = (&world.grabs.gate, &world.sale.sale_id, world.sale.shards);
    for shard in 0..shards {
        gate.mark_empty(
            sale_id,
            shards,
            shard,
            flashsale_domain::ports::ShardTakers::of([&order_id]),
            start(),
        );
    }
    gate.note_doubt(sale_id, shards, &order_id, Some(taken_on), start());
    world.ledger.fail_next_give_backs(1);

    let first = world
        .grabs
        .grab(sale_id, &token, &bob, Attempt::Retry)
        .await;
    assert!(
        matches!(&first.outcome, Ok(GrabOutcome::Resumed(resumed)) if resumed.shard == held_on),
        "the buyer holds a unit and is told so: {first:?}"
    );
    assert!(!world.no_stray_takes().await, "the give-back failed");

    let next = world.grab("carol").await;
    assert_eq!(reserved(&next).shard, taken_on, "the unit given back, sold");
    assert!(world.no_stray_takes().await);
    assert_eq!(world.available(), 0);
}
