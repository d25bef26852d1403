//! The reconciler function: a periodic pass of the domain's [`Reconciler`], the safety
//! net under the happy path. It releases the holds no timer released, whether the timer
//! was lost or never set (a lost queue message), and gives back the takes no hold
//! accounts for (see [`Reconciler`] for the rules).
//!
//! A schedule invokes it; the event's content (a Scheduler input, an EventBridge
//! scheduled event) carries nothing it needs and is ignored. Its answer is the pass's
//! [`ReconcileReport`]. Holds the pass could not repair are left to the next run, which
//! finds them again: the invocation still succeeds, and says so at error level. Only a
//! pass that could not run at all fails the invocation.

use std::sync::Arc;

use chrono::Duration;
use flashsale_adapters::DynamoStore;
use flashsale_domain::AppError;
use flashsale_domain::ports::{Clock, OrderBook, SaleCatalog, StockLedger, SystemClock, SystemIds};
use flashsale_domain::service::{PaymentService, ReconcileReport, Reconciler, SaleService};
use flashsale_lambda::failure::{diagnostic, error_chain};
use flashsale_lambda::metrics::PaymentMoves;
use flashsale_lambda::{
    CallBudget, CardPayments, Clients, Env, FromEnv, Function, PaymentsInitError,
};
use lambda_runtime::Diagnostic;
use serde_json::Value;

/// How long past its deadline an order may stay open before its timer counts as lost,
/// when `RECONCILE_TIMER_GRACE_SECS` is unset. A timer releases at most 3 s after the
/// deadline for a payment window of a minute or more, and at most a minute after the
/// consumer set it for a shorter one (see `EventBridgeScheduler::at_expression`); a
/// release that fails is retried by Lambda about a minute later. Three minutes leaves
/// the timer and its first retry the first word; the reconciler only repairs what
/// they lost.
pub const DEFAULT_TIMER_GRACE_SECS: u32 = 180;

/// How old a take no hold accounts for must be before it goes back to its shard, when
/// `RECONCILE_TAKE_GRACE_SECS` is unset: see
/// [`DEFAULT_TAKE_GRACE`](flashsale_domain::service::DEFAULT_TAKE_GRACE).
pub const DEFAULT_TAKE_GRACE_SECS: u32 = {
    let secs = flashsale_domain::service::DEFAULT_TAKE_GRACE.num_seconds();
    assert!(secs > 0 && secs <= u32::MAX as i64);
    secs as u32
};

/// How long one SDK call of the reconciler may take. A pass makes a call per sale and
/// per stuck hold, so its length grows with the backlog and only the template's timeout
/// bounds it; what the budget bounds is one stalled call: a repair that runs out is
/// counted failed and the pass moves on to the next hold instead of waiting out the
/// invocation. A release is at most two calls (the transaction and, when it is
/// refused, one read), so 3 s per call keeps one repair under six seconds.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(1),
    operation: std::time::Duration::from_secs(3),
};

/// The reconciler's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    /// See [`DEFAULT_TIMER_GRACE_SECS`].
    pub timer_grace: Duration,
    /// See [`DEFAULT_TAKE_GRACE_SECS`].
    pub take_grace: Duration,
    /// The Secrets Manager secret of the Stripe keys, where the deployment takes card
    /// payments: the passes then settle the payments left unsettled.
    pub stripe_secret_arn: Option<String>,
    /// Stripe's API, or a local fake's.
    pub stripe_api_base: String,
}

impl FromEnv for Config {
    fn read(env: &Env<'_>) -> Self {
        let seconds = |var, default: u32| Duration::seconds(i64::from(env.parsed_or(var, default)));
        Self {
            table_name: env.required("TABLE_NAME"),
            timer_grace: seconds("RECONCILE_TIMER_GRACE_SECS", DEFAULT_TIMER_GRACE_SECS),
            take_grace: seconds("RECONCILE_TAKE_GRACE_SECS", DEFAULT_TAKE_GRACE_SECS),
            stripe_secret_arn: env.optional("STRIPE_SECRET_ARN"),
            stripe_api_base: env.required("STRIPE_API_BASE"),
        }
    }
}

/// The ports the reconciler needs. Production fills them from AWS in [`Deps::new`];
/// tests pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub catalog: Arc<dyn SaleCatalog>,
    pub orders: Arc<dyn OrderBook>,
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
    /// The settlement of payments left unsettled, where a payment provider is wired.
    pub payments: Option<Arc<PaymentService>>,
    /// The deployment takes card payments but its Stripe secret holds no usable keys
    /// ([`CardPayments::Misconfigured`]): no payment is settled (`payments` is `None`),
    /// and each pass says so, counted in `payments_misconfigured`, while it still
    /// repairs holds.
    pub payments_misconfigured: bool,
}

/// What the handler needs, built once per process.
pub struct Deps {
    reconciler: Reconciler,
    payments_misconfigured: bool,
    /// Counts each sale's stock for the gauges after a pass.
    sales: SaleService,
}

impl Deps {
    /// DynamoDB for sales and holds, and the wall clock. The catalog is not cached:
    /// the pass lists sales once per run. Stripe as the cold start found its keys.
    pub fn new(
        config: &Config,
        clients: &Clients,
        card_payments: &CardPayments,
    ) -> Result<Self, PaymentsInitError> {
        let store = Arc::new(DynamoStore::new(clients.dynamodb(), &config.table_name));
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let payments = match card_payments {
            CardPayments::On(keys) => Some(Arc::new(PaymentService {
                orders: store.clone(),
                payments: store.clone(),
                ledger: store.clone(),
                provider: Arc::new(keys.provider(&config.stripe_api_base)?),
                clock: clock.clone(),
            })),
            CardPayments::Off | CardPayments::Misconfigured(_) => None,
        };
        Ok(Self::from_ports(
            config,
            Ports {
                catalog: store.clone(),
                orders: store.clone(),
                ledger: store,
                clock,
                payments,
                payments_misconfigured: matches!(card_payments, CardPayments::Misconfigured(_)),
            },
        ))
    }

    pub fn from_ports(config: &Config, ports: Ports) -> Self {
        Self {
            sales: SaleService {
                catalog: ports.catalog.clone(),
                ledger: ports.ledger.clone(),
                orders: ports.orders.clone(),
                clock: ports.clock.clone(),
                // The reconciler creates no sale: its stats only.
                ids: Arc::new(SystemIds),
            },
            reconciler: Reconciler {
                catalog: ports.catalog,
                orders: ports.orders,
                ledger: ports.ledger,
                clock: ports.clock,
                timer_grace: config.timer_grace,
                take_grace: config.take_grace,
                payments: ports.payments,
            },
            payments_misconfigured: ports.payments_misconfigured,
        }
    }
}

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The pass could not run: the sales or a sale's open holds could not be listed.
    /// Nothing is lost: the next run (or Lambda's retry of this one) starts over, and
    /// every repair is conditional on the hold's state, so overlapping passes are safe.
    #[error("the reconciliation pass could not run")]
    Pass(#[source] AppError),
    #[error("could not encode the report")]
    Encode(#[source] serde_json::Error),
}

impl ReconcileError {
    /// The `errorType` Lambda records for this error (in its error metrics and the
    /// invocation's failure record): stable, so alarms and queries can tell a table
    /// that is down for now from one the function cannot use at all.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Pass(AppError::Store(store)) if store.is_retryable() => {
                "Reconciler.StoreUnavailable"
            }
            Self::Pass(AppError::Store(_)) => "Reconciler.StoreFailed",
            Self::Pass(_) => "Reconciler.PassRefused",
            Self::Encode(_) => "Reconciler.EncodeFailed",
        }
    }
}

impl From<ReconcileError> for Diagnostic {
    fn from(error: ReconcileError) -> Self {
        diagnostic(error.error_type(), &error)
    }
}

/// The Lambda handler. `event` is ignored: whatever the schedule sends, the pass is
impl Function for Deps {
    type Config = Config;
    type Event = Value;
    type Output = Value;
    type Error = ReconcileError;
    type InitError = PaymentsInitError;
    const SDK_BUDGET: CallBudget = SDK_BUDGET;

    /// Reads the Stripe keys first if the deployment takes card payments (see the
    /// api's cold start).
    async fn init(config: &Config, clients: &Clients) -> Result<Self, PaymentsInitError> {
        let card_payments =
            flashsale_lambda::stripe_keys::read_if_on(config.stripe_secret_arn.as_deref(), clients)
                .await?;
        Self::new(config, clients, &card_payments)
    }

    async fn handle(&self, event: Value) -> Result<Value, ReconcileError> {
        handler(self, event).await
    }
}

/// the same.
pub async fn handler(deps: &Deps, _event: Value) -> Result<Value, ReconcileError> {
    let report = reconcile(deps).await?;
    record_stock(deps).await;
    serde_json::to_value(report).map_err(ReconcileError::Encode)
}

async fn reconcile(deps: &Deps) -> Result<ReconcileReport, ReconcileError> {
    if deps.payments_misconfigured {
        // Every pass, not only the cold start's log line: the alarm stays up until the
        // secret is fixed and the containers have started again.
        flashsale_lambda::metrics::payments_misconfigured();
        tracing::error!(
            "payments left unsettled are not settled: the Stripe secret holds no usable keys"
        );
    }
    let report = match deps.reconciler.run().await {
        Ok(report) => report,
        Err(source) => {
            let expected = source.is_retryable();
            let err = ReconcileError::Pass(source);
            if expected {
                tracing::warn!(error = %error_chain(&err), "reconciliation not done; the next run tries again");
            } else {
                tracing::error!(error = %error_chain(&err), "reconciliation failed; it will keep failing until the cause is fixed");
            }
            return Err(err);
        }
    };
    let ReconcileReport {
        sales,
        open_holds,
        expired,
        failed,
        failed_sales,
        takes_returned,
        payments_settled,
        orders_paid,
        captures,
        capture_retries,
        capture_failures,
        authorisations_cancelled,
        refunds,
        captures_refused,
        payment_failures,
        money_unsettled,
        money_unsettled_oldest_secs,
        money_unsettled_known,
    } = report.clone();
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    flashsale_lambda::metrics::reconciled(
        count(expired),
        count(takes_returned),
        count(failed),
        count(failed_sales),
    );
    // Unknown (no payments, or the read failed): no datapoint rather than a false 0.
    if money_unsettled_known {
        flashsale_lambda::metrics::money_unsettled(
            count(money_unsettled),
            u64::try_from(money_unsettled_oldest_secs).unwrap_or(0),
        );
    }
    // Orders a pass sold count with the ones the api's settlements sell.
    for order_id in &orders_paid {
        flashsale_lambda::metrics::order_step(
            flashsale_lambda::metrics::ORDERS_PAID,
            order_id.sale_id(),
        );
    }
    flashsale_lambda::metrics::payments(PaymentMoves {
        settled: count(payments_settled),
        captures: count(captures),
        capture_retries: count(capture_retries),
        capture_failures: count(capture_failures),
        authorisations_cancelled: count(authorisations_cancelled),
        refunds: count(refunds),
        captures_refused: count(captures_refused),
        failures: count(payment_failures),
        // A refunded order is settled by Stripe's events to the api, never by a pass.
        refunds_failed: 0,
    });
    if failed > 0 || failed_sales > 0 || payment_failures > 0 {
        tracing::error!(
            sales,
            open_holds,
            expired,
            takes_returned,
            failed,
            failed_sales,
            payments_settled,
            payment_failures,
            "some stuck holds or payments could not be repaired; the next run tries them again"
        );
    } else {
        tracing::info!(
            sales,
            open_holds,
            expired,
            takes_returned,
            failed,
            failed_sales,
            payments_settled,
            "reconciliation done"
        );
    }
    Ok(report)
}

/// Stock by state of every sale still able to hold stock, as gauges: the dashboard's
/// stock widget, one datapoint per sale per pass. The same counts as the admin's
/// stats (the shards, and the sale's holds through the index). Best effort: a sale
/// that cannot be read now is read on the next pass.
async fn record_stock(deps: &Deps) {
    let reconciler = &deps.reconciler;
    let now = reconciler.clock.now();
    let sales = match reconciler.catalog.sales_ending_after(now).await {
        Ok(sales) => sales,
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "could not list sales for the stock gauges");
            return;
        }
    };
    for sale in sales {
        match deps.sales.stats(&sale.sale_id).await {
            Ok(stats) => flashsale_lambda::metrics::stock(&sale.sale_id, &stats.counts),
            Err(error) => {
                tracing::warn!(sale_id = %sale.sale_id, error = %error_chain(&error), "could not count a sale's stock");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use flashsale_domain::testing::injected_store_failure;

    use super::*;

    /// Alarms and log queries match these names: renaming one is a breaking change.
    #[test]
    fn every_error_has_a_stable_error_type() {
        let store = |transient| AppError::Store(injected_store_failure(transient, "list sales"));
        let encode = serde_json::from_str::<Value>("{").expect_err("not JSON");
        for (error, expected) in [
            (
                ReconcileError::Pass(store(true)),
                "Reconciler.StoreUnavailable",
            ),
            (ReconcileError::Pass(store(false)), "Reconciler.StoreFailed"),
            (
                ReconcileError::Pass(AppError::SaleNotFound),
                "Reconciler.PassRefused",
            ),
            (ReconcileError::Encode(encode), "Reconciler.EncodeFailed"),
        ] {
            let message = error_chain(&error);
            let diagnostic = Diagnostic::from(error);
            assert_eq!(diagnostic.error_type, expected);
            assert_eq!(diagnostic.error_message, message);
        }
    }
}
