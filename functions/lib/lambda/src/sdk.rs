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
//! Each function states its own [`CallBudget`] next to its `Deps`, sized from its
//! Lambda timeout in `template.yaml` and the longest chain of calls one invocation
//! makes, and applies it with [`CallBudget::bound`] before building its clients.

use std::time::Duration;

use aws_types::SdkConfig;
use aws_types::sdk_config::TimeoutConfig;

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
    fn every_client_built_from_the_bounded_config_carries_the_budget() {
        let sdk = BUDGET.bound(&base());

        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let scheduler = aws_sdk_scheduler::Client::new(&sdk);

        for timeouts in [
            dynamodb.config().timeout_config(),
            sqs.config().timeout_config(),
            scheduler.config().timeout_config(),
        ] {
            let timeouts = timeouts.expect("the client has a timeout configuration");
            assert_eq!(CallBudget::of(timeouts), Some(BUDGET));
        }
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
