//! The harness of the end-to-end tests (and of the load tool's own): what every one needs: a local stack of its own (on the emulators shared by
//! the test process), an admin, a sale, and direct reads of what was written.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Select};
use chrono::{DateTime, Utc};
use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::{OrderBook, SaleCatalog, StockLedger, Take};
use flashsale_domain::{OrderId, Sale, SaleId, UserId};
use flashsale_emulators::LocalEndpoints;
use flashsale_emulators::proxy::{ConflictMode, Proxy, ProxyOptions};
use flashsale_load::{ApiClient, ApiResponse};
use flashsale_local::metrics::Summary;
use flashsale_local::{EmulatorSource, LocalStack, StackOptions};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long the consumer may take to set an order's release timer before a test
/// fails. Generous: it only bounds a failure, and a loaded machine running other
/// builds delays the event source emulation's polls by seconds.
pub const CONSUMER_LAG: Duration = Duration::from_secs(90);

/// How long an order with a payment window of `window_secs` may take to expire before a
/// test fails. The timer's minute ends at most 3 s after the deadline for a window of
/// a minute or more, and at most a minute after the timer was set for a shorter one
/// (see `EventBridgeScheduler::at_expression`); the rest is room for a loaded machine.
pub fn expiry_lag(window_secs: u64) -> Duration {
    Duration::from_secs(window_secs.max(60) + 120)
}

pub struct Harness {
    pub stack: LocalStack,
    pub api: ApiClient,
    pub admin: String,
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub scheduler: aws_sdk_scheduler::Client,
    /// The proxy the stack's DynamoDB calls go through, when it counts them or plays
    /// transaction conflicts ([`Harness::start_counted`], [`Harness::start_contended`]);
    /// held here so it lives as the stack does.
    pub dynamodb_proxy: Option<Arc<Proxy>>,
}

impl Harness {
    pub async fn start(name: &str) -> Self {
        Self::start_with(name, &[]).await
    }

    /// A stack with template parameters overridden, like `--parameter-overrides`.
    pub async fn start_with(name: &str, parameters: &[(&str, &str)]) -> Self {
        Self::start_on(name, parameters, None).await
    }

    /// A stack whose DynamoDB calls meet transaction conflicts as on AWS: they go
    /// through a proxy in conflict mode (flashsale_emulators::proxy), every transaction
    /// holding its items for its round trip plus `commit_time`. DynamoDB Local alone
    /// runs one transaction at a time and never answers a conflict. The test's own
    /// reads go straight to DynamoDB Local, neither counted nor conflicted.
    pub async fn start_contended(
        name: &str,
        parameters: &[(&str, &str)],
        commit_time: Duration,
    ) -> Self {
        Self::start_on(
            name,
            parameters,
            Some(ProxyOptions {
                conflicts: Some(ConflictMode::with_commit_time(commit_time)),
            }),
        )
        .await
    }

    /// A stack whose DynamoDB calls go through the counting pass-through, which
    /// forwards them as they are: [`Harness::dynamodb_requests`] counts them.
    pub async fn start_counted(name: &str, parameters: &[(&str, &str)]) -> Self {
        Self::start_on(name, parameters, Some(ProxyOptions::default())).await
    }

    /// The stack's DynamoDB requests so far, as the pass-through saw them (needs
    /// [`Harness::start_counted`] or [`Harness::start_contended`]).
    pub fn dynamodb_requests(&self) -> u64 {
        self.dynamodb_proxy
            .as_ref()
            .expect("a stack started with its DynamoDB calls counted")
            .counts()
            .total()
    }

    async fn start_on(
        name: &str,
        parameters: &[(&str, &str)],
        proxy_options: Option<ProxyOptions>,
    ) -> Self {
        let stack_name = format!("e2e-{name}-{}", flashsale_emulators::unique_suffix());
        let mut options = StackOptions::new(stack_name);
        for (key, value) in parameters {
            options = options.parameter(*key, *value);
        }
        // The grab-token key is the stack's own secret, generated on moto: the tests
        // get grab paths from the token route, as buyers do.
        let mut options = options
            // Redelivery after a failure in seconds, not the deployed 3 minutes.
            .parameter("OrdersVisibilityTimeout", "2");
        let mut dynamodb_proxy = None;
        let mut own_reads = None;
        if let Some(proxy_options) = proxy_options {
            let emulators = flashsale_emulators::shared().await;
            let proxy = Proxy::start_with(&emulators.dynamodb_endpoint, 0, proxy_options)
                .await
                .expect("the DynamoDB pass-through starts");
            options.emulators = EmulatorSource::Endpoints(LocalEndpoints {
                dynamodb: proxy.url(),
                ..emulators.endpoints()
            });
            options.stripe_endpoint = Some(emulators.stripe_endpoint.clone());
            dynamodb_proxy = Some(Arc::new(proxy));
            own_reads = Some(emulators.sdk_config().await);
        }
        let stack = LocalStack::start(options)
            .await
            .expect("the local stack starts");
        let api = ApiClient::new(&stack.api_url);
        let admin = stack.token("e2e-admin", true).expect("an admin token");
        let own_reads = own_reads.as_ref().unwrap_or(&stack.sdk_config);
        let dynamodb = aws_sdk_dynamodb::Client::new(own_reads);
        let scheduler = aws_sdk_scheduler::Client::new(own_reads);
        Self {
            stack,
            api,
            admin,
            dynamodb,
            scheduler,
            dynamodb_proxy,
        }
    }

    /// Transaction conflicts the proxy answered, by operation (none without one).
    /// The stack's DynamoDB requests of one operation so far (`UpdateItem`, say), as the
    /// pass-through saw them (needs [`Harness::start_counted`] or
    /// [`Harness::start_contended`]).
    pub fn dynamodb_requests_of(&self, operation: &str) -> u64 {
        self.dynamodb_proxy
            .as_ref()
            .expect("a stack started with its DynamoDB calls counted")
            .counts()
            .of(&format!("DynamoDB_20120810.{operation}"))
    }

    pub fn conflicts_answered(&self) -> std::collections::BTreeMap<String, u64> {
        self.dynamodb_proxy
            .as_ref()
            .map(|proxy| conflicts_by_operation(&proxy.counts()))
            .unwrap_or_default()
    }

    pub fn user(&self, name: &str) -> String {
        self.stack.token(name, false).expect("a user token")
    }

    /// Pays the buyer's order by card as the page does: [`Harness::card_confirmed`],
    /// then the settlement. The settlement's answer, or the opening's when it refused
    /// (an order no longer open).
    pub async fn pay_by_card(&self, buyer: &str, order_id: &str) -> ApiResponse {
        if let Err(refused) = self.card_confirmed(buyer, order_id).await {
            return refused;
        }
        self.api
            .confirm_payment(buyer, order_id)
            .await
            .expect("the settlement answers")
    }

    /// Opens the order's payment and confirms it at the local Stripe with a good card,
    /// as the page's Stripe.js does once, however often the buyer clicks after. The
    /// opening's answer when it refused (an order no longer open).
    pub async fn card_confirmed(&self, buyer: &str, order_id: &str) -> Result<(), ApiResponse> {
        let opened = self
            .api
            .open_payment(buyer, order_id)
            .await
            .expect("opening a payment answers");
        if opened.status != StatusCode::OK {
            return Err(opened);
        }
        let (status, confirmed) = LocalStripe::of(self)
            .page_confirm(&opened.body, GOOD_CARD)
            .await;
        assert_eq!(status, StatusCode::OK, "{confirmed:#}");
        Ok(())
    }

    pub fn table(&self) -> &str {
        self.stack
            .table_name("Table")
            .expect("the template has a Table")
    }

    pub fn schedule_group(&self) -> &str {
        self.stack
            .schedule_group_name("ReleaseScheduleGroup")
            .expect("the template has a ReleaseScheduleGroup")
    }

    /// Creates an active sale (started a second ago, ending in an hour).
    pub async fn active_sale(
        &self,
        sale_id: &str,
        stock: u32,
        shards: u16,
        payment_timeout_secs: u32,
    ) {
        self.active_sale_with(sale_id, stock, shards, payment_timeout_secs, json!({}))
            .await;
    }

    /// [`Harness::active_sale`] with more fields of the create request (`{"reserve":
    /// "transaction"}`, say), which replace the defaults.
    pub async fn active_sale_with(
        &self,
        sale_id: &str,
        stock: u32,
        shards: u16,
        payment_timeout_secs: u32,
        fields: Value,
    ) {
        let now = Utc::now();
        let mut sale = json!({
            "sale_id": sale_id,
            "name": format!("e2e {sale_id}"),
            "price": flashsale_load::client::sale_price(),
            "stock": stock,
            "shards": shards,
            "payment_timeout_secs": payment_timeout_secs,
            "starts_at": now - chrono::Duration::seconds(1),
            "ends_at": now + chrono::Duration::hours(1),
        });
        if let (Some(sale), Value::Object(fields)) = (sale.as_object_mut(), fields) {
            sale.extend(fields);
        }
        // A busy DynamoDB Local (another test's surge) can make the create answer 503,
        // which means "try again". The attempt may still have committed, so after a 503
        // a retry's 409 sale_exists is that attempt's sale; without one it is a failure.
        let mut answered_busy = false;
        // For a time, not a count: a loaded machine keeps DynamoDB Local busy for long.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while tokio::time::Instant::now() < deadline {
            let created = self
                .api
                .create_sale(&self.admin, &sale)
                .await
                .expect("create sale answers");
            match created.status {
                StatusCode::CREATED => return,
                StatusCode::CONFLICT
                    if answered_busy && created.error_code() == Some("sale_exists") =>
                {
                    return;
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    answered_busy = true;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ => panic!(
                    "creating the sale answered {}: {}",
                    created.status, created.body
                ),
            }
        }
        panic!("creating the sale stayed busy");
    }

    /// `available` of every stock shard, read straight from the table.
    pub async fn shard_availability(&self, sale_id: &str, shards: u16) -> Vec<i64> {
        let mut available = Vec::new();
        for shard in 0..shards {
            let item = self
                .dynamodb
                .get_item()
                .table_name(self.table())
                .key(
                    "pk",
                    AttributeValue::S(format!("SALE#{sale_id}#SHARD#{shard}")),
                )
                .key("sk", AttributeValue::S("STOCK".into()))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem of a shard");
            let value = item
                .item()
                .and_then(|item| item.get("available"))
                .and_then(|value| value.as_n().ok())
                .expect("every shard has an available count");
            available.push(value.parse().expect("a number"));
        }
        available
    }

    /// A new buyer's grab path and a path `holder` got before are both refused with
    /// `status` and `code`, and nothing is written: what a block or a pause promises
    /// once its refresh interval has passed.
    pub async fn assert_grabs_refused_without_writing(
        &self,
        sale_id: &str,
        (new_buyer, holder, held_path): (&str, &str, &str),
        status: StatusCode,
        code: &str,
    ) {
        let before = self.item_count().await;
        let refused = self
            .api
            .grab_pass(new_buyer, sale_id)
            .await
            .expect("token answers");
        assert_error(&refused, status, code);
        let refused = self
            .api
            .send(reqwest::Method::POST, held_path, Some(holder), None)
            .await
            .expect("grab answers");
        assert_error(&refused, status, code);
        assert_eq!(self.item_count().await, before, "{code}: nothing written");
    }

    /// How many items the table holds: proof that a refused request wrote nothing.
    pub async fn item_count(&self) -> i32 {
        let mut total = 0;
        let mut start = None;
        loop {
            let page = self
                .dynamodb
                .scan()
                .table_name(self.table())
                .select(Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .expect("Scan COUNT");
            total += page.count();
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return total;
            }
        }
    }

    pub async fn stats(&self, sale_id: &str) -> Value {
        let stats = self
            .api
            .stats(&self.admin, sale_id)
            .await
            .expect("stats answer");
        assert_eq!(stats.status, StatusCode::OK, "{}", stats.body);
        stats.body
    }

    /// Grabs one unit, expecting success; answers the order id and its expiry.
    pub async fn grab_ok(&self, user: &str, sale_id: &str) -> (String, DateTime<Utc>) {
        let grabbed = self.api.grab(user, sale_id).await.expect("grab answers");
        assert_eq!(grabbed.status, StatusCode::ACCEPTED, "{}", grabbed.body);
        assert_eq!(grabbed.str_field("status"), Some("reserved"));
        let expires_at = grabbed
            .str_field("expires_at")
            .expect("expires_at")
            .parse()
            .expect("RFC 3339");
        (
            grabbed.str_field("order_id").expect("order_id").to_owned(),
            expires_at,
        )
    }

    pub async fn order_status(&self, user: &str, order_id: &str) -> String {
        let order = self.api.order(user, order_id).await.expect("order answers");
        assert_eq!(order.status, StatusCode::OK, "{}", order.body);
        order.str_field("status").expect("status").to_owned()
    }

    /// Waits until the order reaches `status`, as a timer, the reconciler or the buyer
    /// moves it.
    pub async fn wait_for_status(
        &self,
        user: &str,
        order_id: &str,
        status: &str,
        within: Duration,
    ) {
        eventually(within, || async {
            let current = self.order_status(user, order_id).await;
            (current == status).then_some(()).ok_or(current)
        })
        .await;
    }

    /// Every metric the test process's stacks recorded, as `GET /local/metrics` answers.
    pub async fn local_metrics(&self) -> Summary {
        let answer = self
            .api
            .send_raw(reqwest::Method::GET, "/local/metrics", None, None)
            .await
            .expect("the local metrics answer");
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        serde_json::from_value(answer.body).expect("the local metrics summary")
    }

    /// How many release timers the consumer has set for the sale's orders: its
    /// `orders_opened` counter, as the stack's `GET /local/metrics` answers it. The
    /// consumer only reads the hold and writes nothing to the table, so this (or the
    /// timer itself, while it exists) is the only sign that it has handed an order over.
    /// The counter is the test process's: every stack of a test binary records into one
    /// recorder, told apart by sale id, so a binary's sale ids must be its own. A
    /// redelivered record counts again.
    pub async fn orders_opened(&self, sale_id: &str) -> u64 {
        let counted = self
            .local_metrics()
            .await
            .counter("orders_opened", &[("sale_id", sale_id)]);
        // A counter, read as a float: whole and never negative.
        counted.max(0.0).round() as u64
    }

    /// Waits until the consumer has set at least `count` release timers for the sale's
    /// orders in all (see [`Harness::orders_opened`]), and answers how many it has. The
    /// timer may have fired and deleted itself by then: a short window's timer may fire
    /// the instant it is set (a random second of the current minute).
    pub async fn wait_for_orders_opened(&self, sale_id: &str, count: u64) -> u64 {
        eventually(CONSUMER_LAG, || async {
            let opened = self.orders_opened(sale_id).await;
            (opened >= count)
                .then_some(opened)
                .ok_or(format!("{opened} of {count} timers set for {sale_id}"))
        })
        .await
    }

    /// The stack's table read directly (not through any proxy), and the sale.
    pub async fn store_and_sale(&self, sale_id: &str) -> (DynamoStore, Sale) {
        let store = DynamoStore::new(self.dynamodb.clone(), self.table());
        let sale = store
            .find_sale(&SaleId::parse(sale_id).expect("a sale id"))
            .await
            .expect("the sale reads")
            .expect("the sale exists");
        (store, sale)
    }

    /// Units taken from a shard that no open or paid hold accounts for: each is a unit
    /// sold to nobody until the reconciler gives it back.
    pub async fn stray_takes(&self, sale_id: &str) -> Vec<Take> {
        let (store, sale) = self.store_and_sale(sale_id).await;
        store
            .unaccounted_takes(&sale)
            .await
            .expect("the shards and holds read")
    }

    /// The event the order's release timer carries: its reservation, read back through
    /// the adapter that wrote it. Read from the store rather than from the schedule,
    /// which may have fired and deleted itself at any second of its minute.
    pub async fn release_event(&self, user_id: &str, order_id: &str) -> Value {
        let store = DynamoStore::new(self.dynamodb.clone(), self.table());
        let order_id = OrderId::parse(order_id).expect("an order id");
        let user_id = UserId::parse(user_id).expect("a user id");
        let (_, reservation) = store
            .find(&order_id, &user_id)
            .await
            .expect("reading the order")
            .expect("the buyer holds the order");
        serde_json::to_value(reservation).expect("a reservation is JSON")
    }

    /// An order's `expires_at` and `expired_at` (when its release committed), as
    /// GET /orders/{order_id} answers them.
    pub async fn expiry_times(
        &self,
        user: &str,
        order_id: &str,
    ) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
        let order = self.api.order(user, order_id).await.expect("order answers");
        assert_eq!(order.status, StatusCode::OK, "{}", order.body);
        let time = |field: &str| {
            order
                .str_field(field)
                .map(|raw| raw.parse::<DateTime<Utc>>().expect("RFC 3339"))
        };
        (time("expires_at").expect("expires_at"), time("expired_at"))
    }

    /// Waits until the consumer has created the order's release timer, and answers its
    /// Target.Input. Only for windows long enough that the timer's minute is still
    /// ahead (about two minutes or more): a shorter one may fire and delete itself
    /// before it is looked at.
    pub async fn wait_for_release_timer(&self, order_id: &str) -> Value {
        eventually(CONSUMER_LAG, || async {
            self.release_timer_input(order_id)
                .await
                .ok_or("no timer yet")
        })
        .await
    }

    /// The release timer of an order, if it exists: its Target.Input is the event the
    /// release function will get.
    pub async fn release_timer_input(&self, order_id: &str) -> Option<Value> {
        let unique = order_id
            .rsplit('.')
            .next()
            .expect("order ids end in a ULID");
        let found = self
            .scheduler
            .get_schedule()
            .group_name(self.schedule_group())
            .name(format!("release-{unique}"))
            .send()
            .await;
        match found {
            Ok(schedule) => {
                let input = schedule
                    .target()
                    .and_then(|target| target.input())
                    .expect("an input");
                Some(serde_json::from_str(input).expect("the input is JSON"))
            }
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                None
            }
            Err(error) => panic!("GetSchedule failed: {error:?}"),
        }
    }

    pub async fn timers_in_group(&self) -> usize {
        let listed = self
            .scheduler
            .list_schedules()
            .group_name(self.schedule_group())
            .send()
            .await
            .expect("ListSchedules");
        listed.schedules().len()
    }
}

/// The conflicts in `counts`, by operation, leaving out those that had none.
pub fn conflicts_by_operation(
    counts: &flashsale_emulators::proxy::Counts,
) -> std::collections::BTreeMap<String, u64> {
    counts
        .operations
        .iter()
        .filter(|(_, op)| op.conflicts > 0)
        .map(|(name, op)| (name.clone(), op.conflicts))
        .collect()
}

/// An SQS event of the orders queue, as the event source mapping hands it to the
/// consumer: one record per message id, each carrying `reservation`.
pub fn orders_queue_event(order_id: &str, reservation: &Value, message_ids: &[&str]) -> Value {
    let records: Vec<Value> = message_ids
        .iter()
        .map(|message_id| {
            json!({
                "messageId": message_id,
                "receiptHandle": format!("handle-{message_id}"),
                "body": reservation.to_string(),
                "attributes": {
                    "ApproximateReceiveCount": "2",
                    "SentTimestamp": "1764400000000",
                    "MessageGroupId": order_id,
                    "MessageDeduplicationId": order_id,
                    "SequenceNumber": "18890000000000000001",
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders.fifo",
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({ "Records": records })
}

/// Polls `probe` every 100 ms until it answers `Ok`, failing with its last answer after
/// `within`.
pub async fn eventually<T, E, F, Fut>(within: Duration, probe: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    eventually_every(within, Duration::from_millis(100), probe).await
}

/// Polls `probe` every `poll` until it answers `Ok`, failing with its last answer after
/// `within`.
pub async fn eventually_every<T, E, F, Fut>(within: Duration, poll: Duration, mut probe: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("still not there after {within:?}; last answer: {last:?}")
            }
            Err(_) => tokio::time::sleep(poll).await,
        }
    }
}

/// Asserts an error response: its status, its code, and a message.
/// Who refused a request, which decides what its body looks like.
pub enum RefusedBy {
    /// A function: `{"error": code, "message": text}`.
    Function(&'static str),
    /// API Gateway itself (the authorizer, a throttle, no such route): an HTTP API's own
    /// answers are exactly `{"message": text}` and cannot be customised.
    Gateway(&'static str),
}

impl From<&'static str> for RefusedBy {
    fn from(code: &'static str) -> Self {
        Self::Function(code)
    }
}

pub fn assert_refused(response: &ApiResponse, status: StatusCode, by: impl Into<RefusedBy>) {
    match by.into() {
        RefusedBy::Function(code) => assert_error(response, status, code),
        RefusedBy::Gateway(message) => {
            assert_eq!(response.status, status, "{}", response.body);
            assert_eq!(response.body, json!({ "message": message }));
        }
    }
}

pub fn assert_error(response: &ApiResponse, status: StatusCode, code: &str) {
    assert_eq!(response.status, status, "{}", response.body);
    assert_eq!(response.error_code(), Some(code), "{}", response.body);
    assert!(
        response
            .body
            .get("message")
            .and_then(Value::as_str)
            .is_some_and(|m| !m.is_empty()),
        "an error carries a message: {}",
        response.body
    );
}

/// Stripe's test card that authorises.
pub const GOOD_CARD: &str = "4242424242424242";

/// The local Stripe, as the page and the operator see it.
pub struct LocalStripe {
    base: String,
    http: reqwest::Client,
}

impl LocalStripe {
    pub fn of(harness: &Harness) -> Self {
        Self {
            base: harness
                .stack
                .stripe_endpoint
                .clone()
                .expect("the local stack takes card payments through its local Stripe"),
            http: reqwest::Client::new(),
        }
    }

    /// The page confirms the payment with `card` typed in, as Stripe.js does: the
    /// publishable key and the client secret the API answered, nothing else.
    pub async fn page_confirm(&self, payment: &Value, card: &str) -> (StatusCode, Value) {
        let field = |name: &str| payment[name].as_str().expect(name).to_owned();
        let response = self
            .http
            .post(format!(
                "{}/v1/payment_intents/{}/confirm",
                self.base,
                field("payment_id")
            ))
            .form(&[
                ("key", field("publishable_key").as_str()),
                ("client_secret", field("client_secret").as_str()),
                ("payment_method_data[type]", "card"),
                ("payment_method_data[card][number]", card),
                ("payment_method_data[card][exp_month]", "12"),
                ("payment_method_data[card][exp_year]", "2034"),
                ("payment_method_data[card][cvc]", "123"),
            ])
            .send()
            .await
            .expect("the local Stripe answers");
        let status = response.status();
        (status, response.json().await.expect("JSON"))
    }

    /// The PaymentIntent, as the operator reads it in Stripe's dashboard.
    pub async fn intent(&self, payment: &Value) -> Value {
        let id = payment["payment_id"].as_str().expect("payment_id");
        self.http
            .get(format!("{}/v1/payment_intents/{id}", self.base))
            .bearer_auth(flashsale_local::local_stripe::SECRET_KEY)
            .send()
            .await
            .expect("the local Stripe answers")
            .json()
            .await
            .expect("JSON")
    }

    /// The PaymentIntent's status.
    pub async fn status_of(&self, payment: &Value) -> String {
        let intent = self.intent(payment).await;
        intent["status"].as_str().unwrap_or_default().to_owned()
    }

    /// A PaymentIntent made with the account's secret key outside the API, as another
    /// product on the account (or a forger who has the key) would: `metadata` is sent
    /// as given.
    pub async fn create_intent(
        &self,
        amount: u64,
        currency: &str,
        metadata: &[(&str, &str)],
    ) -> Value {
        let mut form = vec![
            ("amount".to_owned(), amount.to_string()),
            ("currency".to_owned(), currency.to_owned()),
            ("capture_method".to_owned(), "manual".to_owned()),
        ];
        form.extend(
            metadata
                .iter()
                .map(|(key, value)| (format!("metadata[{key}]"), (*value).to_owned())),
        );
        let response = self
            .http
            .post(format!("{}/v1/payment_intents", self.base))
            .bearer_auth(flashsale_local::local_stripe::SECRET_KEY)
            .form(&form)
            .send()
            .await
            .expect("the local Stripe answers");
        assert_eq!(response.status(), StatusCode::OK, "create a PaymentIntent");
        response.json().await.expect("JSON")
    }

    /// Cancels the PaymentIntent `intent` with the secret key, as the API withdraws a
    /// payment its order did not take: the PaymentIntent as cancelled.
    pub async fn cancel(&self, intent: &Value) -> Value {
        let id = intent["id"].as_str().expect("an id");
        let response = self
            .http
            .post(format!("{}/v1/payment_intents/{id}/cancel", self.base))
            .bearer_auth(flashsale_local::local_stripe::SECRET_KEY)
            .send()
            .await
            .expect("the local Stripe answers");
        assert_eq!(response.status(), StatusCode::OK, "cancel a PaymentIntent");
        response.json().await.expect("JSON")
    }
}

/// Stripe's side of the stack's webhook: events signed with the endpoint's signing
/// secret, as Stripe signs them.
pub struct StripeWebhook {
    url: String,
    secret: String,
    http: reqwest::Client,
}

impl StripeWebhook {
    /// The webhook of `harness`'s stack, with the signing secret it registered.
    pub fn of(harness: &Harness) -> Self {
        Self {
            url: format!(
                "{}{}",
                harness.stack.api_url,
                flashsale_local::local_stripe::WEBHOOK_PATH
            ),
            secret: harness
                .stack
                .stripe_webhook_secret
                .clone()
                .expect("the local stack takes card payments through its local Stripe"),
            http: reqwest::Client::new(),
        }
    }

    /// Delivers the event `event_id` of `kind` about the PaymentIntent `intent` as
    /// Stripe does, signed now: the status and the body answered.
    pub async fn deliver(&self, event_id: &str, kind: &str, intent: &Value) -> (StatusCode, Value) {
        let payload = json!({
            "id": event_id,
            "object": "event",
            "type": kind,
            "data": {"object": intent},
        })
        .to_string();
        let signature = flashsale_adapters::stripe::webhook::sign(
            payload.as_bytes(),
            &self.secret,
            Utc::now().timestamp(),
        );
        let response = self
            .http
            .post(&self.url)
            .header("stripe-signature", signature)
            .header("content-type", "application/json")
            .body(payload)
            .send()
            .await
            .expect("the API answers");
        let status = response.status();
        (status, response.json().await.expect("JSON"))
    }
}
