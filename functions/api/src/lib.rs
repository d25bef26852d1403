//! The api function: every HTTP route but the grab's. The public sale page, sale
//! administration, the blocklist, and the buyer's own orders (read, pay by card,
//! cancel).

use std::sync::Arc;

use flashsale_adapters::breaker::BreakerPolicy;
use flashsale_adapters::{DynamoStore, EventBridgeScheduler};
use flashsale_domain::buyer_orders::BuyerOrdersCursor;
use flashsale_domain::ports::{
    Blocklist, Clock, OrderBook, ReleaseScheduler, SaleCatalog, StockLedger, SystemClock, SystemIds,
};
use flashsale_domain::service::{
    BlocklistService, CachedCatalog, OrderService, PaymentService, PaymentWebhook, SaleService,
};
use flashsale_domain::{AppError, SaleAction, SaleCursor, SaleDraft, UserId, ValidationError};
use flashsale_lambda::caller::{DEFAULT_ADMIN_CLAIM, DEFAULT_ADMIN_GROUP};
use flashsale_lambda::{
    AdminRule, ApiError, CachePolicy, CallBudget, Caller, CardPayments, Clients, Env, FromEnv,
    Function, PaymentsInitError, ensure_within_limit, json, json_body, order_id_param, respond,
    route_key, sale_id_param, user_of,
};
use lambda_http::http::header::{HeaderValue, LOCATION};
use lambda_http::http::{Response, StatusCode};
use lambda_http::{Body, Request, RequestExt as _};
use serde::Serialize;

mod export;
mod payments;
pub use payments::PaymentPorts;

/// The routes this function serves, exactly as the API declares them.
pub const GET_SALE_ROUTE: &str = "GET /sales/{sale_id}";
pub const CREATE_SALE_ROUTE: &str = "POST /admin/sales";
pub const LIST_SALES_ROUTE: &str = "GET /admin/sales";
pub const SALE_STATS_ROUTE: &str = "GET /admin/sales/{sale_id}/stats";
pub const PAUSE_SALE_ROUTE: &str = "POST /admin/sales/{sale_id}/pause";
pub const RESUME_SALE_ROUTE: &str = "POST /admin/sales/{sale_id}/resume";
pub const END_SALE_ROUTE: &str = "POST /admin/sales/{sale_id}/end";
pub const SALE_AUDIT_ROUTE: &str = "GET /admin/sales/{sale_id}/audit";
pub const SALE_ORDERS_ROUTE: &str = "GET /admin/sales/{sale_id}/orders";
pub const SALE_ORDERS_CSV_ROUTE: &str = "GET /admin/sales/{sale_id}/orders.csv";
pub use export::NEXT_CURSOR_HEADER;
pub const LIST_ORDERS_ROUTE: &str = "GET /orders";
pub const GET_ORDER_ROUTE: &str = "GET /orders/{order_id}";
pub const CANCEL_ORDER_ROUTE: &str = "POST /orders/{order_id}/cancel";
pub const OPEN_PAYMENT_ROUTE: &str = "POST /orders/{order_id}/payment";
pub const CONFIRM_PAYMENT_ROUTE: &str = "POST /orders/{order_id}/payment/confirm";
/// Stripe's, without the JWT authorizer: the signature is its authentication.
pub const STRIPE_WEBHOOK_ROUTE: &str = "POST /payments/stripe/webhook";
pub const BLOCK_USER_ROUTE: &str = "PUT /admin/blocklist/{user_id}";
pub const UNBLOCK_USER_ROUTE: &str = "DELETE /admin/blocklist/{user_id}";
pub const LIST_BLOCKLIST_ROUTE: &str = "GET /admin/blocklist";

/// How long clients and CDNs may share the public sale page. One second: the page
/// shows server time and live stock, and during a sale even a second-old count is
/// only a hint, while the cache still absorbs a crowd refreshing the page.
pub const SALE_PAGE_MAX_AGE_SECS: u32 = 1;

/// Sales the process keeps in memory for the sale page; see the grab's cache.
pub const SALE_CACHE_CAPACITY: usize = 1024;

/// How long one SDK call of the api may take. The template gives the function 10 s.
/// A buyer's route makes about five calls one after another at worst (pay after the
/// window closed: read the hold, the refused pay transaction, its read, the release
/// transaction and, if the timer won that race, its read): 5 x 1.5 s leaves 2.5 s
/// spare, so a slow table or Scheduler answers 503 instead of a Lambda timeout halfway
/// through. The admin stats read one page per bucket, so there only each page is
/// bounded; that route writes nothing, so running out of time on it leaves nothing
/// half done.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_millis(700),
    operation: std::time::Duration::from_millis(1500),
};

/// The api function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    /// The group of the release schedules that a cancel deletes (a paid order's timer
    /// fires, finds it paid and does nothing).
    pub schedule_group_name: String,
    pub admin: AdminRule,
    /// When DynamoDB's circuit breaker opens, and for how long.
    pub breaker: BreakerPolicy,
    /// How long the sale page answers a sale from memory before rereading its control.
    pub sale_refresh: std::time::Duration,
    /// The Secrets Manager secret of the Stripe keys ([`flashsale_lambda::StripeKeys`]). Without it the
    /// deployment takes no card payments, and the payment routes answer `payments_off`.
    pub stripe_secret_arn: Option<String>,
    /// Stripe's API (`https://api.stripe.com`), or a local fake's.
    pub stripe_api_base: String,
}

impl FromEnv for Config {
    /// `ADMIN_CLAIM`, `ADMIN_GROUP` and `STRIPE_SECRET_ARN` are optional.
    fn read(env: &Env<'_>) -> Self {
        Self {
            table_name: env.required("TABLE_NAME"),
            schedule_group_name: env.required("SCHEDULE_GROUP_NAME"),
            admin: AdminRule {
                claim: env
                    .optional("ADMIN_CLAIM")
                    .unwrap_or_else(|| DEFAULT_ADMIN_CLAIM.to_owned()),
                group: env
                    .optional("ADMIN_GROUP")
                    .unwrap_or_else(|| DEFAULT_ADMIN_GROUP.to_owned()),
            },
            breaker: env.breaker_policy(),
            sale_refresh: env.sale_refresh(),
            stripe_secret_arn: env.optional("STRIPE_SECRET_ARN"),
            stripe_api_base: env.required("STRIPE_API_BASE"),
        }
    }
}

/// The ports the api needs. Production fills them from AWS in [`Deps::new`]; tests
/// pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub orders: Arc<dyn OrderBook>,
    pub scheduler: Arc<dyn ReleaseScheduler>,
    pub clock: Arc<dyn Clock>,
    pub blocklist: Arc<dyn Blocklist>,
    pub payments: PaymentWiring,
}

/// How the api takes card payments.
pub enum PaymentWiring {
    /// No provider: the payment routes answer 404 `payments_off`.
    Off,
    On(PaymentPorts),
    /// A provider whose keys are unusable ([`CardPayments::Misconfigured`]): the payment
    /// routes answer 503 `payment_unavailable`, each counted in `payments_misconfigured`.
    Misconfigured,
}

/// What the handler needs, built once per process.
pub struct Deps {
    sales: SaleService,
    orders: OrderService,
    blocklist: BlocklistService,
    payments: payments::PaymentRoutes,
    admin: AdminRule,
}

impl Deps {
    /// DynamoDB for sales, stock and orders, behind a circuit breaker so that pay and
    /// cancel fail fast on a failing table; Scheduler only to delete release timers
    /// (this function never creates one, so it has no release target); Stripe as the
    /// cold start found its keys.
    pub fn new(
        config: &Config,
        clients: &Clients,
        card_payments: &CardPayments,
    ) -> Result<Self, PaymentsInitError> {
        let dynamodb = clients.dynamodb_behind(config.breaker);
        let store = Arc::new(DynamoStore::new(dynamodb.clone(), &config.table_name));
        let payments = match card_payments {
            CardPayments::Off => PaymentWiring::Off,
            CardPayments::On(keys) => PaymentWiring::On(PaymentPorts {
                payments: store.clone(),
                events: store.clone(),
                provider: Arc::new(keys.provider(&config.stripe_api_base)?),
                publishable_key: keys.publishable_key.clone(),
                webhook_secret: keys.webhook_secret.clone(),
            }),
            CardPayments::Misconfigured(_) => PaymentWiring::Misconfigured,
        };
        Ok(Self::from_ports(
            config,
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
                scheduler: Arc::new(EventBridgeScheduler::new(
                    clients.scheduler(),
                    &config.schedule_group_name,
                    None,
                )),
                clock: Arc::new(SystemClock),
                blocklist: store,
                payments,
            },
        ))
    }

    pub fn from_ports(config: &Config, ports: Ports) -> Self {
        let payments = match ports.payments {
            PaymentWiring::Off => payments::PaymentRoutes::Off,
            PaymentWiring::Misconfigured => payments::PaymentRoutes::Misconfigured,
            PaymentWiring::On(wired) => {
                let service = Arc::new(PaymentService {
                    orders: ports.orders.clone(),
                    payments: wired.payments,
                    ledger: ports.ledger.clone(),
                    provider: wired.provider,
                    clock: ports.clock.clone(),
                });
                payments::PaymentRoutes::On(payments::Payments {
                    webhook: PaymentWebhook {
                        payments: service.clone(),
                        events: wired.events,
                        clock: ports.clock.clone(),
                    },
                    service,
                    clock: ports.clock.clone(),
                    publishable_key: wired.publishable_key,
                    webhook_secret: wired.webhook_secret,
                })
            }
        };
        Self {
            sales: SaleService {
                catalog: ports.catalog.clone(),
                ledger: ports.ledger.clone(),
                orders: ports.orders.clone(),
                clock: ports.clock.clone(),
                ids: Arc::new(SystemIds),
            },
            orders: OrderService {
                orders: ports.orders,
                catalog: ports.catalog,
                ledger: ports.ledger,
                scheduler: ports.scheduler,
                clock: ports.clock,
            },
            blocklist: BlocklistService {
                blocklist: ports.blocklist,
            },
            payments,
            admin: config.admin.clone(),
        }
    }
}

impl Function for Deps {
    type Config = Config;
    type Event = Request;
    type Output = Response<Body>;
    type Error = lambda_http::Error;
    type InitError = PaymentsInitError;
    const SDK_BUDGET: CallBudget = SDK_BUDGET;

    /// The cold start, as deployed: reads the Stripe keys from Secrets Manager if the
    /// deployment takes card payments (once; a secret that cannot be read fails the
    /// start, one without usable keys only the payment routes), then builds everything
    /// else.
    async fn init(config: &Config, clients: &Clients) -> Result<Self, PaymentsInitError> {
        let card_payments =
            flashsale_lambda::stripe_keys::read_if_on(config.stripe_secret_arn.as_deref(), clients)
                .await?;
        Self::new(config, clients, &card_payments)
    }

    async fn handle(&self, request: Request) -> Result<Response<Body>, lambda_http::Error> {
        handler(self, request).await
    }
}

/// The Lambda handler. Never fails as a Lambda invocation: every error becomes an
/// HTTP answer.
pub async fn handler(deps: &Deps, req: Request) -> Result<Response<Body>, lambda_http::Error> {
    let correlation_id = flashsale_lambda::correlation::of(&req).unwrap_or_default();
    let span = tracing::info_span!("request", correlation_id = %correlation_id);
    Ok(respond(
        tracing::Instrument::instrument(route(deps, &req), span).await,
    ))
}

async fn route(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    ensure_within_limit(req)?;
    match route_key(req).as_str() {
        GET_SALE_ROUTE => get_sale(deps, req).await,
        CREATE_SALE_ROUTE => create_sale(deps, req).await,
        LIST_SALES_ROUTE => list_sales(deps, req).await,
        SALE_STATS_ROUTE => sale_stats(deps, req).await,
        PAUSE_SALE_ROUTE => control_sale(deps, req, SaleAction::Pause).await,
        RESUME_SALE_ROUTE => control_sale(deps, req, SaleAction::Resume).await,
        END_SALE_ROUTE => control_sale(deps, req, SaleAction::End).await,
        SALE_AUDIT_ROUTE => sale_audit(deps, req).await,
        SALE_ORDERS_ROUTE => export::sale_orders(deps, req).await,
        SALE_ORDERS_CSV_ROUTE => export::sale_orders_csv(deps, req).await,
        LIST_ORDERS_ROUTE => list_orders(deps, req).await,
        GET_ORDER_ROUTE => get_order(deps, req).await,
        CANCEL_ORDER_ROUTE => cancel_order(deps, req).await,
        OPEN_PAYMENT_ROUTE => payments::open_payment(deps, req).await,
        CONFIRM_PAYMENT_ROUTE => payments::confirm_payment(deps, req).await,
        STRIPE_WEBHOOK_ROUTE => payments::stripe_webhook(deps, req).await,
        BLOCK_USER_ROUTE => block_user(deps, req).await,
        UNBLOCK_USER_ROUTE => unblock_user(deps, req).await,
        LIST_BLOCKLIST_ROUTE => list_blocklist(deps, req).await,
        other => Err(ApiError::RouteNotFound {
            route: other.to_owned(),
        }),
    }
}

async fn get_sale(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let sale_id = sale_id_param(req)?;
    let view = deps.sales.view(&sale_id).await?;
    json(
        StatusCode::OK,
        &view,
        CachePolicy::Public {
            max_age_secs: SALE_PAGE_MAX_AGE_SECS,
        },
    )
}

/// The admin check comes before the body is read, so a non-admin learns nothing about
/// what a valid sale looks like and never causes a write.
fn admin(deps: &Deps, req: &Request) -> Result<Caller, ApiError> {
    let caller = Caller::of(req, &deps.admin)?;
    caller.require_admin()?;
    Ok(caller)
}

async fn create_sale(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = admin(deps, req)?;
    let draft: SaleDraft = json_body(req)?;
    let sale = deps.sales.create(draft).await?;
    tracing::info!(sale_id = %sale.sale_id, admin = %caller.user, stock = sale.stock_total, shards = sale.shards, "sale created");
    let mut response = json(StatusCode::CREATED, &sale, CachePolicy::NoStore)?;
    if let Ok(location) = HeaderValue::from_str(&format!("/sales/{}", sale.sale_id)) {
        response.headers_mut().insert(LOCATION, location);
    }
    Ok(response)
}

/// Sales per page of `GET /admin/sales` when the caller does not say, and the most a
/// caller may ask for: each sale on a page costs a read of its shards.
const SALES_PER_PAGE: usize = 20;
const MAX_SALES_PER_PAGE: usize = 100;
/// A page of a buyer's own orders: the sales they bought in, each with all their
/// orders there (at most the sale's per-user limit).
const BUYER_SALES_PER_PAGE: usize = 10;
const MAX_BUYER_SALES_PER_PAGE: usize = 50;

/// The `limit` query parameter: `default` when absent, else a whole number from 1 to
/// `max`.
fn limit_param(
    query: &lambda_http::aws_lambda_events::query_map::QueryMap,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(raw) = query.first("limit") else {
        return Ok(default);
    };
    raw.parse()
        .ok()
        .filter(|limit| (1..=max).contains(limit))
        .ok_or_else(|| {
            ApiError::from(AppError::Invalid(ValidationError::new(
                "limit",
                format!("must be a whole number from 1 to {max}"),
            )))
        })
}

/// The `cursor` query parameter, as `parse` reads the cursors it wrote; absent: `None`.
fn cursor_param<T>(
    query: &lambda_http::aws_lambda_events::query_map::QueryMap,
    parse: fn(&str) -> Result<T, ValidationError>,
) -> Result<Option<T>, ApiError> {
    Ok(query
        .first("cursor")
        .map(parse)
        .transpose()
        .map_err(AppError::Invalid)?)
}

async fn list_sales(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    admin(deps, req)?;
    let query = req.query_string_parameters();
    let limit = limit_param(&query, SALES_PER_PAGE, MAX_SALES_PER_PAGE)?;
    let after = cursor_param(&query, SaleCursor::parse)?;
    let list = deps.sales.list(after.as_ref(), limit).await?;
    json(StatusCode::OK, &list, CachePolicy::NoStore)
}

async fn sale_stats(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    admin(deps, req)?;
    let sale_id = sale_id_param(req)?;
    let stats = deps.sales.stats(&sale_id).await?;
    if !stats.consistent {
        tracing::warn!(%sale_id, ?stats, "stock does not reconcile");
    }
    json(StatusCode::OK, &stats, CachePolicy::NoStore)
}

/// Pauses, resumes or ends a sale. Each change is recorded with the admin who made it;
/// a repeat answers `changed: false` and records nothing.
async fn control_sale(
    deps: &Deps,
    req: &Request,
    action: SaleAction,
) -> Result<Response<Body>, ApiError> {
    let caller = admin(deps, req)?;
    let sale_id = sale_id_param(req)?;
    let controlled = deps.sales.control(&sale_id, action, &caller.user).await?;
    if controlled.changed {
        tracing::info!(%sale_id, admin = %caller.user, action = action.name(), "sale controlled");
        flashsale_lambda::metrics::sale_controlled(action, &sale_id);
    }
    json(StatusCode::OK, &controlled, CachePolicy::NoStore)
}

/// The entries of a sale's audit trail that `GET /admin/sales/{id}/audit` answers, the
/// newest first: far more than the changes one sale sees.
const AUDIT_ENTRIES: usize = 100;

async fn sale_audit(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    admin(deps, req)?;
    let sale_id = sale_id_param(req)?;
    let trail = deps.sales.audit(&sale_id, AUDIT_ENTRIES).await?;
    json(StatusCode::OK, &trail, CachePolicy::NoStore)
}

/// The answer to a block or unblock: the user's state after the call, which is the
/// same whether the call changed it or found it so already.
#[derive(Debug, Serialize)]
struct BlockState<'a> {
    user_id: &'a UserId,
    blocked: bool,
}

#[derive(Debug, Serialize)]
struct Blocklisted {
    users: Vec<UserId>,
}

/// The `user_id` path parameter. Unlike sale and order ids it names something the
/// admin is about to write, so a malformed one is bad input, not a missing thing.
fn user_id_param(req: &Request) -> Result<UserId, ApiError> {
    let raw = flashsale_lambda::path_param(req, "user_id")?;
    Ok(UserId::parse(raw).map_err(flashsale_domain::AppError::from)?)
}

async fn block_user(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = admin(deps, req)?;
    let user = user_id_param(req)?;
    deps.blocklist.block_user(&user).await?;
    tracing::info!(%user, admin = %caller.user, "user blocked");
    json(
        StatusCode::OK,
        &BlockState {
            user_id: &user,
            blocked: true,
        },
        CachePolicy::NoStore,
    )
}

async fn unblock_user(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = admin(deps, req)?;
    let user = user_id_param(req)?;
    deps.blocklist.unblock_user(&user).await?;
    tracing::info!(%user, admin = %caller.user, "user unblocked");
    json(
        StatusCode::OK,
        &BlockState {
            user_id: &user,
            blocked: false,
        },
        CachePolicy::NoStore,
    )
}

async fn list_blocklist(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    admin(deps, req)?;
    let users = deps.blocklist.blocked_users().await?;
    json(StatusCode::OK, &Blocklisted { users }, CachePolicy::NoStore)
}

/// The caller's own orders in every sale, the latest sale first, a page of sales at a
/// time.
async fn list_orders(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let user = user_of(req)?;
    let query = req.query_string_parameters();
    let limit = limit_param(&query, BUYER_SALES_PER_PAGE, MAX_BUYER_SALES_PER_PAGE)?;
    let after = cursor_param(&query, BuyerOrdersCursor::parse)?;
    let orders = deps.orders.mine(&user, after.as_ref(), limit).await?;
    json(StatusCode::OK, &orders, CachePolicy::NoStore)
}

async fn get_order(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let user = user_of(req)?;
    let order_id = order_id_param(req)?;
    let order = deps.orders.get(&order_id, &user).await?;
    json(StatusCode::OK, &order, CachePolicy::NoStore)
}

async fn cancel_order(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let user = user_of(req)?;
    let order_id = order_id_param(req)?;
    let order = deps.orders.cancel(&order_id, &user).await?;
    tracing::info!(%order_id, "cancelled");
    flashsale_lambda::metrics::order_step(
        flashsale_lambda::metrics::ORDERS_CANCELLED,
        &order.sale_id,
    );
    json(StatusCode::OK, &order, CachePolicy::NoStore)
}
