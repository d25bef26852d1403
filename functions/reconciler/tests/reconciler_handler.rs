//! The reconciler function through its handler, with the scheduled event of
//! `events/reconciler.json` and the domain's in-memory fakes.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_domain::control::ControlWrite;
use flashsale_domain::error::StoreError;
use flashsale_domain::payment::{Payment, PaymentState};
use flashsale_domain::ports::{Clock, OrderBook, OrderPayments, PaymentProvider, SaleCatalog};
use flashsale_domain::service::{PaymentService, ReconcileReport};
use flashsale_domain::testing;
use flashsale_domain::testing::{FakePaymentProvider, InMemoryStore, ManualClock};
use flashsale_domain::{
    AppError, OrderId, OrderStatus, Reservation, Sale, SaleAudit, SaleCursor, SaleId, SalePage,
    UserId,
};
use flashsale_lambda::testing::fixture;
use flashsale_lambda::{ConfigError, FromEnv};
use flashsale_reconciler::{Config, Deps, Ports, ReconcileError, handler};
use lambda_runtime::Diagnostic;
use serde_json::{Value, json};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// `pairs`, with the Stripe endpoint every deployment sets (unused without the keys).
fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .chain(&[("STRIPE_API_BASE", "http://127.0.0.1:9")])
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Config::from_lookup(move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone()))
}

fn default_config() -> Config {
    config(&[("TABLE_NAME", "t")]).unwrap()
}

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    provider: Arc<FakePaymentProvider>,
    clock: Arc<ManualClock>,
    sale: Sale,
}

impl World {
    async fn new() -> Self {
        Self::build(&default_config(), None).await
    }

    /// A deployment whose Stripe secret holds no usable keys: no payment settlement.
    async fn misconfigured() -> Self {
        let mut world = Self::new().await;
        world.deps = Deps::from_ports(
            &default_config(),
            Ports {
                catalog: world.store.clone(),
                orders: world.store.clone(),
                ledger: world.store.clone(),
                clock: world.clock.clone(),
                payments: None,
                payments_misconfigured: true,
            },
        );
        world
    }

    /// A sale of 10 units in one shard, open from `start()` for an hour with a
    /// ten-minute payment window; the clock at `start()`.
    async fn build(config: &Config, catalog: Option<Arc<dyn SaleCatalog>>) -> Self {
        let store = Arc::new(InMemoryStore::new());
        let clock = Arc::new(ManualClock::new(start()));
        let provider = Arc::new(FakePaymentProvider::new());
        let sale = testing::sale(10, 1)
            .starting_at(start())
            .payment_window_secs(600)
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        let deps = Deps::from_ports(
            config,
            Ports {
                catalog: catalog.unwrap_or_else(|| store.clone()),
                orders: store.clone(),
                ledger: store.clone(),
                clock: clock.clone(),
                payments: Some(Arc::new(PaymentService {
                    orders: store.clone(),
                    payments: store.clone(),
                    ledger: store.clone(),
                    provider: provider.clone(),
                    clock: clock.clone(),
                })),
                payments_misconfigured: false,
            },
        );
        Self {
            deps,
            store,
            provider,
            clock,
            sale,
        }
    }

    /// A reservation made now whose queue message never arrived: no timer.
    fn strand(&self, user: &str) -> Reservation {
        let now = self.clock.now();
        let reservation = Reservation {
            order_id: OrderId::new(self.sale.sale_id.clone()),
            sale_id: self.sale.sale_id.clone(),
            user_id: UserId::parse(user).unwrap(),
            shard: 0,
            created_at: now,
            expires_at: self.sale.payment_deadline(now),
            price: self.sale.price,
        };
        self.store.strand(&self.sale, &reservation);
        reservation
    }

    /// A stranded reservation whose buyer's card was authorised, and the clock past its
    /// window and the timer grace: the pass's to release, money and all.
    async fn strand_authorised(&self, user: &str) -> (Reservation, Payment) {
        let lost = self.strand(user);
        let payment = self
            .provider
            .open(&lost.order_id, &lost.user_id, self.sale.price.unwrap())
            .await
            .unwrap();
        self.store.attach_payment(&lost, &payment.id).await.unwrap();
        assert!(self.provider.authorise(&payment.id));
        self.clock.set(lost.expires_at + Duration::seconds(181));
        (lost, payment)
    }

    async fn run(&self) -> ReconcileReport {
        report(
            handler(&self.deps, fixture("reconciler.json"))
                .await
                .unwrap(),
        )
    }

    fn available(&self) -> u64 {
        self.store.shard_available(&self.sale.sale_id, 0)
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
}

/// The handler's answer read back as the report it encodes.
fn report(answer: Value) -> ReconcileReport {
    let field = |name: &str| {
        let value = answer[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} missing from {answer}"));
        usize::try_from(value).unwrap()
    };
    ReconcileReport {
        sales: field("sales"),
        open_holds: field("open_holds"),
        expired: field("expired"),
        failed: field("failed"),
        failed_sales: field("failed_sales"),
        takes_returned: field("takes_returned"),
        payments_settled: field("payments_settled"),
        orders_paid: serde_json::from_value(answer["orders_paid"].clone()).expect("orders_paid"),
        captures: field("captures"),
        capture_retries: field("capture_retries"),
        capture_failures: field("capture_failures"),
        authorisations_cancelled: field("authorisations_cancelled"),
        refunds: field("refunds"),
        captures_refused: field("captures_refused"),
        payment_failures: field("payment_failures"),
        money_unsettled: field("money_unsettled"),
        money_unsettled_oldest_secs: answer["money_unsettled_oldest_secs"]
            .as_i64()
            .expect("money_unsettled_oldest_secs"),
        money_unsettled_known: answer["money_unsettled_known"]
            .as_bool()
            .expect("money_unsettled_known"),
    }
}

#[tokio::test]
async fn a_pass_releases_an_authorised_order_left_past_its_window_and_releases_its_money() {
    let world = World::new().await;
    let (lost, payment) = world.strand_authorised("user-alice").await;

    let report = world.run().await;
    assert_eq!(report.expired, 1, "{report:?}");
    assert_eq!(
        (
            report.payments_settled,
            report.authorisations_cancelled,
            report.refunds
        ),
        (1, 1, 0),
        "{report:?}"
    );
    assert_eq!(world.status(&lost).await, OrderStatus::Expired);
    assert_eq!(
        world.provider.state_of(&payment.id),
        Some(PaymentState::Cancelled)
    );
    assert_eq!(world.run().await.payments_settled, 0, "settled once");
}

/// A Stripe secret without usable keys stops only the payments: the pass still gives
/// back the overdue hold, and leaves its payment for a pass with keys.
#[tokio::test]
async fn without_usable_stripe_keys_a_pass_still_repairs_holds_and_settles_no_payment() {
    let world = World::misconfigured().await;
    let (lost, payment) = world.strand_authorised("user-alice").await;

    let report = world.run().await;
    assert_eq!(
        (report.expired, report.payments_settled),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(world.status(&lost).await, OrderStatus::Expired);
    assert_eq!(world.available(), 10);
    assert_eq!(
        world.provider.state_of(&payment.id),
        Some(PaymentState::Authorised),
        "left for a pass with keys"
    );
}

#[tokio::test]
async fn a_hold_within_its_window_is_left_alone_though_no_timer_was_set() {
    let world = World::new().await;
    let lost = world.strand("user-alice");
    world.clock.advance(Duration::seconds(61));

    let answer = handler(&world.deps, fixture("reconciler.json"))
        .await
        .unwrap();

    assert_eq!(
        answer,
        json!({
            "sales": 1, "open_holds": 1, "expired": 0, "failed": 0, "failed_sales": 0,
            "takes_returned": 0, "payments_settled": 0, "orders_paid": [], "captures": 0,
            "capture_retries": 0,
            "capture_failures": 0, "authorisations_cancelled": 0, "refunds": 0,
            "captures_refused": 0, "payment_failures": 0, "money_unsettled": 0,
            "money_unsettled_oldest_secs": 0, "money_unsettled_known": true
        })
    );
    assert_eq!(
        world.available(),
        9,
        "the unit stays held: its buyer may pay"
    );
    assert_eq!(world.status(&lost).await, OrderStatus::Reserved);
}

#[tokio::test]
async fn a_hold_no_timer_released_goes_back_to_stock_after_the_default_timer_grace() {
    let world = World::new().await;
    let held = world.strand("user-alice");

    world.clock.set(held.expires_at + Duration::seconds(179));
    assert_eq!(world.run().await.expired, 0, "the timer still has time");
    assert_eq!(world.status(&held).await, OrderStatus::Reserved);

    world.clock.set(held.expires_at + Duration::seconds(180));
    assert_eq!(world.run().await.expired, 1);
    assert_eq!(world.status(&held).await, OrderStatus::Expired);
    assert_eq!(world.available(), 10);

    // Nothing is left for the next run.
    let again = world.run().await;
    assert_eq!((again.open_holds, again.expired), (0, 0));
    assert_eq!(world.available(), 10);
}

#[tokio::test]
async fn a_paid_order_is_never_touched() {
    let world = World::new().await;
    let paid = world.strand("user-alice");
    testing::pay_by_card(&*world.store, &paid, world.clock.now())
        .await
        .unwrap();
    world.clock.set(paid.expires_at + Duration::days(1));

    let report = world.run().await;

    assert_eq!((report.open_holds, report.expired), (0, 0));
    assert_eq!(world.status(&paid).await, OrderStatus::Paid);
    assert_eq!(world.available(), 9);
}

#[tokio::test]
async fn the_timer_grace_comes_from_configuration() {
    let config = config(&[("TABLE_NAME", "t"), ("RECONCILE_TIMER_GRACE_SECS", "5")]).unwrap();
    let world = World::build(&config, None).await;
    let held = world.strand("user-alice");

    world.clock.set(held.expires_at + Duration::seconds(4));
    assert_eq!(world.run().await.expired, 0);
    world.clock.set(held.expires_at + Duration::seconds(5));
    assert_eq!(world.run().await.expired, 1);
}

#[tokio::test]
async fn the_event_content_changes_nothing() {
    for event in [
        fixture("reconciler.json"),
        json!({}),
        Value::Null,
        json!("garbage"),
        json!([1, 2, 3]),
    ] {
        let world = World::new().await;
        let held = world.strand("user-alice");
        world.clock.set(held.expires_at + Duration::seconds(180));

        let answer = handler(&world.deps, event.clone()).await.unwrap();

        assert_eq!(report(answer).expired, 1, "{event}");
        assert_eq!(world.available(), 10, "{event}");
    }
}

#[tokio::test]
async fn long_ended_sales_are_not_read() {
    let world = World::new().await;
    world.clock.set(start() + Duration::days(3));

    assert_eq!(
        world.run().await,
        ReconcileReport {
            // The followed money is read whatever the sales' age: none here.
            money_unsettled_known: true,
            ..ReconcileReport::default()
        }
    );
}

#[tokio::test]
async fn when_the_sales_cannot_be_listed_the_invocation_fails_whatever_the_kind() {
    for transient in [true, false] {
        let world = World::build(
            &default_config(),
            Some(Arc::new(UnreachableCatalog { transient })),
        )
        .await;
        let held = world.strand("user-alice");
        world.clock.set(held.expires_at + Duration::seconds(180));

        let err = handler(&world.deps, fixture("reconciler.json"))
            .await
            .unwrap_err();

        let ReconcileError::Pass(AppError::Store(store)) = &err else {
            panic!("expected a pass failure from the store, got {err}");
        };
        assert_eq!(store.is_retryable(), transient);
        let expected_type = if transient {
            "Reconciler.StoreUnavailable"
        } else {
            "Reconciler.StoreFailed"
        };
        assert_eq!(Diagnostic::from(err).error_type, expected_type);
        assert_eq!(world.available(), 9, "nothing was released");
    }
}

#[test]
fn config_reads_the_table_and_defaults_the_graces() {
    assert_eq!(
        Config::env_vars(),
        [
            "TABLE_NAME",
            "RECONCILE_TIMER_GRACE_SECS",
            "RECONCILE_TAKE_GRACE_SECS",
            "STRIPE_SECRET_ARN",
            "STRIPE_API_BASE",
        ]
    );
    let config = default_config();
    assert_eq!(config.table_name, "t");
    assert_eq!(config.timer_grace, Duration::seconds(180));
    assert_eq!(
        config.take_grace,
        flashsale_domain::service::DEFAULT_TAKE_GRACE,
        "past a grab path's life"
    );
}

#[test]
fn config_without_the_table_fails() {
    assert!(matches!(
        config(&[("RECONCILE_TIMER_GRACE_SECS", "5")]),
        Err(ConfigError::Missing("TABLE_NAME"))
    ));
}

#[test]
fn a_grace_that_is_not_a_whole_number_of_seconds_is_invalid() {
    for (var, value) in [
        ("RECONCILE_TIMER_GRACE_SECS", "soon"),
        ("RECONCILE_TIMER_GRACE_SECS", "-5"),
        ("RECONCILE_TAKE_GRACE_SECS", "1.5"),
    ] {
        let err = config(&[("TABLE_NAME", "t"), (var, value)]).unwrap_err();
        assert!(
            matches!(err, ConfigError::Invalid { var: bad, .. } if bad == var),
            "{var}={value}: {err:?}"
        );
    }
}

/// A catalog whose listing fails, as an unreachable or misconfigured table would.
struct UnreachableCatalog {
    transient: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the table is unreachable")]
struct Unreachable;

#[async_trait]
impl SaleCatalog for UnreachableCatalog {
    async fn create_sale(&self, _sale: &Sale) -> Result<bool, StoreError> {
        unreachable!("the reconciler never creates sales")
    }

    async fn find_sale(&self, _sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        unreachable!("the reconciler lists sales, it does not look them up")
    }

    async fn list_sales(
        &self,
        _after: Option<&SaleCursor>,
        _limit: usize,
    ) -> Result<SalePage, StoreError> {
        unreachable!("the reconciler lists the sales still ending, not pages of them")
    }

    async fn control_sale(
        &self,
        _sale_id: &SaleId,
        _change: &SaleAudit,
    ) -> Result<ControlWrite, StoreError> {
        unreachable!("the reconciler never pauses or ends a sale")
    }

    async fn audit_trail(
        &self,
        _sale_id: &SaleId,
        _limit: usize,
    ) -> Result<Vec<SaleAudit>, StoreError> {
        unreachable!("the reconciler reads no audit trail")
    }

    async fn sales_ending_after(&self, _cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        Err(if self.transient {
            StoreError::transient("sales_ending_after", Unreachable)
        } else {
            StoreError::permanent("sales_ending_after", Unreachable)
        })
    }
}
