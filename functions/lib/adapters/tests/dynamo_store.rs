//! `DynamoStore` against DynamoDB Local: what only DynamoDB has (its items, conflicts,
//! pages, corrupt data, hundreds of buyers at once). What every store promises, the
//! fakes included, is the contract suite's (tests/contract.rs).

mod support;

use std::collections::HashSet;
use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{Duration, Utc};
use flashsale_adapters::{ContentionExhausted, CorruptItem, DynamoStore, ItemError, ReserveMode};
use flashsale_domain::ports::{
    OrderBook, OrderPayments, PayOutcome, ReserveRefusal, SaleCatalog, Settlement, StockLedger,
};
use flashsale_domain::sale::StockCounts;
use flashsale_domain::testing::{InMemoryStore, pay_by_card};
use flashsale_domain::{
    OrderStatus, ReleaseReason, Reservation, ReservePath, Sale, SaleId, StoreError, UserId,
};

use support::conflicts::Pattern;

async fn created(store: &DynamoStore, sale: &Sale) {
    assert!(store.create_sale(sale).await.expect("create the sale"));
}

async fn reserved(store: &DynamoStore, sale: &Sale, user: &UserId, shard: u16) -> Reservation {
    let reservation = support::reservation(sale, user, shard);
    store
        .reserve(sale, shard, &reservation)
        .await
        .expect("reserve")
        .expect("stock and limit allow it");
    reservation
}

fn assert_reconciles(sale: &Sale, counts: &StockCounts) {
    let accounted = counts.available + counts.reserved + counts.paid;
    assert_eq!(
        accounted,
        u64::from(sale.stock_total),
        "every unit is available, held or sold: {counts:?}"
    );
}

/// What the grab does with one buyer: try the shards in the buyer's order until one
/// has stock. Transient errors (contention that outlasted the adapter's retries) are
/// retried here, as a client would, and counted; a retry of a call that committed
/// after all answers `AlreadyHeld`, and the buyer has the unit.
async fn grab(
    store: &DynamoStore,
    sale: &Sale,
    user: &UserId,
    transient: &AtomicUsize,
) -> Option<Reservation> {
    for shard in sale.shard_order(user) {
        let reservation = support::reservation(sale, user, shard);
        loop {
            match store.reserve(sale, shard, &reservation).await {
                Ok(Ok(()) | Err(ReserveRefusal::AlreadyHeld)) => return Some(reservation),
                Ok(Err(ReserveRefusal::ShardEmpty(_))) => break,
                Ok(Err(ReserveRefusal::LimitReached)) => {
                    panic!("a buyer with nothing reserved reached the limit")
                }
                // Nothing was written: the same reservation again is safe.
                Ok(Err(ReserveRefusal::Contended)) => {}
                Err(error) if error.is_retryable() => {
                    transient.fetch_add(1, Ordering::SeqCst);
                }
                Err(error) => panic!("reserve failed: {error:?}"),
            }
        }
    }
    None
}

/// A grab may wait out contention for most of its budget before it takes. A grab that
/// finds the shard empty waits for as long as the youngest take there may be undone, so
/// the take must say when it was written: stamped with its order's `created_at`, a late
/// take looked old already, and its undo came after every waiter had read the shard.
#[tokio::test]
async fn a_take_records_when_it_was_written_not_when_its_grab_began() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(1, 1, 1);
    created(&store, &sale).await;
    let mut late = support::reservation(&sale, &support::user("alice"), 0);
    late.created_at -= Duration::seconds(2);
    // The shard records milliseconds.
    let before = Utc::now() - Duration::milliseconds(1);
    store
        .reserve(&sale, 0, &late)
        .await
        .expect("reserve")
        .expect("the unit");
    let after = Utc::now();

    let bobs = support::reservation(&sale, &support::user("bob"), 0);
    let refused = store.reserve(&sale, 0, &bobs).await.expect("reserve");
    let Err(ReserveRefusal::ShardEmpty(takers)) = refused else {
        panic!("expected the shard empty, got {refused:?}");
    };
    let written = takers.latest_take().expect("the take's time");
    assert!(
        before <= written && written <= after,
        "written at {written}, between {before} and {after}; the grab began at {}",
        late.created_at
    );
    let states = store.shard_states(&sale).await.expect("shard states");
    assert_eq!(states[0].takers.latest_take(), Some(written));
}
#[tokio::test]
async fn reserving_the_same_order_again_answers_already_held_and_takes_nothing() {
    let (store, old_items) = support::old_items_store(false).await;
    let sale = support::sale(5, 1, 2);
    created(&store, &sale).await;
    let alice = support::user("alice");
    let first = reserved(&store, &sale, &alice, 0).await;
    let reads = old_items.reads();
    assert_eq!(
        store.reserve(&sale, 0, &first).await.expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(
        old_items.reads(),
        reads,
        "the refusal's old item told it apart, without a read"
    );
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![4]
    );
    assert_eq!(
        support::status_of(&store, &first).await,
        Some(OrderStatus::Reserved)
    );
    // Her one hold counts once, so her limit of two still allows a second order.
    reserved(&store, &sale, &alice, 0).await;
    let counts = store.count(&sale).await.expect("count");
    assert_eq!(counts.reserved, 2);
    assert_reconciles(&sale, &counts);
}

/// The order's own hold is checked first: a retry gets its order back, not the
/// refusal a new order would get now.
async fn a_held_order_is_already_held_on_an_empty_shard_and_at_the_limit(store: &DynamoStore) {
    // One shard of one unit, limit one: after alice's order both the shard and her
    // limit refuse anything else.
    let sale = support::sale(1, 1, 1);
    created(store, &sale).await;
    let alice = support::user("alice");
    let held = reserved(store, &sale, &alice, 0).await;

    assert_eq!(
        store.reserve(&sale, 0, &held).await.expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld),
        "empty shard and limit reached, but this order is held"
    );
    let another = support::reservation(&sale, &alice, 0);
    let bob = support::user("bob");
    let bobs = support::reservation(&sale, &bob, 0);
    for (refused, why) in [
        (
            &another,
            "a new order of hers finds the shard empty before her limit",
        ),
        (&bobs, "so does anyone else's"),
    ] {
        match store.reserve(&sale, 0, refused).await.expect("reserve") {
            Err(ReserveRefusal::ShardEmpty(takers)) => {
                assert!(
                    support::names_exactly(&takers, &[&held]),
                    "{why}: {takers:?}"
                );
            }
            other => panic!("{why}: expected the shard empty, got {other:?}"),
        }
    }

    // Two shards, limit one: her order took shard 0, shard 1 still has stock, and a
    // retry that tries shard 1 with the same order id finds the order held there too.
    let sale = support::sale(2, 2, 1);
    created(store, &sale).await;
    let held = reserved(store, &sale, &alice, 0).await;
    let elsewhere = Reservation {
        shard: 1,
        ..held.clone()
    };
    assert_eq!(
        store.reserve(&sale, 1, &elsewhere).await.expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![0, 1],
        "nothing taken from the shard the retry tried"
    );
    assert_eq!(
        store.count(&sale).await.expect("count").reserved,
        1,
        "one hold"
    );
}

#[tokio::test]
async fn without_the_old_item_a_consistent_read_still_tells_already_held_from_limit_reached() {
    let (store, old_items) = support::old_items_store(true).await;
    let reads = old_items.reads();
    a_held_order_is_already_held_on_an_empty_shard_and_at_the_limit(&store).await;
    assert!(
        old_items.reads() > reads,
        "with the old item withheld, the refusals were told apart by reading"
    );
}

#[tokio::test]
async fn after_a_release_the_same_order_id_answers_already_held_and_writes_nothing() {
    let (store, client, table) = support::store().await;
    let sale = support::sale(2, 1, 1);
    created(&store, &sale).await;
    let alice = support::user("alice");
    let now = Utc::now();
    let cancelled = reserved(&store, &sale, &alice, 0).await;
    assert_eq!(
        store
            .release(&cancelled, ReleaseReason::Cancelled, now)
            .await
            .expect("release"),
        Settlement::Applied
    );
    let user_item = || async {
        client
            .get_item()
            .table_name(&table)
            .key(
                "pk",
                AttributeValue::S(format!("SALE#{}#USER#{alice}", sale.sale_id)),
            )
            .key("sk", AttributeValue::S("HOLDS".to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("read the user item")
            .item
            .expect("the user item")
    };
    let before = user_item().await;
    let hold = before
        .get(&format!("hold#{}", cancelled.order_id))
        .and_then(|hold| hold.as_m().ok())
        .expect("the released hold stays");
    assert_eq!(
        hold.get("status"),
        Some(&AttributeValue::S("cancelled".to_owned()))
    );
    assert_eq!(
        before.get("active"),
        Some(&AttributeValue::N("0".to_owned())),
        "the released hold no longer counts against the limit"
    );

    // Shard has stock and alice is under her limit: only the order id refuses.
    assert_eq!(
        store.reserve(&sale, 0, &cancelled).await.expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(user_item().await, before, "nothing written");
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![2],
        "stock unchanged"
    );
    assert_eq!(
        support::status_of(&store, &cancelled).await,
        Some(OrderStatus::Cancelled)
    );
    assert_eq!(
        store
            .release(&cancelled, ReleaseReason::Expired, now)
            .await
            .expect("release again"),
        Settlement::AlreadySettled(OrderStatus::Cancelled)
    );
    let counts = store.count(&sale).await.expect("count");
    assert_eq!(
        counts,
        StockCounts {
            available: 2,
            cancelled: 1,
            ..StockCounts::default()
        },
        "the released unit is counted once, from its order"
    );

    // Her limit is free again for a new order; expiring it leaves two released holds
    // on her item, each counted once.
    let expired = reserved(&store, &sale, &alice, 0).await;
    store
        .release(&expired, ReleaseReason::Expired, now)
        .await
        .expect("release");
    // The expiry is recorded on the order its owner reads; a cancel is not an expiry.
    let expired_at = |reservation: Reservation| {
        let store = &store;
        async move {
            store
                .find(&reservation.order_id, &reservation.user_id)
                .await
                .expect("find")
                .expect("held")
                .0
                .expired_at
        }
    };
    assert_eq!(expired_at(expired.clone()).await, Some(now));
    assert_eq!(expired_at(cancelled.clone()).await, None);
    assert_eq!(
        store.reserve(&sale, 0, &expired).await.expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(
        pay_by_card(&store, &expired, now)
            .await
            .expect("pay by card"),
        PayOutcome::Settled(OrderStatus::Expired)
    );
    assert_eq!(store.open_holds(&sale).await.expect("open holds"), vec![]);
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.cancelled, counts.expired), (1, 1));
    assert_eq!(counts.available, 2);
    assert_reconciles(&sale, &counts);
}

#[tokio::test]
async fn a_reservation_for_another_shard_or_sale_is_rejected_before_writing() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(4, 2, 1);
    created(&store, &sale).await;
    let alice = support::user("alice");
    let for_shard_one = support::reservation(&sale, &alice, 1);
    let error = store
        .reserve(&sale, 0, &for_shard_one)
        .await
        .expect_err("mismatched shard");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    let error = store
        .reserve(&sale, 2, &support::reservation(&sale, &alice, 2))
        .await
        .expect_err("no such shard");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![2, 2]
    );
}

#[tokio::test]
async fn a_conflicted_take_then_hold_answers_contended_at_once_and_writes_nothing() {
    let (plain, _, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&plain, &sale).await;
    // The take conflicts (a reserve's transaction held the shard).
    let (client, injector) = support::conflicting_writes_client(Pattern::First(1)).await;
    let contended = DynamoStore::new(client, &table).with_reserve_mode(ReserveMode::TakeThenHold);
    let alice = support::user("alice");
    let reservation = support::reservation(&sale, &alice, 0);

    let answer = contended
        .reserve(&sale, 0, &reservation)
        .await
        .expect("answers");
    assert_eq!(answer, Err(ReserveRefusal::Contended));
    assert_eq!(injector.seen(), 1, "not waited out inside the adapter");
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![3]
    );
    assert!(support::status_of(&plain, &reservation).await.is_none());

    // The hold conflicts (a transaction of alice's held her item): the take stays,
    // since a concurrent request of the same order may share it, and the caller hears
    // an unknown outcome, for a retry on this shard to finish.
    let (client, injector) = support::conflicting_writes_client(Pattern::Only(1)).await;
    let error = DynamoStore::new(client, &table)
        .with_reserve_mode(ReserveMode::TakeThenHold)
        .reserve(&sale, 0, &reservation)
        .await
        .expect_err("outcome unknown");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(injector.seen(), 2, "take, hold; no undo");
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![2]
    );
    assert!(support::status_of(&plain, &reservation).await.is_none());

    // The same reservation again finishes the take it left, once.
    contended
        .reserve(&sale, 0, &reservation)
        .await
        .expect("answers")
        .expect("commits");
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![2]
    );
    assert_eq!(plain.count(&sale).await.expect("count").reserved, 1);
}

#[tokio::test]
async fn a_reserve_whose_transaction_conflicts_on_its_shard_goes_on_with_plain_writes_and_so_does_its_sale_for_a_while()
 {
    let (plain, _, table) = support::store().await;
    let sale = support::sale(6, 2, 1);
    created(&plain, &sale).await;
    // Every transaction conflicts on its shard item, as on a hot shard on AWS.
    let (client, injector) = support::conflicting_client(Pattern::Always).await;
    // Long enough that the two reserves below finish inside it on a loaded machine.
    let plain_for = ReserveMode::PLAIN_AFTER_A_CONFLICT;
    let adaptive = DynamoStore::new(client, &table)
        .with_reserve_mode(ReserveMode::AsTheSaleSays { plain_for });
    let reserve = |name: &'static str, shard: u16| {
        let (adaptive, sale) = (&adaptive, &sale);
        async move { reserved(adaptive, sale, &support::user(name), shard).await }
    };

    // The conflicted transaction wrote nothing; the reserve took and held with plain
    // writes instead, once.
    let alice = reserve("alice", 0).await;
    assert_eq!(injector.seen(), 1, "one transaction, conflicted");
    assert_eq!(
        support::status_of(&plain, &alice).await,
        Some(OrderStatus::Reserved)
    );
    assert_eq!(plain.availability(&sale).await.expect("stock"), vec![2, 3]);
    // The sale is hot in this process: no transaction is tried on any of its shards
    // for a while...
    reserve("bob", 0).await;
    reserve("carol", 1).await;
    assert_eq!(
        injector.seen(),
        1,
        "both shards went straight to plain writes"
    );
    // ...and once the while has passed, the transaction is tried again.
    tokio::time::sleep(plain_for + std::time::Duration::from_millis(50)).await;
    reserve("dave", 0).await;
    assert_eq!(injector.seen(), 2, "tried again");
    assert_eq!(plain.availability(&sale).await.expect("stock"), vec![0, 2]);
    assert_eq!(plain.count(&sale).await.expect("count").reserved, 4);
}

#[tokio::test]
async fn a_sale_set_to_take_then_hold_sends_no_transaction_and_one_set_to_transaction_never_goes_plain()
 {
    let (plain, _, table) = support::store().await;
    // Every transaction conflicts on its shard item, as on a hot shard on AWS.
    let (client, injector) = support::conflicting_client(Pattern::Always).await;
    let store = DynamoStore::new(client, &table);

    let surge = Sale {
        reserve: ReservePath::TakeThenHold,
        ..support::sale(3, 1, 1)
    };
    created(&plain, &surge).await;
    let alice = reserved(&store, &surge, &support::user("alice"), 0).await;
    assert_eq!(injector.seen(), 0, "no transaction, not even a first one");
    assert_eq!(
        support::status_of(&plain, &alice).await,
        Some(OrderStatus::Reserved)
    );
    assert_eq!(plain.availability(&surge).await.expect("stock"), vec![2]);

    let strict = Sale {
        reserve: ReservePath::Transaction,
        ..support::sale(3, 1, 1)
    };
    created(&plain, &strict).await;
    for attempt in 1..=2 {
        let bob = support::reservation(&strict, &support::user("bob"), 0);
        let answer = store.reserve(&strict, 0, &bob).await.expect("answers");
        assert_eq!(answer, Err(ReserveRefusal::Contended), "attempt {attempt}");
        assert!(
            support::status_of(&plain, &bob).await.is_none(),
            "nothing written"
        );
    }
    assert_eq!(
        injector.seen(),
        2,
        "a transaction each time, never plain writes"
    );
    assert_eq!(plain.availability(&strict).await.expect("stock"), vec![3]);
}

#[tokio::test]
async fn a_conflicted_release_is_retried_until_it_commits() {
    let (plain, _, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&plain, &sale).await;
    let held = reserved(&plain, &sale, &support::user("alice"), 0).await;
    let (client, injector) = support::conflicting_client(Pattern::First(4)).await;
    let contended = DynamoStore::new(client, &table);

    let settled = contended
        .release(&held, ReleaseReason::Cancelled, Utc::now())
        .await
        .expect("release");
    assert_eq!(settled, Settlement::Applied);
    assert_eq!(injector.injected(), 4, "four conflicts were answered");
    assert_eq!(injector.seen(), 5, "and the fifth attempt committed");
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![3]
    );
}

#[tokio::test]
async fn contention_that_outlasts_the_retries_is_transient_and_writes_nothing() {
    let (plain, _, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&plain, &sale).await;
    let held = reserved(&plain, &sale, &support::user("alice"), 0).await;
    let (client, injector) = support::conflicting_client(Pattern::Always).await;
    let contended = DynamoStore::new(client, &table);

    let started = Instant::now();
    let error = contended
        .release(&held, ReleaseReason::Cancelled, Utc::now())
        .await
        .expect_err("never commits");
    let elapsed = started.elapsed();
    assert!(error.is_retryable(), "{error:?}");
    let exhausted = error
        .source()
        .and_then(|source| source.downcast_ref::<ContentionExhausted>())
        .expect("the source says why");
    assert_eq!(exhausted.attempts, 10);
    assert_eq!(injector.seen(), 10, "bounded: exactly ten attempts");
    assert!(
        elapsed < std::time::Duration::from_secs(3),
        "the jittered waits are capped: {elapsed:?}"
    );
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![2]
    );
    assert_eq!(
        support::status_of(&plain, &held).await,
        Some(OrderStatus::Reserved)
    );
}

/// 300 buyers at once on a stock of 20: exactly 20 get one, whatever the sharding.
/// No transaction writes a shard, so on AWS these plain writes queue rather than
/// conflict; the conflicts a hold can meet are exercised on their own above.
async fn concurrent_buyers_get_exactly_the_stock(shards: u16) {
    const BUYERS: usize = 300;
    const STOCK: u32 = 20;
    let (plain, _, _) = support::store().await;
    let sale = support::sale(STOCK, shards, 1);
    created(&plain, &sale).await;
    let store = plain.clone();
    let transient = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for buyer in 0..BUYERS {
        let (store, sale, transient) = (store.clone(), sale.clone(), transient.clone());
        tasks.spawn(async move {
            let user = support::user(&format!("buyer-{buyer}"));
            grab(&store, &sale, &user, &transient).await
        });
    }
    let mut winners = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Some(reservation) = joined.expect("buyer task") {
            winners.push(reservation);
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "K={shards}: {BUYERS} buyers, {} won, {} transient errors, {elapsed:?}",
        winners.len(),
        transient.load(Ordering::SeqCst)
    );

    assert_eq!(winners.len(), STOCK as usize, "exactly the stock is sold");
    let users: HashSet<&UserId> = winners.iter().map(|r| &r.user_id).collect();
    assert_eq!(users.len(), winners.len(), "nobody holds two");
    assert_eq!(
        plain.availability(&sale).await.expect("availability"),
        vec![0; usize::from(shards)],
        "every shard is empty, none negative"
    );
    let counts = plain.count(&sale).await.expect("count");
    assert_eq!(counts.reserved, u64::from(STOCK));
    assert_reconciles(&sale, &counts);
    assert!(
        plain
            .unaccounted_takes(&sale)
            .await
            .expect("takes")
            .is_empty(),
        "every take has its hold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_buyers_get_exactly_the_stock_of_one_shard() {
    concurrent_buyers_get_exactly_the_stock(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_buyers_get_exactly_the_stock_of_four_shards() {
    concurrent_buyers_get_exactly_the_stock(4).await;
}

/// Sales ending around `cutoff`, from a day before it to a month after, down to the
/// nanosecond on either side of it.
fn sales_ending_around(cutoff: chrono::DateTime<Utc>) -> Vec<Sale> {
    [
        -Duration::days(1),
        -Duration::nanoseconds(1),
        Duration::zero(),
        Duration::nanoseconds(1),
        Duration::hours(1),
        Duration::days(1),
        Duration::days(30),
    ]
    .into_iter()
    .map(|offset| Sale {
        starts_at: cutoff - Duration::days(2),
        ends_at: cutoff + offset,
        ..support::sale(3, 1, 1)
    })
    .collect()
}

#[tokio::test]
async fn sales_ending_after_returns_exactly_the_sales_ending_at_or_after_the_cutoff_across_pages() {
    let (store, pages) = support::small_pages_store(2).await;
    let fake = InMemoryStore::default();
    let cutoff = Utc::now();
    let sales = sales_ending_around(cutoff);
    for sale in &sales {
        created(&store, sale).await;
        assert!(fake.create_sale(sale).await.expect("create in the fake"));
    }
    let mut expected: Vec<Sale> = sales
        .iter()
        .filter(|sale| sale.ends_at >= cutoff)
        .cloned()
        .collect();
    expected.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
    assert_eq!(expected.len(), 5);

    let before = pages.queries();
    let found = store.sales_ending_after(cutoff).await.expect("sales");
    assert!(
        pages.queries() - before >= 3,
        "five sales at two a page take at least three pages"
    );
    assert_eq!(found, expected);
    assert_eq!(
        fake.sales_ending_after(cutoff)
            .await
            .expect("the fake's sales"),
        found,
        "the store agrees with the fake"
    );
    assert_eq!(
        store
            .sales_ending_after(cutoff + Duration::days(31))
            .await
            .expect("sales"),
        Vec::<Sale>::new(),
        "no sale ends after the last one"
    );
}

/// One scenario played on any store: holds of every status on a sale, some on the same
/// user item, and an open hold of another sale. Returns the open holds of `sale`
/// it leaves behind, by order id.
async fn play_holds_of_every_status<S>(
    store: &S,
    sale: &Sale,
    other_sale: &Sale,
    holds: &[Reservation],
    other_hold: &Reservation,
) -> Vec<Reservation>
where
    S: SaleCatalog + StockLedger + OrderBook + OrderPayments,
{
    assert!(store.create_sale(sale).await.expect("create the sale"));
    assert!(
        store
            .create_sale(other_sale)
            .await
            .expect("create the other sale")
    );
    for reservation in holds {
        store
            .reserve(sale, reservation.shard, reservation)
            .await
            .expect("reserve")
            .expect("stock and limit allow it");
    }
    store
        .reserve(other_sale, other_hold.shard, other_hold)
        .await
        .expect("reserve")
        .expect("stock and limit allow it");
    let now = Utc::now();
    for paid in [2, 3] {
        assert_eq!(
            pay_by_card(store, &holds[paid], now)
                .await
                .expect("pay by card"),
            PayOutcome::Paid
        );
    }
    for (released, reason) in [(4, ReleaseReason::Cancelled), (5, ReleaseReason::Expired)] {
        assert_eq!(
            store
                .release(&holds[released], reason, now)
                .await
                .expect("release"),
            Settlement::Applied
        );
    }
    // A retried grab of any of them, open, paid or released, gets its order back.
    for again in [0, 1, 2, 4, 5] {
        assert_eq!(
            store
                .reserve(sale, holds[again].shard, &holds[again])
                .await
                .expect("reserve again"),
            Err(ReserveRefusal::AlreadyHeld),
            "hold {again}"
        );
    }
    let mut open: Vec<Reservation> = [0, 1, 6, 7, 8]
        .into_iter()
        .map(|index| holds[index].clone())
        .collect();
    open.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    open
}

#[tokio::test]
async fn open_holds_returns_the_reservations_of_reserved_holds_and_omits_settled_ones() {
    let (store, pages) = support::small_pages_store(2).await;
    let fake = InMemoryStore::default();
    let sale = support::sale(20, 2, 2);
    let other_sale = support::sale(5, 1, 1);
    let users: Vec<UserId> = (0..8)
        .map(|buyer| support::user(&format!("holder-{buyer}")))
        .collect();
    let mut holds: Vec<Reservation> = users
        .iter()
        .zip(0..)
        .map(|(user, index)| support::reservation(&sale, user, index % 2))
        .collect();
    // A second hold on holder-0's item: one user item, two open holds.
    holds.push(support::reservation(&sale, &users[0], 1));
    let other_hold = support::reservation(&other_sale, &users[0], 0);

    let expected =
        play_holds_of_every_status(&store, &sale, &other_sale, &holds, &other_hold).await;
    let before = pages.queries();
    let open = store.open_holds(&sale).await.expect("open holds");
    assert_eq!(open, expected);
    assert!(
        pages.queries() - before > u64::from(sale.shards),
        "eight user items at two a page take more than one page per bucket"
    );

    let expected_by_fake =
        play_holds_of_every_status(&fake, &sale, &other_sale, &holds, &other_hold).await;
    assert_eq!(expected_by_fake, expected);
    assert_eq!(
        fake.open_holds(&sale).await.expect("the fake's open holds"),
        open,
        "the store agrees with the fake"
    );
    assert_eq!(
        store.open_holds(&other_sale).await.expect("open holds"),
        vec![other_hold]
    );
    assert_eq!(
        store.count(&sale).await.expect("count"),
        fake.count(&sale).await.expect("the fake's count"),
        "count, which shares the read, agrees too"
    );
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        fake.availability(&sale)
            .await
            .expect("the fake's availability"),
        "the retried grabs took nothing from either"
    );
}

#[tokio::test]
async fn a_corrupt_hold_makes_open_holds_a_permanent_error_naming_the_user_item() {
    let (store, client, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&store, &sale).await;
    let alice = support::user("alice");
    reserved(&store, &sale, &alice, 0).await;
    let user_pk = format!("SALE#{}#USER#{alice}", sale.sale_id);
    client
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(user_pk.clone()))
        .key("sk", AttributeValue::S("HOLDS".to_owned()))
        .update_expression("SET #stray = :hold")
        .expression_attribute_names("#stray", "hold#not-an-order")
        .expression_attribute_values(":hold", AttributeValue::M(Default::default()))
        .send()
        .await
        .expect("corrupt the item");

    let error = store.open_holds(&sale).await.expect_err("corrupt");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    let corrupt = error
        .source()
        .and_then(|source| source.downcast_ref::<CorruptItem>())
        .expect("the source names the item");
    assert_eq!(corrupt.pk, user_pk);
    assert!(
        matches!(&corrupt.source, ItemError::Id { name, .. } if name == "hold#not-an-order"),
        "{corrupt:?}"
    );
}

#[tokio::test]
async fn a_missing_table_is_a_permanent_error() {
    let client = support::dynamodb().await;
    let store = DynamoStore::new(client, "no-such-table");
    let error = store
        .find_sale(&SaleId::generate())
        .await
        .expect_err("no table");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_transient_error() {
    let config = aws_sdk_dynamodb::config::Builder::from(&support::sdk_config().await)
        .endpoint_url(support::closed_endpoint())
        .build();
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), "any");
    let error = store
        .find_sale(&SaleId::generate())
        .await
        .expect_err("nobody listens");
    assert!(error.is_retryable(), "{error:?}");
}

#[tokio::test]
async fn a_corrupt_sale_item_is_a_permanent_error_naming_the_item() {
    let (store, client, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&store, &sale).await;
    client
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(format!("SALE#{}", sale.sale_id)))
        .key("sk", AttributeValue::S("META".to_owned()))
        .update_expression("SET stock_total = :text")
        .expression_attribute_values(":text", AttributeValue::S("lots".to_owned()))
        .send()
        .await
        .expect("corrupt the item");

    let error = store.find_sale(&sale.sale_id).await.expect_err("corrupt");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    let corrupt = error
        .source()
        .and_then(|source| source.downcast_ref::<CorruptItem>())
        .expect("the source names the item");
    assert_eq!(corrupt.pk, format!("SALE#{}", sale.sale_id));
    assert!(
        matches!(&corrupt.source, ItemError::WrongType { name, expected: "N" } if name == "stock_total"),
        "{corrupt:?}"
    );
}

/// The order item's sort key (the adapter's own is private to it).
const ORDER_SK: &str = "ORDER";

/// Leaves `reservation` as the consumer of the version before the hold became the order
/// left it: the hold `pending_payment`, and an order item of the same status.
async fn opened_by_an_earlier_version(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    reservation: &Reservation,
) {
    let user_pk = format!("SALE#{}#USER#{}", reservation.sale_id, reservation.user_id);
    client
        .update_item()
        .table_name(table)
        .key("pk", AttributeValue::S(user_pk))
        .key("sk", AttributeValue::S("HOLDS".to_owned()))
        .update_expression("SET #hold.#status = :pending")
        .expression_attribute_names("#hold", format!("hold#{}", reservation.order_id))
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":pending", AttributeValue::S("pending_payment".to_owned()))
        .send()
        .await
        .expect("the earlier consumer's hold");
    client
        .put_item()
        .table_name(table)
        .item(
            "pk",
            AttributeValue::S(format!("ORDER#{}", reservation.order_id)),
        )
        .item("sk", AttributeValue::S(ORDER_SK.to_owned()))
        .item("status", AttributeValue::S("pending_payment".to_owned()))
        .send()
        .await
        .expect("the earlier consumer's order item");
}

#[tokio::test]
async fn orders_an_earlier_version_opened_read_as_reserved_and_settle_as_ever() {
    let (store, client, table) = support::store().await;
    let sale = support::sale(3, 1, 1);
    created(&store, &sale).await;
    let (alice, bob) = (support::user("alice"), support::user("bob"));
    let paying = reserved(&store, &sale, &alice, 0).await;
    let lapsing = reserved(&store, &sale, &bob, 0).await;
    for reservation in [&paying, &lapsing] {
        opened_by_an_earlier_version(&client, &table, reservation).await;
    }

    assert_eq!(
        support::status_of(&store, &paying).await,
        Some(OrderStatus::Reserved)
    );
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.reserved, counts.available), (2, 1));
    assert_reconciles(&sale, &counts);
    assert_eq!(store.open_holds(&sale).await.expect("open holds").len(), 2);

    assert_eq!(
        pay_by_card(&store, &paying, Utc::now())
            .await
            .expect("pay by card"),
        PayOutcome::Paid
    );
    assert_eq!(
        store
            .release(&lapsing, ReleaseReason::Expired, lapsing.expires_at)
            .await
            .expect("release"),
        Settlement::Applied
    );
    assert_eq!(
        support::status_of(&store, &paying).await,
        Some(OrderStatus::Paid)
    );
    assert_eq!(
        support::status_of(&store, &lapsing).await,
        Some(OrderStatus::Expired)
    );
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.paid, counts.expired, counts.available), (1, 1, 2));
    assert_reconciles(&sale, &counts);
}

/// Issue 47: a settlement counts a capture when its write changes the order's recorded
/// payment to captured. When that write applied but its answer was lost, the SDK's
/// resend was refused (the state is captured already) and the change was counted by
/// no call. The write leaves a token of its call, so the refused resend still tells
/// that the change was its own; another call finds it `Unchanged`.
#[tokio::test]
async fn a_payment_state_change_whose_answer_was_lost_is_still_this_calls_change() {
    use flashsale_domain::payment::{OrderPayment, PaymentId, PaymentState};
    use flashsale_domain::ports::PaymentRecorded;

    let (store, _, table) = support::store().await;
    let sale = support::sale(2, 1, 1);
    created(&store, &sale).await;
    let reservation = support::reservation(&sale, &support::user("alice"), 0);
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("a unit");
    let id = PaymentId::new("pi_lost_answer");
    store
        .attach_payment(&reservation, &id)
        .await
        .expect("attach");
    let in_state = |state| OrderPayment {
        id: id.clone(),
        state,
    };
    assert_eq!(
        store
            .pay_with(
                &reservation,
                &in_state(PaymentState::Authorised),
                Utc::now()
            )
            .await
            .expect("pay"),
        PayOutcome::Paid
    );

    let (lossy, injector) = support::lossy_writes_client(Pattern::Only(0)).await;
    let lossy = DynamoStore::new(lossy, &table);
    let captured = in_state(PaymentState::Captured);
    assert_eq!(
        lossy
            .record_payment(&reservation, &captured)
            .await
            .expect("recorded"),
        PaymentRecorded::Changed
    );
    assert_eq!(
        (injector.injected(), injector.seen()),
        (1, 2),
        "the answer lost, the write resent"
    );
    assert_eq!(
        store
            .record_payment(&reservation, &captured)
            .await
            .expect("recorded"),
        PaymentRecorded::Unchanged,
        "another call's change"
    );
    let (order, _) = store
        .find(&reservation.order_id, &reservation.user_id)
        .await
        .expect("find")
        .expect("the order");
    assert_eq!(order.payment, Some(captured));
}
