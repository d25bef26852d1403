//! Every way an HTTP request can fail, and the one table that maps each to its status
//! and stable error code.

use flashsale_domain::{AppError, StoreError};
use http::StatusCode;

/// A failed request. Domain refusals arrive as [`AppError`]; the rest are problems
/// with the HTTP request itself or with producing the response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the request body is empty; a JSON object is expected")]
    EmptyBody,
    #[error("the request body is not valid JSON: {source}")]
    InvalidJson {
        #[source]
        source: serde_json::Error,
    },
    /// The body is JSON but a field is missing, unknown or of the wrong type. `field`
    /// is the path of the offending value; `None` when the body as a whole does not fit
    /// (then `problem` names the missing or unknown field). `problem` is in the API's
    /// words ("must be an integer"), never a Rust type's.
    #[error("{}", describe_field(field.as_deref(), problem))]
    InvalidField {
        field: Option<String>,
        problem: String,
    },
    #[error("the request body is {actual} bytes; at most {limit} bytes are accepted")]
    PayloadTooLarge { limit: usize, actual: usize },
    /// A body declared as something other than JSON: it is refused rather than parsed
    /// anyway, so what a client meant and what the server read cannot differ.
    #[error("{}", describe_media_type(declared.as_deref()))]
    UnsupportedMediaType { declared: Option<String> },
    /// No authenticated caller: the route is public in the API configuration, or the
    /// authorizer passed no subject.
    #[error("authentication is required: {reason}")]
    Unauthenticated { reason: &'static str },
    #[error("the token's subject is not a valid user id")]
    InvalidSubject {
        #[source]
        source: flashsale_domain::ValidationError,
    },
    #[error("no route for {route}")]
    RouteNotFound { route: String },
    /// The event matched a route but lacks one of its path parameters: a mismatch
    /// between the API configuration and the function.
    #[error("path parameter {0} is missing")]
    MissingPathParameter(&'static str),
    /// The function gave up on the request to answer before its own timeout would
    /// end it. What it had begun may or may not have happened; retrying is safe.
    #[error("the request did not finish within {0:?}; try again")]
    DeadlineExceeded(std::time::Duration),
    #[error("could not encode the response")]
    Encode {
        #[source]
        source: flashsale_domain::error::BoxError,
    },
    /// A provider's webhook whose signature does not verify (missing, forged, or stale):
    /// nothing in it is read or written.
    #[error("the webhook's signature does not verify: {0}")]
    WebhookSignature(#[source] flashsale_adapters::stripe::webhook::SignatureError),
    /// A signed webhook body that is not an event.
    #[error("the webhook's body is not a Stripe event")]
    NotAnEvent,
    /// A payment route on a deployment given no payment provider.
    #[error("this deployment takes no card payments")]
    PaymentsOff,
    /// A payment route on a deployment whose Stripe secret holds no usable keys: an
    /// operator's to fix (alarmed); nothing was charged.
    #[error("card payments are unavailable right now; nothing was charged")]
    PaymentsMisconfigured,
    #[error(transparent)]
    App(#[from] AppError),
}

impl ApiError {
    /// The HTTP status and the stable machine-readable code clients switch on.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::EmptyBody | Self::InvalidJson { .. } => (StatusCode::BAD_REQUEST, "invalid_json"),
            Self::InvalidField { .. } | Self::MissingPathParameter(_) => {
                (StatusCode::BAD_REQUEST, "invalid_input")
            }
            Self::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::UnsupportedMediaType { .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::Unauthenticated { .. } | Self::InvalidSubject { .. } => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            Self::RouteNotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Self::WebhookSignature(_) => (StatusCode::BAD_REQUEST, "invalid_signature"),
            Self::NotAnEvent => (StatusCode::BAD_REQUEST, "invalid_event"),
            Self::PaymentsOff => (StatusCode::NOT_FOUND, "payments_off"),
            Self::PaymentsMisconfigured => (StatusCode::SERVICE_UNAVAILABLE, "payment_unavailable"),
            Self::DeadlineExceeded(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Encode { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            Self::App(err) => app_status_and_code(err),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }

    /// Whether the client may simply try again later (the response says when).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::DeadlineExceeded(_)
                | Self::App(
                    AppError::Store(StoreError::Transient { .. } | StoreError::Unavailable { .. })
                        | AppError::Provider(
                            StoreError::Transient { .. } | StoreError::Unavailable { .. }
                        )
                )
        )
    }

    /// When the client should try again, if it should: the dependency's own cool-off
    /// when its circuit breaker knows it, else [`crate::response::RETRY_AFTER_SECS`].
    pub fn retry_after_secs(&self) -> Option<u64> {
        if !self.is_transient() {
            return None;
        }
        let known = match self {
            Self::App(AppError::Store(store)) => store.retry_after(),
            _ => None,
        };
        Some(
            known.map_or(u64::from(crate::response::RETRY_AFTER_SECS), |wait| {
                wait.as_secs_f64().ceil().max(1.0) as u64
            }),
        )
    }
}

fn describe_field(field: Option<&str>, problem: &str) -> String {
    match field {
        Some(field) => format!("`{field}` {problem}"),
        None => problem.to_owned(),
    }
}

fn describe_media_type(declared: Option<&str>) -> String {
    match declared {
        Some(declared) => {
            format!("the request body must be application/json, not {declared:?}")
        }
        None => "the request body must be sent with Content-Type: application/json".to_owned(),
    }
}

fn app_status_and_code(err: &AppError) -> (StatusCode, &'static str) {
    match err {
        AppError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
        AppError::SaleNotFound => (StatusCode::NOT_FOUND, "sale_not_found"),
        AppError::SaleExists => (StatusCode::CONFLICT, "sale_exists"),
        AppError::NotStarted => (StatusCode::TOO_EARLY, "not_started"),
        AppError::Ended => (StatusCode::GONE, "ended"),
        AppError::Paused => (StatusCode::CONFLICT, "sale_paused"),
        AppError::SoldOut => (StatusCode::CONFLICT, "sold_out"),
        AppError::LimitReached => (StatusCode::CONFLICT, "limit_reached"),
        AppError::InvalidToken => (StatusCode::FORBIDDEN, "invalid_token"),
        AppError::ChallengeRequired => (StatusCode::FORBIDDEN, "challenge_required"),
        AppError::ChallengeRefused(_) => (StatusCode::FORBIDDEN, "challenge_failed"),
        AppError::NoChallenge => (StatusCode::NOT_FOUND, "no_challenge"),
        AppError::OrderNotFound => (StatusCode::NOT_FOUND, "order_not_found"),
        AppError::OrderExpired => (StatusCode::CONFLICT, "order_expired"),
        AppError::OrderCancelled => (StatusCode::CONFLICT, "order_cancelled"),
        AppError::OrderPaid => (StatusCode::CONFLICT, "order_paid"),
        AppError::NotPayable => (StatusCode::CONFLICT, "not_payable"),
        AppError::NoPayment => (StatusCode::CONFLICT, "no_payment"),
        // Only the webhook meets a withdrawn payment, and answers it 200 `withdrawn`.
        AppError::PaymentMismatch | AppError::PaymentWithdrawn => {
            (StatusCode::CONFLICT, "payment_mismatch")
        }
        // Whatever the provider's trouble, the buyer can only wait: never a 5xx of ours.
        AppError::Provider(_) => (StatusCode::SERVICE_UNAVAILABLE, "payment_unavailable"),
        AppError::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
        AppError::Blocked => (StatusCode::FORBIDDEN, "blocked"),
        // Only the release function's use case answers this; reaching HTTP means a
        // route called the wrong use case, which is our bug, not the client's.
        AppError::NotYetDue => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        AppError::Store(StoreError::Transient { .. } | StoreError::Unavailable { .. }) => {
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
        AppError::Store(StoreError::Permanent { .. }) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        }
    }
}

#[cfg(test)]
mod tests {
    use flashsale_domain::ValidationError;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("boom")]
    struct Boom;

    #[test]
    fn every_domain_refusal_has_its_contract_status_and_code() {
        let cases = [
            (
                AppError::Invalid(ValidationError::new("stock", "must be positive")),
                400,
                "invalid_input",
            ),
            (AppError::SaleNotFound, 404, "sale_not_found"),
            (AppError::SaleExists, 409, "sale_exists"),
            (AppError::NotStarted, 425, "not_started"),
            (AppError::Ended, 410, "ended"),
            (AppError::Paused, 409, "sale_paused"),
            (AppError::SoldOut, 409, "sold_out"),
            (AppError::LimitReached, 409, "limit_reached"),
            (AppError::InvalidToken, 403, "invalid_token"),
            (AppError::ChallengeRequired, 403, "challenge_required"),
            (
                AppError::ChallengeRefused(flashsale_domain::challenge::ChallengeRefusal::Expired),
                403,
                "challenge_failed",
            ),
            (AppError::NoChallenge, 404, "no_challenge"),
            (AppError::OrderNotFound, 404, "order_not_found"),
            (AppError::OrderExpired, 409, "order_expired"),
            (AppError::OrderCancelled, 409, "order_cancelled"),
            (AppError::OrderPaid, 409, "order_paid"),
            (AppError::NotPayable, 409, "not_payable"),
            (AppError::NoPayment, 409, "no_payment"),
            (AppError::PaymentMismatch, 409, "payment_mismatch"),
            (AppError::PaymentWithdrawn, 409, "payment_mismatch"),
            (
                AppError::Provider(StoreError::permanent("stripe.open", Boom)),
                503,
                "payment_unavailable",
            ),
            (AppError::Forbidden, 403, "forbidden"),
            (AppError::Blocked, 403, "blocked"),
            (
                AppError::Store(StoreError::transient("reserve", Boom)),
                503,
                "unavailable",
            ),
            (
                AppError::Store(StoreError::permanent("reserve", Boom)),
                500,
                "internal",
            ),
            (AppError::NotYetDue, 500, "internal"),
        ];
        for (err, status, code) in cases {
            let err = ApiError::from(err);
            assert_eq!(err.status().as_u16(), status, "{err:?}");
            assert_eq!(err.code(), code, "{err:?}");
        }
    }

    #[test]
    fn only_transient_store_failures_invite_a_retry() {
        assert!(
            ApiError::from(AppError::Store(StoreError::transient("find", Boom))).is_transient()
        );
        assert!(
            !ApiError::from(AppError::Store(StoreError::permanent("find", Boom))).is_transient()
        );
        assert!(!ApiError::from(AppError::SoldOut).is_transient());
    }
}
