//! A request as the payload-format-2.0 event API Gateway sends, and the function's
//! payload-format-2.0 result as the HTTP response API Gateway makes of it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
    ApiGatewayV2httpRequest, ApiGatewayV2httpRequestContext,
    ApiGatewayV2httpRequestContextHttpDescription,
};
use aws_lambda_events::query_map::QueryMap;
use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::Value;

use super::routes::{Route, percent_decode};
use super::{gateway_refusal, json_response};
use crate::auth::Verified;

/// Content types API Gateway passes as text; anything else arrives base64-encoded.
pub(super) const TEXT_TYPES: [&str; 5] = [
    "text/",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/x-www-form-urlencoded",
];

pub(super) struct EventParts<'a> {
    pub(super) account_id: &'a str,
    pub(super) route: &'a Route,
    pub(super) method: &'a Method,
    pub(super) raw_path: &'a str,
    pub(super) raw_query: &'a str,
    pub(super) headers: &'a HeaderMap,
    pub(super) version: http::Version,
    pub(super) peer: SocketAddr,
    pub(super) request_id: &'a str,
    pub(super) path_parameters: BTreeMap<String, String>,
    pub(super) authorizer: Option<Verified>,
}

/// The payload-format-2.0 event for one request, as the function receives it.
pub(super) fn gateway_event(p: &EventParts<'_>, body: &[u8]) -> Result<Value, serde_json::Error> {
    let request = gateway_request(p, body);
    let mut event = serde_json::to_value(&request)?;
    // The type also carries the Custom Authorizer v1 fields, serialized even when unset;
    // payload format 2.0 never has them, so the function must not see them either.
    if let Some(object) = event.as_object_mut() {
        for v1_only in V1_AUTHORIZER_FIELDS {
            object.remove(v1_only);
        }
        if request.stage_variables.is_empty() {
            object.remove("stageVariables");
        }
    }
    Ok(event)
}

/// Fields of `ApiGatewayV2httpRequest` that only Custom Authorizer v1 payloads carry.
pub(super) const V1_AUTHORIZER_FIELDS: [&str; 6] = [
    "type",
    "methodArn",
    "httpMethod",
    "identitySource",
    "authorizationToken",
    "resource",
];

pub(super) fn gateway_request(p: &EventParts<'_>, body: &[u8]) -> ApiGatewayV2httpRequest {
    let header_text = |name: header::HeaderName| {
        p.headers
            .get(name)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    };
    // Repeated headers arrive comma-joined, cookies apart.
    let mut headers = HeaderMap::new();
    let mut cookies: Vec<String> = Vec::new();
    for name in p.headers.keys() {
        let values: Vec<String> = p
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        if name == header::COOKIE {
            for value in &values {
                cookies.extend(value.split(';').map(|c| c.trim().to_owned()));
            }
        } else if let Ok(joined) = HeaderValue::from_str(&values.join(",")) {
            headers.insert(name.clone(), joined);
        }
    }
    // Repeated parameters arrive comma-joined too: the type's serializer joins them.
    let mut query: HashMap<String, Vec<String>> = HashMap::new();
    for pair in p.raw_query.split('&').filter(|s| !s.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        query
            .entry(percent_decode(&key.replace('+', " ")))
            .or_default()
            .push(percent_decode(&value.replace('+', " ")));
    }
    let host = header_text(header::HOST).unwrap_or_else(|| "localhost".to_owned());
    let content_type = header_text(header::CONTENT_TYPE)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let now = chrono::Utc::now();
    let spec = &p.route.spec;
    let route_key = if spec.path == "$default" {
        "$default".to_owned()
    } else {
        spec.route_key()
    };

    let mut http = ApiGatewayV2httpRequestContextHttpDescription::default();
    http.method = p.method.clone();
    http.path = Some(p.raw_path.to_owned());
    http.protocol = Some(format!("{:?}", p.version));
    http.source_ip = Some(p.peer.ip().to_string());
    http.user_agent = Some(header_text(header::USER_AGENT).unwrap_or_default());

    let mut context = ApiGatewayV2httpRequestContext::default();
    context.account_id = Some(p.account_id.to_owned());
    context.apiid = Some(spec.api_id.clone());
    context.domain_prefix = host.split('.').next().map(str::to_owned);
    context.domain_name = Some(host);
    context.http = http;
    context.request_id = Some(p.request_id.to_owned());
    context.route_key = Some(route_key.clone());
    context.stage = Some(spec.stage.clone());
    context.time = Some(now.format("%d/%b/%Y:%H:%M:%S %z").to_string());
    context.time_epoch = now.timestamp_millis();
    context.authorizer = p.authorizer.as_ref().map(|verified| {
        let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
        jwt.claims = verified.claims.clone().into_iter().collect();
        jwt.scopes = verified.scopes.clone();
        let mut authorizer = ApiGatewayRequestAuthorizer::default();
        authorizer.jwt = Some(jwt);
        authorizer
    });

    let mut request = ApiGatewayV2httpRequest::default();
    request.version = Some("2.0".to_owned());
    request.route_key = Some(route_key);
    request.raw_path = Some(p.raw_path.to_owned());
    request.raw_query_string = Some(p.raw_query.to_owned());
    request.cookies = (!cookies.is_empty()).then_some(cookies);
    request.headers = headers;
    request.query_string_parameters = QueryMap::from(query);
    request.path_parameters = p.path_parameters.clone().into_iter().collect();
    request.stage_variables = spec.stage_variables.clone().into_iter().collect();
    request.request_context = context;
    if !body.is_empty() {
        let textual = TEXT_TYPES.iter().any(|t| content_type.starts_with(t))
            || content_type.ends_with("+json");
        request.body = Some(match (textual, std::str::from_utf8(body)) {
            (true, Ok(text)) => text.to_owned(),
            _ => {
                request.is_base64_encoded = true;
                base64::engine::general_purpose::STANDARD.encode(body)
            }
        });
    }
    request
}

/// The HTTP response API Gateway makes of a payload-format-2.0 function result: a
/// `statusCode` object is taken as it is; any other JSON is a 200 with that JSON as the
/// body (API Gateway's format inference).
pub(super) fn gateway_response(payload: Value) -> Response {
    let Some(object) = payload.as_object().filter(|o| o.contains_key("statusCode")) else {
        return json_response(StatusCode::OK, payload);
    };
    let status = object
        .get("statusCode")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let Some(status) = status else {
        tracing::error!(?payload, "function returned an invalid statusCode");
        return gateway_refusal(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let body = match object.get("body") {
        Some(Value::String(text)) if object.get("isBase64Encoded") == Some(&Value::Bool(true)) => {
            match base64::engine::general_purpose::STANDARD.decode(text) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::error!(error = %e, "function returned invalid base64");
                    return gateway_refusal(StatusCode::INTERNAL_SERVER_ERROR);
                }
            }
        }
        Some(Value::String(text)) => text.clone().into_bytes(),
        Some(Value::Null) | None => Vec::new(),
        Some(other) => other.to_string().into_bytes(),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    if let Some(Value::Object(headers)) = object.get("headers") {
        for (name, value) in headers {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                response.headers_mut().append(name, value);
            }
        }
    }
    if let Some(Value::Array(cookies)) = object.get("cookies") {
        for cookie in cookies.iter().filter_map(Value::as_str) {
            if let Ok(value) = HeaderValue::from_str(cookie) {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
        }
    }
    response
}
