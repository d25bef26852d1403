//! `DynamoStore` as the [`Blocklist`] against DynamoDB Local: one item per blocked user
//! in the `BLOCKLIST` partition, idempotent writes, and a whole-list read that follows
//! every page. The port's promises themselves are the contract suite's (tests/contract.rs).

mod support;

use std::error::Error as _;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Duration;
use flashsale_adapters::{CorruptItem, ItemError};
use flashsale_domain::ports::{Blocklist, SaleCatalog, StockLedger};
use flashsale_domain::{StoreError, UserId};

async fn sorted_blocked(store: &impl Blocklist) -> Vec<UserId> {
    let mut users = store.blocked().await.expect("read the blocklist");
    users.sort();
    users
}

/// The sort keys of every item in the blocklist partition, read raw.
async fn blocklist_keys(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<String> {
    let output = client
        .query()
        .table_name(table)
        .key_condition_expression("pk = :blocklist")
        .expression_attribute_values(":blocklist", AttributeValue::S("BLOCKLIST".to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("query the partition");
    let mut keys: Vec<String> = output
        .items()
        .iter()
        .map(|item| item["sk"].as_s().expect("sk is a string").clone())
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn blocking_is_idempotent_and_keeps_one_item_per_user_in_the_blocklist_partition() {
    let (store, client, table) = support::store().await;
    let (alice, bob) = (support::user("alice"), support::user("bob"));
    store.block(&alice).await.expect("block alice");
    store.block(&bob).await.expect("block bob");
    store.block(&alice).await.expect("block alice again");

    assert_eq!(sorted_blocked(&store).await, vec![alice, bob]);
    assert_eq!(
        blocklist_keys(&client, &table).await,
        ["USER#alice", "USER#bob"]
    );
}

#[tokio::test]
async fn unblocking_removes_the_user_and_unblocking_someone_not_blocked_succeeds() {
    let (store, client, table) = support::store().await;
    let (alice, bob) = (support::user("alice"), support::user("bob"));
    store.block(&alice).await.expect("block alice");
    store.block(&bob).await.expect("block bob");

    store.unblock(&alice).await.expect("unblock alice");
    store.unblock(&alice).await.expect("unblock alice again");
    store
        .unblock(&support::user("never-blocked"))
        .await
        .expect("unblock a stranger");

    assert_eq!(sorted_blocked(&store).await, vec![bob]);
    assert_eq!(blocklist_keys(&client, &table).await, ["USER#bob"]);
}

#[tokio::test]
async fn the_whole_blocklist_is_read_across_pages() {
    let (store, pages) = support::small_pages_store(2).await;
    let users: Vec<UserId> = (0..7).map(|i| support::user(&format!("bot-{i}"))).collect();
    for user in &users {
        store.block(user).await.expect("block");
    }
    let before = pages.queries();

    assert_eq!(sorted_blocked(&store).await, users);
    assert!(
        pages.queries() - before >= 4,
        "7 users at 2 a page take at least 4 pages, took {}",
        pages.queries() - before
    );
}

#[tokio::test]
async fn the_blocklist_lives_apart_from_sales_and_their_stock() {
    let (store, _, _) = support::store().await;
    let sale = support::sale(3, 1, 1);
    assert!(store.create_sale(&sale).await.expect("create the sale"));
    let alice = support::user("alice");
    let reservation = support::reservation(&sale, &alice, 0);
    store
        .reserve(&sale, 0, &reservation)
        .await
        .expect("reserve")
        .expect("stock and limit allow it");
    store.block(&support::user("bot")).await.expect("block");

    assert_eq!(sorted_blocked(&store).await, vec![support::user("bot")]);
    let sales = store
        .sales_ending_after(sale.ends_at - Duration::days(1))
        .await
        .expect("sales");
    assert_eq!(sales, vec![sale.clone()]);
    assert_eq!(store.availability(&sale).await.expect("availability"), [2]);
}

#[tokio::test]
async fn a_corrupt_blocklist_item_is_a_permanent_error_naming_it() {
    let (store, client, table) = support::store().await;
    store.block(&support::user("alice")).await.expect("block");
    client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("BLOCKLIST".to_owned()))
        .item("sk", AttributeValue::S("NOT-A-USER".to_owned()))
        .send()
        .await
        .expect("write a stray item");

    let error = store.blocked().await.expect_err("corrupt");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    let corrupt = error
        .source()
        .and_then(|source| source.downcast_ref::<CorruptItem>())
        .expect("the source names the item");
    assert_eq!(
        (corrupt.pk.as_str(), corrupt.sk.as_str()),
        ("BLOCKLIST", "NOT-A-USER")
    );
    assert!(
        matches!(&corrupt.source, ItemError::Form { name, .. } if name == "sk"),
        "{corrupt:?}"
    );
}

#[tokio::test]
async fn a_blocklist_on_a_missing_table_is_a_permanent_error() {
    let store = flashsale_adapters::DynamoStore::new(support::dynamodb().await, "no-such-table");
    for error in [
        store.blocked().await.expect_err("no table"),
        store
            .block(&support::user("alice"))
            .await
            .expect_err("no table"),
        store
            .unblock(&support::user("alice"))
            .await
            .expect_err("no table"),
    ] {
        assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    }
}
