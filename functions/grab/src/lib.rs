//! The grab function: the hot path of the sale. It serves
//! `GET /sales/{sale_id}/challenge` (the proof-of-work challenge of a sale that asks
//! for one), `POST /sales/{sale_id}/token` (the dynamic grab path, only once the sale
//! is active, for a solved challenge if the sale asks for one) and `POST /sales/{sale_id}/grab/{token}` (one reservation transaction, then the order
//! goes to the queue).
//!
//! Everything a request needs is built once per process in [`Deps`]: the sale cache and
//! the sold-out gate live as long as the Lambda execution environment, which is what
//! lets them spare the table most of a sold-out sale's traffic.

mod grab_key;

use std::sync::Arc;

use tracing::Instrument as _;

use chrono::{DateTime, Duration, Utc};
use flashsale_adapters::breaker::BreakerPolicy;
use flashsale_adapters::proof_of_work::AltchaChallenges;
use flashsale_adapters::{DynamoStore, SqsOrderQueue, TokioPause};
use flashsale_domain::gate::SoldOutGate;
use flashsale_domain::ports::{
    Blocklist, Clock, OrderBook, OrderQueue, Pause, SaleCatalog, StockLedger, SystemClock,
    SystemIds,
};
use flashsale_domain::service::{
    Attempt, CachedBlocklist, CachedCatalog, ContentionPolicy, GrabOutcome, GrabReport,
    GrabService, SoldOutBy,
};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{OrderId, OrderStatus, Price};
use flashsale_lambda::metrics;
use flashsale_lambda::{
    ApiError, CachePolicy, CallBudget, Clients, Env, FromEnv, Function, SecretsManagerSecret,
    ensure_within_limit, json, json_body, respond, route_key, sale_id_param, user_of,
};
pub use grab_key::GrabKeyError;
use lambda_http::http::header::{HeaderValue, LOCATION};
use lambda_http::http::{Response, StatusCode};
use lambda_http::{Body, Request};
use serde::Serialize;

/// The routes this function serves, exactly as the API declares them.
pub const CHALLENGE_ROUTE: &str = "GET /sales/{sale_id}/challenge";
pub const TOKEN_ROUTE: &str = "POST /sales/{sale_id}/token";
pub const GRAB_ROUTE: &str = "POST /sales/{sale_id}/grab/{token}";

/// The request header by which a client marks a retry of the same grab path: `N >= 1`
/// on the N-th retry, absent or `0` on the first attempt. Only a marked retry pays for
/// looking up an order the lost first answer may have created.
pub const RETRY_ATTEMPT_HEADER: &str = "x-retry-attempt";

/// Sales one process keeps in memory. A flash sale process serves a handful of sales;
/// the bound only stops a stream of distinct ids from growing the cache without limit.
pub const SALE_CACHE_CAPACITY: usize = 1024;

/// How long the sold-out gate trusts an "empty" answer when `SOLD_OUT_RECHECK_MS` is
/// unset.
pub const DEFAULT_SOLD_OUT_RECHECK_MS: u32 = 1000;

/// How long a process answers from its blocklist snapshot when `BLOCKLIST_REFRESH_MS`
/// is unset: a block reaches every grab within five seconds, for one small read per
/// process per five seconds.
pub const DEFAULT_BLOCKLIST_REFRESH_MS: u32 = 5000;

/// How long one SDK call of the grab may take. DynamoDB and SQS answer in tens of
/// milliseconds; an attempt still waiting after 500 ms is stuck, and a retry (with the
/// same idempotency token) is likelier to succeed than waiting longer.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_millis(500),
    operation: std::time::Duration::from_secs(1),
};

/// How long a request may take before the buyer gets a 503 to retry; the template
/// gives the function 5 s. Most grabs make two calls, but one can make many more: a
/// reserve per shard until one has stock, and more walks over contended shards. The
/// grab stops starting reserves after its own budget
/// ([`ContentionPolicy::budget`], 2.5 s), so this deadline is only the backstop.
/// Answering first keeps the process, with its sale cache and sold-out gate, which a
/// Lambda timeout would throw away. Whatever the abandoned request committed is safe:
/// the retry of the same path resumes its order (reserve is idempotent per order id),
/// and the reconciler releases it past its deadline if no timer was set.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(4);

/// The grab function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    pub orders_queue_url: String,
    /// The Secrets Manager secret holding the grab-token key, read once per cold start
    /// by the cold start ([`Function::init`]); the key itself is never in the environment.
    pub grab_token_secret_arn: String,
    pub sold_out_recheck: Duration,
    /// How often a process rereads the blocklist.
    pub blocklist_refresh: Duration,
    /// How long a sale is answered from memory before it is reread for its control: a
    /// pause reaches this process within it.
    pub sale_refresh: std::time::Duration,
    /// When DynamoDB's and SQS's circuit breakers open, and for how long.
    pub breaker: BreakerPolicy,
}

impl FromEnv for Config {
    fn read(env: &Env<'_>) -> Self {
        let millis =
            |var, default: u32| Duration::milliseconds(i64::from(env.parsed_or(var, default)));
        Self {
            table_name: env.required("TABLE_NAME"),
            orders_queue_url: env.required("ORDERS_QUEUE_URL"),
            grab_token_secret_arn: env.required("GRAB_TOKEN_SECRET_ARN"),
            sold_out_recheck: millis("SOLD_OUT_RECHECK_MS", DEFAULT_SOLD_OUT_RECHECK_MS),
            blocklist_refresh: millis("BLOCKLIST_REFRESH_MS", DEFAULT_BLOCKLIST_REFRESH_MS),
            sale_refresh: env.sale_refresh(),
            breaker: env.breaker_policy(),
        }
    }
}

/// The ports the grab needs. Production fills them from AWS in [`Deps::new`]; tests
/// pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    /// Read only when a grab is retried, to answer the order it already holds.
    pub orders: Arc<dyn OrderBook>,
    pub queue: Arc<dyn OrderQueue>,
    pub clock: Arc<dyn Clock>,
    /// Read whole, at most once per `blocklist_refresh`, behind the process's cache.
    pub blocklist: Arc<dyn Blocklist>,
    /// Waits between walks over contended shards.
    pub pause: Arc<dyn Pause>,
}

/// What the handler needs, built once per process.
pub struct Deps {
    grab: GrabService,
}

impl Deps {
    /// DynamoDB behind a per-process sale cache, the SQS orders queue, and the wall
    /// clock, DynamoDB and SQS each behind its own circuit breaker (a failing one is
    /// then refused in memory instead of called); grab paths signed and checked with
    /// `signer`.
    pub fn new(config: &Config, signer: GrabTokenSigner, clients: &Clients) -> Self {
        let dynamodb = clients.dynamodb_behind(config.breaker);
        let sqs = clients.sqs_behind(config.breaker);
        let store = Arc::new(DynamoStore::new(dynamodb.clone(), &config.table_name));
        Self::from_ports(
            config,
            signer,
            Ports {
                catalog: Arc::new(
                    CachedCatalog::new(
                        DynamoStore::new(dynamodb, &config.table_name),
                        SALE_CACHE_CAPACITY,
                    )
                    .with_refresh(config.sale_refresh),
                ),
                ledger: store.clone(),
                orders: store.clone(),
                queue: Arc::new(SqsOrderQueue::new(sqs, &config.orders_queue_url)),
                clock: Arc::new(SystemClock),
                blocklist: store,
                pause: Arc::new(TokioPause),
            },
        )
    }

    pub fn from_ports(config: &Config, signer: GrabTokenSigner, ports: Ports) -> Self {
        Self {
            grab: GrabService {
                catalog: ports.catalog,
                ledger: ports.ledger,
                orders: ports.orders,
                queue: ports.queue,
                clock: ports.clock,
                ids: Arc::new(SystemIds),
                pause: ports.pause,
                challenges: Arc::new(AltchaChallenges::new(&signer)),
                signer,
                gate: SoldOutGate::new(config.sold_out_recheck),
                blocked_users: CachedBlocklist::new(ports.blocklist, config.blocklist_refresh),
                contention: ContentionPolicy::DEFAULT,
            },
        }
    }
}

impl Function for Deps {
    type Config = Config;
    type Event = Request;
    type Output = Response<Body>;
    type Error = lambda_http::Error;
    type InitError = GrabKeyError;
    const SDK_BUDGET: CallBudget = SDK_BUDGET;

    /// The cold start, as deployed: reads the grab-token key from Secrets Manager (the
    /// one time this process does; a missing, unreadable or weak one fails the start
    /// with its reason logged), then builds everything else.
    async fn init(config: &Config, clients: &Clients) -> Result<Self, GrabKeyError> {
        let key = SecretsManagerSecret::new(clients.sdk_config(), &config.grab_token_secret_arn);
        let signer = grab_key::signer(&key).await?;
        Ok(Self::new(config, signer, clients))
    }

    async fn handle(&self, request: Request) -> Result<Response<Body>, lambda_http::Error> {
        handler(self, request).await
    }
}

/// The 202 answer to a successful grab: the unit is held, the order is on its way.
#[derive(Debug, Serialize)]
struct Reserved {
    order_id: OrderId,
    status: OrderStatus,
    expires_at: DateTime<Utc>,
    /// What the buyer will pay: the reservation carries it, so it costs no read.
    #[serde(skip_serializing_if = "Option::is_none")]
    price: Option<Price>,
}

/// The Lambda handler. Never fails as a Lambda invocation: every error becomes an
/// HTTP answer, so API Gateway never turns one into an opaque 500.
pub async fn handler(deps: &Deps, req: Request) -> Result<Response<Body>, lambda_http::Error> {
    let correlation_id = flashsale_lambda::correlation::of(&req).unwrap_or_default();
    // Every log line of the request carries the id, and the order's queue message too.
    let span = tracing::info_span!("request", correlation_id = %correlation_id);
    let work = tokio::time::timeout(REQUEST_DEADLINE, route(deps, &req));
    let (answer, grab) = flashsale_adapters::correlation::scope(correlation_id, work)
        .instrument(span)
        .await
        .unwrap_or((Err(ApiError::DeadlineExceeded(REQUEST_DEADLINE)), None));
    record_outcome(&req, &answer, grab);
    Ok(respond(answer))
}

/// What the grab metric needs of a grab that the use case answered.
#[derive(Debug, Clone, Copy)]
struct GrabSeen {
    /// `None` for a refusal, which the answer's error code names.
    outcome: Option<metrics::GrabOutcome>,
    /// It ran at least one reserve transaction.
    reached_database: bool,
}

impl GrabSeen {
    fn of(report: &GrabReport) -> Self {
        let outcome = match &report.outcome {
            Ok(GrabOutcome::Reserved(_)) => Some(metrics::GrabOutcome::Reserved),
            Ok(GrabOutcome::Resumed(_)) => Some(metrics::GrabOutcome::Resumed),
            Ok(GrabOutcome::SoldOut(SoldOutBy::Gate)) => Some(metrics::GrabOutcome::SoldOutGate),
            Ok(GrabOutcome::SoldOut(SoldOutBy::Database)) => {
                Some(metrics::GrabOutcome::SoldOutDatabase)
            }
            Err(_) => None,
        };
        Self {
            outcome,
            reached_database: report.reserves > 0,
        }
    }
}

/// The one place a request's outcome becomes a metric: after the deadline, so a grab
/// cut short counts as `unavailable` too.
fn record_outcome(
    req: &Request,
    answer: &Result<Response<Body>, ApiError>,
    seen: Option<GrabSeen>,
) {
    let sale_id = sale_id_param(req).ok();
    match route_key(req).as_str() {
        TOKEN_ROUTE => match (answer, &sale_id) {
            (Ok(_), Some(sale_id)) => flashsale_lambda::metrics::token_issued(sale_id),
            (Ok(_), None) => {}
            (Err(err), _) => flashsale_lambda::metrics::token_refused(err.code()),
        },
        GRAB_ROUTE => {
            // A grab cut short by the deadline was waiting on a store call.
            let reached_database = seen.is_none_or(|seen| seen.reached_database);
            let outcome = match (seen.and_then(|seen| seen.outcome), answer) {
                (Some(outcome), _) => outcome,
                (None, Err(err)) => metrics::GrabOutcome::Refused(err.code()),
                (None, Ok(_)) => return,
            };
            metrics::grab(sale_id.as_ref(), outcome, reached_database);
        }
        _ => {}
    }
}

/// The answer, and what the metric needs of the grab when the use case ran.
async fn route(deps: &Deps, req: &Request) -> (Result<Response<Body>, ApiError>, Option<GrabSeen>) {
    if let Err(error) = ensure_within_limit(req) {
        return (Err(error), None);
    }
    match route_key(req).as_str() {
        CHALLENGE_ROUTE => (issue_challenge(deps, req).await, None),
        TOKEN_ROUTE => (issue_token(deps, req).await, None),
        GRAB_ROUTE => match grab_report(deps, req).await {
            Ok(report) => {
                let seen = GrabSeen::of(&report);
                (answer_grab(report), Some(seen))
            }
            Err(error) => (Err(error), None),
        },
        other => (
            Err(ApiError::RouteNotFound {
                route: other.to_owned(),
            }),
            None,
        ),
    }
}

async fn issue_challenge(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let user = user_of(req)?;
    let sale_id = sale_id_param(req)?;
    let challenge = deps.grab.issue_challenge(&sale_id, &user).await?;
    // The buyer's own: no cache may hand it to another.
    json(StatusCode::OK, &challenge, CachePolicy::NoStore)
}

async fn issue_token(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let user = user_of(req)?;
    let sale_id = sale_id_param(req)?;
    // No body, or the solved challenge: ALTCHA's payload, `{"challenge", "solution"}`.
    let solution: Option<serde_json::Value> = if req.body().iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(json_body(req)?)
    };
    let pass = deps
        .grab
        .issue_pass(&sale_id, &user, solution.as_ref())
        .await?;
    json(StatusCode::OK, &pass, CachePolicy::NoStore)
}

/// Runs the grab use case on the request's caller, sale and path.
async fn grab_report(deps: &Deps, req: &Request) -> Result<GrabReport, ApiError> {
    let user = user_of(req)?;
    let sale_id = sale_id_param(req)?;
    let token = flashsale_lambda::path_param(req, "token")?;
    Ok(deps
        .grab
        .grab(&sale_id, token, &user, attempt_of(req))
        .await)
}

/// The HTTP answer to what the grab did: 202 with the order, or the refusal.
fn answer_grab(report: GrabReport) -> Result<Response<Body>, ApiError> {
    let (reserves, contended) = (report.reserves, report.contended);
    let reservation = report.into_answer()?;
    tracing::info!(
        order_id = %reservation.order_id,
        sale_id = %reservation.sale_id,
        shard = reservation.shard,
        reserves,
        contended,
        "reserved"
    );
    let mut response = json(
        StatusCode::ACCEPTED,
        &Reserved {
            order_id: reservation.order_id.clone(),
            status: OrderStatus::Reserved,
            expires_at: reservation.expires_at,
            price: reservation.price,
        },
        CachePolicy::NoStore,
    )?;
    // Where the client follows the order from here on.
    if let Ok(location) = HeaderValue::from_str(&format!("/orders/{}", reservation.order_id)) {
        response.headers_mut().insert(LOCATION, location);
    }
    Ok(response)
}

/// Which try of its grab path the client says this is ([`RETRY_ATTEMPT_HEADER`]):
/// absent or `0` is a first attempt, anything else a retry. Lenient on purpose: a
/// header that proxies joined (`1, 1`) or a client miscounted still marks a retry,
/// whose worst cost is one read, while refusing it could hide an order from its buyer.
fn attempt_of(req: &Request) -> Attempt {
    match req
        .headers()
        .get(RETRY_ATTEMPT_HEADER)
        .map(|value| value.as_bytes().trim_ascii())
    {
        None | Some(b"0") => Attempt::First,
        Some(_) => Attempt::Retry,
    }
}
