//! The measurements through the local stack: every count comes from the proxies in front
//! of the emulators, every latency from the client side of the local gateway.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use flashsale_domain::ReservePath;
use flashsale_load::client::{ApiClient, ClientError, expect_status};
use futures::stream::{self, StreamExt};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};

use crate::proxy::Counts;
use crate::stack::BenchStack;
use crate::stats::{Percentiles, per_second};

/// The header by which a client marks a grab as the retry of an earlier attempt whose
/// answer it lost: only such a grab pays for the lookup of the buyer's own order.
pub const RETRY_HEADER: &str = "X-Retry-Attempt";

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Unexpected(String),
}

/// Busy answers (429, 503) asked again before a step gives up: preparation and reads
/// are safe to repeat, and a loaded machine's stack is busy for a while at worst.
const BUSY_RETRIES: u32 = 10;

/// `call` asked again with the load tool's backoff while `status` of its answer is busy
/// (429 or 503), at most [`BUSY_RETRIES`] times: the last answer, and how many times it
/// was asked again. For calls that are safe to repeat.
pub(crate) async fn asked_while_busy<T, F, Fut>(
    mut call: F,
    status: impl Fn(&T) -> StatusCode,
) -> Result<(T, u32), ScenarioError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ScenarioError>>,
{
    let mut retry = 0;
    loop {
        let answer = call().await?;
        let busy = matches!(
            status(&answer),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        );
        if !busy || retry == BUSY_RETRIES {
            return Ok((answer, retry));
        }
        tokio::time::sleep(flashsale_load::surge::backoff(retry)).await;
        retry += 1;
    }
}

/// A client of the stack's API with an admin token.
pub struct Session {
    pub api: ApiClient,
    pub(crate) http: reqwest::Client,
    pub(crate) admin: String,
    /// Unique per run, in every sale and buyer name, so runs on one table never meet.
    pub(crate) run: String,
    /// The local Stripe, where a buyer's page confirms a card.
    pub(crate) stripe_endpoint: String,
}

/// What one request got.
#[derive(Debug, Clone)]
struct Shot {
    /// 0 when no answer came (a transport error).
    status: u16,
    body: Value,
    latency: Duration,
}

impl Shot {
    fn outcome(&self) -> String {
        match self.body.get("error").and_then(Value::as_str) {
            Some(code) => format!("{} {code}", self.status),
            None if self.status == 0 => "no answer".to_owned(),
            None => self.status.to_string(),
        }
    }
}

fn outcomes(shots: &[Shot]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for shot in shots {
        *counts.entry(shot.outcome()).or_default() += 1;
    }
    counts
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Session {
    pub async fn open(stack: &BenchStack) -> Result<Self, ScenarioError> {
        let api = ApiClient::new(stack.api_url.clone());
        let admin = api.local_token("bench-admin", true).await?;
        Ok(Self {
            api,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .build()
                .map_err(|e| ScenarioError::Unexpected(format!("HTTP client: {e}")))?,
            admin,
            run: flashsale_emulators::unique_suffix(),
            stripe_endpoint: stack.stripe_endpoint.clone(),
        })
    }

    /// Confirms an opened payment at the local Stripe as the page's Stripe.js does (its
    /// publishable key and client secret) with Stripe's test card; whether Stripe
    /// authorised it.
    async fn confirm_test_card(&self, opened: &Value) -> bool {
        let field = |name: &str| opened.get(name).and_then(Value::as_str).unwrap_or_default();
        let confirmed = self
            .http
            .post(format!(
                "{}/v1/payment_intents/{}/confirm",
                self.stripe_endpoint,
                field("payment_id")
            ))
            .form(&[
                ("key", field("publishable_key")),
                ("client_secret", field("client_secret")),
                ("payment_method", "pm_card_visa"),
            ])
            .send()
            .await;
        confirmed.is_ok_and(|response| response.status().is_success())
    }

    /// Creates an active sale; answers its id.
    async fn create_sale(
        &self,
        name: &str,
        stock: u32,
        payment_timeout_secs: u32,
    ) -> Result<String, ScenarioError> {
        self.create_sale_on_shards(
            name,
            stock,
            payment_timeout_secs,
            None,
            ReservePath::Adaptive,
        )
        .await
    }

    /// [`Session::create_sale`] on `shards` stock shards (`None`: the sale's default),
    /// its grabs reserving as `reserve` says.
    pub(crate) async fn create_sale_on_shards(
        &self,
        name: &str,
        stock: u32,
        payment_timeout_secs: u32,
        shards: Option<u16>,
        reserve: ReservePath,
    ) -> Result<String, ScenarioError> {
        let sale_id = format!("bench-{name}-{}", self.run);
        let now = Utc::now();
        let mut sale = json!({
            "sale_id": sale_id,
            "name": format!("bench {name}"),
            "price": flashsale_load::client::sale_price(),
            "stock": stock,
            "starts_at": rfc3339(now - chrono::Duration::seconds(5)),
            "ends_at": rfc3339(now + chrono::Duration::hours(2)),
            "payment_timeout_secs": payment_timeout_secs,
            "reserve": reserve.name(),
        });
        if let Some(shards) = shards {
            sale["shards"] = json!(shards);
        }
        let (created, retries) = asked_while_busy(
            || async { Ok(self.api.create_sale(&self.admin, &sale).await?) },
            |created| created.status,
        )
        .await?;
        // A busy answer may hide a committed create (its SDK call timed out), so after
        // one, a 409 for this run's unique id means the sale is there.
        let there_already = retries > 0 && created.error_code() == Some("sale_exists");
        if !there_already {
            expect_status(&created, StatusCode::CREATED, "/admin/sales")?;
        }
        Ok(sale_id)
    }

    /// Buyer tokens and grab paths for `count` new buyers of `sale_id`.
    pub(crate) async fn buyers_with_paths(
        &self,
        sale_id: &str,
        tag: &str,
        count: usize,
    ) -> Result<Vec<(String, String)>, ScenarioError> {
        let api = &self.api;
        stream::iter(0..count)
            .map(|n| async move {
                let token = api
                    .local_token(&format!("bench-{tag}-{n}-{}", self.run), false)
                    .await?;
                // Preparation, not measurement: a busy answer is asked again.
                let pass = api.grab_pass_retrying(&token, sale_id).await?;
                expect_status(&pass, StatusCode::OK, "grab path")?;
                let path = pass
                    .str_field("grab_path")
                    .ok_or_else(|| {
                        ScenarioError::Unexpected(format!("no grab_path: {:?}", pass.body))
                    })?
                    .to_owned();
                Ok::<_, ScenarioError>((token, path))
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// Sends each request once (no retry: the answer is what is measured).
    async fn fire(
        &self,
        requests: Vec<(Method, String, String, bool)>,
        concurrency: usize,
    ) -> (Vec<Shot>, Duration) {
        let started = Instant::now();
        let shots = stream::iter(requests)
            .map(|(method, path, token, retry)| {
                let mut request = self
                    .http
                    .request(method, format!("{}{path}", self.api.base_url()))
                    .bearer_auth(token);
                if retry {
                    request = request.header(RETRY_HEADER, "1");
                }
                async move {
                    let sent = Instant::now();
                    let answer = request.send().await;
                    let (status, body) = match answer {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let body = response.json::<Value>().await.unwrap_or(Value::Null);
                            (status, body)
                        }
                        Err(_) => (0, Value::Null),
                    };
                    Shot {
                        status,
                        body,
                        latency: sent.elapsed(),
                    }
                }
            })
            // In request order, so callers can pair answers with what they sent.
            .buffered(concurrency.max(1))
            .collect::<Vec<_>>()
            .await;
        (shots, started.elapsed())
    }
}

/// Calls counted by the proxies over a window, and what the idle stack (its pollers,
/// timers and reconciler) calls over an equal time, measured right after.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub elapsed: Duration,
    pub dynamodb: Counts,
    pub sqs: Counts,
}

#[derive(Debug, Clone, Serialize)]
pub struct CallCost {
    /// Per operation: calls in the window, and the idle background expected over it.
    pub operations: BTreeMap<String, (u64, f64)>,
    /// Calls in the window beyond the idle background, per request.
    pub dynamodb_per_request: f64,
    pub sqs_per_request: f64,
    pub dynamodb_reads_per_request: f64,
}

/// SQS operations only the consumer's poller makes (the event source mapping); the grab
/// never calls them, so they are background by construction.
fn is_poller_operation(operation: &str) -> bool {
    [
        "AmazonSQS.ReceiveMessage",
        "AmazonSQS.DeleteMessage",
        "AmazonSQS.DeleteMessageBatch",
        "AmazonSQS.ChangeMessageVisibility",
        "AmazonSQS.ChangeMessageVisibilityBatch",
        "AmazonSQS.GetQueueAttributes",
        "AmazonSQS.GetQueueUrl",
    ]
    .contains(&operation)
        || !operation.starts_with("AmazonSQS.")
}

fn is_read(operation: &str) -> bool {
    [
        "GetItem",
        "Query",
        "BatchGetItem",
        "Scan",
        "TransactGetItems",
    ]
    .iter()
    .any(|read| operation == format!("DynamoDB_20120810.{read}"))
}

impl CallCost {
    fn of(window: &Window, idle: &Window, requests: usize) -> Self {
        let scale = if idle.elapsed.is_zero() {
            0.0
        } else {
            window.elapsed.as_secs_f64() / idle.elapsed.as_secs_f64()
        };
        let mut operations = BTreeMap::new();
        for counts in [&window.dynamodb, &idle.dynamodb, &window.sqs, &idle.sqs] {
            for name in counts.operations.keys() {
                let seen = window.dynamodb.of(name) + window.sqs.of(name);
                let background = (idle.dynamodb.of(name) + idle.sqs.of(name)) as f64 * scale;
                operations.insert(name.clone(), (seen, background));
            }
        }
        let net = |keep: &dyn Fn(&str) -> bool| -> f64 {
            operations
                .iter()
                .filter(|(name, _)| keep(name))
                .map(|(_, (seen, background))| (*seen as f64 - background).max(0.0))
                // An empty float sum is -0.0, which would print as "-0.000".
                .fold(0.0, |total, calls| total + calls)
                / requests.max(1) as f64
        };
        Self {
            dynamodb_per_request: net(&|op| op.starts_with("DynamoDB_")),
            sqs_per_request: net(&|op| op.starts_with("AmazonSQS.") && !is_poller_operation(op)),
            dynamodb_reads_per_request: net(&is_read),
            operations,
        }
    }
}

async fn counted<T>(stack: &BenchStack, work: impl Future<Output = T>) -> (T, Window) {
    let (dynamodb, sqs) = (stack.dynamodb.counts(), stack.sqs.counts());
    let started = Instant::now();
    let out = work.await;
    let elapsed = started.elapsed();
    let window = Window {
        elapsed,
        dynamodb: stack.dynamodb.counts().since(&dynamodb),
        sqs: stack.sqs.counts().since(&sqs),
    };
    (out, window)
}

#[derive(Debug, Clone, Copy)]
pub struct RejectionSizes {
    pub stock: u32,
    pub first_attempts: usize,
    pub retries: usize,
    pub concurrency: usize,
    /// The idle window is at least this long (and at least as long as the measurement).
    pub min_idle: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct RejectionReport {
    pub stock: u32,
    pub sold: usize,
    pub concurrency: usize,
    pub first_attempts: usize,
    pub first_outcomes: BTreeMap<String, usize>,
    pub first_cost: CallCost,
    pub rejections_per_sec: f64,
    pub first_latency: Option<Percentiles>,
    pub retries: usize,
    pub retry_outcomes: BTreeMap<String, usize>,
    pub retry_cost: CallCost,
    pub idle: Window,
    pub window: Window,
}

/// Sells a sale out, then sends first attempts and marked retries by new buyers.
pub async fn rejection_cost(
    session: &Session,
    stack: &BenchStack,
    sizes: RejectionSizes,
) -> Result<RejectionReport, ScenarioError> {
    let sale_id = session.create_sale("reject", sizes.stock, 900).await?;
    // New buyers grab until the stats show nothing left (a grab lost to a 503 under load
    // is made up by the next round), so every measured attempt comes after the last unit.
    let mut round = 0;
    let sold = loop {
        let stats = session.api.stats(&session.admin, &sale_id).await?;
        expect_status(&stats, StatusCode::OK, "stats")?;
        let available = stats.body["available"].as_u64().unwrap_or(0) as usize;
        if available == 0 || round == 20 {
            break sizes.stock as usize - available.min(sizes.stock as usize);
        }
        round += 1;
        let buyers = session
            .buyers_with_paths(&sale_id, &format!("seller{round}"), available)
            .await?;
        let grabs = buyers
            .into_iter()
            .map(|(token, path)| (Method::POST, path, token, false))
            .collect();
        session.fire(grabs, 8).await;
    };
    // A few rejections first, as in a real surge: they close the in-memory sold-out gate.
    let warmup = session.buyers_with_paths(&sale_id, "warmup", 10).await?;
    let warmup = warmup
        .into_iter()
        .map(|(token, path)| (Method::POST, path, token, false))
        .collect();
    session.fire(warmup, 1).await;

    let first = session
        .buyers_with_paths(&sale_id, "first", sizes.first_attempts)
        .await?;
    let retry = session
        .buyers_with_paths(&sale_id, "retry", sizes.retries)
        .await?;
    let first: Vec<_> = first
        .into_iter()
        .map(|(token, path)| (Method::POST, path, token, false))
        .collect();
    let retry: Vec<_> = retry
        .into_iter()
        .map(|(token, path)| (Method::POST, path, token, true))
        .collect();
    let ((first_shots, first_elapsed), window) =
        counted(stack, session.fire(first, sizes.concurrency)).await;
    let ((retry_shots, _), retry_window) =
        counted(stack, session.fire(retry, sizes.concurrency)).await;
    let idle_for = window.elapsed.max(retry_window.elapsed).max(sizes.min_idle);
    let ((), idle) = counted(stack, tokio::time::sleep(idle_for)).await;

    let rejected = first_shots
        .iter()
        .filter(|s| (400..500).contains(&s.status))
        .count();
    let latencies: Vec<Duration> = first_shots.iter().map(|s| s.latency).collect();
    Ok(RejectionReport {
        stock: sizes.stock,
        sold,
        concurrency: sizes.concurrency,
        first_attempts: first_shots.len(),
        first_outcomes: outcomes(&first_shots),
        first_cost: CallCost::of(&window, &idle, rejected),
        rejections_per_sec: per_second(rejected, first_elapsed),
        first_latency: Percentiles::of(&latencies),
        retries: retry_shots.len(),
        retry_outcomes: outcomes(&retry_shots),
        retry_cost: CallCost::of(&retry_window, &idle, retry_shots.len()),
        idle,
        window,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct RouteLatency {
    pub route: String,
    pub outcomes: BTreeMap<String, usize>,
    pub latency: Option<Percentiles>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SurgeLatencyReport {
    pub buyers: usize,
    pub concurrency: usize,
    pub elapsed: Duration,
    pub routes: Vec<RouteLatency>,
}

/// Each buyer loads the sale page, fetches a grab path, grabs, reads the order until it
/// is held (awaiting payment from the grab on) and pays by card (opens the payment,
/// confirms it at the local Stripe, settles); every call of ours is kept under its
/// route.
pub async fn route_latencies(
    session: &Session,
    buyers: usize,
    concurrency: usize,
) -> Result<SurgeLatencyReport, ScenarioError> {
    let stock = u32::try_from(buyers).unwrap_or(u32::MAX);
    let sale_id = session.create_sale("surge", stock, 900).await?;
    let tokens: Vec<String> = stream::iter(0..buyers)
        .map(|n| {
            let user = format!("bench-surge-{n}-{}", session.run);
            async move { session.api.local_token(&user, false).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(&'static str, Shot)>::new()));
    let started = Instant::now();
    stream::iter(tokens)
        .for_each_concurrent(concurrency.max(1), |token| {
            let samples = Arc::clone(&samples);
            let sale_id = sale_id.clone();
            async move {
                let keep = |route: &'static str, shot: Shot| {
                    let body = shot.body.clone();
                    samples
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((route, shot));
                    body
                };
                let one = |method: Method, path: String| {
                    let token = token.clone();
                    async move {
                        let (mut shots, _) =
                            session.fire(vec![(method, path, token, false)], 1).await;
                        shots.pop()
                    }
                };
                if let Some(shot) = one(Method::GET, format!("/sales/{sale_id}")).await {
                    keep("GET /sales/{id}", shot);
                }
                let Some(pass) = one(Method::POST, format!("/sales/{sale_id}/token")).await else {
                    return;
                };
                let pass = keep("POST /sales/{id}/token", pass);
                let Some(path) = pass.get("grab_path").and_then(Value::as_str) else {
                    return;
                };
                let Some(grab) = one(Method::POST, path.to_owned()).await else {
                    return;
                };
                let grab = keep("POST /sales/{id}/grab/{token}", grab);
                let Some(order_id) = grab.get("order_id").and_then(Value::as_str) else {
                    return;
                };
                // The order is payable from the grab on; read it once, as the page does.
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    let Some(read) = one(Method::GET, format!("/orders/{order_id}")).await else {
                        return;
                    };
                    let read = keep("GET /orders/{id}", read);
                    if read.get("status").and_then(Value::as_str) == Some("reserved") {
                        let Some(opened) =
                            one(Method::POST, format!("/orders/{order_id}/payment")).await
                        else {
                            return;
                        };
                        let opened = keep("POST /orders/{id}/payment", opened);
                        // The page's Stripe.js confirms the card at Stripe (not ours, so
                        // not measured), then the page asks for the settlement.
                        if session.confirm_test_card(&opened).await
                            && let Some(settled) =
                                one(Method::POST, format!("/orders/{order_id}/payment/confirm"))
                                    .await
                        {
                            keep("POST /orders/{id}/payment/confirm", settled);
                        }
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .await;
    let elapsed = started.elapsed();
    let samples = std::mem::take(
        &mut *samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let mut by_route: BTreeMap<&str, Vec<Shot>> = BTreeMap::new();
    for (route, shot) in samples {
        by_route.entry(route).or_default().push(shot);
    }
    let routes = by_route
        .into_iter()
        .map(|(route, shots)| RouteLatency {
            route: route.to_owned(),
            outcomes: outcomes(&shots),
            latency: Percentiles::of(&shots.iter().map(|s| s.latency).collect::<Vec<_>>()),
        })
        .collect();
    Ok(SurgeLatencyReport {
        buyers,
        concurrency,
        elapsed,
        routes,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct LatenessReport {
    pub orders: usize,
    pub payment_timeout_secs: u32,
    /// Orders seen expired before the wait ended.
    pub lapsed: usize,
    /// `expired_at - expires_at` of each lapsed order, when the API reports `expired_at`.
    pub lateness: Option<Percentiles>,
    /// First poll that saw the order expired, minus its deadline (1 s polls): an upper
    /// bound that needs no field from the API.
    pub observed: Option<Percentiles>,
    pub note: Option<String>,
}

/// Leaves orders unpaid and measures how late each comes back after its deadline.
pub async fn release_lateness(
    session: &Session,
    orders: usize,
    payment_timeout_secs: u32,
    wait_after_deadline: Duration,
) -> Result<LatenessReport, ScenarioError> {
    let stock = u32::try_from(orders).unwrap_or(u32::MAX);
    let sale_id = session
        .create_sale("lapse", stock, payment_timeout_secs)
        .await?;
    let buyers = session.buyers_with_paths(&sale_id, "lapse", orders).await?;
    let grabs: Vec<_> = buyers
        .iter()
        .map(|(token, path)| (Method::POST, path.clone(), token.clone(), false))
        .collect();
    let (shots, _) = session.fire(grabs, 8).await;
    let mut open: Vec<(String, String, DateTime<Utc>)> = Vec::new();
    for ((token, _), shot) in buyers.iter().zip(&shots) {
        let order = shot.body.get("order_id").and_then(Value::as_str);
        let due = shot
            .body
            .get("expires_at")
            .and_then(Value::as_str)
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok());
        if let (202, Some(order), Some(due)) = (shot.status, order, due) {
            open.push((token.clone(), order.to_owned(), due.with_timezone(&Utc)));
        }
    }
    let last_due = open
        .iter()
        .map(|(_, _, due)| *due)
        .max()
        .unwrap_or_else(Utc::now);
    let give_up = last_due + chrono::Duration::from_std(wait_after_deadline).unwrap_or_default();
    let mut lateness = Vec::new();
    let mut observed = Vec::new();
    let mut field_missing = false;
    while !open.is_empty() && Utc::now() < give_up {
        let mut still_open = Vec::new();
        for (token, order_id, due) in open {
            let read = session.api.order(&token, &order_id).await?;
            if read.str_field("status") != Some("expired") {
                still_open.push((token, order_id, due));
                continue;
            }
            let seen = Utc::now();
            observed.push((seen - due).to_std().unwrap_or_default());
            match read
                .str_field("expired_at")
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            {
                Some(at) => {
                    lateness.push((at.with_timezone(&Utc) - due).to_std().unwrap_or_default())
                }
                None => field_missing = true,
            }
        }
        open = still_open;
        if !open.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let lapsed = observed.len();
    let mut notes = Vec::new();
    if field_missing {
        notes.push("not available: GET /orders/{id} has no `expired_at`".to_owned());
    }
    if !open.is_empty() {
        notes.push(format!(
            "{} of {} orders were still open {}s after the last deadline",
            open.len(),
            lapsed + open.len(),
            wait_after_deadline.as_secs()
        ));
    }
    Ok(LatenessReport {
        orders: shots.len(),
        payment_timeout_secs,
        lapsed,
        lateness: if field_missing {
            None
        } else {
            Percentiles::of(&lateness)
        },
        observed: Percentiles::of(&observed),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        let mut counts = Counts::default();
        for (operation, n) in pairs {
            let entry = counts
                .operations
                .entry((*operation).to_owned())
                .or_default();
            entry.total = *n;
            entry.by_outcome.insert("200".to_owned(), *n);
        }
        counts
    }

    fn window(secs: u64, dynamodb: &[(&str, u64)], sqs: &[(&str, u64)]) -> Window {
        Window {
            elapsed: Duration::from_secs(secs),
            dynamodb: counts(dynamodb),
            sqs: counts(sqs),
        }
    }

    #[test]
    fn the_idle_background_is_scaled_to_the_window_and_subtracted() {
        let get = "DynamoDB_20120810.GetItem";
        let transact = "DynamoDB_20120810.TransactWriteItems";
        let send = "AmazonSQS.SendMessage";
        let receive = "AmazonSQS.ReceiveMessage";
        // 2 s of traffic: 12 reads, 4 transactions, 2 sends, 30 polls.
        let busy = window(2, &[(get, 12), (transact, 4)], &[(send, 2), (receive, 30)]);
        // 4 s idle: 8 reads (the blocklist refresh, say) and 60 polls.
        let idle = window(4, &[(get, 8)], &[(receive, 60)]);
        let cost = CallCost::of(&busy, &idle, 10);
        // Reads: 12 seen, 4 expected from the background: 8 over 10 requests.
        assert!((cost.dynamodb_reads_per_request - 0.8).abs() < 1e-9);
        assert!((cost.dynamodb_per_request - 1.2).abs() < 1e-9);
        // The poller's receives are never the grab's; the sends are.
        assert!((cost.sqs_per_request - 0.2).abs() < 1e-9);
        assert_eq!(cost.operations[receive], (30, 30.0));
    }

    #[test]
    fn a_quiet_window_costs_nothing_even_when_the_idle_one_was_busier() {
        let get = "DynamoDB_20120810.GetItem";
        let cost = CallCost::of(
            &window(1, &[(get, 1)], &[]),
            &window(1, &[(get, 3)], &[]),
            5,
        );
        assert_eq!(cost.dynamodb_per_request, 0.0);
    }

    #[test]
    fn counts_since_a_snapshot_keep_only_what_happened_after_it() {
        let before = counts(&[("A", 2), ("B", 5)]);
        let after = counts(&[("A", 2), ("B", 7), ("C", 1)]);
        let since = after.since(&before);
        assert_eq!(since.of("A"), 0);
        assert!(!since.operations.contains_key("A"));
        assert_eq!(since.of("B"), 2);
        assert_eq!(since.operations["B"].by_outcome["200"], 2);
        assert_eq!(since.of("C"), 1);
        assert_eq!(since.total(), 3);
    }
}
