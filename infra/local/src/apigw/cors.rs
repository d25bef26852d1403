//! CORS as API Gateway answers it: preflights, and the headers it sets on answers.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use crate::model::CorsSpec;

pub(super) fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

pub(super) fn preflight_response(cors: &CorsSpec, origin: Option<&str>) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    if origin.and_then(|o| cors.allowed_origin(o)).is_none() {
        return response;
    }
    let headers = response.headers_mut();
    let lists = [
        (header::ACCESS_CONTROL_ALLOW_METHODS, &cors.allow_methods),
        (header::ACCESS_CONTROL_ALLOW_HEADERS, &cors.allow_headers),
    ];
    for (name, values) in lists {
        if !values.is_empty()
            && let Some(value) = header_value(&values.join(","))
        {
            headers.insert(name, value);
        }
    }
    if let Some(max_age) = cors.max_age.and_then(|m| header_value(&m.to_string())) {
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, max_age);
    }
    response
}

/// The CORS headers API Gateway sets (replacing any the function returned).
pub(super) fn add_cors_headers(response: &mut Response, cors: &CorsSpec, origin: &str) {
    let Some(allowed) = cors.allowed_origin(origin) else {
        return;
    };
    let headers = response.headers_mut();
    if let Some(value) = header_value(&allowed) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    if !cors.expose_headers.is_empty()
        && let Some(value) = header_value(&cors.expose_headers.join(","))
    {
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, value);
    }
    if cors.allow_credentials == Some(true) {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
}
