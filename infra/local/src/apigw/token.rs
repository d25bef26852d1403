//! LOCAL ONLY: `POST /local/token` mints a token the local authorizer accepts.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::StatusCode;
use serde_json::json;

use super::{Gateway, error_response, json_response};
use crate::lambda::error_chain;

#[derive(serde::Deserialize)]
pub(super) struct TokenRequest {
    user_id: String,
    #[serde(default)]
    admin: bool,
}

/// LOCAL ONLY: mints a token the local authorizer accepts.
pub(super) async fn issue_token(State(gateway): State<Arc<Gateway>>, body: Bytes) -> Response {
    let request: TokenRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                &format!("expected {{\"user_id\": \"...\", \"admin\": false}}: {e}"),
            );
        }
    };
    if request.user_id.trim().is_empty() || request.user_id.len() > 128 {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            "user_id must be 1..=128 characters",
        );
    }
    match gateway.jwt.issue(&request.user_id, request.admin) {
        Ok(token) => json_response(StatusCode::OK, json!({"token": token})),
        Err(e) => error_response(StatusCode::NOT_FOUND, "not_found", &error_chain(&e)),
    }
}
