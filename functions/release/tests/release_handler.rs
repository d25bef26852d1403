//! The release function through its handler, with the schedule input of
//! `events/release.json` and the domain's in-memory fakes.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use flashsale_domain::ports::{Clock, OrderBook, SaleCatalog, StockLedger};
use flashsale_domain::testing::{FailingLedger, InMemoryStore, ManualClock};
use flashsale_domain::{AppError, OrderStatus, ReleaseReason, Reservation, Sale, SaleDraft};
use flashsale_http::ConfigError;
use flashsale_http::testing::fixture;
use flashsale_release::{Config, Deps, Ports, ReleaseError, handler};
use serde_json::{Value, json};

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
    sale: Sale,
    reservation: Reservation,
}

impl World {
    /// The fixture's reservation, held in the store, and the clock at its expiry.
    async fn new() -> Self {
        Self::with_ledger(None).await
    }

    async fn with_ledger(ledger: Option<Arc<dyn StockLedger>>) -> Self {
        let reservation: Reservation = serde_json::from_value(fixture("release.json")).unwrap();
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let store = Arc::new(InMemoryStore::new());
        let sale = Sale::from_draft(SaleDraft {
            sale_id: Some(reservation.sale_id.to_string()),
            name: "Phone launch".to_owned(),
            stock: 100,
            starts_at: start,
            ends_at: start + Duration::hours(1),
            per_user_limit: None,
            payment_timeout_secs: Some(900),
            shards: Some(8),
        })
        .unwrap();
        assert!(store.create_sale(&sale).await.unwrap());
        store
            .reserve(&sale, reservation.shard, &reservation)
            .await
            .unwrap()
            .unwrap();
        let clock = Arc::new(ManualClock::new(reservation.expires_at));
        let deps = Deps::from_ports(Ports {
            ledger: ledger.unwrap_or_else(|| store.clone()),
            clock: clock.clone(),
        });
        Self {
            deps,
            store,
            clock,
            sale,
            reservation,
        }
    }

    fn event(&self) -> Value {
        serde_json::to_value(&self.reservation).unwrap()
    }

    async fn available(&self) -> u64 {
        self.store
            .availability(&self.sale)
            .await
            .unwrap()
            .iter()
            .sum()
    }

    async fn status(&self) -> OrderStatus {
        self.store
            .find(&self.reservation.order_id, &self.reservation.user_id)
            .await
            .unwrap()
            .unwrap()
            .0
            .status
    }
}

fn retry_source(err: &lambda_runtime::Error) -> &AppError {
    match err.downcast_ref::<ReleaseError>() {
        Some(ReleaseError::Retry { source, .. }) => source,
        other => panic!("expected a retry error, got {other:?} from {err}"),
    }
}

#[tokio::test]
async fn a_due_release_expires_the_order_and_returns_the_unit() {
    let world = World::new().await;
    assert_eq!(world.available().await, 99);

    let answer = handler(&world.deps, fixture("release.json")).await.unwrap();

    assert_eq!(
        answer,
        json!({"outcome": "released", "order_id": world.reservation.order_id.to_string()})
    );
    assert_eq!(world.available().await, 100);
    assert_eq!(world.status().await, OrderStatus::Expired);
}

#[tokio::test]
async fn a_second_release_changes_nothing_and_says_so() {
    let world = World::new().await;
    handler(&world.deps, world.event()).await.unwrap();

    let answer = handler(&world.deps, world.event()).await.unwrap();

    assert_eq!(answer["outcome"], "already_settled");
    assert_eq!(answer["status"], "expired");
    assert_eq!(world.available().await, 100);
}

#[tokio::test]
async fn the_timer_of_a_paid_order_changes_nothing() {
    let world = World::new().await;
    world
        .clock
        .set(world.reservation.expires_at - Duration::seconds(1));
    world
        .store
        .pay(&world.reservation, world.clock.now())
        .await
        .unwrap();
    world.clock.set(world.reservation.expires_at);

    let answer = handler(&world.deps, world.event()).await.unwrap();

    assert_eq!(answer["outcome"], "already_settled");
    assert_eq!(answer["status"], "paid");
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status().await, OrderStatus::Paid);
}

#[tokio::test]
async fn the_timer_of_a_cancelled_order_changes_nothing() {
    let world = World::new().await;
    world
        .store
        .release(&world.reservation, ReleaseReason::Cancelled, Utc::now())
        .await
        .unwrap();

    let answer = handler(&world.deps, world.event()).await.unwrap();

    assert_eq!(answer["status"], "cancelled");
    assert_eq!(world.available().await, 100);
}

#[tokio::test]
async fn a_release_before_the_expiry_fails_so_the_scheduler_retries() {
    let world = World::new().await;
    world
        .clock
        .set(world.reservation.expires_at - Duration::milliseconds(300));

    let err = handler(&world.deps, world.event()).await.unwrap_err();

    assert!(matches!(retry_source(&err), AppError::NotYetDue));
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status().await, OrderStatus::Reserved);

    // The retry, once due, does the release.
    world.clock.set(world.reservation.expires_at);
    let answer = handler(&world.deps, world.event()).await.unwrap();
    assert_eq!(answer["outcome"], "released");
}

#[tokio::test]
async fn a_store_failure_fails_so_the_scheduler_retries_whatever_its_kind() {
    for transient in [true, false] {
        let world = World::with_ledger(Some(Arc::new(FailingLedger { transient }))).await;

        let err = handler(&world.deps, world.event()).await.unwrap_err();

        let AppError::Store(store) = retry_source(&err) else {
            panic!("expected a store error, got {err}");
        };
        assert_eq!(store.is_retryable(), transient);
        assert_eq!(world.available().await, 99);
    }
}

#[tokio::test]
async fn a_malformed_event_is_rejected_once_and_never_retried() {
    let world = World::new().await;
    let mut missing_field = world.event();
    missing_field.as_object_mut().unwrap().remove("expires_at");
    let mut bad_order_id = world.event();
    bad_order_id["order_id"] = json!("not an order");
    for event in [
        json!({}),
        json!("garbage"),
        json!(42),
        Value::Null,
        missing_field,
        bad_order_id,
    ] {
        let answer = handler(&world.deps, event.clone()).await.unwrap();
        assert_eq!(answer["outcome"], "rejected", "{event}");
        assert_eq!(answer["error"], "invalid_event", "{event}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("not a reservation")
        );
    }
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status().await, OrderStatus::Reserved);
}

#[tokio::test]
async fn a_reservation_nobody_holds_is_unknown_and_not_retried() {
    let world = World::new().await;
    let mut stranger = world.reservation.clone();
    stranger.order_id = flashsale_domain::OrderId::new(world.reservation.sale_id.clone());

    let answer = handler(&world.deps, serde_json::to_value(&stranger).unwrap())
        .await
        .unwrap();

    assert_eq!(
        answer,
        json!({"outcome": "unknown", "order_id": stranger.order_id.to_string()})
    );
    assert_eq!(world.available().await, 99);
}

#[tokio::test]
async fn an_input_passed_as_a_json_string_is_understood() {
    let world = World::new().await;
    let as_string = Value::String(world.event().to_string());

    let answer = handler(&world.deps, as_string).await.unwrap();

    assert_eq!(answer["outcome"], "released");
}

#[test]
fn config_needs_only_the_table() {
    assert_eq!(Config::ENV_VARS, ["TABLE_NAME"]);
    let config = Config::from_lookup(|var| (var == "TABLE_NAME").then(|| "t".to_owned())).unwrap();
    assert_eq!(config.table_name, "t");
    assert!(matches!(
        Config::from_lookup(|_| None),
        Err(ConfigError::Missing("TABLE_NAME"))
    ));
}
