//! The grab when AWS stops answering: its SDK calls give up within the function's
//! [`SDK_BUDGET`], the buyer gets a 503 to retry, and a committed reservation whose
//! order could not be sent is given back, instead of the function dying at its Lambda
//! timeout with the unit held.
//!
//! The services are real SDK clients over an HTTP client that never answers, on
//! tokio's paused clock: the timeouts fire as soon as nothing else can run, so these
//! tests take no wall-clock time and do not depend on the machine's speed.

use std::collections::HashMap;
use std::sync::Arc;

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
use flashsale_domain::ports::{OrderBook, SaleCatalog};
use flashsale_domain::testing::{InMemoryBlocklist, InMemoryStore, ManualClock};
use flashsale_domain::{Sale, SaleDraft, SaleId};
use flashsale_grab::{Config, Deps, Ports, SDK_BUDGET, handler};
use flashsale_http::testing::{ApiEvent, body_json, error_code};
use lambda_http::Body;
use lambda_http::http::Response;
use tokio::time::Instant;

const SECRET: &str = "0123456789abcdef0123456789abcdef-test-only";
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
        ("GRAB_TOKEN_SECRET", SECRET),
    ]
    .into_iter()
    .collect();
    Config::from_lookup(|var| vars.get(var).map(|value| (*value).to_owned())).unwrap()
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
async fn when_the_table_never_answers_the_buyer_gets_a_503_within_one_call_budget() {
    let deps = Deps::new(&config(), &stalled_aws());
    let started = Instant::now();

    let response = call(&deps, token_request("user-alice")).await;

    assert_unavailable(&response);
    assert!(
        started.elapsed() <= SDK_BUDGET.operation,
        "gave up after {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn when_the_queue_never_answers_after_the_reserve_the_buyer_gets_a_503_and_the_hold_waits_for_the_retry()
 {
    let store = Arc::new(InMemoryStore::new());
    let sale = Sale::from_draft(SaleDraft {
        sale_id: Some(SALE.to_owned()),
        name: "Phone launch".to_owned(),
        stock: 1,
        starts_at: starts_at(),
        ends_at: starts_at() + Duration::hours(1),
        per_user_limit: None,
        payment_timeout_secs: Some(900),
        shards: Some(1),
    })
    .unwrap();
    assert!(store.create_sale(&sale).await.unwrap());
    // The queue is the production adapter over a client built within the grab's budget,
    // as `Deps::new` builds it; the table is in memory and answers at once.
    let sqs = aws_sdk_sqs::Client::new(&SDK_BUDGET.bound(&stalled_aws()));
    let deps = Deps::from_ports(
        &config(),
        Ports {
            catalog: store.clone(),
            ledger: store.clone(),
            orders: store.clone(),
            queue: Arc::new(SqsOrderQueue::new(sqs, QUEUE_URL)),
            clock: Arc::new(ManualClock::new(starts_at() + Duration::minutes(1))),
            blocklist: Arc::new(InMemoryBlocklist::new()),
        },
    );
    let token_response = call(&deps, token_request("user-alice")).await;
    assert_eq!(token_response.status(), 200);
    let grab_path = body_json(&token_response)["grab_path"]
        .as_str()
        .unwrap()
        .to_owned();
    let token = grab_path.rsplit_once('/').unwrap().1;
    let started = Instant::now();

    let response = call(
        &deps,
        ApiEvent::fixture("grab.json")
            .path_param("sale_id", SALE)
            .path_param("token", token)
            .user("user-alice"),
    )
    .await;

    assert_unavailable(&response);
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
    assert_eq!(open[0].0.user_id.as_str(), "user-alice");
}
