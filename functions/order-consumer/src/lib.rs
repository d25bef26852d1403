//! The order consumer: reads the held orders the grab put on the orders FIFO queue
//! and sets each one's release timer. It reads the hold and writes nothing to the
//! table, the grab's hold already being the order, but for a retry's order: the takes
//! its path's earlier requests left on other shards go back (see
//! [`OrderService::receive`]).
//!
//! Records are independent (each is its own message group), so a batch is processed
//! concurrently, up to [`MAX_CONCURRENT_RECORDS`] at a time. The answer is a partial
//! batch response: only records that may succeed later are reported failed and come
//! back. A record that can never succeed (not a reservation, or one no hold matches)
//! is parked in the dead-letter queue at once and counted as handled.

pub mod dead_letter;

use std::convert::Infallible;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use flashsale_adapters::{DynamoStore, EventBridgeScheduler, ReleaseTarget};
use flashsale_domain::ports::{
    Clock, OrderBook, ReleaseScheduler, SaleCatalog, StockLedger, SystemClock,
};
use flashsale_domain::service::{OrderService, TimerSet};
use flashsale_domain::{AppError, OrderId, OrderMessage};
use flashsale_lambda::failure::{diagnostic, error_chain};
use flashsale_lambda::{CallBudget, Clients, Env, FromEnv, Function};
use futures::StreamExt as _;
use lambda_runtime::Diagnostic;
use tracing::Instrument as _;

pub use dead_letter::{DeadLetter, DeadLetterQueue, ParkError, SqsDeadLetterQueue};

/// Records of one batch processed at once. The FIFO event source hands at most ten;
/// the bound matters if the batch size is ever raised, so one invocation never opens
/// an unbounded number of connections to the table.
pub const MAX_CONCURRENT_RECORDS: usize = 10;

/// How long one SDK call of the consumer may take. The template gives the function
/// 30 s and records run concurrently, so what counts is one record's chain: the read of
/// the hold, creating the timer, and parking a poison record (three calls): 3 x 5 s
/// leaves 15 s spare. A retry's order adds a read of the sale, one of its shards and
/// a give-back per take found elsewhere: a record whose calls all crawl may then meet
/// the timeout and come back, and every step is safe to repeat. Nobody waits on the consumer, and a record
/// whose call fails comes back only after the queue's visibility timeout, so a slow
/// call is given more time than on the HTTP functions before it is abandoned.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(2),
    operation: std::time::Duration::from_secs(5),
};

/// The order consumer's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    pub schedule_group_name: String,
    /// What the release schedules invoke, and the role Scheduler assumes to do it.
    pub release_target: ReleaseTarget,
    /// Where poison records are parked.
    pub dlq_url: String,
}

impl FromEnv for Config {
    fn read(env: &Env<'_>) -> Self {
        Self {
            table_name: env.required("TABLE_NAME"),
            schedule_group_name: env.required("SCHEDULE_GROUP_NAME"),
            release_target: ReleaseTarget {
                function_arn: env.required("RELEASE_FUNCTION_ARN"),
                role_arn: env.required("SCHEDULER_ROLE_ARN"),
                dead_letter_arn: Some(env.required("RELEASE_SCHEDULE_DLQ_ARN")),
            },
            dlq_url: env.required("ORDERS_DLQ_URL"),
        }
    }
}

/// The ports the consumer needs. Production fills them from AWS in [`Deps::new`];
/// tests pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub orders: Arc<dyn OrderBook>,
    pub catalog: Arc<dyn SaleCatalog>,
    pub ledger: Arc<dyn StockLedger>,
    pub scheduler: Arc<dyn ReleaseScheduler>,
    pub dead_letters: Arc<dyn DeadLetterQueue>,
    pub clock: Arc<dyn Clock>,
}

/// What the handler needs, built once per process.
pub struct Deps {
    orders: OrderService,
    dead_letters: Arc<dyn DeadLetterQueue>,
}

impl Deps {
    /// DynamoDB for orders, Scheduler for release timers (targeting the release
    /// function), and the orders dead-letter queue.
    pub fn new(config: &Config, clients: &Clients) -> Self {
        let store = Arc::new(DynamoStore::new(clients.dynamodb(), &config.table_name));
        Self::from_ports(Ports {
            orders: store.clone(),
            catalog: store.clone(),
            ledger: store,
            scheduler: Arc::new(EventBridgeScheduler::new(
                clients.scheduler(),
                &config.schedule_group_name,
                Some(config.release_target.clone()),
            )),
            dead_letters: Arc::new(SqsDeadLetterQueue::new(clients.sqs(), &config.dlq_url)),
            clock: Arc::new(SystemClock),
        })
    }

    pub fn from_ports(ports: Ports) -> Self {
        Self {
            orders: OrderService {
                orders: ports.orders,
                catalog: ports.catalog,
                ledger: ports.ledger,
                scheduler: ports.scheduler,
                clock: ports.clock,
            },
            dead_letters: ports.dead_letters,
        }
    }
}

impl Function for Deps {
    type Config = Config;
    type Event = SqsEvent;
    type Output = SqsBatchResponse;
    type Error = Infallible;
    type InitError = Infallible;
    const SDK_BUDGET: CallBudget = SDK_BUDGET;

    async fn init(config: &Config, clients: &Clients) -> Result<Self, Infallible> {
        Ok(Self::new(config, clients))
    }

    async fn handle(&self, event: SqsEvent) -> Result<SqsBatchResponse, Infallible> {
        handler(self, event).await
    }
}

/// Why one record was not consumed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("the record has no body")]
    NoBody,
    #[error("the record's body is not a reservation")]
    NotAReservation(#[source] serde_json::Error),
    #[error("setting the release timer of order {order_id} failed")]
    Timer {
        order_id: OrderId,
        #[source]
        source: AppError,
    },
}

impl RecordError {
    /// Whether the record itself is at fault, so that no redelivery can succeed.
    ///
    /// A store failure is never poison, even a permanent one: a missing permission or
    /// a wrong table name is fixed by a deployment, after which the same record
    /// succeeds. Such records are reported failed, and if the fix takes too long the
    /// queue's redrive policy moves them to the same dead-letter queue anyway.
    pub fn is_poison(&self) -> bool {
        match self {
            Self::NoBody | Self::NotAReservation(_) => true,
            Self::Timer { source, .. } => {
                matches!(source, AppError::OrderNotFound | AppError::Invalid(_))
            }
        }
    }

    /// A stable name for what went wrong, in Lambda's `errorType` style. The consumer
    /// answers a partial batch response and never fails an invocation, so the name
    /// goes where a record's failure is seen: the log line and the parked record's
    /// reason, where a redrive tool or a query can group by it.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::NoBody => "OrderConsumer.NoBody",
            Self::NotAReservation(_) => "OrderConsumer.NotAReservation",
            Self::Timer { source, .. } => match source {
                AppError::OrderNotFound => "OrderConsumer.OrderNotFound",
                AppError::Invalid(_) => "OrderConsumer.InvalidReservation",
                AppError::Store(store) if store.is_retryable() => {
                    "OrderConsumer.OrderStoreUnavailable"
                }
                AppError::Store(_) => "OrderConsumer.OrderStoreFailed",
                // The name from when the consumer opened orders: parked records and
                // log queries group by it, so it stays.
                _ => "OrderConsumer.OpenRefused",
            },
        }
    }
}

impl From<&RecordError> for Diagnostic {
    fn from(error: &RecordError) -> Self {
        diagnostic(error.error_type(), error)
    }
}

/// The Lambda handler: a partial batch response naming the records to redeliver.
///
/// A record without a message id cannot be named; if it fails, it is reported with an
/// empty identifier, which makes Lambda retry the whole batch (safe: consuming is
/// idempotent) rather than lose it.
///
/// The invocation itself never fails: a record's failure is reported in the response.
pub async fn handler(deps: &Deps, event: SqsEvent) -> Result<SqsBatchResponse, Infallible> {
    let records = event.records.len();
    // Owned records, not borrowed ones: a stream of futures borrowing the event is not
    // provably `Send`, and the handler's future must be, to run on any runtime worker.
    let failed: Vec<String> = futures::stream::iter(event.records)
        .map(|record| async move {
            let message_id = record.message_id.clone().unwrap_or_default();
            // The grab's request, carried in the message: the order's log lines and
            // its release timer name it too.
            let correlation_id = record
                .body
                .as_deref()
                .and_then(|body| serde_json::from_str(body).ok())
                .and_then(|body| flashsale_adapters::correlation::carried_by(&body))
                .unwrap_or_default();
            let span = tracing::info_span!(
                "record",
                message_id = %message_id,
                correlation_id = %correlation_id
            );
            let work = handle(deps, &record).instrument(span);
            let retry = flashsale_adapters::correlation::scope(correlation_id, work).await;
            retry.then_some(message_id)
        })
        .buffer_unordered(MAX_CONCURRENT_RECORDS)
        .filter_map(|failed| async move { failed })
        .collect()
        .await;
    if !failed.is_empty() {
        tracing::warn!(
            failed = failed.len(),
            records,
            "records left for redelivery"
        );
    }
    let mut response = SqsBatchResponse::default();
    response.set_failures(failed);
    Ok(response)
}

async fn consume(deps: &Deps, record: &SqsMessage) -> Result<TimerSet, RecordError> {
    let body = record
        .body
        .as_deref()
        .filter(|body| !body.trim().is_empty())
        .ok_or(RecordError::NoBody)?;
    let message: OrderMessage = serde_json::from_str(body).map_err(RecordError::NotAReservation)?;
    let reservation = &message.reservation;
    let timer = deps
        .orders
        .receive(&message)
        .await
        .map_err(|source| RecordError::Timer {
            order_id: reservation.order_id.clone(),
            source,
        })?;
    if timer == TimerSet::Set {
        // At least once, like the message: a redelivered record counts again.
        flashsale_lambda::metrics::order_step(
            flashsale_lambda::metrics::ORDERS_OPENED,
            &reservation.sale_id,
        );
    }
    Ok(timer)
}

/// Consumes one record; `true` when it must be redelivered.
async fn handle(deps: &Deps, record: &SqsMessage) -> bool {
    match consume(deps, record).await {
        Ok(TimerSet::Set) => {
            tracing::info!(outcome = "awaiting_payment", "release timer set");
            false
        }
        Ok(TimerSet::AlreadySettled(status)) => {
            tracing::info!(outcome = "already_settled", %status, "order settled before the consumer");
            false
        }
        Err(err) if err.is_poison() => park(deps, record, &Diagnostic::from(&err)).await,
        Err(err) => {
            let retryable =
                matches!(&err, RecordError::Timer { source, .. } if source.is_retryable());
            let Diagnostic {
                error_type,
                error_message,
            } = Diagnostic::from(&err);
            if retryable {
                tracing::warn!(error_type, error = %error_message, "record will be retried");
            } else {
                tracing::error!(error_type, error = %error_message, "record failed; it will be retried until the redrive policy parks it");
            }
            true
        }
    }
}

/// Parks a poison record; `true` (redeliver) only if parking itself failed. The
/// reason reads as Lambda reports an error, `errorType: errorMessage`.
async fn park(deps: &Deps, record: &SqsMessage, why: &Diagnostic) -> bool {
    let message_id = record.message_id.clone().unwrap_or_default();
    let letter = DeadLetter {
        body: record.body.clone().unwrap_or_default(),
        group_id: record
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_else(|| message_id.clone()),
        dedup_id: message_id,
        reason: format!("{}: {}", why.error_type, why.error_message),
    };
    let error_type = why.error_type.as_str();
    let reason = letter.reason.as_str();
    match deps.dead_letters.park(&letter).await {
        Ok(()) => {
            flashsale_lambda::metrics::dlq_parked();
            tracing::error!(error_type, reason, group_id = %letter.group_id, "poison record parked in the dead-letter queue");
            false
        }
        Err(err) => {
            tracing::error!(error_type, reason, error = %error_chain(&err), "poison record could not be parked; it will be retried");
            true
        }
    }
}

/// Compile-time proof that the handler's future is `Send`, so any runtime (the Lambda
/// runtime, the local stack) may run it on any worker thread. Never called.
#[allow(dead_code)]
fn handler_future_is_send(deps: &'static Deps) -> impl Send {
    handler(deps, SqsEvent::default())
}

#[cfg(test)]
mod tests {
    use flashsale_domain::ValidationError;
    use flashsale_domain::testing::injected_store_failure;

    use super::*;

    /// Parked records and log queries are grouped by these names: renaming one is a
    /// breaking change.
    #[test]
    fn every_error_has_a_stable_error_type() {
        let timer = |source| RecordError::Timer {
            order_id: OrderId::new(flashsale_domain::SaleId::parse("phone").expect("valid")),
            source,
        };
        let store = |transient| AppError::Store(injected_store_failure(transient, "open order"));
        let not_json = serde_json::from_str::<OrderMessage>("{").expect_err("not JSON");
        for (error, expected) in [
            (RecordError::NoBody, "OrderConsumer.NoBody"),
            (
                RecordError::NotAReservation(not_json),
                "OrderConsumer.NotAReservation",
            ),
            (
                timer(AppError::OrderNotFound),
                "OrderConsumer.OrderNotFound",
            ),
            (
                timer(AppError::Invalid(ValidationError::new("qty", "is zero"))),
                "OrderConsumer.InvalidReservation",
            ),
            (timer(store(true)), "OrderConsumer.OrderStoreUnavailable"),
            (timer(store(false)), "OrderConsumer.OrderStoreFailed"),
            (timer(AppError::SoldOut), "OrderConsumer.OpenRefused"),
        ] {
            let diagnostic = Diagnostic::from(&error);
            assert_eq!(diagnostic.error_type, expected);
            assert_eq!(diagnostic.error_message, error_chain(&error));
        }
    }
}
