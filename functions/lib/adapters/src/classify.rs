//! Turning SDK failures into [`StoreError`]s, shared by every adapter.
//!
//! The SDK has already retried what its standard retry policy retries by the time an
//! error reaches us, so this only decides what the *caller* may do next: try again
//! later (`Transient`) or give up (`Permanent`). The SDK error itself is kept as the
//! source, so logs keep its code, message and request id.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_types::retry::ErrorKind;
use flashsale_domain::StoreError;

/// Error codes that mean "too much, too fast" or "the service hiccuped": the same
/// request may succeed later. Mirrors the SDK's own throttling and transient lists
/// (aws-runtime `THROTTLING_ERRORS`/`TRANSIENT_ERRORS`), plus the codes of the three
/// services we call that those lists do not name.
const TRANSIENT_CODES: &[&str] = &[
    // generic AWS throttling
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "PriorRequestNotComplete",
    // generic AWS transient
    "RequestTimeout",
    "RequestTimeoutException",
    // DynamoDB
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "ReplicatedWriteConflictException",
    "InternalServerError",
    // SQS
    "KmsThrottled",
    "ServiceUnavailable",
    // Scheduler
    "InternalServerException",
];

/// Whether the same request may succeed if sent again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retryability {
    Transient,
    Permanent,
}

/// Decides [`Retryability`] from the SDK error's variant, HTTP status and error code.
pub(crate) fn retryability<E>(error: &SdkError<E, HttpResponse>) -> Retryability
where
    E: ProvideErrorMetadata,
{
    match error {
        // Never sent: a missing required field or a bad configuration. Sending the
        // same thing again fails the same way.
        SdkError::ConstructionFailure(_) => Retryability::Permanent,
        SdkError::TimeoutError(_) => Retryability::Transient,
        SdkError::DispatchFailure(failure) => {
            let user_error = failure.is_user();
            let client_error = failure.as_other() == Some(ErrorKind::ClientError);
            if user_error || client_error {
                Retryability::Permanent
            } else {
                Retryability::Transient
            }
        }
        // A response that could not be parsed is almost always a truncated one.
        SdkError::ResponseError(_) => Retryability::Transient,
        SdkError::ServiceError(context) => {
            let status = context.raw().status().as_u16();
            let transient_code = context
                .err()
                .code()
                .is_some_and(|code| TRANSIENT_CODES.contains(&code));
            if transient_code || status == 429 || status >= 500 {
                Retryability::Transient
            } else {
                Retryability::Permanent
            }
        }
        // `SdkError` is non-exhaustive; an unknown kind of failure is not known to be
        // safe to repeat blindly, but it is not the request's fault either.
        _ => Retryability::Transient,
    }
}

/// The [`StoreError`] for a failed SDK call, with the SDK error as its source.
pub(crate) fn store_error<E>(
    operation: &'static str,
    error: SdkError<E, HttpResponse>,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    // Refused at its first try: nothing was sent. A retry refused after a sent try
    // leaves that try's outcome unknown, as any transient failure does.
    if let Some(open) = crate::breaker::refused_by_breaker(&error)
        && !open.after_a_sent_try
    {
        return StoreError::unavailable(operation, open.retry_after, error);
    }
    match retryability(&error) {
        Retryability::Transient => StoreError::transient(operation, error),
        Retryability::Permanent => StoreError::permanent(operation, error),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_smithy_types::body::SdkBody;

    use super::*;

    fn service_error(status: u16, code: &str) -> SdkError<GetItemError, HttpResponse> {
        let raw = HttpResponse::try_from(
            http::Response::builder()
                .status(status)
                .body(SdkBody::empty())
                .expect("a valid response"),
        )
        .expect("an http 1 response converts");
        let error = GetItemError::generic(ErrorMetadata::builder().code(code).build());
        SdkError::service_error(error, raw)
    }

    #[test]
    fn throttling_codes_are_transient_even_with_a_4xx_status() {
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
        ] {
            assert_eq!(
                retryability(&service_error(400, code)),
                Retryability::Transient,
                "{code}"
            );
        }
    }

    #[test]
    fn server_errors_and_429_are_transient_whatever_the_code() {
        assert_eq!(
            retryability(&service_error(503, "SomethingNew")),
            Retryability::Transient
        );
        assert_eq!(
            retryability(&service_error(429, "SomethingNew")),
            Retryability::Transient
        );
    }

    #[test]
    fn client_errors_are_permanent() {
        for code in [
            "ResourceNotFoundException",
            "ValidationException",
            "AccessDeniedException",
        ] {
            assert_eq!(
                retryability(&service_error(400, code)),
                Retryability::Permanent,
                "{code}"
            );
        }
    }

    #[test]
    fn timeouts_are_transient_and_unsent_requests_permanent() {
        let timeout: SdkError<GetItemError, HttpResponse> =
            SdkError::timeout_error(std::io::Error::other("timed out"));
        assert_eq!(retryability(&timeout), Retryability::Transient);
        let unsent: SdkError<GetItemError, HttpResponse> =
            SdkError::construction_failure(std::io::Error::other("no table name"));
        assert_eq!(retryability(&unsent), Retryability::Permanent);
    }

    #[test]
    fn the_sdk_error_stays_the_source() {
        let error = store_error("test.op", service_error(400, "ValidationException"));
        let source = std::error::Error::source(&error).expect("has a source");
        let sdk = source
            .downcast_ref::<SdkError<GetItemError, HttpResponse>>()
            .expect("the source is the SDK error itself");
        assert_eq!(sdk.code(), Some("ValidationException"));
    }
}
