//! The api function through its handler, with API Gateway events built from the
//! `events/api-*.json` fixtures, and the domain's in-memory fakes.

mod support;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use flashsale_api::{Config, Deps, LIST_ORDERS_ROUTE, PaymentWiring, Ports, handler};
use flashsale_domain::ports::{Blocklist, Clock, OrderBook, PayOutcome, SaleCatalog, StockLedger};
use flashsale_domain::testing;
use flashsale_domain::testing::{
    FailingLedger, InMemoryBlocklist, InMemoryStore, ManualClock, RecordingScheduler, pay_by_card,
};
use flashsale_domain::{OrderId, Reservation, Sale, SaleId, UserId};
use flashsale_lambda::testing::{ApiEvent, assert_refused, body_json, error_code, fixture};
use flashsale_lambda::{ConfigError, FromEnv as _, MAX_BODY_BYTES};
use lambda_http::Body;
use lambda_http::http::Response;
use serde_json::{Value, json};
use support::{config, starts_at};

const SALE: &str = "phone-launch";

fn sale_id() -> SaleId {
    SaleId::parse(SALE).unwrap()
}

/// The body of `events/api-create-sale.json`, as JSON, to vary per test.
fn sale_body() -> Value {
    serde_json::from_str(fixture("api-create-sale.json")["body"].as_str().unwrap()).unwrap()
}

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    scheduler: Arc<RecordingScheduler>,
    clock: Arc<ManualClock>,
    blocklist: Arc<InMemoryBlocklist>,
}

impl World {
    fn new() -> Self {
        Self::with_ledger(None)
    }

    fn with_ledger(ledger: Option<Arc<dyn StockLedger>>) -> Self {
        let store = Arc::new(InMemoryStore::new());
        let scheduler = Arc::new(RecordingScheduler::default());
        let clock = Arc::new(ManualClock::new(starts_at() + Duration::minutes(1)));
        let blocklist = Arc::new(InMemoryBlocklist::new());
        let deps = Deps::from_ports(
            &config(),
            Ports {
                catalog: store.clone(),
                ledger: ledger.unwrap_or_else(|| store.clone()),
                orders: store.clone(),
                scheduler: scheduler.clone(),
                clock: clock.clone(),
                blocklist: blocklist.clone(),
                payments: PaymentWiring::Off,
            },
        );
        Self {
            deps,
            store,
            scheduler,
            clock,
            blocklist,
        }
    }

    /// The fixture's sale (stock 100, 8 shards, one hour from `starts_at()`), created
    /// in the store directly.
    async fn with_sale() -> Self {
        let world = Self::new();
        world.create_sale_in_store(100, 8).await;
        world
    }

    async fn create_sale_in_store(&self, stock: i64, shards: i64) -> Sale {
        let sale = testing::sale(stock, shards)
            .id(SALE)
            .starting_at(starts_at())
            .build();
        assert!(self.store.create_sale(&sale).await.unwrap());
        sale
    }

    /// A unit reserved for `user`, as a grab would have left it.
    async fn reserve(&self, user: &str) -> Reservation {
        let sale = self.store.find_sale(&sale_id()).await.unwrap().unwrap();
        let now = self.clock.now();
        let user = UserId::parse(user).unwrap();
        let shard = sale.bucket_of(&user);
        let reservation = Reservation {
            order_id: OrderId::new(sale_id()),
            sale_id: sale_id(),
            user_id: user,
            shard,
            created_at: now,
            expires_at: sale.payment_deadline(now),
            price: sale.price,
        };
        self.store
            .reserve(&sale, shard, &reservation)
            .await
            .unwrap()
            .unwrap();
        reservation
    }

    /// A reservation whose release timer the order consumer has already set (it writes
    /// nothing else: the hold is the order).
    async fn with_timer(&self, user: &str) -> Reservation {
        let reservation = self.reserve(user).await;
        self.scheduler
            .timers
            .lock()
            .unwrap()
            .insert(reservation.order_id.clone(), reservation.clone());
        reservation
    }

    /// The order paid by card, as a settlement marks it (the card routes' own tests are
    /// in payment_routes.rs).
    async fn pay(&self, reservation: &Reservation) {
        let paid = pay_by_card(self.store.as_ref(), reservation, self.clock.now()).await;
        assert_eq!(paid.unwrap(), PayOutcome::Paid);
    }

    async fn call(&self, event: ApiEvent) -> Response<Body> {
        handler(&self.deps, event.into_request()).await.unwrap()
    }

    async fn order_call(&self, fixture: &str, user: &str, order_id: &OrderId) -> Response<Body> {
        self.call(
            ApiEvent::fixture(fixture)
                .path_param("order_id", &order_id.to_string())
                .user(user),
        )
        .await
    }

    async fn create(&self, body: &Value) -> Response<Body> {
        self.call(ApiEvent::fixture("api-create-sale.json").json(body))
            .await
    }

    async fn available(&self) -> u64 {
        let Some(sale) = self.store.find_sale(&sale_id()).await.unwrap() else {
            return 0;
        };
        self.store.availability(&sale).await.unwrap().iter().sum()
    }

    async fn sale_exists(&self) -> bool {
        self.store.find_sale(&sale_id()).await.unwrap().is_some()
    }

    async fn status_of(&self, reservation: &Reservation) -> String {
        let (order, _) = self
            .store
            .find(&reservation.order_id, &reservation.user_id)
            .await
            .unwrap()
            .unwrap();
        order.status.to_string()
    }

    /// A blocklist route, called by the fixture's admin unless the event is changed.
    fn blocklist_event(route: &str, user_id: Option<&str>) -> ApiEvent {
        let event = ApiEvent::fixture("api-sale-stats.json").route(route);
        match user_id {
            Some(user_id) => event.path_param("user_id", user_id),
            None => event,
        }
    }

    async fn blocked_now(&self) -> Vec<String> {
        let mut users: Vec<String> = self
            .blocklist
            .blocked()
            .await
            .unwrap()
            .into_iter()
            .map(String::from)
            .collect();
        users.sort();
        users
    }

    fn has_timer(&self, reservation: &Reservation) -> bool {
        self.scheduler
            .timers
            .lock()
            .unwrap()
            .contains_key(&reservation.order_id)
    }
}

// ---- POST /admin/sales ----------------------------------------------------------

#[tokio::test]
async fn an_admin_creates_a_sale_and_gets_it_back_with_201() {
    let world = World::new();
    let response = world.call(ApiEvent::fixture("api-create-sale.json")).await;

    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["location"], "/sales/phone-launch");
    let body = body_json(&response);
    assert_eq!(body["sale_id"], SALE);
    assert_eq!(body["name"], "Phone launch");
    assert_eq!(
        body["price"],
        json!({"amount": 129_900, "currency": "EUR", "decimals": 2})
    );
    assert_eq!(body["stock_total"], 100);
    assert_eq!(body["shards"], 8);
    assert_eq!(body["per_user_limit"], 1);
    assert_eq!(body["payment_timeout_secs"], 900);
    assert_eq!(body["starts_at"], "2026-01-01T00:00:00Z");
    assert_eq!(world.available().await, 100);
}

#[tokio::test]
async fn a_sale_without_an_id_gets_one_and_the_defaults() {
    let world = World::new();
    let mut body = sale_body();
    for optional in [
        "sale_id",
        "per_user_limit",
        "payment_timeout_secs",
        "shards",
    ] {
        body.as_object_mut().unwrap().remove(optional);
    }
    let response = world.create(&body).await;

    assert_eq!(response.status(), 201);
    let created = body_json(&response);
    let id = SaleId::parse(created["sale_id"].as_str().unwrap()).unwrap();
    assert!(world.store.find_sale(&id).await.unwrap().is_some());
    assert_eq!(created["per_user_limit"], 1);
    assert_eq!(created["payment_timeout_secs"], 900);
    assert!(created["shards"].as_u64().unwrap() >= 1);
}

#[tokio::test]
async fn creating_an_existing_sale_is_sale_exists_and_changes_nothing() {
    let world = World::with_sale().await;
    let reservation = world.reserve("user-alice").await;
    let mut body = sale_body();
    body["stock"] = json!(50);

    let response = world.create(&body).await;
    assert_refused(&response, 409, "sale_exists");
    let sale = world.store.find_sale(&sale_id()).await.unwrap().unwrap();
    assert_eq!(sale.stock_total, 100);
    assert_eq!(world.available().await, 99);
    assert_eq!(world.status_of(&reservation).await, "reserved");
}

#[tokio::test]
async fn every_bad_sale_body_is_a_4xx_naming_the_problem_and_writes_nothing() {
    let world = World::new();
    let with = |field: &str, value: Value| {
        let mut body = sale_body();
        body[field] = value;
        body.to_string()
    };
    let without = |field: &str| {
        let mut body = sale_body();
        body.as_object_mut().unwrap().remove(field);
        body.to_string()
    };
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "malformed JSON",
            r#"{"sale_id":"phone-launch","name":"#.to_owned(),
            "invalid_json",
            "not valid JSON",
        ),
        (
            "trailing garbage",
            format!("{} x", sale_body()),
            "invalid_json",
            "not valid JSON",
        ),
        ("an empty body", String::new(), "invalid_json", "empty"),
        (
            "an array",
            "[]".to_owned(),
            "invalid_input",
            "the request body must be a JSON object",
        ),
        (
            "a missing name",
            without("name"),
            "invalid_input",
            "missing field `name`",
        ),
        (
            "a missing stock",
            without("stock"),
            "invalid_input",
            "missing field `stock`",
        ),
        (
            "stock as a string",
            with("stock", json!("ten")),
            "invalid_input",
            "`stock` must be an integer, not a string",
        ),
        (
            "stock as a fraction",
            with("stock", json!(1.5)),
            "invalid_input",
            "`stock` must be an integer",
        ),
        (
            "a null sale id",
            with("sale_id", Value::Null),
            "invalid_input",
            "`sale_id` must be a string, not null",
        ),
        (
            "a null per-user limit",
            with("per_user_limit", Value::Null),
            "invalid_input",
            "`per_user_limit` must be an integer, not null",
        ),
        (
            "a null payment timeout",
            with("payment_timeout_secs", Value::Null),
            "invalid_input",
            "`payment_timeout_secs` must be an integer, not null",
        ),
        (
            "null shards",
            with("shards", Value::Null),
            "invalid_input",
            "`shards` must be an integer, not null",
        ),
        (
            "stock 0",
            with("stock", json!(0)),
            "invalid_input",
            "stock must be between 1 and 1000000",
        ),
        (
            "negative stock",
            with("stock", json!(-5)),
            "invalid_input",
            "stock must be between",
        ),
        (
            "too much stock",
            with("stock", json!(1_000_001)),
            "invalid_input",
            "stock must be between",
        ),
        (
            "a date that is not a date",
            with("starts_at", json!("tomorrow")),
            "invalid_input",
            "`starts_at` must be an RFC 3339 date-time",
        ),
        (
            "an end before the start",
            with("ends_at", json!("2025-12-31T23:00:00Z")),
            "invalid_input",
            "ends_at must be after starts_at",
        ),
        (
            "an end equal to the start",
            with("ends_at", json!("2026-01-01T00:00:00Z")),
            "invalid_input",
            "ends_at must be after starts_at",
        ),
        (
            "a zero payment timeout",
            with("payment_timeout_secs", json!(0)),
            "invalid_input",
            "payment_timeout_secs",
        ),
        (
            "a zero per-user limit",
            with("per_user_limit", json!(0)),
            "invalid_input",
            "per_user_limit",
        ),
        (
            "more shards than stock",
            with("shards", json!(101)),
            "invalid_input",
            "shards",
        ),
        (
            "an unsafe sale id",
            with("sale_id", json!("phone launch/1")),
            "invalid_input",
            "sale_id",
        ),
        (
            "a blank name",
            with("name", json!("   ")),
            "invalid_input",
            "name must be 1 to 200 characters, not all blank",
        ),
        (
            "a name too long before trimming",
            with("name", json!(format!("     {}     ", "x".repeat(200)))),
            "invalid_input",
            "name must be 1 to 200 characters",
        ),
        (
            "a name with NUL",
            with("name", json!("Phone\u{0}")),
            "invalid_input",
            "control or bidirectional formatting characters (found U+0000)",
        ),
        (
            "a name with an escape sequence",
            with("name", json!("\u{1b}[2JPhone")),
            "invalid_input",
            "(found U+001B)",
        ),
        (
            "a name with a right-to-left override",
            with("name", json!("Phone \u{202e}gpj.exe")),
            "invalid_input",
            "(found U+202E)",
        ),
        (
            "an unknown field",
            with("discount", json!(10)),
            "invalid_input",
            "unknown field `discount`",
        ),
        (
            "no price",
            without("price"),
            "invalid_input",
            "missing field `price`",
        ),
        (
            "a price as a bare number",
            with("price", json!(1299)),
            "invalid_input",
            "`price` must be an object such as",
        ),
        (
            "a price in major units",
            with("price", json!({"amount": 12.99, "currency": "EUR"})),
            "invalid_input",
            "`price.amount` must be an integer, not a number",
        ),
        (
            "a free unit",
            with("price", json!({"amount": 0, "currency": "EUR"})),
            "invalid_input",
            "price.amount must be positive",
        ),
        (
            "a price past Stripe's eight digits",
            with("price", json!({"amount": 100_000_000, "currency": "EUR"})),
            "invalid_input",
            "price.amount must be at most 999999.99 EUR, Stripe's largest charge",
        ),
        (
            "a price under Stripe's minimum charge",
            with("price", json!({"amount": 49, "currency": "USD"})),
            "invalid_input",
            "price.amount must be at least 0.50 USD, Stripe's minimum charge",
        ),
        (
            "a fraction of an ariary, which Stripe charges whole",
            with("price", json!({"amount": 129_950, "currency": "MGA"})),
            "invalid_input",
            "price.amount must be a multiple of 100 (in ISO 4217's minor unit, 2 decimals): \
             Stripe charges MGA in steps of 1.00",
        ),
        (
            "a currency Stripe does not charge in",
            with("price", json!({"amount": 1_299, "currency": "IRR"})),
            "invalid_input",
            "price.currency must be a currency Stripe charges in, which IRR is not",
        ),
        (
            "a made-up currency",
            with("price", json!({"amount": 100, "currency": "ABC"})),
            "invalid_input",
            "price.currency must be an ISO 4217 currency code",
        ),
        (
            "a currency in Stripe's lower case",
            with("price", json!({"amount": 100, "currency": "eur"})),
            "invalid_input",
            "(in upper case)",
        ),
        (
            "gold",
            with("price", json!({"amount": 100, "currency": "XAU"})),
            "invalid_input",
            "not money a buyer pays in",
        ),
        (
            "no currency",
            with("price", json!({"amount": 100})),
            "invalid_input",
            "missing field `currency`",
        ),
        (
            "a null name",
            with("name", Value::Null),
            "invalid_input",
            "`name` must be a string, not null",
        ),
    ];
    for (what, body, code, hint) in cases {
        let response = world
            .call(ApiEvent::fixture("api-create-sale.json").body(body))
            .await;
        assert_eq!(response.status(), 400, "{what}");
        assert_eq!(error_code(&response), code, "{what}");
        let message = body_json(&response)["message"].as_str().unwrap().to_owned();
        assert!(message.contains(hint), "{what}: {message:?} lacks {hint:?}");
        for rust_word in ["i64", "struct", "SaleDraft", "PriceDraft", "DateTime"] {
            assert!(!message.contains(rust_word), "{what}: {message:?}");
        }
        assert!(!world.sale_exists().await, "{what} wrote a sale");
    }
}

#[tokio::test]
async fn a_name_is_kept_exactly_as_sent() {
    let world = World::new();
    let mut body = sale_body();
    body["name"] = json!("  Phone \u{1F4F1} launch ");
    let response = world.create(&body).await;
    assert_eq!(response.status(), 201);
    assert_eq!(body_json(&response)["name"], "  Phone \u{1F4F1} launch ");
}

#[tokio::test]
async fn a_sale_body_not_sent_as_json_is_unsupported_media_type_and_writes_nothing() {
    let world = World::new();
    for content_type in [Some("text/plain"), Some("application/xml"), None] {
        let mut event = ApiEvent::fixture("api-create-sale.json").json(&sale_body());
        event = match content_type {
            Some(content_type) => event.header("content-type", content_type),
            None => event.without_header("content-type"),
        };
        let response = world.call(event).await;
        assert_eq!(response.status(), 415, "{content_type:?}");
        assert_eq!(error_code(&response), "unsupported_media_type");
        assert!(!world.sale_exists().await, "{content_type:?} wrote a sale");
    }
    let charset = ApiEvent::fixture("api-create-sale.json")
        .json(&sale_body())
        .header("content-type", "application/json; charset=utf-8");
    assert_eq!(world.call(charset).await.status(), 201);
}

#[tokio::test]
async fn every_route_answers_an_oversize_body_with_payload_too_large() {
    let world = World::with_sale().await;
    let huge = "x".repeat(MAX_BODY_BYTES + 1);
    for fixture in [
        "api-get-sale.json",
        "api-get-order.json",
        "api-open-payment.json",
        "api-cancel-order.json",
        "api-sale-stats.json",
    ] {
        let response = world
            .call(ApiEvent::fixture(fixture).body(huge.clone()))
            .await;
        assert_eq!(response.status(), 413, "{fixture}");
        assert_eq!(error_code(&response), "payload_too_large", "{fixture}");
    }
}

#[tokio::test]
async fn an_oversize_sale_body_is_payload_too_large_and_writes_nothing() {
    let world = World::new();
    let body = with_long_name(MAX_BODY_BYTES);
    let response = world
        .call(ApiEvent::fixture("api-create-sale.json").body(body))
        .await;
    assert_refused(&response, 413, "payload_too_large");
    assert!(!world.sale_exists().await);
}

fn with_long_name(len: usize) -> String {
    let mut body = sale_body();
    body["name"] = json!("x".repeat(len));
    body.to_string()
}

#[tokio::test]
async fn a_non_admin_cannot_create_a_sale_and_nothing_is_written() {
    let world = World::new();
    let user = ApiEvent::fixture("api-create-sale.json")
        .user("user-mallory")
        .without_claim("cognito:groups");
    let wrong_group = ApiEvent::fixture("api-create-sale.json").claim("cognito:groups", "[buyers]");
    for event in [user, wrong_group] {
        let response = world.call(event).await;
        assert_refused(&response, 403, "forbidden");
    }
    // Even an invalid body answers forbidden: non-admins learn nothing about bodies.
    let response = world
        .call(
            ApiEvent::fixture("api-create-sale.json")
                .without_claim("cognito:groups")
                .body("{"),
        )
        .await;
    assert_eq!(error_code(&response), "forbidden");
    assert!(!world.sale_exists().await);
}

#[tokio::test]
async fn an_anonymous_caller_cannot_create_a_sale() {
    let world = World::new();
    let response = world
        .call(ApiEvent::fixture("api-create-sale.json").anonymous())
        .await;
    assert_refused(&response, 401, "unauthorized");
    assert!(!world.sale_exists().await);
}

// ---- GET /sales/{sale_id} ---------------------------------------------------------

#[tokio::test]
async fn the_public_sale_page_shows_status_stock_and_server_time_with_a_short_cache() {
    let world = World::with_sale().await;
    world.reserve("user-alice").await;
    let response = world.call(ApiEvent::fixture("api-get-sale.json")).await;

    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "public, max-age=1");
    let body = body_json(&response);
    assert_eq!(body["sale_id"], SALE);
    assert_eq!(body["name"], "Phone launch");
    assert_eq!(body["status"], "active");
    assert_eq!(body["stock_total"], 100);
    assert_eq!(body["stock_available"], 99);
    assert_eq!(
        body["price"],
        json!({"amount": 129_900, "currency": "EUR", "decimals": 2}),
        "the price, with its currency's decimals for display"
    );
    assert_eq!(
        body["per_user_limit"], 1,
        "a rule of the sale the page shows"
    );
    assert_eq!(body["starts_at"], "2026-01-01T00:00:00Z");
    assert_eq!(body["ends_at"], "2026-01-01T01:00:00Z");
    let server_time: DateTime<Utc> = body["server_time"].as_str().unwrap().parse().unwrap();
    assert_eq!(server_time, world.clock.now());
}

#[tokio::test]
async fn the_sale_page_follows_the_sale_through_its_phases() {
    let world = World::new();
    world.create_sale_in_store(1, 1).await;
    let page = || async { body_json(&world.call(ApiEvent::fixture("api-get-sale.json")).await) };

    world.clock.set(starts_at() - Duration::minutes(5));
    assert_eq!(page().await["status"], "upcoming");
    world.clock.set(starts_at() + Duration::minutes(1));
    assert_eq!(page().await["status"], "active");
    world.reserve("user-alice").await;
    assert_eq!(page().await["status"], "sold_out");
    world.clock.set(starts_at() + Duration::hours(2));
    assert_eq!(page().await["status"], "ended");
}

#[tokio::test]
async fn an_unknown_or_malformed_sale_is_sale_not_found() {
    let world = World::with_sale().await;
    for sale in ["no-such-sale", "not a sale id"] {
        let response = world
            .call(ApiEvent::fixture("api-get-sale.json").path_param("sale_id", sale))
            .await;
        assert_eq!(response.status(), 404, "{sale}");
        assert_eq!(error_code(&response), "sale_not_found", "{sale}");
    }
}

#[tokio::test]
async fn a_transient_store_failure_is_unavailable_with_retry_after() {
    let world = World::with_ledger(Some(Arc::new(FailingLedger { transient: true })));
    world.create_sale_in_store(10, 1).await;
    let response = world.call(ApiEvent::fixture("api-get-sale.json")).await;
    assert_refused(&response, 503, "unavailable");
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.headers()["cache-control"], "no-store");
}

// ---- GET /admin/sales -----------------------------------------------------------------

/// `GET /admin/sales` with `limit` and `cursor`, as the admin.
async fn list_page(world: &World, limit: Option<&str>, cursor: Option<&str>) -> Response<Body> {
    world
        .call(
            ApiEvent::fixture("api-list-sales.json")
                .query("limit", limit)
                .query("cursor", cursor),
        )
        .await
}

#[tokio::test]
async fn an_admin_pages_through_every_sale_latest_ending_first_each_with_its_status() {
    let world = World::new();
    // (id, starts, ends) after the start of `starts_at()`; the clock is a minute in.
    let hours = Duration::hours;
    for (id, starts, ends) in [
        ("ended", hours(-48), hours(-1)),
        ("active-a", hours(0), hours(24)),
        ("active-b", hours(0), hours(48)),
        ("upcoming", hours(24), hours(72)),
    ] {
        let sale = testing::sale(3, 1)
            .id(id)
            .starting_at(starts_at() + starts)
            .with(|draft| draft.ends_at = starts_at() + ends)
            .build();
        assert!(world.store.create_sale(&sale).await.unwrap());
    }

    let first = list_page(&world, Some("3"), None).await;
    assert_eq!(first.status(), 200);
    let first = body_json(&first);
    let listed = |page: &Value| -> Vec<(String, String, u64)> {
        page["sales"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sale| {
                (
                    sale["sale_id"].as_str().unwrap().to_owned(),
                    sale["status"].as_str().unwrap().to_owned(),
                    sale["stock_available"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        listed(&first),
        [
            ("upcoming".to_owned(), "upcoming".to_owned(), 3),
            ("active-b".to_owned(), "active".to_owned(), 3),
            ("active-a".to_owned(), "active".to_owned(), 3),
        ],
        "{first}"
    );
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let last = body_json(&list_page(&world, Some("3"), Some(cursor)).await);
    assert_eq!(
        listed(&last),
        [("ended".to_owned(), "ended".to_owned(), 3)],
        "{last}"
    );
    assert!(last.get("next_cursor").is_none(), "the last page: {last}");
    // Without a limit, the default page holds them all.
    let all = body_json(&list_page(&world, None, None).await);
    assert_eq!(all["sales"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn a_bad_page_request_is_invalid_input_and_only_admins_list_sales() {
    let world = World::with_sale().await;
    for limit in ["0", "101", "-1", "ten", ""] {
        let response = list_page(&world, Some(limit), None).await;
        assert_eq!(response.status(), 400, "limit {limit:?}");
        assert_eq!(error_code(&response), "invalid_input", "limit {limit:?}");
    }
    for cursor in ["garbage", "1.2", "1.2.not a sale"] {
        let response = list_page(&world, None, Some(cursor)).await;
        assert_eq!(response.status(), 400, "cursor {cursor:?}");
        assert_eq!(error_code(&response), "invalid_input", "cursor {cursor:?}");
    }
    let response = world
        .call(ApiEvent::fixture("api-list-sales.json").without_claim("cognito:groups"))
        .await;
    assert_refused(&response, 403, "forbidden");
}

// ---- POST /admin/sales/{sale_id}/pause, /resume, /end; GET .../audit --------------

async fn control(world: &World, action: &str) -> Response<Body> {
    world
        .call(
            ApiEvent::fixture("api-pause-sale.json")
                .route(&format!("POST /admin/sales/{{sale_id}}/{action}")),
        )
        .await
}

#[tokio::test]
async fn an_admin_pauses_resumes_and_ends_a_sale_each_change_audited_with_who_and_when() {
    let world = World::with_sale().await;
    let expect = |response: Response<Body>, control: &str, changed: bool| {
        assert_eq!(response.status(), 200);
        assert_eq!(
            body_json(&response),
            json!({"sale_id": SALE, "control": control, "changed": changed})
        );
    };
    expect(control(&world, "pause").await, "paused", true);
    let page = world.call(ApiEvent::fixture("api-get-sale.json")).await;
    assert_eq!(body_json(&page)["status"], "paused");
    expect(control(&world, "pause").await, "paused", false);
    world.clock.advance(Duration::seconds(30));
    expect(control(&world, "resume").await, "open", true);
    let page = world.call(ApiEvent::fixture("api-get-sale.json")).await;
    assert_eq!(body_json(&page)["status"], "active");
    world.clock.advance(Duration::seconds(30));
    expect(control(&world, "end").await, "ended", true);
    expect(control(&world, "end").await, "ended", false);
    for action in ["pause", "resume"] {
        assert_refused(&control(&world, action).await, 410, "ended");
    }

    let trail = world.call(ApiEvent::fixture("api-sale-audit.json")).await;
    assert_eq!(trail.status(), 200);
    let started = starts_at() + Duration::minutes(1);
    let at = |seconds| json!(started + Duration::seconds(seconds));
    assert_eq!(
        body_json(&trail),
        json!({"entries": [
            {"action": "end", "by": "user-admin", "at": at(60)},
            {"action": "resume", "by": "user-admin", "at": at(30)},
            {"action": "pause", "by": "user-admin", "at": at(0)},
        ]})
    );
}

#[tokio::test]
async fn only_admins_control_a_sale_or_read_its_trail_and_a_refusal_writes_nothing() {
    let world = World::with_sale().await;
    for action in ["pause", "resume", "end"] {
        let event = ApiEvent::fixture("api-pause-sale.json")
            .route(&format!("POST /admin/sales/{{sale_id}}/{action}"));
        let response = world
            .call(event.clone().without_claim("cognito:groups"))
            .await;
        assert_refused(&response, 403, "forbidden");
        assert_eq!(world.call(event.anonymous()).await.status(), 401);
    }
    let trail = ApiEvent::fixture("api-sale-audit.json");
    let response = world
        .call(trail.clone().without_claim("cognito:groups"))
        .await;
    assert_refused(&response, 403, "forbidden");
    let found = world.store.find_sale(&sale_id()).await.unwrap().unwrap();
    assert_eq!(found.control, flashsale_domain::SaleControl::Open);
    assert_eq!(world.store.audit_trail(&sale_id(), 10).await.unwrap(), []);

    let unknown = ApiEvent::fixture("api-pause-sale.json").path_param("sale_id", "no-such-sale");
    assert_refused(&world.call(unknown).await, 404, "sale_not_found");
    let unknown = trail.path_param("sale_id", "no-such-sale");
    assert_refused(&world.call(unknown).await, 404, "sale_not_found");
}

#[tokio::test]
async fn a_paused_sale_lists_as_paused() {
    let world = World::with_sale().await;
    assert_eq!(control(&world, "pause").await.status(), 200);
    let listed = body_json(&list_page(&world, None, None).await);
    assert_eq!(listed["sales"][0]["status"], "paused", "{listed}");
}

// ---- GET /admin/sales/{sale_id}/orders and /orders.csv ------------------------------

fn export(route: &str, query: &[(&str, &str)]) -> ApiEvent {
    let mut event = ApiEvent::fixture("api-sale-stats.json")
        .route(&format!("GET /admin/sales/{{sale_id}}/{route}"));
    for (name, value) in query {
        event = event.query(name, Some(value));
    }
    event
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

fn text(response: &Response<Body>) -> String {
    match response.body() {
        Body::Text(text) => text.clone(),
        other => panic!("a text body, not {other:?}"),
    }
}

/// Every page of the paid orders' export at `route` (`orders` or `orders.csv`), two
/// buyers a page, each answered 200, following the cursor `next` reads off a page.
async fn export_pages(
    world: &World,
    route: &str,
    next: impl Fn(&Response<Body>) -> Option<String>,
) -> Vec<Response<Body>> {
    let (mut pages, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let mut query = vec![("status", "paid"), ("limit", "2")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor));
        }
        let response = world.call(export(route, &query)).await;
        assert_eq!(response.status(), 200);
        cursor = next(&response);
        pages.push(response);
        if cursor.is_none() {
            return pages;
        }
    }
}

#[tokio::test]
async fn an_admin_exports_the_paid_orders_page_by_page_as_json_and_as_csv() {
    let world = World::with_sale().await;
    let mut paid = Vec::new();
    for buyer in ["user-ann", "=cmd|calc", "user-cy", "user-dee", "user-eve"] {
        let held = world.with_timer(buyer).await;
        if buyer != "user-cy" {
            world.pay(&held).await;
            paid.push(held);
        }
    }

    // JSON, two buyers a page: every paid order once, and the unpaid one left out.
    let mut listed = Vec::new();
    for response in export_pages(&world, "orders", |response| {
        body_json(response)["next_cursor"]
            .as_str()
            .map(str::to_owned)
    })
    .await
    {
        for line in body_json(&response)["orders"].as_array().unwrap() {
            assert_eq!(line["status"], "paid", "{line}");
            assert_eq!(line["price"]["amount"], 129_900, "{line}");
            assert!(line["paid_at"].is_string(), "{line}");
            listed.push(line["order_id"].as_str().unwrap().to_owned());
        }
    }
    listed.sort();
    let mut expected: Vec<String> = paid.iter().map(|held| held.order_id.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);

    // CSV: the header row on the first page only, the cursor in a header.
    let mut csv = String::new();
    for response in export_pages(&world, "orders.csv", |response| {
        header(response, "x-next-cursor").map(str::to_owned)
    })
    .await
    {
        assert_eq!(
            header(&response, "content-type"),
            Some("text/csv; charset=utf-8")
        );
        assert_eq!(
            header(&response, "content-disposition"),
            Some("attachment; filename=\"phone-launch-orders.csv\"")
        );
        csv.push_str(&text(&response));
    }
    let lines: Vec<&str> = csv.lines().collect();
    assert!(csv.ends_with("\r\n"), "RFC 4180 line ends: {csv:?}");
    assert_eq!(
        lines[0],
        "order_id,buyer,status,payment,amount,currency,price,paid_at"
    );
    assert_eq!(lines.len(), 1 + paid.len(), "{csv}");
    let ann = paid[0].order_id.to_string();
    let row = lines
        .iter()
        .find(|line| line.starts_with(&ann))
        .expect("ann's row");
    assert!(
        row.starts_with(&format!(
            "{ann},user-ann,paid,captured,129900,EUR,1299.00,2026-"
        )),
        "{row}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains(",'=cmd|calc,paid,captured,")),
        "a formula is defused: {csv}"
    );

    // Without a status: every order, the unpaid one too.
    let all = body_json(&world.call(export("orders", &[])).await);
    assert_eq!(all["orders"].as_array().unwrap().len(), 5, "{all}");
}

#[tokio::test]
async fn a_bad_export_request_is_invalid_input_and_only_admins_export() {
    let world = World::with_sale().await;
    for route in ["orders", "orders.csv"] {
        for query in [
            [("status", "shipped")],
            [("limit", "0")],
            [("limit", "1001")],
            [("cursor", "nonsense")],
        ] {
            let response = world.call(export(route, &query)).await;
            assert_refused(&response, 400, "invalid_input");
        }
        let response = world
            .call(export(route, &[]).without_claim("cognito:groups"))
            .await;
        assert_refused(&response, 403, "forbidden");
        let response = world
            .call(export(route, &[]).path_param("sale_id", "no-such-sale"))
            .await;
        assert_refused(&response, 404, "sale_not_found");
    }
}

// ---- GET /admin/sales/{sale_id}/stats ---------------------------------------------

#[tokio::test]
async fn an_admin_sees_stats_that_reconcile() {
    let world = World::with_sale().await;
    world.reserve("user-alice").await;
    world.with_timer("user-bob").await;
    let paid = world.with_timer("user-carol").await;
    world.pay(&paid).await;
    let cancelled = world.reserve("user-dave").await;
    world
        .order_call("api-cancel-order.json", "user-dave", &cancelled.order_id)
        .await;

    let response = world.call(ApiEvent::fixture("api-sale-stats.json")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        body_json(&response),
        json!({
            "stock_total": 100,
            "available": 97,
            "reserved": 2,
            "paid": 1,
            "cancelled": 1,
            "expired": 0,
            "refunded": 0,
            "payment_failed": 0,
            "capture_pending": 0,
            "refund_pending": 0,
            "consistent": true,
        })
    );
}

#[tokio::test]
async fn stats_are_for_admins_only() {
    let world = World::with_sale().await;
    let response = world
        .call(ApiEvent::fixture("api-sale-stats.json").without_claim("cognito:groups"))
        .await;
    assert_refused(&response, 403, "forbidden");

    let response = world
        .call(ApiEvent::fixture("api-sale-stats.json").anonymous())
        .await;
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn stats_of_an_unknown_sale_are_sale_not_found() {
    let world = World::new();
    let response = world.call(ApiEvent::fixture("api-sale-stats.json")).await;
    assert_refused(&response, 404, "sale_not_found");
}

// ---- GET /orders/{order_id} -------------------------------------------------------

#[tokio::test]
async fn the_owner_reads_their_order() {
    let world = World::with_sale().await;
    let reservation = world.reserve("user-alice").await;
    let response = world
        .order_call("api-get-order.json", "user-alice", &reservation.order_id)
        .await;

    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body = body_json(&response);
    assert_eq!(
        body,
        json!({
            "order_id": reservation.order_id.to_string(),
            "sale_id": SALE,
            "status": "reserved",
            "price": {"amount": 129_900, "currency": "EUR", "decimals": 2},
            "expires_at": reservation.expires_at,
        })
    );
}

#[tokio::test]
async fn another_users_order_is_not_found_like_a_missing_one() {
    let world = World::with_sale().await;
    let alices = world.reserve("user-alice").await;
    let missing = OrderId::new(sale_id());
    for (user, order_id) in [("user-bob", &alices.order_id), ("user-alice", &missing)] {
        let response = world.order_call("api-get-order.json", user, order_id).await;
        assert_refused(&response, 404, "order_not_found");
    }
    let response = world
        .call(ApiEvent::fixture("api-get-order.json").path_param("order_id", "garbage"))
        .await;
    assert_eq!(error_code(&response), "order_not_found");
}

// ---- GET /orders ----------------------------------------------------------------------

async fn my_orders(
    world: &World,
    user: &str,
    limit: Option<&str>,
    cursor: Option<&str>,
) -> Response<Body> {
    world
        .call(
            ApiEvent::fixture("api-get-order.json")
                .route(LIST_ORDERS_ROUTE)
                .user(user)
                .query("limit", limit)
                .query("cursor", cursor),
        )
        .await
}

#[tokio::test]
async fn a_buyer_lists_their_own_orders_as_each_reads_and_nobody_elses() {
    let world = World::with_sale().await;
    let alices = world.reserve("user-alice").await;
    let bobs = world.reserve("user-bob").await;
    for (user, theirs) in [("user-alice", &alices), ("user-bob", &bobs)] {
        let response = my_orders(&world, user, None, None).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["cache-control"], "no-store");
        let read = world
            .order_call("api-get-order.json", user, &theirs.order_id)
            .await;
        assert_eq!(body_json(&response), json!({"orders": [body_json(&read)]}));
    }
    let response = my_orders(&world, "user-carol", Some("50"), None).await;
    assert_eq!(body_json(&response), json!({"orders": []}));
}

#[tokio::test]
async fn a_bad_page_of_my_orders_is_invalid_input_and_an_anonymous_caller_is_refused() {
    let world = World::with_sale().await;
    for limit in ["0", "51", "-1", "ten", ""] {
        let response = my_orders(&world, "user-alice", Some(limit), None).await;
        assert_refused(&response, 400, "invalid_input");
    }
    for cursor in ["garbage", "1.2", "1.2.not a sale"] {
        let response = my_orders(&world, "user-alice", None, Some(cursor)).await;
        assert_refused(&response, 400, "invalid_input");
    }
    let response = world
        .call(
            ApiEvent::fixture("api-get-order.json")
                .route(LIST_ORDERS_ROUTE)
                .anonymous(),
        )
        .await;
    assert_eq!(response.status(), 401);
}

// ---- POST /orders/{order_id}/cancel -------------------------------------------------

#[tokio::test]
async fn cancelling_returns_the_stock_at_once_and_is_idempotent() {
    let world = World::with_sale().await;
    let reservation = world.with_timer("user-alice").await;
    for _ in 0..2 {
        let response = world
            .order_call("api-cancel-order.json", "user-alice", &reservation.order_id)
            .await;
        assert_eq!(response.status(), 200);
        assert_eq!(body_json(&response)["status"], "cancelled");
        assert_eq!(world.available().await, 100);
    }
    assert!(!world.has_timer(&reservation));
}

#[tokio::test]
async fn cancelling_a_paid_order_is_order_paid_and_keeps_the_sale() {
    let world = World::with_sale().await;
    let reservation = world.with_timer("user-alice").await;
    world.pay(&reservation).await;

    let response = world
        .order_call("api-cancel-order.json", "user-alice", &reservation.order_id)
        .await;
    assert_refused(&response, 409, "order_paid");
    assert_eq!(world.status_of(&reservation).await, "paid");
    assert_eq!(world.available().await, 99);
}

#[tokio::test]
async fn nobody_cancels_another_users_order() {
    let world = World::with_sale().await;
    let reservation = world.with_timer("user-alice").await;
    let response = world
        .order_call("api-cancel-order.json", "user-bob", &reservation.order_id)
        .await;
    assert_refused(&response, 404, "order_not_found");
    assert_eq!(world.status_of(&reservation).await, "reserved");
    assert_eq!(world.available().await, 99);
}

#[tokio::test]
async fn order_routes_need_a_verified_caller() {
    let world = World::with_sale().await;
    let reservation = world.with_timer("user-alice").await;
    for fixture in ["api-get-order.json", "api-cancel-order.json"] {
        let response = world
            .call(
                ApiEvent::fixture(fixture)
                    .path_param("order_id", &reservation.order_id.to_string())
                    .anonymous(),
            )
            .await;
        assert_eq!(response.status(), 401, "{fixture}");
        assert_eq!(error_code(&response), "unauthorized", "{fixture}");
    }
    assert_eq!(world.status_of(&reservation).await, "reserved");
}

// ---- routing and configuration ------------------------------------------------------

#[tokio::test]
async fn a_route_this_function_does_not_serve_is_not_found() {
    let world = World::with_sale().await;
    for route in [
        "DELETE /sales/{sale_id}",
        "POST /sales/{sale_id}/grab/{token}",
    ] {
        let response = world
            .call(ApiEvent::fixture("api-get-sale.json").route(route))
            .await;
        assert_eq!(response.status(), 404, "{route}");
        assert_eq!(error_code(&response), "not_found", "{route}");
    }
}

// ---- /admin/blocklist ---------------------------------------------------------------

const BLOCK: &str = "PUT /admin/blocklist/{user_id}";
const UNBLOCK: &str = "DELETE /admin/blocklist/{user_id}";
const LIST: &str = "GET /admin/blocklist";

#[tokio::test]
async fn an_admin_blocks_lists_and_unblocks_users_idempotently() {
    let world = World::new();
    for user in ["user-zed", "user-amy", "user-zed"] {
        let response = world.call(World::blocklist_event(BLOCK, Some(user))).await;
        assert_eq!(response.status(), 200, "{user}");
        assert_eq!(response.headers()["cache-control"], "no-store");
        assert_eq!(
            body_json(&response),
            json!({"user_id": user, "blocked": true})
        );
    }
    let listed = world.call(World::blocklist_event(LIST, None)).await;
    assert_eq!(listed.status(), 200);
    assert_eq!(
        body_json(&listed),
        json!({"users": ["user-amy", "user-zed"]})
    );

    for _ in 0..2 {
        let response = world
            .call(World::blocklist_event(UNBLOCK, Some("user-zed")))
            .await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            body_json(&response),
            json!({"user_id": "user-zed", "blocked": false})
        );
    }
    assert_eq!(world.blocked_now().await, ["user-amy"]);
    let listed = world.call(World::blocklist_event(LIST, None)).await;
    assert_eq!(body_json(&listed), json!({"users": ["user-amy"]}));
}

#[tokio::test]
async fn the_blocklist_is_for_admins_only_and_a_refused_call_writes_nothing() {
    let world = World::new();
    world
        .call(World::blocklist_event(BLOCK, Some("user-amy")))
        .await;
    for (route, user) in [
        (BLOCK, Some("user-bob")),
        (UNBLOCK, Some("user-amy")),
        (LIST, None),
    ] {
        let response = world
            .call(
                World::blocklist_event(route, user)
                    .user("user-mallory")
                    .claim("cognito:groups", "[buyers]"),
            )
            .await;
        assert_eq!(response.status(), 403, "{route}");
        assert_eq!(error_code(&response), "forbidden", "{route}");

        let response = world
            .call(World::blocklist_event(route, user).anonymous())
            .await;
        assert_eq!(response.status(), 401, "{route}");
        assert_eq!(error_code(&response), "unauthorized", "{route}");
    }
    assert_eq!(world.blocked_now().await, ["user-amy"]);
}

#[tokio::test]
async fn a_malformed_user_id_is_invalid_input_and_writes_nothing() {
    let world = World::new();
    for bad in ["x".repeat(129), "user\u{7}bell".to_owned()] {
        for route in [BLOCK, UNBLOCK] {
            let response = world.call(World::blocklist_event(route, Some(&bad))).await;
            assert_eq!(response.status(), 400, "{route} {bad:?}");
            assert_eq!(error_code(&response), "invalid_input", "{route} {bad:?}");
        }
    }
    assert!(world.blocked_now().await.is_empty());
}

#[tokio::test]
async fn a_failing_blocklist_store_is_unavailable_with_retry_after() {
    let world = World::new();
    world
        .blocklist
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for (route, user) in [
        (BLOCK, Some("user-amy")),
        (UNBLOCK, Some("user-amy")),
        (LIST, None),
    ] {
        let response = world.call(World::blocklist_event(route, user)).await;
        assert_eq!(response.status(), 503, "{route}");
        assert_eq!(error_code(&response), "unavailable", "{route}");
        assert!(response.headers().contains_key("retry-after"), "{route}");
    }
}

#[test]
fn config_defaults_the_admin_rule() {
    let config = Config::from_lookup(|var| {
        matches!(
            var,
            "TABLE_NAME" | "SCHEDULE_GROUP_NAME" | "STRIPE_API_BASE"
        )
        .then(|| "x".to_owned())
    })
    .unwrap();
    assert_eq!(config.admin.claim, "cognito:groups");
    assert_eq!(config.admin.group, "admin");
}

#[test]
fn config_refuses_to_start_without_its_schedule_group() {
    let result = Config::from_lookup(|var| (var == "TABLE_NAME").then(|| "t".to_owned()));
    assert!(
        matches!(result, Err(ConfigError::Missing("SCHEDULE_GROUP_NAME"))),
        "{result:?}"
    );
}
