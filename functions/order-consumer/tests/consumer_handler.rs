//! The order consumer through its handler, with SQS events built from
//! `events/order-consumer.json`, the domain's in-memory fakes and a recording
//! dead-letter queue.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use chrono::{Duration, TimeZone, Utc};
use flashsale_domain::error::StoreError;
use flashsale_domain::ports::{OrderBook, ReleaseScheduler, SaleCatalog, StockLedger, Take};
use flashsale_domain::testing;
use flashsale_domain::testing::{InMemoryStore, ManualClock, RecordingScheduler};
use flashsale_domain::{OrderId, OrderStatus, ReleaseReason, Reservation, Sale};
use flashsale_lambda::testing::fixture;
use flashsale_lambda::{ConfigError, FromEnv as _};
use flashsale_order_consumer::{
    Config, DeadLetter, DeadLetterQueue, Deps, MAX_CONCURRENT_RECORDS, ParkError, Ports, handler,
};
use serde_json::{Value, json};

/// A dead-letter queue that records what it was given, and can be told to fail.
#[derive(Default)]
struct RecordingDeadLetters {
    parked: Mutex<Vec<DeadLetter>>,
    fail: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
#[error("the dead-letter queue is down")]
struct Down;

#[async_trait]
impl DeadLetterQueue for RecordingDeadLetters {
    async fn park(&self, letter: &DeadLetter) -> Result<(), ParkError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(ParkError(Box::new(Down)));
        }
        self.parked.lock().unwrap().push(letter.clone());
        Ok(())
    }
}

/// Scheduler that fails for chosen orders, and measures how many calls overlap.
#[derive(Default)]
struct FlakyScheduler {
    inner: RecordingScheduler,
    failing: Mutex<HashSet<OrderId>>,
    permanent: AtomicBool,
    delay_ms: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
#[error("scheduler throttled the request")]
struct Throttled;

#[async_trait]
impl ReleaseScheduler for FlakyScheduler {
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = self.delay_ms.load(Ordering::SeqCst) as u64;
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.failing.lock().unwrap().contains(&reservation.order_id) {
            return Err(if self.permanent.load(Ordering::SeqCst) {
                StoreError::permanent("schedule_release", Throttled)
            } else {
                StoreError::transient("schedule_release", Throttled)
            });
        }
        self.inner.schedule_release(reservation).await
    }

    async fn cancel_release(&self, order_id: &OrderId) -> Result<(), StoreError> {
        self.inner.cancel_release(order_id).await
    }
}

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    scheduler: Arc<FlakyScheduler>,
    dead_letters: Arc<RecordingDeadLetters>,
    sale: Sale,
}

impl World {
    async fn new() -> Self {
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let store = Arc::new(InMemoryStore::new());
        let sale = testing::sale(100, 8).starting_at(start).build();
        assert!(store.create_sale(&sale).await.unwrap());
        let scheduler = Arc::new(FlakyScheduler::default());
        let dead_letters = Arc::new(RecordingDeadLetters::default());
        let deps = Deps::from_ports(Ports {
            orders: store.clone(),
            catalog: store.clone(),
            ledger: store.clone(),
            scheduler: scheduler.clone(),
            dead_letters: dead_letters.clone(),
            clock: Arc::new(ManualClock::new(start + Duration::seconds(1))),
        });
        Self {
            deps,
            store,
            scheduler,
            dead_letters,
            sale,
        }
    }

    /// Holds for the reservations the records carry, as the grab would have left them.
    async fn hold(&self, reservations: &[Reservation]) {
        for reservation in reservations {
            self.store
                .reserve(&self.sale, reservation.shard, reservation)
                .await
                .unwrap()
                .unwrap();
        }
    }

    async fn consume(&self, event: &Value) -> SqsBatchResponse {
        let event: SqsEvent = serde_json::from_value(event.clone()).unwrap();
        handler(&self.deps, event).await.unwrap()
    }

    async fn status(&self, reservation: &Reservation) -> OrderStatus {
        self.store
            .find(&reservation.order_id, &reservation.user_id)
            .await
            .unwrap()
            .unwrap()
            .0
            .status
    }

    fn timers(&self) -> usize {
        self.scheduler.inner.timers.lock().unwrap().len()
    }

    fn schedules_created(&self) -> usize {
        self.scheduler.inner.created.load(Ordering::SeqCst)
    }

    fn parked(&self) -> Vec<DeadLetter> {
        self.dead_letters.parked.lock().unwrap().clone()
    }
}

fn batch() -> Value {
    fixture("order-consumer.json")
}

fn reservations_of(event: &Value) -> Vec<Reservation> {
    event["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|record| serde_json::from_str(record["body"].as_str().unwrap()).unwrap())
        .collect()
}

fn failures(response: &SqsBatchResponse) -> Vec<String> {
    let mut ids: Vec<String> = response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect();
    ids.sort();
    ids
}

fn message_id(event: &Value, index: usize) -> String {
    event["Records"][index]["messageId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A batch of `count` records for fresh reservations, one user each.
fn batch_of(count: usize) -> (Value, Vec<Reservation>) {
    let template = batch()["Records"][0].clone();
    let first: Reservation = serde_json::from_str(template["body"].as_str().unwrap()).unwrap();
    let mut records = Vec::new();
    let mut reservations = Vec::new();
    for i in 0..count {
        let reservation = Reservation {
            order_id: OrderId::new(first.sale_id.clone()),
            user_id: flashsale_domain::UserId::parse(format!("user-{i}")).unwrap(),
            shard: u16::try_from(i % 8).unwrap(),
            ..first.clone()
        };
        let mut record = template.clone();
        record["messageId"] = json!(format!("message-{i}"));
        record["body"] = json!(serde_json::to_string(&reservation).unwrap());
        record["attributes"]["MessageGroupId"] = json!(reservation.order_id.to_string());
        records.push(record);
        reservations.push(reservation);
    }
    (json!({ "Records": records }), reservations)
}

#[tokio::test]
async fn the_fixture_batch_sets_every_orders_release_timer_and_writes_no_order() {
    let world = World::new().await;
    let event = batch();
    let reservations = reservations_of(&event);
    world.hold(&reservations).await;

    let response = world.consume(&event).await;

    assert!(failures(&response).is_empty());
    for reservation in &reservations {
        assert_eq!(world.status(reservation).await, OrderStatus::Reserved);
        let timers = world.scheduler.inner.timers.lock().unwrap();
        assert_eq!(timers.get(&reservation.order_id), Some(reservation));
    }
    // The grab's hold is the order; the consumer writes none.
    assert_eq!(world.store.order_count(), 0);
    assert!(world.parked().is_empty());
}

/// Issue 48 (the simulation, seeds 48079 and 48329 among others): a grab's take landed
/// and its hold write did not (its invocation died between the two); the page's retry
/// went to another process, which knew nothing of that take, and held the order on
/// another shard. The first take was no one's: its unit out of every shard until the
/// reconciler's grace, while buyers were told "sold out". The retry's record has the
/// consumer give it back; a first try's record reads no shard.
#[tokio::test]
async fn a_retrys_record_gives_back_the_take_its_first_try_left_on_another_shard() {
    let world = World::new().await;
    let (first_try, reservations) = batch_of(1);
    let held = &reservations[0];
    world.hold(&reservations).await;
    world.store.leave_take(
        &world.sale,
        Take {
            shard: 5,
            order_id: held.order_id.clone(),
            user_id: held.user_id.clone(),
            taken_at: held.created_at,
        },
    );
    let left_with = world.store.shard_available(&world.sale.sale_id, 5);
    let held_with = world.store.shard_available(&world.sale.sale_id, held.shard);

    assert!(failures(&world.consume(&first_try).await).is_empty());
    assert_eq!(world.store.loose_takes_of(&held.order_id).len(), 1);

    let mut retry = first_try.clone();
    let mut body: Value =
        serde_json::from_str(retry["Records"][0]["body"].as_str().unwrap()).unwrap();
    body["retried"] = json!(true);
    retry["Records"][0]["body"] = json!(body.to_string());
    for _ in 0..2 {
        assert!(failures(&world.consume(&retry).await).is_empty());
    }

    assert!(world.store.loose_takes_of(&held.order_id).is_empty());
    assert_eq!(
        world.store.shard_available(&world.sale.sale_id, 5),
        left_with + 1,
        "the unit is for sale again, once"
    );
    assert_eq!(
        world.store.shard_available(&world.sale.sale_id, held.shard),
        held_with,
        "the hold keeps its unit"
    );
    assert_eq!(world.status(held).await, OrderStatus::Reserved);
    assert_eq!(world.timers(), 1);
}

#[tokio::test]
async fn a_redelivered_batch_creates_one_timer_each() {
    let world = World::new().await;
    let event = batch();
    world.hold(&reservations_of(&event)).await;

    for _ in 0..3 {
        assert!(failures(&world.consume(&event).await).is_empty());
    }
    assert_eq!(world.store.order_count(), 0);
    assert_eq!(world.schedules_created(), 2);
    assert_eq!(world.timers(), 2);
}

#[tokio::test]
async fn an_order_settled_before_the_consumer_is_done_without_a_timer() {
    let world = World::new().await;
    let event = batch();
    let reservations = reservations_of(&event);
    world.hold(&reservations).await;
    world
        .store
        .release(&reservations[0], ReleaseReason::Cancelled, Utc::now())
        .await
        .unwrap();

    let response = world.consume(&event).await;

    assert!(failures(&response).is_empty());
    assert_eq!(world.status(&reservations[0]).await, OrderStatus::Cancelled);
    assert_eq!(world.status(&reservations[1]).await, OrderStatus::Reserved);
    assert_eq!(world.timers(), 1);
    assert!(world.parked().is_empty());
}

#[tokio::test]
async fn poison_records_are_parked_with_their_group_and_the_rest_are_consumed() {
    let world = World::new().await;
    let mut event = batch();
    let reservations = reservations_of(&event);
    // Only the second record's hold exists; the first names an order nobody reserved.
    world.hold(&reservations[1..]).await;
    let mut records = event["Records"].as_array().unwrap().clone();
    let mut not_json = records[1].clone();
    not_json["messageId"] = json!("poison-not-json");
    not_json["body"] = json!("{\"order_id\": ");
    not_json["attributes"]["MessageGroupId"] = json!("group-not-json");
    let mut wrong_shape = records[1].clone();
    wrong_shape["messageId"] = json!("poison-wrong-shape");
    wrong_shape["body"] = json!(r#"{"order_id":"not an order id","shard":"x"}"#);
    let mut no_body = records[1].clone();
    no_body["messageId"] = json!("poison-no-body");
    no_body.as_object_mut().unwrap().remove("body");
    records.extend([not_json, wrong_shape, no_body]);
    event["Records"] = json!(records);

    let response = world.consume(&event).await;

    assert!(failures(&response).is_empty(), "{:?}", failures(&response));
    assert_eq!(world.status(&reservations[1]).await, OrderStatus::Reserved);
    let parked: HashMap<String, DeadLetter> = world
        .parked()
        .into_iter()
        .map(|letter| (letter.dedup_id.clone(), letter))
        .collect();
    assert_eq!(parked.len(), 4, "{parked:?}");

    let unknown = &parked[&message_id(&event, 0)];
    assert_eq!(unknown.group_id, reservations[0].order_id.to_string());
    assert_eq!(unknown.body, event["Records"][0]["body"].as_str().unwrap());
    assert!(
        unknown
            .reason
            .starts_with("OrderConsumer.OrderNotFound: setting the release timer of order")
            && unknown.reason.ends_with("order not found"),
        "{}",
        unknown.reason
    );

    let not_json = &parked["poison-not-json"];
    assert_eq!(not_json.group_id, "group-not-json");
    assert_eq!(not_json.body, "{\"order_id\": ");
    assert!(
        not_json
            .reason
            .starts_with("OrderConsumer.NotAReservation: the record's body is not a reservation"),
        "{}",
        not_json.reason
    );

    assert!(
        parked["poison-wrong-shape"]
            .reason
            .starts_with("OrderConsumer.NotAReservation: ")
    );
    assert_eq!(
        parked["poison-no-body"].reason,
        "OrderConsumer.NoBody: the record has no body"
    );
    assert_eq!(world.timers(), 1);
}

#[tokio::test]
async fn a_poison_record_that_cannot_be_parked_is_reported_failed() {
    let world = World::new().await;
    let event = batch();
    world.hold(&reservations_of(&event)[1..]).await;
    world.dead_letters.fail.store(true, Ordering::SeqCst);

    let response = world.consume(&event).await;

    assert_eq!(failures(&response), vec![message_id(&event, 0)]);
    assert!(world.parked().is_empty());
}

#[tokio::test]
async fn a_transient_failure_reports_only_that_record_and_its_retry_succeeds() {
    let world = World::new().await;
    let event = batch();
    let reservations = reservations_of(&event);
    world.hold(&reservations).await;
    world
        .scheduler
        .failing
        .lock()
        .unwrap()
        .insert(reservations[0].order_id.clone());

    let response = world.consume(&event).await;
    assert_eq!(failures(&response), vec![message_id(&event, 0)]);
    assert!(world.parked().is_empty());
    assert_eq!(world.timers(), 1);

    // The queue redelivers only the failed record.
    world.scheduler.failing.lock().unwrap().clear();
    let mut retry = event.clone();
    retry["Records"] = json!([event["Records"][0].clone()]);
    assert!(failures(&world.consume(&retry).await).is_empty());
    assert_eq!(world.status(&reservations[0]).await, OrderStatus::Reserved);
    assert_eq!(world.timers(), 2);
    assert_eq!(world.store.order_count(), 0);
}

#[tokio::test]
async fn a_permanent_store_failure_is_retried_not_parked() {
    let world = World::new().await;
    let event = batch();
    let reservations = reservations_of(&event);
    world.hold(&reservations).await;
    world.scheduler.permanent.store(true, Ordering::SeqCst);
    world
        .scheduler
        .failing
        .lock()
        .unwrap()
        .insert(reservations[1].order_id.clone());

    let response = world.consume(&event).await;

    assert_eq!(failures(&response), vec![message_id(&event, 1)]);
    assert!(world.parked().is_empty());
}

#[tokio::test]
async fn an_empty_batch_reports_nothing() {
    let world = World::new().await;
    let response = world.consume(&json!({ "Records": [] })).await;
    assert!(response.batch_item_failures.is_empty());
}

#[tokio::test]
async fn records_are_processed_concurrently_but_never_more_than_the_bound() {
    let world = World::new().await;
    let (event, reservations) = batch_of(MAX_CONCURRENT_RECORDS * 2 + 5);
    world.hold(&reservations).await;
    world.scheduler.delay_ms.store(20, Ordering::SeqCst);

    let response = world.consume(&event).await;

    assert!(failures(&response).is_empty());
    assert_eq!(world.timers(), reservations.len());
    let max = world.scheduler.max_in_flight.load(Ordering::SeqCst);
    assert!(max > 1, "records were processed one by one");
    assert!(max <= MAX_CONCURRENT_RECORDS, "{max} records in flight");
}

#[test]
fn config_takes_each_variable_where_it_belongs_and_refuses_a_missing_one() {
    let config = Config::from_lookup(|var| Some(format!("value-of-{var}"))).unwrap();
    assert_eq!(
        config.release_target.function_arn,
        "value-of-RELEASE_FUNCTION_ARN"
    );
    assert_eq!(
        config.release_target.role_arn,
        "value-of-SCHEDULER_ROLE_ARN"
    );
    assert_eq!(config.dlq_url, "value-of-ORDERS_DLQ_URL");
    assert_eq!(
        config.release_target.dead_letter_arn.as_deref(),
        Some("value-of-RELEASE_SCHEDULE_DLQ_ARN")
    );

    let missing = Config::from_lookup(|var| (var != "ORDERS_DLQ_URL").then(|| "x".to_owned()));
    assert!(
        matches!(missing, Err(ConfigError::Missing("ORDERS_DLQ_URL"))),
        "{missing:?}"
    );
}
