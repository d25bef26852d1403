//! The release function: the target of each order's one-time Scheduler schedule. The
//! event is the schedule's `Target.Input`, the order's [`Reservation`] as JSON. When the
//! payment window has closed, the unit goes back to its shard and the order becomes
//! `expired`, unless pay or cancel got there first.
//!
//! Scheduler invokes this function asynchronously and deletes the schedule once the
//! invocation is handed over, whatever the function then answers. A returned error
//! gets Lambda's asynchronous retries (two, per the template's `EventInvokeConfig`),
//! after which the event lands in `ReleaseFailuresQueue`, which is alarmed; and the
//! reconciler releases any hold still open three minutes past its deadline. So an error
//! is returned only when a retry can help. An event that can never succeed is
//! answered with a `rejected` outcome and logged at error level.

use std::sync::Arc;

use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::{Clock, Settlement, StockLedger, SystemClock};
use flashsale_domain::service::ExpiryService;
use flashsale_domain::{AppError, OrderId, OrderStatus, Reservation};
use flashsale_http::config::{Env, process_env};
use flashsale_http::telemetry::error_chain;
use flashsale_http::{CallBudget, ConfigError};
use serde::Serialize;
use serde_json::Value;

/// How long one SDK call of the release may take. The template gives the function
/// 10 s; an invocation makes at most two calls one after another (the release
/// transaction and, when it is refused, the read of what settled the order): 2 x 2.5 s
/// leaves room, so a slow table fails the invocation with an error Lambda retries
/// rather than a timeout.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(1),
    operation: std::time::Duration::from_millis(2500),
};

/// The release function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
}

impl Config {
    /// Every environment variable this function reads (besides `RUST_LOG`, which the
    /// log setup reads).
    pub const ENV_VARS: &'static [&'static str] = &["TABLE_NAME"];

    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(process_env)
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env::new(lookup);
        Ok(Self {
            table_name: env.required("TABLE_NAME")?,
        })
    }
}

/// The SDK client of the release, within [`SDK_BUDGET`].
struct Clients {
    dynamodb: aws_sdk_dynamodb::Client,
}

impl Clients {
    fn new(sdk: &aws_config::SdkConfig) -> Self {
        let sdk = SDK_BUDGET.bound(sdk);
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(&sdk),
        }
    }
}

/// The ports the release needs. Production fills them from AWS in [`Deps::new`]; tests
/// pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
}

/// What the handler needs, built once per process.
pub struct Deps {
    expiry: ExpiryService,
}

impl Deps {
    pub fn new(config: &Config, sdk: &aws_config::SdkConfig) -> Self {
        let Clients { dynamodb } = Clients::new(sdk);
        Self::from_ports(Ports {
            ledger: Arc::new(DynamoStore::new(dynamodb, &config.table_name)),
            clock: Arc::new(SystemClock),
        })
    }

    pub fn from_ports(ports: Ports) -> Self {
        Self {
            expiry: ExpiryService {
                ledger: ports.ledger,
                clock: ports.clock,
            },
        }
    }
}

/// What an invocation did; the function's JSON answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// This invocation expired the order and gave its unit back.
    Released { order_id: OrderId },
    /// Paid, cancelled or already expired before: nothing changed.
    AlreadySettled {
        order_id: OrderId,
        status: OrderStatus,
    },
    /// No hold matches the reservation: nothing to release, and nothing a retry could
    /// change.
    Unknown { order_id: OrderId },
    /// The event is not a reservation. Retrying the same event cannot help.
    Rejected {
        error: &'static str,
        message: String,
    },
}

/// A release that may succeed if Lambda tries the event again.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("releasing order {order_id} failed; it will be retried")]
    Retry {
        order_id: OrderId,
        #[source]
        source: AppError,
    },
    #[error("could not encode the outcome")]
    Encode(#[source] serde_json::Error),
}

/// The Lambda handler.
pub async fn handler(deps: &Deps, event: Value) -> Result<Value, lambda_runtime::Error> {
    let correlation_id = match &event {
        Value::String(text) => serde_json::from_str(text).ok(),
        other => Some(other.clone()),
    }
    .and_then(|event| flashsale_adapters::correlation::carried_by(&event))
    .unwrap_or_default();
    let span = tracing::info_span!("release", correlation_id = %correlation_id);
    let outcome = tracing::Instrument::instrument(release(deps, event), span).await?;
    Ok(serde_json::to_value(&outcome).map_err(ReleaseError::Encode)?)
}

/// The schedule's input is normally the reservation object; an emitter that passes
/// `Target.Input` through as the JSON string it is gets the same treatment.
fn reservation_of(event: Value) -> Result<Reservation, serde_json::Error> {
    match event {
        Value::String(text) => serde_json::from_str(&text),
        other => serde_json::from_value(other),
    }
}

async fn release(deps: &Deps, event: Value) -> Result<Outcome, ReleaseError> {
    let reservation = match reservation_of(event) {
        Ok(reservation) => reservation,
        Err(err) => {
            tracing::error!(error = %err, "the release event is not a reservation; dropping it");
            return Ok(Outcome::Rejected {
                error: "invalid_event",
                message: format!("the event is not a reservation: {err}"),
            });
        }
    };
    let order_id = reservation.order_id.clone();
    match deps.expiry.expire(&reservation).await {
        Ok(Settlement::Applied) => {
            let lag = deps.expiry.clock.now() - reservation.expires_at;
            // Milliseconds first: a lag under a second is still worth seeing.
            let lag_secs = lag.num_milliseconds() as f64 / 1000.0;
            flashsale_http::metrics::order_step(
                flashsale_http::metrics::ORDERS_EXPIRED,
                &reservation.sale_id,
            );
            flashsale_http::metrics::release_lag(&reservation.sale_id, lag_secs);
            tracing::info!(%order_id, outcome = "released", lag_secs, "order expired; unit back in stock");
            Ok(Outcome::Released { order_id })
        }
        Ok(Settlement::AlreadySettled(status)) => {
            tracing::info!(%order_id, outcome = "already_settled", %status, "order settled before its timer");
            Ok(Outcome::AlreadySettled { order_id, status })
        }
        Ok(Settlement::Unknown) => {
            tracing::warn!(%order_id, outcome = "unknown", "no hold matches this reservation");
            Ok(Outcome::Unknown { order_id })
        }
        // Whatever the failure, releasing later is right: too early, the store busy,
        // or even misconfigured. Answering success would end the retries, leaving the
        // unit to the reconciler; an error keeps the event (retries, then the alarmed
        // failure queue) in sight.
        Err(source) => {
            let expected = source.is_retryable();
            let err = ReleaseError::Retry { order_id, source };
            if expected {
                tracing::warn!(error = %error_chain(&err), "release not done; leaving it to the retry");
            } else {
                tracing::error!(error = %error_chain(&err), "release failed; retrying in case a deployment fixes it");
            }
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_client_is_built_within_the_budget() {
        let clients = Clients::new(&aws_config::SdkConfig::builder().build());
        assert_eq!(
            clients
                .dynamodb
                .config()
                .timeout_config()
                .and_then(CallBudget::of),
            Some(SDK_BUDGET)
        );
    }
}
