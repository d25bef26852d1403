//! The payment routes through the api handler, on the domain's fakes and its fake
//! provider: the page's PaymentIntent and confirmation, and Stripe's signed webhook
//! (delivered twice, out of order, forged, stale, and for another amount).

mod support;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use flashsale_adapters::stripe::webhook;
use flashsale_api::{
    CANCEL_ORDER_ROUTE, CONFIRM_PAYMENT_ROUTE, Deps, GET_ORDER_ROUTE, OPEN_PAYMENT_ROUTE,
    PaymentPorts, PaymentWiring, Ports, handler,
};
use flashsale_domain::payment::{PaymentId, PaymentState};
use flashsale_domain::ports::{Clock, OrderBook, PaymentProvider, SaleCatalog, StockLedger};
use flashsale_domain::testing::{
    self, FakePaymentProvider, FaultyProvider, InMemoryStore, ManualClock, ProviderFault,
};
use flashsale_domain::testing::{InMemoryBlocklist, RecordingScheduler};
use flashsale_domain::{OrderStatus, Price, Reservation, Sale, UserId};
use flashsale_lambda::testing::{ApiEvent, assert_refused, body_json, error_code};
use lambda_http::Body;
use lambda_http::http::Response;
use serde_json::json;
use support::{config, starts_at};

const WEBHOOK_SECRET: &str = "whsec_flashsale_test";
const PUBLISHABLE_KEY: &str = "pk_test_flashsale";

/// How the deployment's payment provider came up.
#[derive(Clone, Copy)]
enum Provider {
    Wired,
    /// No Stripe secret: no card payments.
    Off,
    /// A Stripe secret without usable keys.
    Misconfigured,
}

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    provider: Arc<FakePaymentProvider>,
    /// The provider as the routes call it, with faults to inject.
    faults: Arc<FaultyProvider>,
    clock: Arc<ManualClock>,
    sale: Sale,
}

impl World {
    async fn new() -> Self {
        Self::wired(Provider::Wired).await
    }

    /// A priced sale, started a minute ago, and the payment routes wired as `provider`.
    async fn wired(provider_wiring: Provider) -> Self {
        let store = Arc::new(InMemoryStore::new());
        let provider = Arc::new(FakePaymentProvider::new());
        let faults = Arc::new(FaultyProvider::new(provider.clone()));
        let clock = Arc::new(ManualClock::new(starts_at() + Duration::minutes(1)));
        let sale = testing::sale(10, 1)
            .id("priced")
            .starting_at(starts_at())
            .priced(1999, "EUR")
            .payment_window_secs(600)
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        let deps = Deps::from_ports(
            &config(),
            Ports {
                catalog: store.clone(),
                ledger: store.clone(),
                orders: store.clone(),
                scheduler: Arc::new(RecordingScheduler::default()),
                clock: clock.clone(),
                blocklist: Arc::new(InMemoryBlocklist::new()),
                payments: match provider_wiring {
                    Provider::Wired => PaymentWiring::On(PaymentPorts {
                        payments: store.clone(),
                        events: store.clone(),
                        provider: faults.clone(),
                        publishable_key: PUBLISHABLE_KEY.to_owned(),
                        webhook_secret: WEBHOOK_SECRET.to_owned(),
                    }),
                    Provider::Off => PaymentWiring::Off,
                    Provider::Misconfigured => PaymentWiring::Misconfigured,
                },
            },
        );
        Self {
            deps,
            store,
            provider,
            faults,
            clock,
            sale,
        }
    }

    /// A unit reserved for `user`, as a grab would have left it.
    async fn reserve(&self, user: &str) -> Reservation {
        let now = self.clock.now();
        let reservation = Reservation {
            order_id: flashsale_domain::OrderId::new(self.sale.sale_id.clone()),
            sale_id: self.sale.sale_id.clone(),
            user_id: UserId::parse(user).unwrap(),
            shard: 0,
            created_at: now,
            expires_at: self.sale.payment_deadline(now),
            price: self.sale.price,
        };
        let reserved = self.store.reserve(&self.sale, 0, &reservation).await;
        assert!(matches!(reserved, Ok(Ok(()))), "{reserved:?}");
        reservation
    }

    async fn call(&self, event: ApiEvent) -> Response<Body> {
        handler(&self.deps, event.into_request()).await.unwrap()
    }

    /// `route` on `reservation`'s order, called by `user`.
    async fn order_route(
        &self,
        route: &str,
        user: &str,
        reservation: &Reservation,
    ) -> Response<Body> {
        self.call(
            ApiEvent::fixture("api-open-payment.json")
                .route(route)
                .path_param("order_id", &reservation.order_id.to_string())
                .user(user),
        )
        .await
    }

    /// The order's payment, opened through the route.
    async fn open(&self, reservation: &Reservation) -> PaymentId {
        let user = reservation.user_id.as_str();
        let response = self
            .order_route(OPEN_PAYMENT_ROUTE, user, reservation)
            .await;
        assert_eq!(response.status(), 200, "{}", body_json(&response));
        PaymentId::new(body_json(&response)["payment_id"].as_str().unwrap())
    }

    async fn confirm(&self, reservation: &Reservation) -> Response<Body> {
        let user = reservation.user_id.as_str();
        self.order_route(CONFIRM_PAYMENT_ROUTE, user, reservation)
            .await
    }

    /// Stripe's delivery of event `event_id` about `payment`, signed `signed_at`.
    async fn deliver(
        &self,
        event_id: &str,
        payment: &PaymentId,
        secret: &str,
        signed_at: DateTime<Utc>,
    ) -> Response<Body> {
        let payload = json!({
            "id": event_id,
            "object": "event",
            "type": "payment_intent.amount_capturable_updated",
            "data": {"object": {"id": payment.as_str(), "object": "payment_intent"}},
        })
        .to_string();
        let signature = webhook::sign(payload.as_bytes(), secret, signed_at.timestamp());
        self.call(
            ApiEvent::fixture("api-stripe-webhook.json")
                .header("stripe-signature", &signature)
                .body(payload),
        )
        .await
    }

    /// A webhook call with no Stripe-Signature at all.
    async fn deliver_unsigned(&self) -> Response<Body> {
        self.call(
            ApiEvent::fixture("api-stripe-webhook.json")
                .without_header("stripe-signature")
                .body("{}"),
        )
        .await
    }

    async fn status_of(&self, reservation: &Reservation) -> OrderStatus {
        let (order, _) = self
            .store
            .find(&reservation.order_id, &reservation.user_id)
            .await
            .unwrap()
            .unwrap();
        order.status
    }
}

/// A confirmation's 200: what the settlement found, and the order's status after it.
fn settled(response: &Response<Body>) -> (String, String) {
    let body = body_json(response);
    assert_eq!(response.status(), 200, "{body}");
    let field = |name: &str| body[name].as_str().unwrap_or_default().to_owned();
    (field("settlement"), field("status"))
}

fn pair(settlement: &str, status: &str) -> (String, String) {
    (settlement.to_owned(), status.to_owned())
}

#[tokio::test]
async fn a_deployment_without_a_provider_answers_payments_off_and_writes_nothing() {
    let world = World::wired(Provider::Off).await;
    let reservation = world.reserve("alice").await;
    for route in [OPEN_PAYMENT_ROUTE, CONFIRM_PAYMENT_ROUTE] {
        let response = world.order_route(route, "alice", &reservation).await;
        assert_eq!(response.status(), 404, "{route}");
        assert_eq!(error_code(&response), "payments_off");
    }
    let payment = PaymentId::new("pi_any");
    let response = world
        .deliver("evt_1", &payment, WEBHOOK_SECRET, world.clock.now())
        .await;
    assert_eq!(error_code(&response), "payments_off");
    // Without a signature at all it is a bad request, whether payments are on or not.
    let unsigned = world.deliver_unsigned().await;
    assert_eq!(error_code(&unsigned), "invalid_signature");
    assert_eq!(world.status_of(&reservation).await, OrderStatus::Reserved);
}

/// A Stripe secret without usable keys fails only the payments: each payment call is
/// 503 `payment_unavailable` with nothing written (the webhook's too, so Stripe delivers
/// it again once the keys are fixed), while orders are read and cancelled as ever.
#[tokio::test]
async fn a_stripe_secret_without_usable_keys_fails_only_the_payments_with_a_503() {
    let world = World::wired(Provider::Misconfigured).await;
    let reservation = world.reserve("alice").await;
    for route in [OPEN_PAYMENT_ROUTE, CONFIRM_PAYMENT_ROUTE] {
        let response = world.order_route(route, "alice", &reservation).await;
        assert_eq!(response.status(), 503, "{route}");
        assert_eq!(error_code(&response), "payment_unavailable", "{route}");
    }
    let payment = PaymentId::new("pi_any");
    let response = world
        .deliver("evt_1", &payment, WEBHOOK_SECRET, world.clock.now())
        .await;
    assert_refused(&response, 503, "payment_unavailable");
    let (order, _) = world
        .store
        .find(&reservation.order_id, &reservation.user_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(order.status, OrderStatus::Reserved);
    assert!(order.payment.is_none(), "no payment opened: {order:?}");

    let read = world
        .order_route(GET_ORDER_ROUTE, "alice", &reservation)
        .await;
    assert_eq!(read.status(), 200);
    let cancelled = world
        .order_route(CANCEL_ORDER_ROUTE, "alice", &reservation)
        .await;
    assert_eq!(cancelled.status(), 200);
    assert_eq!(world.status_of(&reservation).await, OrderStatus::Cancelled);
}

#[tokio::test]
async fn the_buyer_gets_one_payment_for_the_order_with_its_client_secret_and_the_public_key() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    let response = world
        .order_route(OPEN_PAYMENT_ROUTE, "alice", &reservation)
        .await;
    assert_eq!(response.status(), 200);
    let opened = body_json(&response);
    assert_eq!(opened["order_id"], reservation.order_id.to_string());
    assert_eq!(opened["provider"], "stripe");
    assert_eq!(opened["publishable_key"], PUBLISHABLE_KEY);
    assert_eq!(opened["amount"], 1999);
    assert_eq!(opened["currency"].as_str().unwrap().to_lowercase(), "eur");
    assert_eq!(opened["state"], "open");
    assert!(!opened["client_secret"].as_str().unwrap().is_empty());

    let again = world.open(&reservation).await;
    assert_eq!(again.as_str(), opened["payment_id"].as_str().unwrap());
    let other = world
        .order_route(OPEN_PAYMENT_ROUTE, "mallory", &reservation)
        .await;
    assert_refused(&other, 404, "order_not_found");
}

#[tokio::test]
async fn confirming_settles_from_the_provider_not_from_the_page() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    let unopened = world.confirm(&reservation).await;
    assert_refused(&unopened, 409, "no_payment");

    let payment = world.open(&reservation).await;
    // The page says it paid; the card was not confirmed.
    let early = world.confirm(&reservation).await;
    assert_eq!(settled(&early), pair("awaiting_buyer", "reserved"));

    assert!(world.provider.authorise(&payment));
    let paid = world.confirm(&reservation).await;
    assert_eq!(settled(&paid), pair("paid", "paid"));
    assert_eq!(
        world.provider.state_of(&payment),
        Some(PaymentState::Captured)
    );
    let opened_after = world
        .order_route(OPEN_PAYMENT_ROUTE, "alice", &reservation)
        .await;
    assert_eq!(error_code(&opened_after), "order_paid");
}

#[tokio::test]
async fn a_payment_authorised_after_the_deadline_moves_no_money() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    let payment = world.open(&reservation).await;
    world.clock.advance(Duration::seconds(601));
    assert!(world.provider.authorise(&payment));
    let late = world.confirm(&reservation).await;
    assert_eq!(settled(&late), pair("voided", "expired"));
    assert_eq!(
        world.provider.state_of(&payment),
        Some(PaymentState::Cancelled)
    );
    let stock: u64 = world
        .store
        .availability(&world.sale)
        .await
        .unwrap()
        .iter()
        .sum();
    assert_eq!(stock, 10, "the unit is back on sale");
}

#[tokio::test]
async fn a_webhook_settles_once_however_often_and_in_whatever_order_it_comes() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    let payment = world.open(&reservation).await;
    // An event that comes before the buyer confirmed settles nothing yet.
    let early = world
        .deliver("evt_early", &payment, WEBHOOK_SECRET, world.clock.now())
        .await;
    assert_eq!(early.status(), 200);
    assert_eq!(body_json(&early)["outcome"], "awaiting_buyer");

    assert!(world.provider.authorise(&payment));
    let first = world
        .deliver(
            "evt_authorised",
            &payment,
            WEBHOOK_SECRET,
            world.clock.now(),
        )
        .await;
    assert_eq!(first.status(), 200);
    assert_eq!(
        body_json(&first),
        json!({"received": true, "event_id": "evt_authorised", "outcome": "paid"})
    );
    let captures = world
        .provider
        .captures
        .load(std::sync::atomic::Ordering::SeqCst);
    let again = world
        .deliver(
            "evt_authorised",
            &payment,
            WEBHOOK_SECRET,
            world.clock.now(),
        )
        .await;
    assert_eq!(body_json(&again)["outcome"], "duplicate");
    // The early event, delivered again after the payment moved on: settled from the
    // payment as it is now, nothing moved twice.
    let late = world
        .deliver(
            "evt_early_retry",
            &payment,
            WEBHOOK_SECRET,
            world.clock.now(),
        )
        .await;
    assert_eq!(body_json(&late)["outcome"], "paid");
    assert_eq!(
        world
            .provider
            .captures
            .load(std::sync::atomic::Ordering::SeqCst),
        captures
    );
    assert_eq!(world.status_of(&reservation).await, OrderStatus::Paid);
}

#[tokio::test]
async fn a_forged_or_stale_webhook_is_refused_with_nothing_written() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    let payment = world.open(&reservation).await;
    assert!(world.provider.authorise(&payment));
    let now = world.clock.now();
    for (secret, signed_at) in [
        ("whsec_someone_else", now),
        (WEBHOOK_SECRET, now - Duration::minutes(6)),
    ] {
        let refused = world.deliver("evt_1", &payment, secret, signed_at).await;
        assert_refused(&refused, 400, "invalid_signature");
    }
    let unsigned = world.deliver_unsigned().await;
    assert_eq!(error_code(&unsigned), "invalid_signature");
    assert_eq!(world.status_of(&reservation).await, OrderStatus::Reserved);
    assert_eq!(
        world.provider.state_of(&payment),
        Some(PaymentState::Authorised)
    );

    // The same event, genuinely signed, was not taken as processed by the forgeries.
    let genuine = world.deliver("evt_1", &payment, WEBHOOK_SECRET, now).await;
    assert_eq!(body_json(&genuine)["outcome"], "paid");
}

#[tokio::test]
async fn a_signed_event_for_another_amount_is_refused_and_settles_nothing() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    world.open(&reservation).await;
    // A payment that names the order, for less: not the order's own.
    let cheap = world
        .provider
        .open(
            &reservation.order_id,
            &reservation.user_id,
            Price::new(50, "EUR").unwrap(),
        )
        .await
        .unwrap();
    assert!(world.provider.authorise(&cheap.id));
    let refused = world
        .deliver("evt_cheap", &cheap.id, WEBHOOK_SECRET, world.clock.now())
        .await;
    assert_eq!(
        refused.status(),
        200,
        "acknowledged, so Stripe stops sending it"
    );
    assert_eq!(body_json(&refused)["outcome"], "refused");
    assert_eq!(world.status_of(&reservation).await, OrderStatus::Reserved);
    assert_eq!(
        world.provider.state_of(&cheap.id),
        Some(PaymentState::Authorised)
    );
}

#[tokio::test]
async fn a_provider_that_does_not_answer_is_payment_unavailable_and_nothing_is_recorded() {
    let world = World::new().await;
    let reservation = world.reserve("alice").await;
    world.faults.inject("open", ProviderFault::NoAnswer);
    let response = world
        .order_route(OPEN_PAYMENT_ROUTE, "alice", &reservation)
        .await;
    assert_refused(&response, 503, "payment_unavailable");
    assert!(response.headers().contains_key("retry-after"));
    let unopened = world.confirm(&reservation).await;
    assert_eq!(
        error_code(&unopened),
        "no_payment",
        "no payment was recorded"
    );
    world.open(&reservation).await;
}
