//! Time limits on AWS SDK calls, so a slow DynamoDB, SQS or Scheduler fails a call
//! instead of running the function into its Lambda timeout.
//!
//! Without a limit the SDK waits as long as the service takes. A handler that dies at
//! its Lambda timeout stops wherever it was: after a grab's transaction committed but
//! before its queue message was sent, or before the compensating release ran, which
//! strands the unit. With a limit the call fails as a timeout, which the adapters
//! classify as `StoreError::Transient` (503 with `Retry-After` over HTTP), and the code
//! after it (the compensation, the partial batch answer, the error log) still runs.
//!
//! Each function states its own [`CallBudget`] as [`Function::SDK_BUDGET`], sized from
//! its Lambda timeout in `template.yaml` and the longest chain of calls one invocation
//! makes. Its clients come from one [`Clients`] built within that budget, here and
//! nowhere else.
//!
//! [`Function::SDK_BUDGET`]: crate::Function::SDK_BUDGET

use std::time::Duration;

use aws_types::SdkConfig;
use aws_types::sdk_config::TimeoutConfig;
use flashsale_adapters::breaker::{BreakerPolicy, CircuitBreaker};

/// How long one SDK call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBudget {
    /// One try, connecting included. A try that runs out is retried by the SDK's
    /// standard retry policy like any transient failure, with the same idempotency
    /// token (so a transaction whose answer was lost is not applied twice); a short
    /// attempt limit is what leaves room for that retry inside the operation limit.
    pub attempt: Duration,
    /// The whole call: every try and the back-off between them. A handler's worst
    /// case is this times the longest chain of calls it makes one after another.
    pub operation: Duration,
}

impl CallBudget {
    /// `sdk` with this budget as its operation and attempt timeouts. Clients built from
    /// the result inherit them; the connect and read timeouts `sdk` already has (the
    /// SDK's default connect timeout, or one set through the environment) are kept.
    pub fn bound(&self, sdk: &SdkConfig) -> SdkConfig {
        let ours = TimeoutConfig::builder()
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation);
        let timeouts = match sdk.timeout_config() {
            Some(existing) => ours.take_unset_from(existing.to_builder()),
            None => ours,
        };
        sdk.to_builder().timeout_config(timeouts.build()).build()
    }

    /// The budget a client's timeout configuration carries, if it sets both limits:
    /// how tests check that a function's clients were built within its budget.
    pub fn of(timeouts: &TimeoutConfig) -> Option<Self> {
        Some(Self {
            attempt: timeouts.operation_attempt_timeout()?,
            operation: timeouts.operation_timeout()?,
        })
    }
}

/// The SDK clients of one function, every one within the same [`CallBudget`]: the one
/// place a function's clients are built.
#[derive(Debug, Clone)]
pub struct Clients {
    sdk: SdkConfig,
}

impl Clients {
    /// Clients on `sdk` (region, credentials, endpoints, HTTP client), each call within
    /// `budget`.
    pub fn within(budget: CallBudget, sdk: &SdkConfig) -> Self {
        Self {
            sdk: budget.bound(sdk),
        }
    }

    /// The bounded configuration, for a client with a budget of its own (which
    /// [`CallBudget::bound`] replaces).
    pub fn sdk_config(&self) -> &SdkConfig {
        &self.sdk
    }

    pub fn dynamodb(&self) -> aws_sdk_dynamodb::Client {
        aws_sdk_dynamodb::Client::new(&self.sdk)
    }

    /// DynamoDB behind a circuit breaker of its own, so a failing table is refused in
    /// memory instead of called.
    pub fn dynamodb_behind(&self, policy: BreakerPolicy) -> aws_sdk_dynamodb::Client {
        flashsale_adapters::dynamodb_behind(&self.sdk, &CircuitBreaker::new("dynamodb", policy))
    }

    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        aws_sdk_sqs::Client::new(&self.sdk)
    }

    /// SQS behind a circuit breaker of its own.
    pub fn sqs_behind(&self, policy: BreakerPolicy) -> aws_sdk_sqs::Client {
        flashsale_adapters::sqs_behind(&self.sdk, &CircuitBreaker::new("sqs", policy))
    }

    pub fn scheduler(&self) -> aws_sdk_scheduler::Client {
        aws_sdk_scheduler::Client::new(&self.sdk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: CallBudget = CallBudget {
        attempt: Duration::from_millis(700),
        operation: Duration::from_millis(1500),
    };

    fn base() -> SdkConfig {
        SdkConfig::builder()
            .region(aws_types::region::Region::new("us-east-1"))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_millis(3100))
                    .build(),
            )
            .build()
    }

    #[test]
    fn every_client_carries_the_budget() {
        let clients = Clients::within(BUDGET, &base());
        let policy = BreakerPolicy::DEFAULT;

        for timeouts in [
            clients.dynamodb().config().timeout_config().cloned(),
            clients
                .dynamodb_behind(policy)
                .config()
                .timeout_config()
                .cloned(),
            clients.sqs().config().timeout_config().cloned(),
            clients
                .sqs_behind(policy)
                .config()
                .timeout_config()
                .cloned(),
            clients.scheduler().config().timeout_config().cloned(),
        ] {
            let timeouts = timeouts.expect("the client has a timeout configuration");
            assert_eq!(CallBudget::of(&timeouts), Some(BUDGET));
        }
    }

    #[test]
    fn the_breaker_clients_call_through_a_circuit_breaker_and_the_plain_ones_do_not() {
        use aws_smithy_runtime_api::client::interceptors::Intercept;
        let clients = Clients::within(BUDGET, &base());
        let policy = BreakerPolicy::DEFAULT;
        let behind_breaker = |names: Vec<&'static str>| names.contains(&"CircuitBreaker");
        assert!(behind_breaker(
            clients
                .dynamodb_behind(policy)
                .config()
                .interceptors()
                .map(|i| i.name())
                .collect()
        ));
        assert!(behind_breaker(
            clients
                .sqs_behind(policy)
                .config()
                .interceptors()
                .map(|i| i.name())
                .collect()
        ));
        assert!(!behind_breaker(
            clients
                .dynamodb()
                .config()
                .interceptors()
                .map(|i| i.name())
                .collect()
        ));
        assert!(!behind_breaker(
            clients
                .sqs()
                .config()
                .interceptors()
                .map(|i| i.name())
                .collect()
        ));
    }

    #[test]
    fn the_connect_timeout_already_set_is_kept() {
        let sdk = BUDGET.bound(&base());
        let timeouts = sdk.timeout_config().unwrap();
        assert_eq!(
            timeouts.connect_timeout(),
            Some(Duration::from_millis(3100))
        );
        assert_eq!(timeouts.operation_timeout(), Some(BUDGET.operation));
    }

    #[test]
    fn a_config_without_timeouts_gets_the_budget() {
        let bare = SdkConfig::builder().build();
        assert_eq!(bare.timeout_config(), None);
        let sdk = BUDGET.bound(&bare);
        assert_eq!(CallBudget::of(sdk.timeout_config().unwrap()), Some(BUDGET));
    }

    #[test]
    fn a_budget_bound_again_replaces_the_earlier_one() {
        let tighter = CallBudget {
            attempt: Duration::from_millis(300),
            operation: Duration::from_millis(600),
        };
        let sdk = tighter.bound(&BUDGET.bound(&base()));
        assert_eq!(CallBudget::of(sdk.timeout_config().unwrap()), Some(tighter));
    }

    #[test]
    fn a_config_missing_either_limit_carries_no_budget() {
        let attempt_only = TimeoutConfig::builder()
            .operation_attempt_timeout(Duration::from_secs(1))
            .build();
        assert_eq!(CallBudget::of(&attempt_only), None);
    }
}
