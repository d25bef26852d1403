//! What the grab costs, counted where it is paid: the HTTP requests the SDK really
//! sends to DynamoDB Local, the SQS emulator and moto's Secrets Manager, by
//! `X-Amz-Target`, from the grab's own [`cold_start`] (the production wiring) through
//! its handler.
//!
//! The grab-token key is read once, at init, and never by a request. After the sale
//! has sold out and this process knows it, a first attempt must cost no request at
//! all; a retry marked with `X-Retry-Attempt` at most one read, on the buyer's own key,
//! and one whose first answer was lost gets its order back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use chrono::{Duration, Utc};
use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::SaleCatalog;
use flashsale_domain::{Price, ReservePath, Sale, SaleControl, SaleId};
use flashsale_grab::{Config, Deps, GrabKeyError, RETRY_ATTEMPT_HEADER, handler};
use flashsale_lambda::testing::{ApiEvent, body_json, error_code};
use flashsale_lambda::{FromEnv as _, SecretError, cold_start};
use lambda_http::Body;
use lambda_http::http::{HeaderValue, Response};

const SECRET: &str = "0123456789abcdef0123456789abcdef-test-only";

/// Requests by `X-Amz-Target` (e.g. `DynamoDB_20120810.GetItem`, `AmazonSQS.SendMessage`).
type Counts = BTreeMap<String, u64>;

/// An HTTP client that forwards every request and counts it by its target.
#[derive(Debug, Clone)]
struct CountingClient {
    inner: SharedHttpClient,
    counts: Arc<Mutex<Counts>>,
}

impl CountingClient {
    fn new() -> Self {
        let transport = flashsale_adapters::https_client();
        Self {
            inner: transport,
            counts: Arc::default(),
        }
    }

    /// The counts so far, and a fresh start.
    fn take(&self) -> Counts {
        std::mem::take(&mut *self.counts.lock().unwrap())
    }
}

impl HttpClient for CountingClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(CountingConnector {
            inner: self.inner.http_connector(settings, components),
            counts: self.counts.clone(),
        })
    }
}

#[derive(Debug)]
struct CountingConnector {
    inner: SharedHttpConnector,
    counts: Arc<Mutex<Counts>>,
}

impl HttpConnector for CountingConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request
            .headers()
            .get("x-amz-target")
            .unwrap_or("(no X-Amz-Target)")
            .to_owned();
        *self.counts.lock().unwrap().entry(target).or_default() += 1;
        self.inner.call(request)
    }
}

/// A table with the template's key schema (`pk`/`sk`), which is all the grab touches.
async fn create_table(client: &aws_sdk_dynamodb::Client) -> String {
    let name = format!("grab-calls-{}", flashsale_emulators::unique_suffix());
    let attribute = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .unwrap()
    };
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute("pk"))
        .attribute_definitions(attribute("sk"))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .send()
        .await
        .expect("create the table");
    name
}

/// A FIFO queue like the template's `OrdersQueue` (explicit deduplication ids).
async fn create_queue(client: &aws_sdk_sqs::Client) -> String {
    use aws_sdk_sqs::types::QueueAttributeName;
    client
        .create_queue()
        .queue_name(format!(
            "grab-calls-{}.fifo",
            flashsale_emulators::unique_suffix()
        ))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "false")
        .send()
        .await
        .expect("create the queue")
        .queue_url
        .expect("a queue url")
}

/// The grab's configuration on the emulators, with the key in `secret_arn`.
fn config(table: &str, queue_url: &str, secret_arn: &str) -> Config {
    let vars: HashMap<&str, &str> = [
        ("TABLE_NAME", table),
        ("ORDERS_QUEUE_URL", queue_url),
        ("GRAB_TOKEN_SECRET_ARN", secret_arn),
        // Long enough that no background recheck of the gate and no refresh of
        // the blocklist snapshot (each a read per process per interval, whatever
        // the traffic) falls inside a test: what is counted is the requests' cost.
        ("SOLD_OUT_RECHECK_MS", "600000"),
        ("BLOCKLIST_REFRESH_MS", "600000"),
    ]
    .into_iter()
    .collect();
    Config::from_lookup(|var| vars.get(var).map(|value| (*value).to_owned())).unwrap()
}

struct Stack {
    deps: Deps,
    sale_id: SaleId,
    counter: CountingClient,
    /// What the cold start sent, before any request.
    at_init: Counts,
}

impl Stack {
    /// The grab as deployed, on the emulators, with the SDK's requests counted, and
    /// an active sale of `stock` units in `shards` shards.
    async fn start(stock: u32, shards: u16) -> Self {
        let plain = flashsale_emulators::shared().await.sdk_config().await;
        let dynamodb = aws_sdk_dynamodb::Client::new(&plain);
        let table = create_table(&dynamodb).await;
        let queue_url = create_queue(&aws_sdk_sqs::Client::new(&plain)).await;
        let now = Utc::now();
        let sale = Sale {
            sale_id: SaleId::generate(),
            name: "Counted sale".to_owned(),
            price: Some(Price::new(4_999, "USD").expect("a valid price")),
            stock_total: stock,
            starts_at: now - Duration::minutes(1),
            ends_at: now + Duration::hours(1),
            per_user_limit: 1,
            payment_timeout_secs: 900,
            shards,
            challenge_work: None,
            reserve: ReservePath::Adaptive,
            control: SaleControl::Open,
        };
        assert!(
            DynamoStore::new(dynamodb, &table)
                .create_sale(&sale)
                .await
                .unwrap()
        );

        let secret_arn = flashsale_emulators::shared()
            .await
            .secret_holding(SECRET)
            .await;
        let config = config(&table, &queue_url, &secret_arn);
        let counter = CountingClient::new();
        let counted = plain.into_builder().http_client(counter.clone()).build();
        let deps = cold_start::<Deps>(&config, &counted)
            .await
            .expect("the cold start");
        Self {
            deps,
            sale_id: sale.sale_id,
            at_init: counter.take(),
            counter,
        }
    }

    async fn call(&self, request: lambda_http::Request) -> Response<Body> {
        handler(&self.deps, request).await.unwrap()
    }

    async fn grab_token(&self, user: &str) -> String {
        let response = self
            .call(
                ApiEvent::fixture("grab-token.json")
                    .path_param("sale_id", self.sale_id.as_str())
                    .user(user)
                    .into_request(),
            )
            .await;
        assert_eq!(response.status(), 200);
        let path = body_json(&response)["grab_path"]
            .as_str()
            .unwrap()
            .to_owned();
        path.rsplit_once('/').unwrap().1.to_owned()
    }

    /// A grab through `token`; `retry` > 0 marks it `X-Retry-Attempt: retry`.
    async fn grab(&self, user: &str, token: &str, retry: u32) -> Response<Body> {
        self.grab_on(&self.sale_id, user, token, retry).await
    }

    /// A grab through `token` on the path of `sale_id`, which may be any.
    async fn grab_on(
        &self,
        sale_id: &SaleId,
        user: &str,
        token: &str,
        retry: u32,
    ) -> Response<Body> {
        let mut request = ApiEvent::fixture("grab.json")
            .path_param("sale_id", sale_id.as_str())
            .path_param("token", token)
            .user(user)
            .into_request();
        if retry > 0 {
            request
                .headers_mut()
                .insert(RETRY_ATTEMPT_HEADER, HeaderValue::from(retry));
        }
        self.call(request).await
    }
}

fn counts(pairs: &[(&str, u64)]) -> Counts {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test]
async fn after_sell_out_first_attempts_send_no_request_and_a_marked_retry_one_read() {
    let stack = Stack::start(2, 2).await;
    let alice = stack.grab_token("buyer-alice").await;
    // Alice's grab commits, but suppose its answer is lost on the way back.
    let lost = stack.grab("buyer-alice", &alice, 0).await;
    assert_eq!(lost.status(), 202);
    let bob = stack.grab_token("buyer-bob").await;
    assert_eq!(stack.grab("buyer-bob", &bob, 0).await.status(), 202);
    // The first loser learns from the table that every shard is empty.
    let carol = stack.grab_token("buyer-carol").await;
    assert_eq!(
        error_code(&stack.grab("buyer-carol", &carol, 0).await),
        "sold_out"
    );

    let mut late = Vec::new();
    for buyer in 0..50 {
        let user = format!("late-{buyer}");
        let token = stack.grab_token(&user).await;
        late.push((user, token));
    }
    stack.counter.take();

    for (user, token) in &late {
        assert_eq!(error_code(&stack.grab(user, token, 0).await), "sold_out");
    }
    assert_eq!(stack.counter.take(), Counts::new(), "50 first attempts");

    // Alice retries, marked: one read of her own item finds the order, which is sent
    // to the queue again (deduplicated there by order id).
    let retried = stack.grab("buyer-alice", &alice, 1).await;
    assert_eq!(retried.status(), 202);
    assert_eq!(
        body_json(&retried)["order_id"],
        body_json(&lost)["order_id"]
    );
    assert_eq!(
        stack.counter.take(),
        counts(&[
            ("DynamoDB_20120810.GetItem", 1),
            ("AmazonSQS.SendMessage", 1)
        ])
    );

    // A marked retry of a path that never took a unit: one read, and sold out.
    let (user, token) = &late[0];
    assert_eq!(error_code(&stack.grab(user, token, 3).await), "sold_out");
    assert_eq!(
        stack.counter.take(),
        counts(&[("DynamoDB_20120810.GetItem", 1)])
    );
}

#[tokio::test]
async fn junk_grab_paths_cost_no_request_at_all() {
    let stack = Stack::start(10, 2).await;
    let alices = stack.grab_token("buyer-alice").await;
    stack.counter.take();
    let forged = |n: usize| format!("{}{n}", "A".repeat(40));
    for n in 0..20 {
        // A random sale id, and a path of random characters.
        let answer = stack
            .grab_on(&SaleId::generate(), "buyer-mallory", &forged(n), 0)
            .await;
        assert_eq!(error_code(&answer), "invalid_token", "{n}");
        // The real sale, with a forged path, marked as a retry or not.
        let answer = stack.grab("buyer-mallory", &forged(n), n as u32 % 2).await;
        assert_eq!(error_code(&answer), "invalid_token", "{n}");
        // A real path, sent by someone else or for another sale.
        let answer = stack.grab("buyer-mallory", &alices, 0).await;
        assert_eq!(error_code(&answer), "invalid_token", "{n}");
        let answer = stack
            .grab_on(&SaleId::generate(), "buyer-alice", &alices, 0)
            .await;
        assert_eq!(error_code(&answer), "invalid_token", "{n}");
    }
    assert_eq!(stack.counter.take(), Counts::new(), "80 junk grabs");
}

#[tokio::test]
async fn a_quiet_grab_writes_exactly_the_brief_s_one_transaction() {
    let stack = Stack::start(10, 2).await;
    for buyer in 0..5 {
        let user = format!("quiet-{buyer}");
        let token = stack.grab_token(&user).await;
        stack.counter.take();
        assert_eq!(stack.grab(&user, &token, 0).await.status(), 202);
        let sent = stack.counter.take();
        let writes: Counts = sent
            .iter()
            .filter(|(target, _)| {
                [
                    "TransactWriteItems",
                    "UpdateItem",
                    "PutItem",
                    "DeleteItem",
                    "BatchWriteItem",
                ]
                .iter()
                .any(|write| target.ends_with(&format!(".{write}")))
            })
            .map(|(target, n)| (target.clone(), *n))
            .collect();
        assert_eq!(
            writes,
            counts(&[("DynamoDB_20120810.TransactWriteItems", 1)]),
            "grab {buyer}: every request it sent was {sent:?}"
        );
    }
}

#[tokio::test]
async fn the_grab_token_secret_is_read_once_at_init_and_never_by_a_request() {
    let stack = Stack::start(10, 2).await;
    assert_eq!(
        stack.at_init,
        counts(&[("secretsmanager.GetSecretValue", 1)]),
        "the cold start reads the key, and nothing else"
    );

    for buyer in 0..5 {
        let user = format!("buyer-{buyer}");
        let token = stack.grab_token(&user).await;
        assert_eq!(stack.grab(&user, &token, 0).await.status(), 202);
    }

    let served = stack.counter.take();
    assert!(
        served.contains_key("AmazonSQS.SendMessage"),
        "the grabs went through AWS: {served:?}"
    );
    assert!(
        !served
            .keys()
            .any(|target| target.starts_with("secretsmanager.")),
        "a request read the secret: {served:?}"
    );
}

#[tokio::test]
async fn a_weak_or_missing_secret_fails_the_cold_start_naming_it() {
    let emulators = flashsale_emulators::shared().await;
    let plain = emulators.sdk_config().await;
    let queue_url = "http://127.0.0.1:9/000000000000/unused.fifo";

    let weak_arn = emulators.secret_holding("too-short").await;
    let weak = cold_start::<Deps>(&config("unused", queue_url, &weak_arn), &plain).await;
    assert!(
        matches!(&weak, Err(GrabKeyError::Weak { arn, .. }) if *arn == weak_arn),
        "{:?}",
        weak.err()
    );

    let gone_arn = format!("{weak_arn}-never-created");
    let gone = cold_start::<Deps>(&config("unused", queue_url, &gone_arn), &plain).await;
    let Err(error) = gone else {
        panic!("a secret that does not exist was read");
    };
    assert!(
        matches!(&error, GrabKeyError::Secret(SecretError::Unreadable { arn, .. }) if *arn == gone_arn),
        "{error:?}"
    );
    let reason = flashsale_lambda::failure::error_chain(&error);
    assert!(reason.contains(&gone_arn), "{reason}");
    assert!(reason.contains("ResourceNotFound"), "{reason}");
}
