//! Sales with more shards than one DynamoDB request holds (100 items a transaction,
//! 100 keys a `BatchGetItem`), against DynamoDB Local: created in several transactions
//! yet never seen half made, read and sold out whole, and completed by a retry when a
//! create dies part way.

mod support;

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{Duration, Utc};
use flashsale_adapters::DynamoStore;
use flashsale_domain::gate::SoldOutGate;
use flashsale_domain::ports::{
    ReserveRefusal, SaleCatalog, ShardTakers, StockLedger, SystemClock, SystemIds,
};
use flashsale_domain::sale::MAX_SHARDS;
use flashsale_domain::service::SaleService;
use flashsale_domain::{Reservation, Sale};
use tokio::task::JoinSet;

use support::conflicts::Pattern;

/// More shards than one request holds, and not a multiple of 99 or 100, so every
/// request kind ends on a short batch.
const SHARDS: u16 = 250;

fn stats_service(store: &DynamoStore) -> SaleService {
    let store = Arc::new(store.clone());
    SaleService {
        catalog: store.clone(),
        ledger: store.clone(),
        orders: store,
        clock: Arc::new(SystemClock),
        ids: Arc::new(SystemIds),
    }
}

/// `reservation` reserved on `shard`, resent while the answer is transient. DynamoDB
/// Local times out a transaction that waited too long for its table lock (other tests'
/// surges share it), saying AWS would have served it; a grab resends the same
/// reservation too (idempotent per order), and a resent one that finds its own hold
/// committed before.
async fn reserve_resending(
    store: &DynamoStore,
    sale: &Sale,
    shard: u16,
    reservation: &Reservation,
) -> Result<Result<(), ReserveRefusal>, flashsale_domain::StoreError> {
    let mut resent = 0_u64;
    loop {
        match store.reserve(sale, shard, reservation).await {
            Err(error) if error.is_retryable() && resent < 10 => {
                resent += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100 * resent)).await;
            }
            Ok(Err(ReserveRefusal::AlreadyHeld)) if resent > 0 => return Ok(Ok(())),
            answer => return answer,
        }
    }
}

/// Takes the one unit of every shard in `shards`, one buyer each, all at once.
/// One buyer per shard of `shards` takes its unit; their reservations.
async fn take_one_unit_of_each(
    store: &DynamoStore,
    sale: &Sale,
    shards: &[u16],
) -> Vec<Reservation> {
    let mut buyers = JoinSet::new();
    for &shard in shards {
        let (store, sale) = (store.clone(), sale.clone());
        buyers.spawn(async move {
            let buyer = support::user(&format!("buyer-{shard}"));
            let reservation = support::reservation(&sale, &buyer, shard);
            let answer = reserve_resending(&store, &sale, shard, &reservation).await;
            (answer, reservation)
        });
    }
    let mut reservations = Vec::new();
    while let Some(outcome) = buyers.join_next().await {
        let (answer, reservation) = outcome.expect("the buyer's task");
        answer.expect("reserve").expect("the shard had its unit");
        reservations.push(reservation);
    }
    reservations
}

async fn shard_exists(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    sale: &Sale,
    shard: u16,
) -> bool {
    client
        .get_item()
        .table_name(table)
        .key(
            "pk",
            AttributeValue::S(format!("SALE#{}#SHARD#{shard}", sale.sale_id)),
        )
        .key("sk", AttributeValue::S("STOCK".to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("get the shard")
        .item
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_of_250_shards_sells_out_exactly_and_its_stats_reconcile() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(u32::from(SHARDS), SHARDS, 1);
    assert!(store.create_sale(&sale).await.expect("create"));
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![1; usize::from(SHARDS)]
    );

    let every_shard: Vec<u16> = (0..SHARDS).collect();
    take_one_unit_of_each(&store, &sale, &every_shard).await;

    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![0; usize::from(SHARDS)],
        "every unit of every shard sold"
    );
    for shard in [0, 99, 100, SHARDS - 1] {
        let late = support::reservation(&sale, &support::user("late"), shard);
        assert!(
            matches!(
                reserve_resending(&store, &sale, shard, &late)
                    .await
                    .expect("reserve"),
                Err(ReserveRefusal::ShardEmpty(takers)) if takers.len() == 1
            ),
            "nothing is sold twice (shard {shard})"
        );
    }
    let stats = stats_service(&store)
        .stats(&sale.sale_id)
        .await
        .expect("stats");
    assert_eq!(stats.counts.available, 0);
    assert_eq!(stats.counts.reserved, u64::from(SHARDS));
    assert!(stats.consistent, "{stats:?}");
}

#[tokio::test]
async fn a_sale_of_the_most_shards_is_created_and_read_whole() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(u32::from(MAX_SHARDS) * 3, MAX_SHARDS, 1);
    assert!(store.create_sale(&sale).await.expect("create"));
    assert_eq!(
        store.availability(&sale).await.expect("availability"),
        vec![3; usize::from(MAX_SHARDS)]
    );
    assert_eq!(
        store.find_sale(&sale.sale_id).await.expect("find"),
        Some(sale)
    );
}

#[tokio::test]
async fn a_create_that_dies_part_way_shows_no_sale_and_a_retry_completes_it() {
    let (store, client, table) = support::store().await;
    // Calls 0 and 1 (the claim and the first 99 shards) go through; every later one
    // fails, as if the process had died after them.
    let (cut_off, injector) = support::conflicting_client(Pattern::FromCall(2)).await;
    let dying = DynamoStore::new(cut_off, &table);
    let first = support::sale(2 * u32::from(SHARDS), SHARDS, 1);
    let error = dying.create_sale(&first).await.expect_err("cut off");
    assert!(error.is_retryable(), "{error:?}");
    assert!(injector.injected() > 0);
    assert!(
        shard_exists(&client, &table, &first, 0).await,
        "the first batch was written"
    );
    assert!(
        !shard_exists(&client, &table, &first, SHARDS - 1).await,
        "the last was not"
    );

    // Half made is not made: not found, not listed.
    assert_eq!(store.find_sale(&first.sale_id).await.expect("find"), None);
    let listed = store
        .sales_ending_after(Utc::now() - Duration::days(1))
        .await
        .expect("list");
    assert!(listed.iter().all(|sale| sale.sale_id != first.sale_id));

    // The retry, here with another stock, takes over and rewrites every shard.
    let retry = Sale {
        stock_total: u32::from(SHARDS),
        name: "Retried".to_owned(),
        ..first.clone()
    };
    assert!(store.create_sale(&retry).await.expect("retry"));
    assert_eq!(
        store.find_sale(&retry.sale_id).await.expect("find"),
        Some(retry.clone())
    );
    assert_eq!(
        store.availability(&retry).await.expect("availability"),
        vec![1; usize::from(SHARDS)],
        "the leftover shards hold the retry's stock"
    );

    // Once made, another create is the conflict it always was and writes no shard.
    take_one_unit_of_each(&store, &retry, &[0, SHARDS - 1]).await;
    assert!(!store.create_sale(&first).await.expect("create again"));
    let available = store.availability(&retry).await.expect("availability");
    assert_eq!(available.iter().sum::<u64>(), u64::from(SHARDS) - 2);
    assert_eq!((available[0], available[usize::from(SHARDS) - 1]), (0, 0));
}

#[tokio::test]
async fn the_sold_out_gate_rechecks_every_shard_of_a_sale_of_250() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(u32::from(SHARDS), SHARDS, 1);
    assert!(store.create_sale(&sale).await.expect("create"));
    // One shard emptied in each batch of the recheck's read.
    let emptied = [0, 150, SHARDS - 1];
    let holders = take_one_unit_of_each(&store, &sale, &emptied).await;

    let recheck_after = Duration::seconds(1);
    let gate = SoldOutGate::new(recheck_after);
    let seen_at = Utc::now();
    for shard in 0..SHARDS {
        gate.mark_empty(
            &sale.sale_id,
            SHARDS,
            shard,
            ShardTakers::default(),
            seen_at,
        );
    }
    let stale = seen_at + recheck_after;
    let plan = gate.plan(&sale.sale_id, SHARDS, 0..SHARDS, stale);
    assert!(plan.shards.is_empty(), "every shard marked empty");
    let recheck = plan.recheck.expect("a stale mark hands out the recheck");
    recheck.settle(store.shard_states(&sale).await, stale);

    let reopened = gate.plan(&sale.sale_id, SHARDS, 0..SHARDS, stale).shards;
    let expected: Vec<u16> = (0..SHARDS)
        .filter(|shard| !emptied.contains(shard))
        .collect();
    assert_eq!(reopened, expected);
    // And the read brought who holds the empty shards' units.
    for holder in &holders {
        assert_eq!(
            gate.shard_taken_by(&sale.sale_id, SHARDS, &holder.order_id),
            Some(holder.shard)
        );
    }
}
