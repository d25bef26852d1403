//! The proxy's transaction-conflict mode, with the real SDK against DynamoDB Local: each
//! test makes a table of its own through a proxy of its own.
//!
//! Deterministic by construction: a second request is sent only once the proxy says the
//! first one holds its items, and the commit time is long enough (half a second) that
//! the hold outlasts whatever comes next on a loaded machine.

mod support;

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_get_items::TransactGetItemsError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, Get, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, TransactGetItem, TransactWriteItem, Update,
};
use flashsale_emulators::proxy::{ConflictMode, Proxy, ProxyOptions};
use support::dynamodb_through;

const TRANSACT_WRITE: &str = "DynamoDB_20120810.TransactWriteItems";
const TRANSACT_GET: &str = "DynamoDB_20120810.TransactGetItems";
const UPDATE_ITEM: &str = "DynamoDB_20120810.UpdateItem";
const PUT_ITEM: &str = "DynamoDB_20120810.PutItem";
const DELETE_ITEM: &str = "DynamoDB_20120810.DeleteItem";
const GET_ITEM: &str = "DynamoDB_20120810.GetItem";

/// Long enough that a hold outlasts the requests a test sends into it.
const COMMIT_TIME: Duration = Duration::from_millis(500);

/// A table of the test's own behind a conflict-mode proxy.
struct Rig {
    proxy: Proxy,
    /// Through the proxy, without retries: each call is one request, counted once.
    through: Client,
    /// Straight to DynamoDB Local: what was really written.
    direct: Client,
    table: String,
}

impl Rig {
    async fn start() -> Self {
        let emulators = flashsale_emulators::shared().await;
        let proxy = Proxy::start_with(
            &emulators.dynamodb_endpoint,
            0,
            ProxyOptions {
                conflicts: Some(ConflictMode::with_commit_time(COMMIT_TIME)),
            },
        )
        .await
        .expect("a proxy starts");
        let through = dynamodb_through(&proxy, emulators).await;
        let direct = Client::new(&emulators.sdk_config().await);
        let table = format!("conflicts-{}", flashsale_emulators::unique_suffix());
        let key = |name: &str, key_type| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(key_type)
                .build()
                .expect("a key element")
        };
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("an attribute")
        };
        through
            .create_table()
            .table_name(&table)
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .attribute_definitions(attribute("pk"))
            .attribute_definitions(attribute("sk"))
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .expect("CreateTable passes through");
        Self {
            proxy,
            through,
            direct,
            table,
        }
    }

    fn key(pk: &str) -> [(String, AttributeValue); 2] {
        [
            ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
            ("sk".to_owned(), AttributeValue::S("ITEM".to_owned())),
        ]
    }

    /// `SET v = value` on item `pk`.
    fn update(&self, pk: &str, value: &str) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk).into()))
            .update_expression("SET v = :v")
            .expression_attribute_values(":v", AttributeValue::S(value.to_owned()))
            .build()
            .expect("an update");
        TransactWriteItem::builder().update(update).build()
    }

    /// Item `pk` put whole, with more attributes than its key.
    fn put(&self, pk: &str, value: &str) -> TransactWriteItem {
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("v", AttributeValue::S(value.to_owned()))
            .item("extra", AttributeValue::N("7".to_owned()));
        for (name, value) in Self::key(pk) {
            put = put.item(name, value);
        }
        TransactWriteItem::builder()
            .put(put.build().expect("a put"))
            .build()
    }

    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
    ) -> Result<(), aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError>> {
        self.through
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await
            .map(|_| ())
    }

    /// `v` of item `pk`, read straight from DynamoDB Local.
    async fn value_of(&self, pk: &str) -> Option<String> {
        let item = self
            .direct
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk).into()))
            .consistent_read(true)
            .send()
            .await
            .expect("GetItem");
        item.item()?.get("v")?.as_s().ok().cloned()
    }

    /// Waits until in-flight transactions hold `items` items: the proxy has admitted
    /// them, so what is sent next meets their hold.
    async fn until_held(&self, items: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.proxy.held_items() < items {
            assert!(Instant::now() < deadline, "the transaction never held");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn conflicts_of(&self, operation: &str) -> (u64, u64) {
        let counts = self.proxy.counts();
        let op = counts
            .operations
            .get(operation)
            .cloned()
            .unwrap_or_default();
        (op.conflicts, op.by_outcome.get("400").copied().unwrap_or(0))
    }
}

/// The codes of a cancelled transaction's reasons, in request order.
fn cancellation_codes(
    error: aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError>,
) -> Vec<String> {
    match error.into_service_error() {
        TransactWriteItemsError::TransactionCanceledException(cancelled) => {
            let message = cancelled.message().unwrap_or_default().to_owned();
            let codes: Vec<String> = cancelled
                .cancellation_reasons()
                .iter()
                .map(|reason| reason.code().unwrap_or("-").to_owned())
                .collect();
            assert_eq!(
                message,
                format!(
                    "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
                    codes.join(", ")
                )
            );
            codes
        }
        other => panic!("not a cancellation: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_transactions_on_one_item_at_once_one_commits_and_the_other_is_cancelled_there() {
    let rig = Rig::start().await;
    let started = Instant::now();
    let (a, b) = tokio::join!(
        rig.transact(vec![rig.update("own-a", "a"), rig.update("shared", "a")]),
        rig.transact(vec![rig.update("own-b", "b"), rig.update("shared", "b")]),
    );
    let elapsed = started.elapsed();
    let (winner, loser) = match (a, b) {
        (Ok(()), Err(error)) => ("a", error),
        (Err(error), Ok(())) => ("b", error),
        other => panic!("exactly one commits: {other:?}"),
    };
    let loser_name = if winner == "a" { "b" } else { "a" };
    assert_eq!(cancellation_codes(loser), ["None", "TransactionConflict"]);
    assert_eq!(rig.value_of("shared").await.as_deref(), Some(winner));
    assert_eq!(
        rig.value_of(&format!("own-{winner}")).await.as_deref(),
        Some(winner)
    );
    assert_eq!(
        rig.value_of(&format!("own-{loser_name}")).await,
        None,
        "nothing of the cancelled transaction was written"
    );
    assert!(
        elapsed >= COMMIT_TIME,
        "the winner's answer waited out its commit time: {elapsed:?}"
    );
    assert_eq!(rig.proxy.held_items(), 0, "released once answered");
    assert_eq!(rig.conflicts_of(TRANSACT_WRITE), (1, 1));
    let transact = &rig.proxy.counts().operations[TRANSACT_WRITE];
    assert_eq!((transact.total, transact.by_outcome["200"]), (2, 1));
    eprintln!("two at once: answered in {elapsed:?}, winner {winner}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_writes_of_a_held_item_are_refused_unapplied_and_reads_pass() {
    let rig = Rig::start().await;
    let held = rig.transact(vec![rig.update("held", "transaction")]);
    let during = async {
        rig.until_held(1).await;
        let update = rig
            .through
            .update_item()
            .table_name(&rig.table)
            .set_key(Some(Rig::key("held").into()))
            .update_expression("SET v = :v")
            .expression_attribute_values(":v", AttributeValue::S("plain".to_owned()))
            .send()
            .await
            .expect_err("an update of a held item is refused");
        assert!(
            update
                .as_service_error()
                .is_some_and(|e| e.is_transaction_conflict_exception()),
            "{update:?}"
        );
        let mut put = rig
            .through
            .put_item()
            .table_name(&rig.table)
            .item("v", AttributeValue::S("plain".to_owned()));
        for (name, value) in Rig::key("held") {
            put = put.item(name, value);
        }
        let put = put
            .send()
            .await
            .expect_err("a put of a held item is refused");
        assert!(
            put.as_service_error()
                .is_some_and(|e| e.is_transaction_conflict_exception()),
            "{put:?}"
        );
        let delete = rig
            .through
            .delete_item()
            .table_name(&rig.table)
            .set_key(Some(Rig::key("held").into()))
            .send()
            .await
            .expect_err("a delete of a held item is refused");
        assert!(
            delete
                .as_service_error()
                .is_some_and(|e| e.is_transaction_conflict_exception()),
            "{delete:?}"
        );
        // A read passes: it sees the item before or after the commit, never a conflict.
        rig.through
            .get_item()
            .table_name(&rig.table)
            .set_key(Some(Rig::key("held").into()))
            .send()
            .await
            .expect("a read of a held item passes");
        // A plain write of another item passes, and holds nothing.
        rig.through
            .update_item()
            .table_name(&rig.table)
            .set_key(Some(Rig::key("free").into()))
            .update_expression("SET v = :v")
            .expression_attribute_values(":v", AttributeValue::S("plain".to_owned()))
            .send()
            .await
            .expect("a plain write of a free item passes");
        assert_eq!(rig.proxy.held_items(), 1, "all of it within the hold");
    };
    let (held, ()) = tokio::join!(held, during);
    held.expect("the transaction commits");
    assert_eq!(rig.value_of("held").await.as_deref(), Some("transaction"));
    assert_eq!(rig.value_of("free").await.as_deref(), Some("plain"));
    assert_eq!(rig.conflicts_of(UPDATE_ITEM), (1, 1));
    assert_eq!(rig.conflicts_of(PUT_ITEM), (1, 1));
    assert_eq!(rig.conflicts_of(DELETE_ITEM), (1, 1));
    assert_eq!(rig.conflicts_of(GET_ITEM), (0, 0));
    assert_eq!(
        rig.proxy.counts().operations[UPDATE_ITEM].by_outcome["200"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disjoint_transactions_both_commit_and_a_put_conflicts_with_its_keys_update() {
    let rig = Rig::start().await;
    let (one, two) = tokio::join!(
        rig.transact(vec![rig.update("one", "1")]),
        rig.transact(vec![rig.update("two", "2")]),
    );
    one.expect("disjoint items: the first commits");
    two.expect("disjoint items: the second commits");

    // The Put names the whole item; the proxy keys it through the described schema.
    let put = rig.transact(vec![rig.put("whole", "put")]);
    let against = async {
        rig.until_held(1).await;
        let update = rig
            .transact(vec![
                rig.update("other", "x"),
                rig.update("whole", "update"),
            ])
            .await
            .expect_err("an update of the put's key conflicts");
        let codes = cancellation_codes(update);
        let get = Get::builder()
            .table_name(&rig.table)
            .set_key(Some(Rig::key("whole").into()))
            .build()
            .expect("a get");
        let read = rig
            .through
            .transact_get_items()
            .transact_items(TransactGetItem::builder().get(get).build())
            .send()
            .await
            .expect_err("a transactional read of a held item is cancelled");
        let read_codes: Vec<String> = match read.into_service_error() {
            TransactGetItemsError::TransactionCanceledException(cancelled) => cancelled
                .cancellation_reasons()
                .iter()
                .map(|reason| reason.code().unwrap_or("-").to_owned())
                .collect(),
            other => panic!("not a cancellation: {other:?}"),
        };
        (codes, read_codes)
    };
    let (put, (codes, read_codes)) = tokio::join!(put, against);
    put.expect("the put commits");
    assert_eq!(codes, ["None", "TransactionConflict"]);
    assert_eq!(read_codes, ["TransactionConflict"]);
    assert_eq!(rig.value_of("whole").await.as_deref(), Some("put"));
    assert_eq!(rig.value_of("other").await, None);
    assert_eq!(rig.conflicts_of(TRANSACT_WRITE), (1, 1));
    assert_eq!(rig.conflicts_of(TRANSACT_GET), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_item_commits_the_next_transaction_and_with_the_mode_off_none_conflict() {
    let rig = Rig::start().await;
    rig.transact(vec![rig.update("item", "first")])
        .await
        .expect("the first commits");
    assert_eq!(rig.proxy.held_items(), 0);
    rig.transact(vec![rig.update("item", "second")])
        .await
        .expect("after the hold ended, the next commits");
    assert_eq!(rig.value_of("item").await.as_deref(), Some("second"));

    // Off over HTTP, as a program using the proxy would.
    let http = reqwest::Client::new();
    let off = http
        .delete(format!("{}/__conflicts", rig.proxy.url()))
        .send()
        .await
        .expect("DELETE /__conflicts");
    assert_eq!(off.status(), 200);
    assert_eq!(rig.proxy.conflict_mode(), None);
    let (a, b) = tokio::join!(
        rig.transact(vec![rig.update("item", "a")]),
        rig.transact(vec![rig.update("item", "b")]),
    );
    a.expect("mode off: no conflict");
    b.expect("mode off: no conflict");

    let on = http
        .put(format!("{}/__conflicts", rig.proxy.url()))
        .body(r#"{"commit_time_ms": 15}"#)
        .send()
        .await
        .expect("PUT /__conflicts");
    assert_eq!(on.status(), 200);
    assert_eq!(
        rig.proxy.conflict_mode(),
        Some(ConflictMode::with_commit_time(Duration::from_millis(15)))
    );
    let bad = http
        .put(format!("{}/__conflicts", rig.proxy.url()))
        .body(r#"{"commit_time": "soon"}"#)
        .send()
        .await
        .expect("PUT /__conflicts");
    assert_eq!(bad.status(), 400, "a malformed mode is refused");
    assert_eq!(rig.conflicts_of(TRANSACT_WRITE), (0, 0));
    assert_eq!(rig.proxy.counts().of(TRANSACT_WRITE), 4);
}
