//! Responses: JSON bodies with an explicit caching policy, and the single place where
//! an [`ApiError`] becomes a response and a log line.

use std::error::Error as StdError;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use lambda_http::Body;
use serde::Serialize;

use crate::error::ApiError;
use crate::failure::error_chain;

/// Seconds a client should wait before retrying after `unavailable`.
pub const RETRY_AFTER_SECS: u32 = 1;

/// How shared caches may keep a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    /// Per-user or state-changing answers: never cached anywhere.
    NoStore,
    /// Public data that may be shared by every client for this many seconds.
    Public { max_age_secs: u32 },
}

impl CachePolicy {
    fn header(self) -> HeaderValue {
        match self {
            Self::NoStore => HeaderValue::from_static("no-store"),
            Self::Public { max_age_secs } => {
                HeaderValue::from_str(&format!("public, max-age={max_age_secs}"))
                    .unwrap_or_else(|_| HeaderValue::from_static("no-store"))
            }
        }
    }
}

/// A JSON response.
pub fn json<T: Serialize>(
    status: StatusCode,
    body: &T,
    cache: CachePolicy,
) -> Result<Response<Body>, ApiError> {
    let text = serde_json::to_string(body).map_err(|source| ApiError::Encode {
        source: source.into(),
    })?;
    Ok(with_json_headers(status, text, cache))
}

fn with_json_headers(status: StatusCode, text: String, cache: CachePolicy) -> Response<Body> {
    let mut response = Response::new(Body::Text(text));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, cache.header());
    response
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
}

/// The response for an error: its status, `{"error": code, "message": text}`, and
/// `Retry-After` when trying again later can help. Server-side failures get a generic
/// message; their details belong in the logs, not in the client's hands.
pub fn error_response(err: &ApiError) -> Response<Body> {
    let (status, code) = err.status_and_code();
    let detail;
    let message = if status.is_server_error() {
        if err.is_transient() {
            "the service is busy; try again shortly"
        } else {
            "internal error"
        }
    } else {
        detail = err.to_string();
        &detail
    };
    // Two plain strings always serialize; the fallback only keeps this infallible.
    let text = serde_json::to_string(&ErrorBody {
        error: code,
        message,
    })
    .unwrap_or_else(|_| r#"{"error":"internal","message":"internal error"}"#.to_owned());
    let mut response = with_json_headers(status, text, CachePolicy::NoStore);
    if let Some(secs) = err.retry_after_secs() {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Turns a route's result into the response, logging failures: server-side ones at
/// error level with their whole cause chain; refusals at debug level only, because on
/// the grab path nearly every request of a sold-out sale is one, and a log line each
/// would cost more than the grab.
pub fn respond(result: Result<Response<Body>, ApiError>) -> Response<Body> {
    match result {
        Ok(response) => response,
        Err(err) => {
            let (status, code) = err.status_and_code();
            if status.is_server_error() {
                tracing::error!(
                    status = status.as_u16(),
                    code,
                    error = %error_chain(&err as &dyn StdError),
                    "request failed"
                );
            } else {
                tracing::debug!(status = status.as_u16(), code, message = %err, "request refused");
            }
            error_response(&err)
        }
    }
}

#[cfg(test)]
mod tests {
    use flashsale_domain::{AppError, StoreError};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("table flashsale-prod does not exist")]
    struct Secret;

    fn body_json(response: &Response<Body>) -> serde_json::Value {
        serde_json::from_slice(response.body()).unwrap()
    }

    #[test]
    fn a_transient_failure_is_503_with_retry_after() {
        let err = ApiError::from(AppError::Store(StoreError::transient("reserve", Secret)));
        let response = error_response(&err);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(body_json(&response)["error"], "unavailable");
    }

    #[test]
    fn a_call_an_open_circuit_breaker_refused_is_503_retried_after_its_cool_off() {
        let err = ApiError::from(AppError::Store(StoreError::unavailable(
            "reserve",
            std::time::Duration::from_millis(1500),
            Secret,
        )));
        let response = error_response(&err);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers()[RETRY_AFTER],
            "2",
            "rounded up to a second"
        );
        assert_eq!(body_json(&response)["error"], "unavailable");
        let almost_over = ApiError::from(AppError::Store(StoreError::unavailable(
            "reserve",
            std::time::Duration::from_millis(3),
            Secret,
        )));
        assert_eq!(error_response(&almost_over).headers()[RETRY_AFTER], "1");
    }

    #[test]
    fn a_permanent_failure_is_500_and_keeps_its_details_out_of_the_body() {
        let err = ApiError::from(AppError::Store(StoreError::permanent("find_sale", Secret)));
        let response = error_response(&err);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get(RETRY_AFTER).is_none());
        let body = body_json(&response);
        assert_eq!(body["error"], "internal");
        assert!(!body.to_string().contains("flashsale-prod"), "{body}");
    }

    #[test]
    fn a_client_error_explains_itself_and_is_never_cached() {
        let response = error_response(&ApiError::PayloadTooLarge {
            limit: 10,
            actual: 20,
        });
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body = body_json(&response);
        assert_eq!(body["error"], "payload_too_large");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("at most 10 bytes")
        );
    }

    #[test]
    fn public_data_carries_its_max_age() {
        let response = json(
            StatusCode::OK,
            &serde_json::json!({"ok": true}),
            CachePolicy::Public { max_age_secs: 1 },
        )
        .unwrap();
        assert_eq!(response.headers()[CACHE_CONTROL], "public, max-age=1");
    }
}
