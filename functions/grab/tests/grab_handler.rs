//! The grab function through its handler, with API Gateway events built from
//! `events/grab-token.json` and `events/grab.json`, and the domain's in-memory fakes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_domain::ports::Blocklist;
use flashsale_domain::ports::{OrderBook, SaleCatalog, StockLedger};
use flashsale_domain::testing;
use flashsale_domain::testing::{
    FailingLedger, InMemoryBlocklist, InMemoryStore, ManualClock, RecordedPauses, RecordingQueue,
};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{OrderId, ReleaseReason, SaleId, UserId};
use flashsale_grab::{Config, Deps, Ports, RETRY_ATTEMPT_HEADER, handler};
use flashsale_lambda::testing::{ApiEvent, body_json, error_code};
use flashsale_lambda::{ConfigError, FromEnv as _, MAX_BODY_BYTES};
use lambda_http::Body;
use lambda_http::http::{HeaderValue, Response};

const SECRET: &str = "0123456789abcdef0123456789abcdef-test-only";
const SECRET_ARN: &str = "arn:aws:secretsmanager:us-east-1:123456789012:secret:grab-token-AbCdEf";
const SALE: &str = "phone-launch";

fn starts_at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn config_with(extra: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut vars: HashMap<String, String> = [
        ("TABLE_NAME", "flashsale-test"),
        (
            "ORDERS_QUEUE_URL",
            "http://127.0.0.1:5000/000000000000/orders.fifo",
        ),
        ("GRAB_TOKEN_SECRET_ARN", SECRET_ARN),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in extra {
        vars.insert((*k).to_owned(), (*v).to_owned());
    }
    Config::from_lookup(move |var| vars.get(var).cloned())
}

struct World {
    deps: Deps,
    store: Arc<InMemoryStore>,
    queue: Arc<RecordingQueue>,
    clock: Arc<ManualClock>,
    blocklist: Arc<InMemoryBlocklist>,
}

impl World {
    /// A sale of `stock` items in `shards` shards, running from `starts_at()` for an
    /// hour, and the clock one minute into it.
    async fn with_sale(stock: i64, shards: i64) -> Self {
        Self::with_ledger(stock, shards, None).await
    }

    async fn with_ledger(stock: i64, shards: i64, ledger: Option<Arc<dyn StockLedger>>) -> Self {
        let store = Arc::new(InMemoryStore::new());
        let sale = testing::sale(stock, shards)
            .id(SALE)
            .starting_at(starts_at())
            .build();
        assert!(store.create_sale(&sale).await.unwrap());
        let queue = Arc::new(RecordingQueue::default());
        let clock = Arc::new(ManualClock::new(starts_at() + Duration::minutes(1)));
        let blocklist = Arc::new(InMemoryBlocklist::new());
        let deps = Deps::from_ports(
            &config_with(&[]).unwrap(),
            GrabTokenSigner::new(SECRET).unwrap(),
            Ports {
                catalog: store.clone(),
                ledger: ledger.unwrap_or_else(|| store.clone()),
                orders: store.clone(),
                queue: queue.clone(),
                clock: clock.clone(),
                blocklist: blocklist.clone(),
                pause: Arc::new(RecordedPauses::advancing(clock.clone())),
            },
        );
        Self {
            deps,
            store,
            queue,
            clock,
            blocklist,
        }
    }

    async fn call(&self, event: ApiEvent) -> Response<Body> {
        handler(&self.deps, event.into_request()).await.unwrap()
    }

    async fn token(&self, user: &str) -> Response<Body> {
        self.call(
            ApiEvent::fixture("grab-token.json")
                .path_param("sale_id", SALE)
                .user(user),
        )
        .await
    }

    /// The token of the grab path this user is handed.
    async fn grab_token(&self, user: &str) -> String {
        let response = self.token(user).await;
        assert_eq!(response.status(), 200);
        let path = body_json(&response)["grab_path"]
            .as_str()
            .unwrap()
            .to_owned();
        path.rsplit_once('/').unwrap().1.to_owned()
    }

    async fn grab_with(&self, user: &str, token: &str) -> Response<Body> {
        self.call(
            ApiEvent::fixture("grab.json")
                .path_param("sale_id", SALE)
                .path_param("token", token)
                .user(user),
        )
        .await
    }

    /// The same path again, with `X-Retry-Attempt: attempt`.
    async fn retry_with(&self, user: &str, token: &str, attempt: &str) -> Response<Body> {
        let mut request = ApiEvent::fixture("grab.json")
            .path_param("sale_id", SALE)
            .path_param("token", token)
            .user(user)
            .into_request();
        request.headers_mut().insert(
            RETRY_ATTEMPT_HEADER,
            HeaderValue::from_str(attempt).unwrap(),
        );
        handler(&self.deps, request).await.unwrap()
    }

    async fn grab(&self, user: &str) -> Response<Body> {
        let token = self.grab_token(user).await;
        self.grab_with(user, &token).await
    }

    fn available(&self) -> u64 {
        let sale_id = SaleId::parse(SALE).unwrap();
        (0..64)
            .map(|shard| self.store.shard_available(&sale_id, shard))
            .sum()
    }

    fn clock_now(&self) -> DateTime<Utc> {
        flashsale_domain::ports::Clock::now(self.clock.as_ref())
    }

    fn sent(&self) -> usize {
        self.queue.sent.lock().unwrap().len()
    }
}

#[tokio::test]
async fn the_token_route_hands_out_a_grab_path_for_this_sale() {
    let world = World::with_sale(10, 2).await;
    let response = world.token("user-alice").await;

    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body = body_json(&response);
    let path = body["grab_path"].as_str().unwrap();
    assert!(path.starts_with("/sales/phone-launch/grab/"), "{path}");
    let expires_at: DateTime<Utc> = body["expires_at"].as_str().unwrap().parse().unwrap();
    assert!(expires_at > world.clock_now());
}

#[tokio::test]
async fn a_grab_reserves_one_unit_and_enqueues_the_order() {
    let world = World::with_sale(10, 2).await;
    let response = world.grab("user-alice").await;

    assert_eq!(response.status(), 202);
    let body = body_json(&response);
    assert_eq!(body["status"], "reserved");
    let order_id = body["order_id"].as_str().unwrap();
    assert!(order_id.starts_with("phone-launch."), "{order_id}");
    assert_eq!(
        response.headers()["location"],
        format!("/orders/{order_id}").as_str()
    );
    let expires_at: DateTime<Utc> = body["expires_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(expires_at, world.clock_now() + Duration::seconds(900));
    assert_eq!(world.available(), 9);
    let sent = world.queue.sent.lock().unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].reservation.order_id.to_string(), order_id);
    assert_eq!(sent[0].reservation.user_id.as_str(), "user-alice");
    // The sale's price, copied from the sale the grab read anyway: the answer and the
    // message carry it.
    assert_eq!(
        body["price"],
        serde_json::json!({"amount": 129_900, "currency": "EUR", "decimals": 2})
    );
    assert_eq!(
        sent[0].reservation.price.map(|price| price.amount()),
        Some(129_900)
    );
}

#[tokio::test]
async fn when_stock_is_gone_grab_returns_sold_out() {
    let world = World::with_sale(1, 1).await;
    assert_eq!(world.grab("user-alice").await.status(), 202);

    let response = world.grab("user-bob").await;
    assert_eq!(response.status(), 409);
    assert_eq!(error_code(&response), "sold_out");
    assert_eq!(world.available(), 0);
    assert_eq!(world.sent(), 1);
}

#[tokio::test]
async fn a_blocked_user_is_refused_403_blocked_on_both_routes_and_nothing_is_reserved() {
    let world = World::with_sale(10, 2).await;
    // A grab path handed out before the block.
    let token = world.grab_token("user-scalper").await;
    let scalper = UserId::parse("user-scalper").unwrap();
    world.blocklist.block(&scalper).await.unwrap();
    world.clock.advance(Duration::milliseconds(5000));

    let refused = world.token("user-scalper").await;
    assert_eq!(refused.status(), 403);
    assert_eq!(error_code(&refused), "blocked");
    let refused = world.grab_with("user-scalper", &token).await;
    assert_eq!(refused.status(), 403);
    assert_eq!(error_code(&refused), "blocked");
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
    assert_eq!(world.available(), 10);
    assert_eq!(world.sent(), 0);

    assert_eq!(world.grab("user-alice").await.status(), 202);
}

#[tokio::test]
async fn an_unblocked_user_can_grab_once_the_process_rereads_the_blocklist() {
    let world = World::with_sale(10, 2).await;
    let user = UserId::parse("user-pardoned").unwrap();
    world.blocklist.block(&user).await.unwrap();
    assert_eq!(world.token("user-pardoned").await.status(), 403);

    world.blocklist.unblock(&user).await.unwrap();
    world.clock.advance(Duration::milliseconds(5000));
    assert_eq!(world.grab("user-pardoned").await.status(), 202);
    // One read when the process first asked, one after the interval.
    assert_eq!(world.blocklist.reads.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn stock_in_other_shards_is_found_before_answering_sold_out() {
    // Four users, four shards of one unit: whatever their home shards, all succeed.
    let world = World::with_sale(4, 4).await;
    for user in ["u1", "u2", "u3", "u4"] {
        assert_eq!(world.grab(user).await.status(), 202, "{user}");
    }
    assert_eq!(world.available(), 0);
    assert_eq!(error_code(&world.grab("u5").await), "sold_out");
}

#[tokio::test]
async fn a_second_grab_by_the_same_user_returns_limit_reached() {
    let world = World::with_sale(10, 2).await;
    assert_eq!(world.grab("user-alice").await.status(), 202);

    let response = world.grab("user-alice").await;
    assert_eq!(response.status(), 409);
    assert_eq!(error_code(&response), "limit_reached");
    assert_eq!(world.available(), 9);
    assert_eq!(world.sent(), 1);
}

#[tokio::test]
async fn a_forged_token_is_invalid_token_and_reserves_nothing() {
    let world = World::with_sale(10, 2).await;
    let genuine = world.grab_token("user-alice").await;
    let (expiry, tag) = genuine.split_once('.').unwrap();
    let later = expiry.parse::<i64>().unwrap() + 3600;
    let fixture_token = flashsale_lambda::testing::fixture("grab.json")["pathParameters"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for forged in [
        format!("{later}.{tag}"),
        fixture_token,
        "not-a-token".to_owned(),
        format!("{expiry}.AAAA"),
    ] {
        let response = world.grab_with("user-alice", &forged).await;
        assert_eq!(response.status(), 403, "{forged}");
        assert_eq!(error_code(&response), "invalid_token", "{forged}");
    }
    assert_eq!(world.available(), 10);
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
    assert_eq!(world.sent(), 0);
}

#[tokio::test]
async fn another_users_token_is_invalid_token() {
    let world = World::with_sale(10, 2).await;
    let alices = world.grab_token("user-alice").await;

    let response = world.grab_with("user-bob", &alices).await;
    assert_eq!(response.status(), 403);
    assert_eq!(error_code(&response), "invalid_token");
    assert_eq!(world.available(), 10);
}

#[tokio::test]
async fn an_expired_grab_path_is_invalid_token() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    world.clock.advance(Duration::minutes(6));

    let response = world.grab_with("user-alice", &token).await;
    assert_eq!(error_code(&response), "invalid_token");
    assert_eq!(world.available(), 10);
}

#[tokio::test]
async fn before_the_start_there_is_no_grab_path_and_no_grab() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    world.clock.set(starts_at() - Duration::seconds(30));

    let response = world.token("user-alice").await;
    assert_eq!(response.status(), 425);
    assert_eq!(error_code(&response), "not_started");
    let response = world.grab_with("user-alice", &token).await;
    assert_eq!(response.status(), 425);
    assert_eq!(error_code(&response), "not_started");
    assert_eq!(world.available(), 10);
}

#[tokio::test]
async fn a_grab_path_is_handed_out_one_second_before_the_start() {
    let world = World::with_sale(10, 2).await;
    world.clock.set(starts_at() - Duration::milliseconds(500));
    assert_eq!(world.token("user-alice").await.status(), 200);
}

#[tokio::test]
async fn after_the_end_token_and_grab_answer_ended() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    world.clock.set(starts_at() + Duration::hours(2));

    let response = world.token("user-alice").await;
    assert_eq!(response.status(), 410);
    assert_eq!(error_code(&response), "ended");
    let response = world.grab_with("user-alice", &token).await;
    assert_eq!(response.status(), 410);
    assert_eq!(error_code(&response), "ended");
}

#[tokio::test]
async fn an_unknown_or_malformed_sale_is_sale_not_found() {
    let world = World::with_sale(10, 2).await;
    for sale in ["no-such-sale", "bad id!"] {
        let response = world
            .call(
                ApiEvent::fixture("grab-token.json")
                    .path_param("sale_id", sale)
                    .user("user-alice"),
            )
            .await;
        assert_eq!(response.status(), 404, "{sale}");
        assert_eq!(error_code(&response), "sale_not_found", "{sale}");
    }
    // A grab path is issued only for a sale that exists, so one naming an unknown sale
    // is forged, and refused as such before any lookup; a malformed id never gets that
    // far.
    for (sale, status, code) in [
        ("no-such-sale", 403, "invalid_token"),
        ("bad id!", 404, "sale_not_found"),
    ] {
        let response = world
            .call(
                ApiEvent::fixture("grab.json")
                    .path_param("sale_id", sale)
                    .user("user-alice"),
            )
            .await;
        assert_eq!(response.status(), status, "{sale}");
        assert_eq!(error_code(&response), code, "{sale}");
    }
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn without_a_verified_caller_both_routes_are_unauthorized() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    let anonymous_grab = ApiEvent::fixture("grab.json")
        .path_param("sale_id", SALE)
        .path_param("token", &token)
        .anonymous();
    let no_subject = ApiEvent::fixture("grab.json")
        .path_param("sale_id", SALE)
        .path_param("token", &token)
        .without_claim("sub");
    let anonymous_token = ApiEvent::fixture("grab-token.json")
        .path_param("sale_id", SALE)
        .anonymous();
    for event in [anonymous_grab, no_subject, anonymous_token] {
        let response = world.call(event).await;
        assert_eq!(response.status(), 401);
        assert_eq!(error_code(&response), "unauthorized");
    }
    assert_eq!(world.available(), 10);
    assert_eq!(world.sent(), 0);
}

#[tokio::test]
async fn a_route_this_function_does_not_serve_is_not_found() {
    let world = World::with_sale(10, 2).await;
    let response = world
        .call(ApiEvent::fixture("grab.json").route("POST /sales/{sale_id}/steal"))
        .await;
    assert_eq!(response.status(), 404);
    assert_eq!(error_code(&response), "not_found");
}

#[tokio::test]
async fn an_oversize_body_is_payload_too_large_and_reserves_nothing() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    let response = world
        .call(
            ApiEvent::fixture("grab.json")
                .path_param("sale_id", SALE)
                .path_param("token", &token)
                .user("user-alice")
                .body("x".repeat(MAX_BODY_BYTES + 1)),
        )
        .await;
    assert_eq!(response.status(), 413);
    assert_eq!(error_code(&response), "payload_too_large");
    assert_eq!(world.available(), 10);
}

#[tokio::test]
async fn once_sold_out_first_attempts_cost_nothing_and_a_recheck_reads_once_per_interval() {
    let world = World::with_sale(1, 1).await;
    assert_eq!(world.grab("user-alice").await.status(), 202);
    // Bob's refusal saw alice's take young enough to be undone, and read the shards
    // once before saying sold out.
    assert_eq!(error_code(&world.grab("user-bob").await), "sold_out");
    let writes = world.store.reserve_calls.load(Ordering::SeqCst);
    let reads = world.store.availability_reads.load(Ordering::SeqCst);
    assert_eq!(reads, 1);

    let carol = world.grab_token("user-carol").await;
    assert_eq!(
        error_code(&world.grab_with("user-carol", &carol).await),
        "sold_out"
    );
    assert_eq!(
        error_code(&world.retry_with("user-carol", &carol, "0").await),
        "sold_out"
    );
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), writes);
    assert_eq!(world.store.find_calls.load(Ordering::SeqCst), 0);
    assert_eq!(world.store.availability_reads.load(Ordering::SeqCst), reads);

    // SOLD_OUT_RECHECK_MS defaults to 1000: after that one grab reads the shards
    // (still empty), writes nothing, and the grabs after it cost nothing again.
    world.clock.advance(Duration::milliseconds(1500));
    assert_eq!(error_code(&world.grab("user-dave").await), "sold_out");
    assert_eq!(error_code(&world.grab("user-erin").await), "sold_out");
    assert_eq!(
        world.store.availability_reads.load(Ordering::SeqCst),
        reads + 1
    );
    assert_eq!(world.store.reserve_calls.load(Ordering::SeqCst), writes);
}

#[tokio::test]
async fn a_marked_retry_after_sell_out_answers_the_order_its_lost_answer_held() {
    let world = World::with_sale(1, 1).await;
    let token = world.grab_token("user-alice").await;
    let lost = world.grab_with("user-alice", &token).await;
    assert_eq!(lost.status(), 202);
    assert_eq!(error_code(&world.grab("user-bob").await), "sold_out");

    let retried = world.retry_with("user-alice", &token, "1").await;
    assert_eq!(retried.status(), 202);
    assert_eq!(
        body_json(&retried)["order_id"],
        body_json(&lost)["order_id"]
    );
    assert_eq!(world.store.find_calls.load(Ordering::SeqCst), 1);
}

/// A retry whose order settled meanwhile (here its buyer cancelled it from another
/// tab) is told so: 409 with the order's fate, not `invalid_token`.
#[tokio::test]
async fn a_retry_of_a_path_whose_order_settled_is_told_its_fate() {
    let world = World::with_sale(2, 1).await;
    let token = world.grab_token("user-alice").await;
    let held = world.grab_with("user-alice", &token).await;
    assert_eq!(held.status(), 202);
    let order_id = OrderId::parse(body_json(&held)["order_id"].as_str().unwrap()).unwrap();
    let (_, reservation) = world
        .store
        .find(&order_id, &UserId::parse("user-alice").unwrap())
        .await
        .unwrap()
        .unwrap();
    world
        .store
        .release(&reservation, ReleaseReason::Cancelled, world.clock_now())
        .await
        .unwrap();

    let retried = world.retry_with("user-alice", &token, "1").await;
    assert_eq!(retried.status(), 409);
    assert_eq!(error_code(&retried), "order_cancelled");
    assert_eq!(world.available(), 2, "nothing taken again");
}

#[tokio::test]
async fn any_retry_attempt_but_zero_marks_a_retry_that_finds_its_order() {
    let world = World::with_sale(1, 1).await;
    let token = world.grab_token("user-alice").await;
    let lost = world.grab_with("user-alice", &token).await;
    assert_eq!(lost.status(), 202);
    assert_eq!(error_code(&world.grab("user-bob").await), "sold_out");

    // Joined by a proxy, or miscounted: still a retry, worth its one read.
    let mut reads = 0;
    for marked in ["1, 1", "one", "-1"] {
        let retried = world.retry_with("user-alice", &token, marked).await;
        reads += 1;
        assert_eq!(retried.status(), 202, "{marked:?}");
        assert_eq!(
            body_json(&retried)["order_id"],
            body_json(&lost)["order_id"]
        );
        assert_eq!(world.store.find_calls.load(Ordering::SeqCst), reads);
    }
    // `0` is a first attempt, but the gate saw her order holding the shard's unit
    // when it learned the shard was empty: her order again, for one read.
    let first = world.retry_with("user-alice", &token, " 0 ").await;
    assert_eq!(first.status(), 202);
    assert_eq!(world.store.find_calls.load(Ordering::SeqCst), reads + 1);
    // Anyone else's first attempt is refused from memory, with no read.
    let carol = world.grab_token("user-carol").await;
    let refused = world.retry_with("user-carol", &carol, "0").await;
    assert_eq!(error_code(&refused), "sold_out");
    assert_eq!(world.store.find_calls.load(Ordering::SeqCst), reads + 1);
}

#[tokio::test]
async fn when_the_queue_fails_the_unit_is_still_answered_and_the_retry_sends_it() {
    let world = World::with_sale(10, 2).await;
    let token = world.grab_token("user-alice").await;
    world.queue.fail.store(true, Ordering::SeqCst);

    // The unit is the buyer's: the hand-over is the system's job (a retry, the
    // reconciler), not a reason to tell them otherwise.
    let response = world.grab_with("user-alice", &token).await;
    assert_eq!(response.status(), 202);
    assert_eq!(world.available(), 9);
    assert_eq!(world.sent(), 0);

    // Retrying the same path answers the same order, sends it, and takes no second unit.
    world.queue.fail.store(false, Ordering::SeqCst);
    let retried = world.retry_with("user-alice", &token, "1").await;
    assert_eq!(retried.status(), 202);
    assert_eq!(world.available(), 9);
    assert_eq!(world.sent(), 1);
    assert_eq!(
        body_json(&retried)["order_id"],
        body_json(&response)["order_id"]
    );
}

#[tokio::test]
async fn a_transient_store_failure_is_unavailable_with_retry_after() {
    let world = World::with_ledger(10, 2, Some(Arc::new(FailingLedger { transient: true }))).await;
    let response = world.grab("user-alice").await;
    assert_eq!(response.status(), 503);
    assert_eq!(error_code(&response), "unavailable");
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(world.sent(), 0);
}

#[tokio::test]
async fn a_permanent_store_failure_is_internal_and_hides_its_details() {
    let world = World::with_ledger(10, 2, Some(Arc::new(FailingLedger { transient: false }))).await;
    let response = world.grab("user-alice").await;
    assert_eq!(response.status(), 500);
    let body = body_json(&response);
    assert_eq!(body["error"], "internal");
    assert!(!body.to_string().contains("flashsale-prod"), "{body}");
    assert!(response.headers().get("retry-after").is_none());
}

#[test]
fn config_refuses_to_start_on_a_missing_or_invalid_variable() {
    let missing =
        Config::from_lookup(|var| (var == "GRAB_TOKEN_SECRET_ARN").then(|| SECRET_ARN.to_owned()));
    assert!(
        matches!(missing, Err(ConfigError::Missing("TABLE_NAME"))),
        "{missing:?}"
    );

    let no_secret = Config::from_lookup(|var| {
        matches!(var, "TABLE_NAME" | "ORDERS_QUEUE_URL").then(|| "flashsale-test".to_owned())
    });
    assert!(
        matches!(
            no_secret,
            Err(ConfigError::Missing("GRAB_TOKEN_SECRET_ARN"))
        ),
        "{no_secret:?}"
    );

    let recheck = config_with(&[("SOLD_OUT_RECHECK_MS", "-5")]);
    assert!(
        matches!(
            recheck,
            Err(ConfigError::Invalid {
                var: "SOLD_OUT_RECHECK_MS",
                ..
            })
        ),
        "{recheck:?}"
    );

    let refresh = config_with(&[("BLOCKLIST_REFRESH_MS", "often")]);
    assert!(
        matches!(
            refresh,
            Err(ConfigError::Invalid {
                var: "BLOCKLIST_REFRESH_MS",
                ..
            })
        ),
        "{refresh:?}"
    );

    let defaults = config_with(&[]).unwrap();
    assert_eq!(defaults.blocklist_refresh, Duration::milliseconds(5000));

    let config = config_with(&[
        ("SOLD_OUT_RECHECK_MS", "250"),
        ("BLOCKLIST_REFRESH_MS", "750"),
    ])
    .unwrap();
    assert_eq!(config.sold_out_recheck, Duration::milliseconds(250));
    assert_eq!(config.blocklist_refresh, Duration::milliseconds(750));
    assert_eq!(config.grab_token_secret_arn, SECRET_ARN);
}
