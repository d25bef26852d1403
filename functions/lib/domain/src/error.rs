//! Errors of the domain. Business refusals are variants a caller can match on; failures
//! of the world outside (a store, a queue) keep their source error intact.

use std::error::Error as StdError;

/// Boxed source of an infrastructure failure. Adapters put the SDK error here as it is,
/// so logs keep its kind, request id and chain.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// One invalid field of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct ValidationError {
    pub field: &'static str,
    pub problem: String,
}

impl ValidationError {
    pub fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }
}

/// A failure of a port's backing service.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The operation may succeed if tried again later: throttling, a timeout, a
    /// network fault, or contention that outlasted the adapter's own retries.
    #[error("{operation} failed transiently")]
    Transient {
        operation: &'static str,
        #[source]
        source: BoxError,
    },
    /// The service was not called at all: the adapter's circuit breaker is open after a
    /// run of failures. Nothing of the operation happened, so nothing is in doubt; it
    /// may succeed once `retry_after` has passed.
    #[error("{operation} was not attempted: the service kept failing")]
    Unavailable {
        operation: &'static str,
        retry_after: std::time::Duration,
        #[source]
        source: BoxError,
    },
    /// Trying again will not help: bad configuration, missing permissions, or data
    /// in the store that breaks the domain's invariants.
    #[error("{operation} failed")]
    Permanent {
        operation: &'static str,
        #[source]
        source: BoxError,
    },
}

/// What a failed write may have done, as [`StoreError::outcome`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Never sent (the breaker refused it): nothing happened, nothing is in doubt, and
    /// sending it again now would only be refused the same way.
    NotSent,
    /// Sent, with no definite answer (a timeout, a lost answer, a transient fault, or a
    /// later step failing after an earlier one applied): it may have applied, and a
    /// caller that answers for it must find out first.
    InDoubt,
    /// Refused for good: trying again will not help.
    Failed,
}

impl StoreError {
    pub fn transient(operation: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Transient {
            operation,
            source: source.into(),
        }
    }

    pub fn permanent(operation: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Permanent {
            operation,
            source: source.into(),
        }
    }

    pub fn unavailable(
        operation: &'static str,
        retry_after: std::time::Duration,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Unavailable {
            operation,
            retry_after,
            source: source.into(),
        }
    }

    /// What the failed operation may have done: whether its outcome is unknown.
    pub fn outcome(&self) -> WriteOutcome {
        match self {
            Self::Unavailable { .. } => WriteOutcome::NotSent,
            Self::Transient { .. } => WriteOutcome::InDoubt,
            Self::Permanent { .. } => WriteOutcome::Failed,
        }
    }

    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Transient { .. } | Self::Unavailable { .. })
    }

    /// Whether the operation was never sent, so that nothing of it can have happened.
    pub fn was_not_attempted(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// This error, as the failure of an operation of which an earlier step already
    /// happened: a later step refused unsent no longer means that nothing happened, so
    /// it becomes [`StoreError::Transient`] (outcome unknown to the caller, to be
    /// resolved) and the caller does not take it for "nothing in doubt".
    pub fn after_a_step_that_happened(self) -> Self {
        match self {
            Self::Unavailable {
                operation, source, ..
            } => Self::Transient { operation, source },
            other => other,
        }
    }

    /// How long to wait before trying again, when the adapter knows.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Unavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Everything a use case can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("sale not found")]
    SaleNotFound,
    #[error("a sale with this id already exists")]
    SaleExists,
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale has ended")]
    Ended,
    /// An operator paused the sale: no grab path and no grab until it resumes.
    #[error("the sale is paused")]
    Paused,
    #[error("sold out")]
    SoldOut,
    #[error("the per-user limit for this sale is reached")]
    LimitReached,
    #[error("the grab token is invalid for this user and sale")]
    InvalidToken,
    /// The sale asks for a solved challenge before a grab path, and none came.
    #[error("this sale asks for a solved challenge before a grab path")]
    ChallengeRequired,
    #[error(transparent)]
    ChallengeRefused(#[from] crate::challenge::ChallengeRefusal),
    /// A challenge was asked for a sale that asks none.
    #[error("this sale asks for no challenge")]
    NoChallenge,
    #[error("order not found")]
    OrderNotFound,
    #[error("the order has expired")]
    OrderExpired,
    #[error("the order was cancelled")]
    OrderCancelled,
    #[error("the order is already paid")]
    OrderPaid,
    /// The order has no price, so nothing can be paid for it (a sale made before
    /// prices).
    #[error("the order has no price to pay")]
    NotPayable,
    /// Settling was asked of an order no payment was opened for.
    #[error("no payment was started for this order")]
    NoPayment,
    /// The payment is not this order's: another order, amount or currency, or not the
    /// one the order records. Nothing is settled on it.
    #[error("the payment does not match the order")]
    PaymentMismatch,
    /// The payment names the order but is not the one it records, and it is cancelled:
    /// one this service opened and withdrew (a Pay at the deadline, a second tab's),
    /// which never held money. Nothing to settle, and nothing suspicious.
    #[error("the payment was withdrawn: the order took another, or none")]
    PaymentWithdrawn,
    #[error("administrator rights are required")]
    Forbidden,
    /// The user is on the blocklist and may not take part in sales.
    #[error("this user is blocked from taking part in sales")]
    Blocked,
    /// The release fired before the order's expiry; the scheduler should try again.
    #[error("the order does not expire until later")]
    NotYetDue,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The payment provider failed or did not answer (its own failure, or ours to reach
    /// it): kept apart from the store's, so a buyer is told the payment is unavailable
    /// rather than the service broken.
    #[error("the payment provider failed")]
    Provider(#[source] StoreError),
}

impl AppError {
    /// Whether an event source should deliver the same event again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(err) | Self::Provider(err) => err.is_retryable(),
            Self::NotYetDue => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_after_a_step_that_happened_is_in_doubt_not_unsent() {
        let refused = StoreError::unavailable(
            "dynamodb.hold",
            std::time::Duration::from_secs(2),
            "breaker open",
        );
        assert!(refused.was_not_attempted());
        assert_eq!(refused.outcome(), WriteOutcome::NotSent);
        let after_the_take = refused.after_a_step_that_happened();
        assert!(!after_the_take.was_not_attempted(), "the take happened");
        assert_eq!(after_the_take.outcome(), WriteOutcome::InDoubt);
        assert!(after_the_take.is_retryable());
        assert!(matches!(
            after_the_take,
            StoreError::Transient {
                operation: "dynamodb.hold",
                ..
            }
        ));
        let permanent = StoreError::permanent("dynamodb.hold", "denied");
        assert_eq!(permanent.outcome(), WriteOutcome::Failed);
        assert!(matches!(
            permanent.after_a_step_that_happened(),
            StoreError::Permanent { .. }
        ));
    }
}
