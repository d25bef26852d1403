//! The release function: the target of each order's one-time Scheduler schedule. The
//! event is the schedule's `Target.Input`, the order's [`Reservation`] as JSON. When the
//! payment window has closed, the unit goes back to its shard and the order becomes
//! `expired`, unless a card payment's settlement or a cancel got there first.
//!
//! Scheduler fires with minute precision, so the order's schedule is set for a minute
//! that ends by the deadline plus a few seconds (see
//! [`EventBridgeScheduler::at_expression`](flashsale_adapters::EventBridgeScheduler::at_expression)),
//! and may fire up to [`MAX_WAIT`] before the deadline: the release then sleeps until
//! the deadline and releases at it, never before. That keeps one schedule per order and
//! puts a lapsed unit back on sale within seconds of its deadline, for every second of
//! the minute Scheduler may pick. Sleeping costs Lambda time (at most two minutes at
//! the template's memory size, per order that lapses), which is the price of a
//! minute-precision timer with a seconds promise.
//!
//! Scheduler invokes this function asynchronously and deletes the schedule once the
//! invocation is handed over, whatever the function then answers. A returned error
//! gets Lambda's asynchronous retries (two, per the template's `EventInvokeConfig`),
//! after which the event lands in `ReleaseFailuresQueue`, which is alarmed; and the
//! reconciler releases any hold still open three minutes past its deadline. So an error
//! is returned only when a retry can help. An event that can never succeed is
//! answered with a `rejected` outcome and logged at error level.

use std::convert::Infallible;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::{Clock, Settlement, StockLedger, SystemClock};
use flashsale_domain::service::ExpiryService;
use flashsale_domain::{AppError, OrderId, OrderStatus, Reservation};
use flashsale_lambda::failure::{diagnostic, error_chain};
use flashsale_lambda::{CallBudget, Clients, Env, FromEnv, Function};
use lambda_runtime::Diagnostic;
use serde::Serialize;
use serde_json::Value;

/// How long one SDK call of the release may take. An invocation makes at most two calls
/// one after another (the release transaction and, when it is refused, the read of
/// what settled the order), after waiting at most [`MAX_WAIT`]: the template's timeout
/// leaves room for all of it (checked by `infra/template-checks`), so a slow table
/// fails the invocation with an error Lambda retries rather than a timeout.
pub const SDK_BUDGET: CallBudget = CallBudget {
    attempt: std::time::Duration::from_secs(1),
    operation: std::time::Duration::from_millis(2500),
};

/// The longest the release waits for its deadline when fired early: the earliest a
/// timer can fire ([`flashsale_adapters::MAX_EARLY_FIRING`], 117 s) and 3 s for the
/// clocks of Scheduler and Lambda to disagree. An event even earlier than that is not
/// a timer of ours firing on time; it is refused with a retryable error, so Lambda
/// tries it again later.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The release function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
}

impl FromEnv for Config {
    fn read(env: &Env<'_>) -> Self {
        Self {
            table_name: env.required("TABLE_NAME"),
        }
    }
}

/// The ports the release needs. Production fills them from AWS in [`Deps::new`]; tests
/// pass in-memory fakes, and both go through the same [`Deps::from_ports`].
pub struct Ports {
    pub ledger: Arc<dyn StockLedger>,
    pub clock: Arc<dyn Clock>,
}

/// What the handler needs, built once per process: the release function itself.
pub struct Deps {
    expiry: ExpiryService,
    clock: Arc<dyn Clock>,
}

impl Deps {
    pub fn new(config: &Config, clients: &Clients) -> Self {
        Self::from_ports(Ports {
            ledger: Arc::new(DynamoStore::new(clients.dynamodb(), &config.table_name)),
            clock: Arc::new(SystemClock),
        })
    }

    pub fn from_ports(ports: Ports) -> Self {
        Self {
            expiry: ExpiryService {
                ledger: ports.ledger,
                clock: ports.clock.clone(),
            },
            clock: ports.clock,
        }
    }
}

impl Function for Deps {
    type Config = Config;
    type Event = Value;
    type Output = Value;
    type Error = ReleaseError;
    type InitError = Infallible;
    const SDK_BUDGET: CallBudget = SDK_BUDGET;

    async fn init(config: &Config, clients: &Clients) -> Result<Self, Infallible> {
        Ok(Self::new(config, clients))
    }

    async fn handle(&self, event: Value) -> Result<Value, ReleaseError> {
        handler(self, event).await
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

impl ReleaseError {
    /// The `errorType` Lambda records for this error (in the asynchronous invocation's
    /// failure record and the function's error metrics): stable, so alarms and queries
    /// can tell a timer fired early from a store that is down from one misconfigured.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Retry { source, .. } => match source {
                AppError::NotYetDue => "Release.NotYetDue",
                AppError::Store(store) if store.is_retryable() => "Release.OrderStoreUnavailable",
                AppError::Store(_) => "Release.OrderStoreFailed",
                _ => "Release.Refused",
            },
            Self::Encode(_) => "Release.EncodeFailed",
        }
    }
}

impl From<ReleaseError> for Diagnostic {
    fn from(error: ReleaseError) -> Self {
        diagnostic(error.error_type(), &error)
    }
}

/// The Lambda handler.
pub async fn handler(deps: &Deps, event: Value) -> Result<Value, ReleaseError> {
    let correlation_id = match &event {
        Value::String(text) => serde_json::from_str(text).ok(),
        other => Some(other.clone()),
    }
    .and_then(|event| flashsale_adapters::correlation::carried_by(&event))
    .unwrap_or_default();
    let span = tracing::info_span!("release", correlation_id = %correlation_id);
    let outcome = tracing::Instrument::instrument(release(deps, event), span).await?;
    serde_json::to_value(&outcome).map_err(ReleaseError::Encode)
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
    let waited = wait_for_deadline(deps.clock.as_ref(), reservation.expires_at).await;
    let late_ms = (deps.clock.now() - reservation.expires_at).num_milliseconds();
    tracing::debug!(%order_id, waited_ms = waited.as_millis() as u64, late_ms, "the deadline has come");
    match deps.expiry.expire(&reservation).await {
        Ok(Settlement::Applied) => {
            let lag = deps.expiry.clock.now() - reservation.expires_at;
            // Milliseconds first: a lag under a second is still worth seeing.
            let lag_secs = lag.num_milliseconds() as f64 / 1000.0;
            flashsale_lambda::metrics::order_step(
                flashsale_lambda::metrics::ORDERS_EXPIRED,
                &reservation.sale_id,
            );
            flashsale_lambda::metrics::release_lag(&reservation.sale_id, lag_secs);
            tracing::info!(%order_id, outcome = "released", waited_ms = waited.as_millis() as u64, lag_secs, "order expired; unit back in stock");
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

/// Sleeps until `deadline` by `clock` when it is at most [`MAX_WAIT`] away, and answers
/// how long it slept. A deadline further away is not waited for: the expiry that
/// follows refuses it as not yet due. Sleeps again if the clock is still short of the
/// deadline on waking (a timer may wake a little early by the wall clock), so the
/// release never runs before the deadline.
async fn wait_for_deadline(clock: &dyn Clock, deadline: DateTime<Utc>) -> std::time::Duration {
    let mut waited = std::time::Duration::ZERO;
    loop {
        let Ok(left) = (deadline - clock.now()).to_std() else {
            return waited;
        };
        if left.is_zero() || waited + left > MAX_WAIT {
            return waited;
        }
        tokio::time::sleep(left).await;
        waited += left;
    }
}

#[cfg(test)]
mod tests {
    use flashsale_domain::testing::injected_store_failure;

    use super::*;

    #[test]
    fn the_release_waits_for_the_earliest_firing_and_some_clock_skew() {
        let earliest = flashsale_adapters::MAX_EARLY_FIRING
            .to_std()
            .expect("positive");
        assert!(MAX_WAIT >= earliest + std::time::Duration::from_secs(3));
    }

    /// Alarms and log queries match these names: renaming one is a breaking change.
    #[test]
    fn every_error_has_a_stable_error_type() {
        let order_id = || OrderId::new(flashsale_domain::SaleId::parse("phone").expect("valid"));
        let store = |transient| AppError::Store(injected_store_failure(transient, "release"));
        let encode = serde_json::from_str::<Value>("{").expect_err("not JSON");
        let cases = [
            (AppError::NotYetDue, "Release.NotYetDue"),
            (store(true), "Release.OrderStoreUnavailable"),
            (store(false), "Release.OrderStoreFailed"),
            (AppError::OrderNotFound, "Release.Refused"),
        ]
        .map(|(source, expected)| {
            let error = ReleaseError::Retry {
                order_id: order_id(),
                source,
            };
            (error, expected)
        });
        for (error, expected) in cases
            .into_iter()
            .chain([(ReleaseError::Encode(encode), "Release.EncodeFailed")])
        {
            let message = error_chain(&error);
            let diagnostic = Diagnostic::from(error);
            assert_eq!(diagnostic.error_type, expected);
            assert_eq!(diagnostic.error_message, message);
        }
    }
}
