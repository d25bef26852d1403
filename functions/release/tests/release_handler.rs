//! The release function through its handler, with the schedule input of
//! `events/release.json` and the domain's in-memory fakes.

use std::sync::Arc;

use chrono::{DateTime, Duration, NaiveDateTime, TimeZone, Utc};
use flashsale_adapters::{EventBridgeScheduler, FIRING_SLACK};
use flashsale_domain::ports::{Clock, OrderBook, PayOutcome, SaleCatalog, StockLedger};
use flashsale_domain::testing;
use flashsale_domain::testing::{FailingLedger, InMemoryStore, ManualClock};
use flashsale_domain::{AppError, OrderStatus, ReleaseReason, Reservation, Sale};
use flashsale_lambda::testing::fixture;
use flashsale_lambda::{ConfigError, FromEnv};
use flashsale_release::{Config, Deps, MAX_WAIT, Ports, ReleaseError, handler};
use lambda_runtime::Diagnostic;
use serde_json::{Value, json};

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
    sale: Sale,
    reservation: Reservation,
}

/// The wall clock as tokio's paused clock moves it: what the release sees while it
/// sleeps, without a test waiting for real.
struct PausedClock {
    start: DateTime<Utc>,
    origin: tokio::time::Instant,
}

impl Clock for PausedClock {
    fn now(&self) -> DateTime<Utc> {
        self.start + Duration::from_std(self.origin.elapsed()).expect("a short test")
    }
}

impl World {
    /// The fixture's reservation, held in the store, and the clock at its expiry.
    async fn new() -> Self {
        Self::with_ledger(None).await
    }

    async fn with_ledger(ledger: Option<Arc<dyn StockLedger>>) -> Self {
        let reservation: Reservation = serde_json::from_value(fixture("release.json")).unwrap();
        let clock = Arc::new(ManualClock::new(reservation.expires_at));
        Self::build(reservation, ledger, clock.clone(), clock).await
    }

    /// The fixture's reservation with its deadline at `expires_at`, and a release
    /// whose clock reads `fired_at` when tokio's paused clock starts.
    async fn fired_at(expires_at: DateTime<Utc>, fired_at: DateTime<Utc>) -> Self {
        let mut reservation: Reservation = serde_json::from_value(fixture("release.json")).unwrap();
        reservation.expires_at = expires_at;
        let paused = Arc::new(PausedClock {
            start: fired_at,
            origin: tokio::time::Instant::now(),
        });
        let manual = Arc::new(ManualClock::new(fired_at));
        Self::build(reservation, None, paused, manual).await
    }

    async fn build(
        reservation: Reservation,
        ledger: Option<Arc<dyn StockLedger>>,
        release_clock: Arc<dyn Clock>,
        clock: Arc<ManualClock>,
    ) -> Self {
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let store = Arc::new(InMemoryStore::new());
        let sale = testing::sale(100, 8)
            .id(&reservation.sale_id.to_string())
            .starting_at(start)
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        store
            .reserve(&sale, reservation.shard, &reservation)
            .await
            .unwrap()
            .unwrap();
        let deps = Deps::from_ports(Ports {
            ledger: ledger.unwrap_or_else(|| store.clone()),
            clock: release_clock,
        });
        Self {
            deps,
            store,
            clock,
            sale,
            reservation,
        }
    }

    /// When the order's release committed, as its owner reads it.
    async fn expired_at(&self) -> Option<DateTime<Utc>> {
        self.store
            .find(&self.reservation.order_id, &self.reservation.user_id)
            .await
            .unwrap()
            .unwrap()
            .0
            .expired_at
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

fn retry_source(err: &ReleaseError) -> &AppError {
    match err {
        ReleaseError::Retry { source, .. } => source,
        other => panic!("expected a retry error, got {other:?}"),
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
    testing::pay_by_card(&*world.store, &world.reservation, world.clock.now())
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

/// The first and the last instant at which Scheduler may fire the timer the adapter
/// sets for `expires_at`.
fn firing_minute(expires_at: DateTime<Utc>) -> [DateTime<Utc>; 2] {
    let created = expires_at - Duration::minutes(15);
    let expression = EventBridgeScheduler::at_expression(expires_at, created);
    let minute = NaiveDateTime::parse_from_str(
        expression.trim_start_matches("at(").trim_end_matches(')'),
        "%Y-%m-%dT%H:%M:%S",
    )
    .unwrap()
    .and_utc();
    [minute, minute + Duration::milliseconds(59_999)]
}

/// Deadlines at the two ends of a minute: the one whose timer may fire latest after
/// it (:57), and the one whose timer may fire earliest before it (:56.999).
fn deadlines() -> [DateTime<Utc>; 2] {
    let minute = Utc.with_ymd_and_hms(2026, 1, 1, 0, 15, 0).unwrap();
    [
        minute + Duration::seconds(57),
        minute + Duration::milliseconds(56_999),
    ]
}

#[tokio::test(start_paused = true)]
async fn fired_at_the_first_second_of_its_minute_the_release_waits_for_the_deadline() {
    for expires_at in deadlines() {
        let [first, _] = firing_minute(expires_at);
        let world = World::fired_at(expires_at, first).await;
        let started = tokio::time::Instant::now();

        let answer = handler(&world.deps, world.event()).await.unwrap();

        assert_eq!(answer["outcome"], "released", "{expires_at}");
        let waited = started.elapsed();
        assert_eq!(
            Duration::from_std(waited).unwrap().num_seconds(),
            (expires_at - first).num_seconds(),
            "slept until the deadline"
        );
        assert!(waited <= MAX_WAIT, "{waited:?}");
        let expired_at = world.expired_at().await.expect("recorded");
        assert!(
            expired_at >= expires_at,
            "released early: {expired_at} < {expires_at}"
        );
        assert!(expired_at - expires_at < Duration::milliseconds(10));
        assert_eq!(world.available().await, 100);
    }
}

#[tokio::test(start_paused = true)]
async fn fired_at_the_last_second_of_its_minute_the_release_is_at_once_and_within_5_s() {
    for expires_at in deadlines() {
        let [_, last] = firing_minute(expires_at);
        let world = World::fired_at(expires_at, last).await;
        let started = tokio::time::Instant::now();

        let answer = handler(&world.deps, world.event()).await.unwrap();

        assert_eq!(answer["outcome"], "released");
        let expired_at = world.expired_at().await.expect("recorded");
        assert!(expired_at >= expires_at, "{expired_at} < {expires_at}");
        assert!(
            expired_at - expires_at <= FIRING_SLACK,
            "{expired_at} is more than the slack after {expires_at}"
        );
        assert!(expired_at - expires_at < Duration::seconds(5));
        if last >= expires_at {
            assert_eq!(started.elapsed(), std::time::Duration::ZERO, "no wait");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_fired_earlier_than_any_timer_can_fire_is_retried_not_waited_for() {
    let expires_at = deadlines()[0];
    let too_early = expires_at - Duration::from_std(MAX_WAIT).unwrap() - Duration::seconds(1);
    let world = World::fired_at(expires_at, too_early).await;
    let started = tokio::time::Instant::now();

    let err = handler(&world.deps, world.event()).await.unwrap_err();

    assert!(matches!(retry_source(&err), AppError::NotYetDue));
    assert_eq!(Diagnostic::from(err).error_type, "Release.NotYetDue");
    assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status().await, OrderStatus::Reserved);
}

#[tokio::test(start_paused = true)]
async fn a_buyer_paying_while_the_early_release_waits_wins_and_the_release_changes_nothing() {
    let expires_at = deadlines()[0];
    let [first, _] = firing_minute(expires_at);
    let world = World::fired_at(expires_at, first).await;
    let clock = PausedClock {
        start: first,
        origin: tokio::time::Instant::now(),
    };

    let pay = async {
        tokio::time::sleep(
            (expires_at - first - Duration::seconds(1))
                .to_std()
                .unwrap(),
        )
        .await;
        testing::pay_by_card(&*world.store, &world.reservation, clock.now())
            .await
            .unwrap()
    };
    let (paid, released) = tokio::join!(pay, handler(&world.deps, world.event()));

    assert_eq!(paid, PayOutcome::Paid);
    let released = released.unwrap();
    assert_eq!(released["outcome"], "already_settled", "{released}");
    assert_eq!(released["status"], "paid");
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status().await, OrderStatus::Paid);
    assert_eq!(world.expired_at().await, None);
}

#[tokio::test(start_paused = true)]
async fn deliveries_early_late_and_twice_give_the_unit_back_once() {
    let expires_at = deadlines()[1];
    let [first, last] = firing_minute(expires_at);
    let world = World::fired_at(expires_at, first).await;
    let late = last - first;

    // One delivery at the minute's start (waits), one at its end (a Lambda retry or
    // a duplicate), and one at the deadline itself: all in flight together.
    let at = |offset: Duration| {
        let world = &world;
        async move {
            tokio::time::sleep(offset.to_std().unwrap()).await;
            handler(&world.deps, world.event()).await.unwrap()
        }
    };
    let (early, on_time, late) =
        tokio::join!(at(Duration::zero()), at(expires_at - first), at(late));

    let outcomes = [&early, &on_time, &late].map(|answer| answer["outcome"].clone());
    assert_eq!(
        outcomes
            .iter()
            .filter(|outcome| **outcome == "released")
            .count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|outcome| **outcome == "already_settled")
            .count(),
        2,
        "{outcomes:?}"
    );
    assert_eq!(world.available().await, 100);
    assert_eq!(world.status().await, OrderStatus::Expired);
    assert!(world.expired_at().await.expect("recorded") >= expires_at);
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
        let expected_type = if transient {
            "Release.OrderStoreUnavailable"
        } else {
            "Release.OrderStoreFailed"
        };
        let diagnostic = Diagnostic::from(err);
        assert_eq!(diagnostic.error_type, expected_type);
        // The message keeps the cause, not only the outermost line.
        assert!(
            diagnostic
                .error_message
                .ends_with("the fake is set to fail"),
            "{}",
            diagnostic.error_message
        );
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
    assert_eq!(Config::env_vars(), ["TABLE_NAME"]);
    let config = Config::from_lookup(|var| (var == "TABLE_NAME").then(|| "t".to_owned())).unwrap();
    assert_eq!(config.table_name, "t");
    assert!(matches!(
        Config::from_lookup(|_| None),
        Err(ConfigError::Missing("TABLE_NAME"))
    ));
}
