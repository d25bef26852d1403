//! The SDK resends a write whose answer was lost (a 5xx, a cut connection), and the
//! resend's answer speaks only for itself: the try before it may have applied. These
//! drive the take-then-hold reserve's plain writes through the fault proxy on DynamoDB
//! Local: a try applies and its caller hears 500, then the resend meets what the proxy
//! scripts. No reserve may read such a resend as "nothing happened".

mod support;

use flashsale_adapters::{DynamoStore, ReserveMode};
use flashsale_domain::ports::{SaleCatalog, StockLedger};
use flashsale_domain::{OrderStatus, Reservation, Sale, WriteOutcome};
use flashsale_emulators::proxy::{Fault, FaultRule, Proxy};

const UPDATE_ITEM: &str = "DynamoDB_20120810.UpdateItem";

/// Faults the next plain write that no earlier rule faults, once.
fn once(fault: Fault) -> FaultRule {
    FaultRule {
        times: Some(1),
        ..FaultRule::always(UPDATE_ITEM, fault)
    }
}

/// A store on `table` whose requests pass through a proxy of their own, reserving as
/// take then hold; and a direct one, for the test's own reads.
async fn proxied() -> (Proxy, DynamoStore, DynamoStore) {
    let (proxy, sdk) = support::proxied().await;
    let (direct, _, table) = support::store().await;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), &table)
        .with_reserve_mode(ReserveMode::TakeThenHold);
    (proxy, store, direct)
}

async fn new_sale(store: &DynamoStore, stock: u32, shards: u16) -> Sale {
    let sale = support::sale(stock, shards, 1);
    assert!(store.create_sale(&sale).await.expect("create"));
    sale
}

/// Every shard's stock, and the takes no hold accounts for.
async fn ledger_of(store: &DynamoStore, sale: &Sale) -> (Vec<u64>, usize) {
    let stock = store.availability(sale).await.expect("stock");
    let unaccounted = store.unaccounted_takes(sale).await.expect("takes").len();
    (stock, unaccounted)
}

#[tokio::test]
async fn a_take_that_applied_and_whose_resend_met_a_transaction_is_in_doubt_not_contended() {
    let (proxy, store, direct) = proxied().await;
    let sale = new_sale(&direct, 2, 1).await;
    let reservation = support::reservation(&sale, &support::user("alice"), 0);

    proxy.set_faults(vec![
        once(Fault::CommitThenServerError),
        once(Fault::TransactionConflict),
    ]);
    let error = store
        .reserve(&sale, 0, &reservation)
        .await
        .expect_err("the take's first try applied: not a contended shard with nothing written");
    assert_eq!(error.outcome(), WriteOutcome::InDoubt, "{error:?}");
    assert_eq!(
        ledger_of(&direct, &sale).await,
        (vec![1], 1),
        "the lost try took the unit, with no hold yet"
    );

    // The grab asks the same shard again, as it does after a doubt: its take is found
    // and finished, not taken twice.
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("finished");
    assert_eq!(ledger_of(&direct, &sale).await, (vec![1], 0));
    assert_eq!(
        support::status_of(&direct, &reservation).await,
        Some(OrderStatus::Reserved)
    );
}

#[tokio::test]
async fn a_take_that_applied_and_whose_resend_was_refused_goes_on_to_its_hold() {
    let (proxy, store, direct) = proxied().await;
    let sale = new_sale(&direct, 2, 1).await;
    let reservation = support::reservation(&sale, &support::user("bob"), 0);

    proxy.set_faults(vec![once(Fault::CommitThenServerError)]);
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("the refusal names this order's own take: reserved, once");
    assert_eq!(ledger_of(&direct, &sale).await, (vec![1], 0));
    assert_eq!(
        support::status_of(&direct, &reservation).await,
        Some(OrderStatus::Reserved)
    );
}

#[tokio::test]
async fn a_hold_that_applied_and_whose_resend_met_a_transaction_is_in_doubt() {
    let (proxy, store, direct) = proxied().await;
    let sale = new_sale(&direct, 2, 1).await;
    let reservation = support::reservation(&sale, &support::user("carol"), 0);

    // The take passes; the hold applies, its answer is lost, and its resend conflicts.
    proxy.set_faults(vec![
        FaultRule {
            skip: 1,
            ..once(Fault::CommitThenServerError)
        },
        once(Fault::TransactionConflict),
    ]);
    let error = store
        .reserve(&sale, 0, &reservation)
        .await
        .expect_err("the hold's outcome is unknown");
    assert_eq!(error.outcome(), WriteOutcome::InDoubt, "{error:?}");
    assert_eq!(
        support::status_of(&direct, &reservation).await,
        Some(OrderStatus::Reserved),
        "the lost try recorded the hold"
    );
    assert_eq!(
        store
            .reserve(&sale, 0, &reservation)
            .await
            .expect("reserve"),
        Err(flashsale_domain::ports::ReserveRefusal::AlreadyHeld),
        "asked again, the reserve names the hold"
    );
    assert_eq!(ledger_of(&direct, &sale).await, (vec![1], 0));
}

#[tokio::test]
async fn a_give_back_that_applied_and_whose_resend_was_refused_gives_the_unit_back_once() {
    let (proxy, store, direct) = proxied().await;
    let sale = new_sale(&direct, 2, 2).await;
    let reservation = support::reservation(&sale, &support::user("dave"), 0);
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("held on shard 0");
    // A lost request of the same path took a unit on shard 1 as well: its hold is
    // refused (held on shard 0), and the take given back, once.
    proxy.set_faults(vec![
        FaultRule {
            // The take and the refused hold pass; the give-back's answer is lost.
            skip: 2,
            ..once(Fault::CommitThenServerError)
        },
        once(Fault::TransactionConflict),
    ]);
    let elsewhere = Reservation {
        shard: 1,
        ..reservation.clone()
    };
    let answer = store.reserve(&sale, 1, &elsewhere).await;
    assert!(
        matches!(
            answer,
            Ok(Err(flashsale_domain::ports::ReserveRefusal::AlreadyHeld))
        ) || answer
            .as_ref()
            .is_err_and(|error| error.outcome() == WriteOutcome::InDoubt),
        "{answer:?}"
    );
    assert_eq!(
        ledger_of(&direct, &sale).await,
        (vec![0, 1], 0),
        "shard 1's unit is back, once"
    );
}
