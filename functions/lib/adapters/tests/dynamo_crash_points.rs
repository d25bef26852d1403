//! A reservation and a release are each more than one write: the take on the shard,
//! then the hold (a reserve); the hold and order, then the shard (a release). These
//! drills kill the writer between its writes, on DynamoDB Local, and prove for each
//! crash point that the stock is counted exactly once, the per-user limit holds, and
//! no unit is stranded: a retry finishes the work, or the reconciler's
//! `unaccounted_takes` + `return_take` gives the unit back.
//!
//! "Killed" is a client whose plain writes fail from the n-th on, retries included
//! (`support::failing_writes_client`): the writes before it committed, none after.

mod support;

use chrono::Utc;
use flashsale_adapters::{DynamoStore, ReserveMode};
use flashsale_domain::ports::{
    OrderBook, ReserveRefusal, SaleCatalog, Settlement, StockLedger, Take, TakeReturn,
};
use flashsale_domain::sale::StockCounts;
use flashsale_domain::{OrderStatus, ReleaseReason, Reservation, Sale};

use support::conflicts::Pattern;

/// A store whose writer dies after its first `writes` plain writes. It reserves as
/// take then hold, the path with a crash point between its writes (a transaction has
/// none: both or neither).
async fn dying_after(writes: u64, table: &str) -> DynamoStore {
    let (client, _) = support::failing_writes_client(Pattern::FromCall(writes)).await;
    DynamoStore::new(client, table).with_reserve_mode(ReserveMode::TakeThenHold)
}

fn accounted(counts: &StockCounts) -> u64 {
    counts.available + counts.reserved + counts.paid
}

/// Every shard's stock, in shard order.
async fn stock_of(store: &DynamoStore, sale: &Sale) -> Vec<u64> {
    store.availability(sale).await.expect("stock")
}

/// The takes no open or paid hold accounts for: what the reconciler would give back.
async fn unaccounted(store: &DynamoStore, sale: &Sale) -> Vec<Take> {
    store.unaccounted_takes(sale).await.expect("takes")
}

async fn new_sale(store: &DynamoStore, stock: u32, shards: u16, limit: u32) -> Sale {
    let sale = support::sale(stock, shards, limit);
    assert!(store.create_sale(&sale).await.expect("create"));
    sale
}

#[tokio::test]
async fn a_reserve_killed_after_its_take_is_finished_by_its_retry_exactly_once() {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 2, 1, 1).await;
    let alice = support::user("alice");
    let reservation = support::reservation(&sale, &alice, 0);

    let error = dying_after(1, &table)
        .await
        .reserve(&sale, 0, &reservation)
        .await
        .expect_err("killed before the hold");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    let takes = unaccounted(&store, &sale).await;
    assert_eq!(takes.len(), 1, "the take, with no hold behind it");
    assert_eq!(takes[0].order_id, reservation.order_id);
    assert_eq!(takes[0].user_id, alice);

    // The grab's retry on the same shard finds its take and records the hold.
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("finished");
    assert_eq!(stock_of(&store, &sale).await, vec![1], "taken once");
    assert!(unaccounted(&store, &sale).await.is_empty());
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.reserved, accounted(&counts)), (1, 2), "{counts:?}");
    // And her limit of one holds: a second order of hers is refused, stock unchanged.
    let second = support::reservation(&sale, &alice, 0);
    assert_eq!(
        store.reserve(&sale, 0, &second).await.expect("reserve"),
        Err(ReserveRefusal::LimitReached)
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
}

#[tokio::test]
async fn a_take_no_retry_finishes_is_given_back_and_its_late_hold_is_refused() {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 1, 1, 1).await;
    let alice = support::user("alice");
    let reservation = support::reservation(&sale, &alice, 0);
    dying_after(1, &table)
        .await
        .reserve(&sale, 0, &reservation)
        .await
        .expect_err("killed before the hold");
    assert_eq!(stock_of(&store, &sale).await, vec![0]);
    let counts = store.count(&sale).await.expect("count");
    assert_eq!(accounted(&counts), 0, "stranded until returned: {counts:?}");

    let takes = unaccounted(&store, &sale).await;
    assert_eq!(takes.len(), 1);
    assert_eq!(
        store
            .return_take(&takes[0], Utc::now())
            .await
            .expect("return"),
        TakeReturn::Returned
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    assert_eq!(
        store
            .return_take(&takes[0], Utc::now())
            .await
            .expect("again"),
        TakeReturn::AlreadyReturned,
        "idempotent"
    );
    assert!(unaccounted(&store, &sale).await.is_empty());

    // The dead grab's order can no longer be held: its retry (or a write still on its
    // way) meets the settled hold the return recorded, and the unit stays on sale.
    assert_eq!(
        store
            .reserve(&sale, 0, &reservation)
            .await
            .expect("reserve"),
        Err(ReserveRefusal::AlreadyHeld)
    );
    assert_eq!(
        support::status_of(&store, &reservation).await,
        Some(OrderStatus::Expired)
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    // Someone else buys it, once.
    let bob = support::reservation(&sale, &support::user("bob"), 0);
    store
        .reserve(&sale, 0, &bob)
        .await
        .expect("reserve")
        .expect("bob");
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.available, counts.reserved), (0, 1), "{counts:?}");
    assert_eq!(accounted(&counts), 1);
}

#[tokio::test]
async fn a_take_whose_order_is_held_by_then_is_left_alone() {
    let (store, _, _) = support::store().await;
    let sale = new_sale(&store, 2, 1, 1).await;
    let alice = support::user("alice");
    let reservation = support::reservation(&sale, &alice, 0);
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("held");
    let take = flashsale_domain::ports::Take {
        shard: 0,
        order_id: reservation.order_id.clone(),
        user_id: alice,
        taken_at: reservation.created_at,
    };
    // What an index read that lagged the hold would report.
    assert_eq!(
        store.return_take(&take, Utc::now()).await.expect("return"),
        TakeReturn::Accounted
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    assert_eq!(
        support::status_of(&store, &reservation).await,
        Some(OrderStatus::Reserved)
    );
}

#[tokio::test]
async fn a_take_superseded_by_a_retry_on_another_shard_is_given_back() {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 2, 2, 1).await;
    let alice = support::user("alice");
    let first = support::reservation(&sale, &alice, 0);
    dying_after(1, &table)
        .await
        .reserve(&sale, 0, &first)
        .await
        .expect_err("killed before the hold");
    // The grab went on to shard 1 with the same order.
    let elsewhere = Reservation {
        shard: 1,
        ..first.clone()
    };
    store
        .reserve(&sale, 1, &elsewhere)
        .await
        .expect("reserve")
        .expect("held on shard 1");
    assert_eq!(stock_of(&store, &sale).await, vec![0, 0]);

    let takes = unaccounted(&store, &sale).await;
    assert_eq!(takes.len(), 1);
    assert_eq!(takes[0].shard, 0);
    assert_eq!(
        store
            .return_take(&takes[0], Utc::now())
            .await
            .expect("return"),
        TakeReturn::Returned
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1, 0]);
    assert_eq!(
        support::status_of(&store, &elsewhere).await,
        Some(OrderStatus::Reserved)
    );
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.reserved, accounted(&counts)), (1, 2), "{counts:?}");
}

#[tokio::test]
async fn a_reserve_killed_before_its_undo_is_in_doubt_and_its_retry_or_the_reconciler_gives_the_unit_back()
 {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 4, 1, 1).await;
    let alice = support::user("alice");
    let held = support::reservation(&sale, &alice, 0);
    store
        .reserve(&sale, 0, &held)
        .await
        .expect("reserve")
        .expect("held");
    // Two more orders of hers: take, hold refused at the limit, undo killed. Not a
    // refusal: that would send her away and leave the unit to the reconciler's grace.
    let retried = support::reservation(&sale, &alice, 0);
    let abandoned = support::reservation(&sale, &alice, 0);
    for over in [&retried, &abandoned] {
        let error = dying_after(2, &table)
            .await
            .reserve(&sale, 0, over)
            .await
            .expect_err("killed before its undo");
        assert!(error.is_retryable(), "{error:?}");
    }
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    assert_eq!(unaccounted(&store, &sale).await.len(), 2);

    // The grab's retry on the same shard finds its take, is refused again, and undoes it.
    assert_eq!(
        store.reserve(&sale, 0, &retried).await.expect("retry"),
        Err(ReserveRefusal::LimitReached)
    );
    assert_eq!(stock_of(&store, &sale).await, vec![2]);

    // One whose retry never comes is the reconciler's.
    let takes = unaccounted(&store, &sale).await;
    assert_eq!(takes.len(), 1);
    assert_eq!(takes[0].order_id, abandoned.order_id);
    assert_eq!(
        store
            .return_take(&takes[0], Utc::now())
            .await
            .expect("return"),
        TakeReturn::Returned
    );
    assert_eq!(stock_of(&store, &sale).await, vec![3]);
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.reserved, accounted(&counts)), (1, 4), "{counts:?}");
}

#[tokio::test]
async fn a_release_killed_before_its_shard_write_is_finished_by_its_retry() {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 1, 1, 1).await;
    let held = support::reservation(&sale, &support::user("alice"), 0);
    store
        .reserve(&sale, 0, &held)
        .await
        .expect("reserve")
        .expect("held");

    let error = dying_after(0, &table)
        .await
        .release(&held, ReleaseReason::Expired, Utc::now())
        .await
        .expect_err("killed before the give-back");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(
        support::status_of(&store, &held).await,
        Some(OrderStatus::Expired)
    );
    assert_eq!(stock_of(&store, &sale).await, vec![0]);
    assert_eq!(
        unaccounted(&store, &sale).await.len(),
        1,
        "the reconciler would see it"
    );

    // The timer's retry finds the hold settled and finishes the give-back, once.
    for _ in 0..2 {
        assert_eq!(
            store
                .release(&held, ReleaseReason::Expired, Utc::now())
                .await
                .expect("release"),
            Settlement::AlreadySettled(OrderStatus::Expired)
        );
        assert_eq!(stock_of(&store, &sale).await, vec![1]);
    }
    assert!(unaccounted(&store, &sale).await.is_empty());
    let counts = store.count(&sale).await.expect("count");
    assert_eq!((counts.available, accounted(&counts)), (1, 1), "{counts:?}");
}

#[tokio::test]
async fn a_release_killed_before_its_shard_write_is_finished_by_the_reconciler() {
    let (store, _, table) = support::store().await;
    let sale = new_sale(&store, 1, 1, 1).await;
    let held = support::reservation(&sale, &support::user("alice"), 0);
    store
        .reserve(&sale, 0, &held)
        .await
        .expect("reserve")
        .expect("held");
    dying_after(0, &table)
        .await
        .release(&held, ReleaseReason::Cancelled, Utc::now())
        .await
        .expect_err("killed before the give-back");

    let takes = unaccounted(&store, &sale).await;
    assert_eq!(takes.len(), 1);
    assert_eq!(
        store
            .return_take(&takes[0], Utc::now())
            .await
            .expect("return"),
        TakeReturn::Returned
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
    assert_eq!(
        support::status_of(&store, &held).await,
        Some(OrderStatus::Cancelled)
    );
    // A late retry of the release gives nothing back twice.
    assert_eq!(
        store
            .release(&held, ReleaseReason::Cancelled, Utc::now())
            .await
            .expect("release"),
        Settlement::AlreadySettled(OrderStatus::Cancelled)
    );
    assert_eq!(stock_of(&store, &sale).await, vec![1]);
}
