//! The grab when AWS stops answering or answers slowly: its SDK calls give up within
//! the function's [`SDK_BUDGET`], a request as a whole within [`REQUEST_DEADLINE`], and
//! the buyer gets a 503 to retry instead of the function dying at its Lambda timeout. A
//! committed reservation whose order could not be sent is answered 202 all the same,
//! and stays held for a retry or the reconciler to send on.
//!
//! The services are real SDK clients over an HTTP client that never answers, on
//! tokio's paused clock: the timeouts fire as soon as nothing else can run, so these
//! tests take no wall-clock time and do not depend on the machine's speed.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::config::{Credentials, Region, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::shared::IntoShared;
use chrono::{DateTime, Duration, TimeZone, Utc};
use flashsale_adapters::SqsOrderQueue;
use flashsale_domain::error::StoreError;
use flashsale_domain::ports::{
    OrderBook, OrderQueue, ReserveRefusal, SaleCatalog, Settlement, ShardState, ShardTakers,
    StockLedger, Take, TakeReturn,
};
use flashsale_domain::testing;
use flashsale_domain::testing::{InMemoryBlocklist, InMemoryStore, ManualClock, RecordingQueue};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{ReleaseReason, Reservation, Sale, SaleId};
use flashsale_grab::{Config, Deps, GrabKeyError, Ports, REQUEST_DEADLINE, SDK_BUDGET, handler};
use flashsale_lambda::testing::{ApiEvent, body_json, error_code};
use flashsale_lambda::{Clients, FromEnv as _, SECRET_BUDGET, SecretError, cold_start};
use lambda_http::Body;
use lambda_http::http::Response;
use tokio::time::Instant;

const SECRET: &str = "0123456789abcdef0123456789abcdef-test-only";
const SECRET_ARN: &str = "arn:aws:secretsmanager:us-east-1:123456789012:secret:grab-token-AbCdEf";
const SALE: &str = "phone-launch";
const QUEUE_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo";
/// The grab's `Timeout` in template.yaml.
const LAMBDA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// An HTTP client whose requests never get an answer, as from a service that stalls.
#[derive(Debug, Clone)]
struct NeverAnswers;

impl HttpConnector for NeverAnswers {
    fn call(&self, _request: HttpRequest) -> HttpConnectorFuture {
        HttpConnectorFuture::new(std::future::pending::<Result<HttpResponse, ConnectorError>>())
    }
}

impl HttpClient for NeverAnswers {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.clone().into_shared()
    }
}

/// An SDK configuration as Lambda's would be, but every call goes to [`NeverAnswers`].
fn stalled_aws() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "AKIDTEST", "secret", None, None, "test",
        )))
        .http_client(NeverAnswers)
        .build()
}

fn config() -> Config {
    let vars: HashMap<&str, &str> = [
        ("TABLE_NAME", "flashsale-test"),
        ("ORDERS_QUEUE_URL", QUEUE_URL),
        ("GRAB_TOKEN_SECRET_ARN", SECRET_ARN),
    ]
    .into_iter()
    .collect();
    Config::from_lookup(|var| vars.get(var).map(|value| (*value).to_owned())).unwrap()
}

fn signer() -> GrabTokenSigner {
    GrabTokenSigner::new(SECRET).unwrap()
}

fn starts_at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// The handler's answer, or a panic if Lambda would have killed it first.
async fn call(deps: &Deps, event: ApiEvent) -> Response<Body> {
    tokio::time::timeout(LAMBDA_TIMEOUT, handler(deps, event.into_request()))
        .await
        .expect("the handler outlived its Lambda timeout")
        .unwrap()
}

fn token_request(user: &str) -> ApiEvent {
    ApiEvent::fixture("grab-token.json")
        .path_param("sale_id", SALE)
        .user(user)
}

fn assert_unavailable(response: &Response<Body>) {
    assert_eq!(response.status(), 503);
    assert_eq!(error_code(response), "unavailable");
    assert!(response.headers().contains_key("retry-after"));
}

#[tokio::test(start_paused = true)]
async fn when_secrets_manager_never_answers_the_cold_start_fails_within_the_init_budget() {
    let started = Instant::now();

    let failed = cold_start::<Deps>(&config(), &stalled_aws()).await;

    assert!(
        matches!(&failed, Err(GrabKeyError::Secret(SecretError::Unreadable { arn, .. })) if arn == SECRET_ARN),
        "{:?}",
        failed.err()
    );
    assert!(
        started.elapsed() <= SECRET_BUDGET.operation,
        "gave up after {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn when_the_table_never_answers_the_buyer_gets_a_503_within_one_call_budget() {
    let deps = Deps::new(
        &config(),
        signer(),
        &Clients::within(SDK_BUDGET, &stalled_aws()),
    );
    let started = Instant::now();

    let response = call(&deps, token_request("user-alice")).await;

    assert_unavailable(&response);
    assert!(
        started.elapsed() <= SDK_BUDGET.operation,
        "gave up after {:?}",
        started.elapsed()
    );
}

/// A table whose every shard turns out empty, each after a second's worth of
/// transaction conflicts and retries.
struct SlowEmptyShards;

#[async_trait]
impl StockLedger for SlowEmptyShards {
    async fn reserve(
        &self,
        _sale: &Sale,
        _shard: u16,
        _reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Ok(Err(ReserveRefusal::ShardEmpty(ShardTakers::default())))
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        Ok(vec![0; usize::from(sale.shards)])
    }

    async fn release(
        &self,
        _reservation: &Reservation,
        _reason: ReleaseReason,
        _now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        Ok(Settlement::Unknown)
    }

    async fn drop_superseded_take(
        &self,
        _reservation: &Reservation,
        _shard: u16,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        Ok(vec![ShardState::default(); usize::from(sale.shards)])
    }

    async fn unaccounted_takes(&self, _sale: &Sale) -> Result<Vec<Take>, StoreError> {
        Ok(Vec::new())
    }

    async fn return_take(
        &self,
        _take: &Take,
        _now: DateTime<Utc>,
    ) -> Result<TakeReturn, StoreError> {
        Ok(TakeReturn::AlreadyReturned)
    }
}

fn sale(stock: i64, shards: i64) -> Sale {
    testing::sale(stock, shards)
        .id(SALE)
        .starting_at(starts_at())
        .build()
}

/// The grab over an in-memory catalog and order book, with the stock ledger and queue
/// under test, a minute into the sale.
fn deps(
    store: &Arc<InMemoryStore>,
    ledger: Arc<dyn StockLedger>,
    queue: Arc<dyn OrderQueue>,
) -> Deps {
    Deps::from_ports(
        &config(),
        signer(),
        Ports {
            catalog: store.clone(),
            ledger,
            orders: store.clone(),
            queue,
            clock: Arc::new(ManualClock::new(starts_at() + Duration::minutes(1))),
            blocklist: Arc::new(InMemoryBlocklist::new()),
            pause: Arc::new(flashsale_adapters::TokioPause),
        },
    )
}

async fn grab_path(deps: &Deps, user: &str) -> String {
    let token_response = call(deps, token_request(user)).await;
    assert_eq!(token_response.status(), 200);
    body_json(&token_response)["grab_path"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn grab_request(grab_path: &str, user: &str) -> ApiEvent {
    let token = grab_path.rsplit_once('/').unwrap().1;
    ApiEvent::fixture("grab.json")
        .path_param("sale_id", SALE)
        .path_param("token", token)
        .user(user)
}

#[tokio::test(start_paused = true)]
async fn a_grab_that_would_outlast_its_lambda_timeout_answers_503_at_its_deadline() {
    let store = Arc::new(InMemoryStore::new());
    let sale = sale(64, 64);
    assert!(store.create_sale(&sale).await.unwrap());
    let deps = deps(
        &store,
        Arc::new(SlowEmptyShards),
        Arc::new(RecordingQueue::default()),
    );
    let grab_path = grab_path(&deps, "user-alice").await;
    let started = Instant::now();

    let response = call(&deps, grab_request(&grab_path, "user-alice")).await;

    // 64 shards at a second each would take a minute; the buyer hears at the deadline.
    assert_unavailable(&response);
    assert_eq!(started.elapsed(), REQUEST_DEADLINE);
}

#[tokio::test(start_paused = true)]
async fn when_the_queue_never_answers_after_the_reserve_the_buyer_still_gets_the_unit_and_the_hold_waits_for_the_reconciler()
 {
    let store = Arc::new(InMemoryStore::new());
    let sale = sale(1, 1);
    assert!(store.create_sale(&sale).await.unwrap());
    // The queue is the production adapter over a client built within the grab's budget,
    // as the cold start builds it; the table is in memory and answers at once.
    let sqs = Clients::within(SDK_BUDGET, &stalled_aws()).sqs();
    let deps = deps(
        &store,
        store.clone(),
        Arc::new(SqsOrderQueue::new(sqs, QUEUE_URL)),
    );
    let grab_path = grab_path(&deps, "user-alice").await;
    let started = Instant::now();

    let response = call(&deps, grab_request(&grab_path, "user-alice")).await;

    // The unit committed, so the buyer is told so: the hand-over is the system's job.
    assert_eq!(response.status(), 202);
    assert!(
        started.elapsed() <= SDK_BUDGET.operation,
        "gave up after {:?}",
        started.elapsed()
    );
    let sale_id = SaleId::parse(SALE).unwrap();
    assert_eq!(store.shard_available(&sale_id, 0), 0, "the hold is kept");
    // Kept open for the buyer's retry of the same path, or for the reconciler.
    let open = store.open_holds(&sale).await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].user_id.as_str(), "user-alice");
}
