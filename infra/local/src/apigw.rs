//! The HTTP API, locally: routes from the functions' `HttpApi` events, the JWT
//! authorizer in front, and each request turned into the payload-format-2.0 event API
//! Gateway would send, answered from the function's payload-format-2.0 response.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
    ApiGatewayV2httpRequest, ApiGatewayV2httpRequestContext,
    ApiGatewayV2httpRequestContextHttpDescription,
};
use aws_lambda_events::query_map::QueryMap;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use base64::Engine;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::auth::{LocalJwt, Verified};
use crate::edge::EdgeLimiter;
use crate::lambda::{LambdaService, error_chain};
use crate::model::{CorsSpec, RouteAuth, RouteSpec, Throttle};

/// API Gateway's payload limit for HTTP APIs.
pub const MAX_PAYLOAD: usize = 10 * 1024 * 1024;

/// Content types API Gateway passes as text; anything else arrives base64-encoded.
const TEXT_TYPES: [&str; 5] = [
    "text/",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/x-www-form-urlencoded",
];

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Literal(String),
    Param(String),
    Greedy(String),
}

#[derive(Debug, Clone)]
struct Route {
    function: String,
    spec: RouteSpec,
    segments: Vec<Segment>,
    bucket: Option<Arc<Mutex<Bucket>>>,
}

/// API Gateway's token bucket for one route.
#[derive(Debug)]
struct Bucket {
    throttle: Throttle,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new(throttle: Throttle) -> Self {
        Self {
            throttle,
            tokens: throttle.burst_limit as f64,
            refilled: Instant::now(),
        }
    }

    /// Takes a token if there is one.
    fn admit(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * self.throttle.rate_limit;
        self.tokens = (self.tokens + refill).min(self.throttle.burst_limit as f64);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

fn segments(path: &str) -> Vec<Segment> {
    path.trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(
            |s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => match name.strip_suffix('+') {
                    Some(greedy) => Segment::Greedy(greedy.to_owned()),
                    None => Segment::Param(name.to_owned()),
                },
                None => Segment::Literal(s.to_owned()),
            },
        )
        .collect()
}

/// Percent-decodes a path segment or query part; an invalid escape is kept as it is,
/// and a result that is not UTF-8 leaves the input as it was.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .unwrap_or_else(|_| s.to_owned())
}

impl Route {
    /// Path parameters when `path` matches this route's path.
    fn matches(&self, path: &str) -> Option<BTreeMap<String, String>> {
        if self.spec.path == "$default" {
            return Some(BTreeMap::new());
        }
        let parts: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let mut params = BTreeMap::new();
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Greedy(name) => {
                    if i >= parts.len() {
                        return None;
                    }
                    params.insert(name.clone(), percent_decode(&parts[i..].join("/")));
                    return Some(params);
                }
                Segment::Literal(literal) => {
                    if parts.get(i).map(|p| percent_decode(p)) != Some(literal.clone()) {
                        return None;
                    }
                }
                Segment::Param(name) => {
                    let part = parts.get(i)?;
                    params.insert(name.clone(), percent_decode(part));
                }
            }
        }
        (parts.len() == self.segments.len()).then_some(params)
    }

    /// API Gateway prefers the most specific route: a named method over ANY, literal
    /// segments over parameters, anything over a greedy path or `$default`.
    fn specificity(&self) -> (bool, bool, usize) {
        let literals = self
            .segments
            .iter()
            .filter(|s| matches!(s, Segment::Literal(_)))
            .count();
        let greedy = self.spec.path == "$default"
            || self
                .segments
                .iter()
                .any(|s| matches!(s, Segment::Greedy(_)));
        (!greedy, self.spec.method != "ANY", literals)
    }
}

/// The gateway's state.
pub struct Gateway {
    lambda: LambdaService,
    routes: Vec<Route>,
    jwt: LocalJwt,
    /// CORS configuration by API id.
    cors: BTreeMap<String, CorsSpec>,
    /// The web ACL's rate limits, which WAF applies before CloudFront forwards.
    edge: EdgeLimiter,
}

impl Gateway {
    pub fn new(lambda: LambdaService, jwt: LocalJwt) -> Self {
        let routes = lambda
            .model()
            .routes()
            .map(|(function, spec)| Route {
                function: function.logical_id.clone(),
                segments: segments(&spec.path),
                bucket: spec.throttle.map(|t| Arc::new(Mutex::new(Bucket::new(t)))),
                spec: spec.clone(),
            })
            .collect();
        let cors = lambda
            .model()
            .apis
            .iter()
            .filter_map(|api| api.cors.clone().map(|c| (api.api_id.clone(), c)))
            .collect();
        let edge = EdgeLimiter::new(lambda.model().edge_rules.clone());
        Self {
            lambda,
            routes,
            jwt,
            cors,
            edge,
        }
    }

    /// The CORS configuration that applies to a request for `path`: its route's API, or
    /// the only API's when no route matches.
    fn cors_for(&self, path: &str) -> Option<&CorsSpec> {
        let api_id = self
            .routes
            .iter()
            .find(|r| r.matches(unstaged(r, path)).is_some())
            .map(|r| r.spec.api_id.clone());
        match api_id {
            Some(id) => self.cors.get(&id),
            None if self.cors.len() == 1 => self.cors.values().next(),
            None => None,
        }
    }

    /// The axum router: `POST /local/token` and every route of the template.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/local/token", axum::routing::post(issue_token))
            .route("/local/metrics", axum::routing::get(crate::metrics::serve))
            .fallback(serve)
            .with_state(self)
    }

    fn find(&self, method: &Method, path: &str) -> Option<(&Route, BTreeMap<String, String>)> {
        self.routes
            .iter()
            .filter(|r| r.spec.method == "ANY" || r.spec.method == method.as_str())
            .filter_map(|r| r.matches(unstaged(r, path)).map(|params| (r, params)))
            .max_by_key(|(r, _)| r.specificity())
    }
}

/// `path` without the route's stage prefix: on AWS a named stage prefixes the URL;
/// locally both forms are served.
fn unstaged<'p>(route: &Route, path: &'p str) -> &'p str {
    let stage_prefix = format!("/{}", route.spec.stage);
    match path.strip_prefix(&stage_prefix) {
        Some(rest)
            if route.spec.stage != "$default" && (rest.is_empty() || rest.starts_with('/')) =>
        {
            rest
        }
        _ => path,
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An error of the local-only token route, in the functions' `{"error", "message"}`.
fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    json_response(status, json!({"error": code, "message": message}))
}

/// What API Gateway itself answers when it refuses a request (no route, throttled,
/// authorizer refusal) or its integration fails: an HTTP API's own responses are `{"message": ...}` only and
/// cannot be customised, so clients must be ready for them; emulating anything nicer
/// would hide that.
fn gateway_refusal(status: StatusCode) -> Response {
    let message = match status {
        StatusCode::NOT_FOUND => "Not Found",
        StatusCode::TOO_MANY_REQUESTS => "Too Many Requests",
        StatusCode::PAYLOAD_TOO_LARGE => "Request Entity Too Large",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        _ => "Internal Server Error",
    };
    json_response(status, json!({ "message": message }))
}

#[derive(serde::Deserialize)]
struct TokenRequest {
    user_id: String,
    #[serde(default)]
    admin: bool,
}

/// LOCAL ONLY: mints a token the local authorizer accepts.
async fn issue_token(State(gateway): State<Arc<Gateway>>, body: Bytes) -> Response {
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

async fn serve(
    State(gateway): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: http::Request<Body>,
) -> Response {
    let path = request.uri().path().to_owned();
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let cors = gateway.cors_for(&path).cloned();
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        && gateway.find(&Method::OPTIONS, &path).is_none();
    // WAF decides before CloudFront forwards, so a blocked request reaches no route,
    // authorizer or function; the page reads its answer like any other (CORS below).
    let blocked = gateway
        .edge
        .check(&path, peer.ip(), request.headers(), Instant::now());
    let mut response = match (blocked, &cors, preflight) {
        (Some(rule), _, _) => rule.block.to_response(),
        // API Gateway answers preflights itself, before any route or authorizer.
        (None, Some(cors), true) => preflight_response(cors, origin.as_deref()),
        _ => route_request(&gateway, peer, request).await,
    };
    if let (Some(cors), Some(origin)) = (&cors, &origin) {
        add_cors_headers(&mut response, cors, origin);
    }
    response
}

fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

fn preflight_response(cors: &CorsSpec, origin: Option<&str>) -> Response {
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
fn add_cors_headers(response: &mut Response, cors: &CorsSpec, origin: &str) {
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

async fn route_request(
    gateway: &Gateway,
    peer: SocketAddr,
    request: http::Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let Some((route, path_parameters)) = gateway.find(&parts.method, &path) else {
        return gateway_refusal(StatusCode::NOT_FOUND);
    };
    if let Some(bucket) = &route.bucket {
        let admitted = bucket.lock().map(|mut b| b.admit()).unwrap_or(true);
        if !admitted {
            return gateway_refusal(StatusCode::TOO_MANY_REQUESTS);
        }
    }
    let body = match axum::body::to_bytes(body, MAX_PAYLOAD).await {
        Ok(body) => body,
        Err(_) => return gateway_refusal(StatusCode::PAYLOAD_TOO_LARGE),
    };
    let authorizer = match &route.spec.auth {
        RouteAuth::Public => None,
        RouteAuth::Jwt { authorizer, scopes } => {
            let header_value = parts
                .headers
                .get(authorizer.header.as_str())
                .and_then(|v| v.to_str().ok());
            match gateway.jwt.verify(authorizer, scopes, header_value) {
                Ok(verified) => Some(verified),
                Err(e) => {
                    let status =
                        StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
                    // The reason goes only where API Gateway puts it: the
                    // WWW-Authenticate header.
                    let mut response = gateway_refusal(status);
                    if status == StatusCode::UNAUTHORIZED
                        && let Ok(value) = HeaderValue::from_str(&format!(
                            "Bearer error=\"invalid_token\" error_description=\"{e}\""
                        ))
                    {
                        response
                            .headers_mut()
                            .insert(header::WWW_AUTHENTICATE, value);
                    }
                    return response;
                }
            }
        }
    };
    let request_id = ulid::Ulid::new().to_string();
    let event = gateway_event(
        &EventParts {
            account_id: &gateway.lambda.model().account_id,
            route,
            method: &parts.method,
            raw_path: &path,
            raw_query: parts.uri.query().unwrap_or_default(),
            headers: &parts.headers,
            version: parts.version,
            peer,
            request_id: &request_id,
            path_parameters,
            authorizer,
        },
        &body,
    );
    let event = match event {
        Ok(event) => event,
        Err(e) => {
            tracing::error!(route = %route.spec.route_key(), error = %e, "gateway event not serializable");
            return gateway_refusal(StatusCode::INTERNAL_SERVER_ERROR);
        }
    };
    let result = gateway.lambda.invoke(&route.function, event).await;
    let mut response = match result {
        Ok(payload) => gateway_response(payload),
        Err(e) => {
            // What API Gateway answers when the integration fails.
            tracing::error!(route = %route.spec.route_key(), error = %error_chain(&e), "function failed");
            gateway_refusal(StatusCode::INTERNAL_SERVER_ERROR)
        }
    };
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("apigw-requestid", value);
    }
    response
}

struct EventParts<'a> {
    account_id: &'a str,
    route: &'a Route,
    method: &'a Method,
    raw_path: &'a str,
    raw_query: &'a str,
    headers: &'a HeaderMap,
    version: http::Version,
    peer: SocketAddr,
    request_id: &'a str,
    path_parameters: BTreeMap<String, String>,
    authorizer: Option<Verified>,
}

/// The payload-format-2.0 event for one request, as the function receives it.
fn gateway_event(p: &EventParts<'_>, body: &[u8]) -> Result<Value, serde_json::Error> {
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
const V1_AUTHORIZER_FIELDS: [&str; 6] = [
    "type",
    "methodArn",
    "httpMethod",
    "identitySource",
    "authorizationToken",
    "resource",
];

fn gateway_request(p: &EventParts<'_>, body: &[u8]) -> ApiGatewayV2httpRequest {
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
fn gateway_response(payload: Value) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: &str, path: &str) -> Route {
        Route {
            function: "F".to_owned(),
            spec: RouteSpec {
                event_name: "E".to_owned(),
                api_id: "api".to_owned(),
                stage: "dev".to_owned(),
                stage_variables: BTreeMap::new(),
                method: method.to_owned(),
                path: path.to_owned(),
                auth: RouteAuth::Public,
                throttle: None,
            },
            segments: segments(path),
            bucket: None,
        }
    }

    fn event_for(headers: HeaderMap, query: &str, body: &[u8], with_jwt: bool) -> Value {
        let route = route("POST", "/sales/{sale_id}/grab/{token}");
        let authorizer = with_jwt.then(|| Verified {
            claims: BTreeMap::from([("sub".to_owned(), "buyer-1".to_owned())]),
            scopes: None,
        });
        gateway_event(
            &EventParts {
                account_id: "123456789012",
                route: &route,
                method: &Method::POST,
                raw_path: "/sales/s1/grab/abc",
                raw_query: query,
                headers: &headers,
                version: http::Version::HTTP_11,
                peer: SocketAddr::from(([127, 0, 0, 1], 4000)),
                request_id: "req-1",
                path_parameters: BTreeMap::from([
                    ("sale_id".to_owned(), "s1".to_owned()),
                    ("token".to_owned(), "abc".to_owned()),
                ]),
                authorizer,
            },
            body,
        )
        .expect("serializable")
    }

    #[test]
    fn the_event_is_payload_format_2_0_as_lambda_http_reads_it() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("api.local"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.append("x-many", HeaderValue::from_static("a"));
        headers.append("x-many", HeaderValue::from_static("b"));
        headers.append(header::COOKIE, HeaderValue::from_static("k=1; l=2"));
        let event = event_for(headers, "q=1&q=2&name=caf%C3%A9+x", br#"{"a":1}"#, true);

        for v1_only in V1_AUTHORIZER_FIELDS.iter().chain(&["stageVariables"]) {
            assert!(event.get(v1_only).is_none(), "{v1_only} in {event}");
        }
        assert_eq!(event["version"], "2.0");
        assert_eq!(event["routeKey"], "POST /sales/{sale_id}/grab/{token}");
        assert_eq!(event["headers"]["x-many"], "a,b");
        assert_eq!(event["cookies"], json!(["k=1", "l=2"]));
        assert_eq!(event["queryStringParameters"]["q"], "1,2");
        assert_eq!(event["requestContext"]["http"]["method"], "POST");
        assert_eq!(
            event["requestContext"]["authorizer"]["jwt"]["claims"]["sub"],
            "buyer-1"
        );

        let request =
            lambda_http::request::from_str(&event.to_string()).expect("lambda_http reads it");
        use lambda_http::RequestExt;
        assert_eq!(request.method(), Method::POST);
        // lambda_http puts the stage in front of the path unless told not to.
        assert_eq!(request.uri().path(), "/dev/sales/s1/grab/abc");
        assert_eq!(request.raw_http_path(), "/sales/s1/grab/abc");
        assert_eq!(
            request.query_string_parameters().all("q"),
            Some(vec!["1", "2"])
        );
        assert_eq!(
            request.query_string_parameters().first("name"),
            Some("café x")
        );
        assert_eq!(request.path_parameters().first("token"), Some("abc"));
        assert_eq!(request.headers()[header::COOKIE], "k=1; l=2");
        assert_eq!(request.body().as_ref(), br#"{"a":1}"#);
    }

    #[test]
    fn a_body_that_is_not_text_arrives_base64_encoded_and_a_public_route_has_no_authorizer() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let event = event_for(headers, "", &[0, 159, 146, 150], false);
        assert_eq!(event["isBase64Encoded"], true);
        assert_eq!(event["body"], "AJ+Slg==");
        assert!(event["requestContext"].get("authorizer").is_none());
        assert!(event.get("queryStringParameters").is_none());
        assert!(event.get("cookies").is_none());
        let request =
            lambda_http::request::from_str(&event.to_string()).expect("lambda_http reads it");
        assert_eq!(request.body().as_ref(), &[0, 159, 146, 150]);
    }

    #[test]
    fn path_parameters_are_extracted_and_decoded() {
        let r = route("POST", "/sales/{sale_id}/grab/{token}");
        let params = r.matches("/sales/s%201/grab/abc").expect("matches");
        assert_eq!(params["sale_id"], "s 1");
        assert_eq!(params["token"], "abc");
        assert!(r.matches("/sales/s1/grab").is_none());
        assert!(r.matches("/sales/s1/grab/abc/more").is_none());
    }

    #[test]
    fn a_bad_escape_or_bytes_that_are_not_utf8_are_passed_on_as_sent() {
        assert_eq!(percent_decode("caf%C3%A9%2F"), "café/");
        assert_eq!(percent_decode("100%zz%2"), "100%zz%2");
        assert_eq!(percent_decode("bad%FF"), "bad%FF");
    }

    #[test]
    fn the_most_specific_route_wins() {
        let routes = [
            route("GET", "/sales/{sale_id}"),
            route("GET", "/sales/current"),
            route("ANY", "/{proxy+}"),
        ];
        let best = |path: &str| {
            routes
                .iter()
                .filter_map(|r| r.matches(path).map(|_| r))
                .max_by_key(|r| r.specificity())
                .map(|r| r.spec.path.clone())
        };
        assert_eq!(best("/sales/current").as_deref(), Some("/sales/current"));
        assert_eq!(best("/sales/s1").as_deref(), Some("/sales/{sale_id}"));
        assert_eq!(best("/other/x").as_deref(), Some("/{proxy+}"));
    }

    #[test]
    fn a_bucket_admits_its_burst_then_refills_at_its_rate() {
        let mut bucket = Bucket::new(Throttle {
            rate_limit: 1000.0,
            burst_limit: 3,
        });
        assert!((0..3).all(|_| bucket.admit()));
        assert!(!bucket.admit(), "the burst is spent");
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(bucket.admit(), "refilled at 1000/s");
    }

    #[test]
    fn cors_echoes_an_allowed_origin_and_preflights_list_methods_and_headers() {
        let cors = CorsSpec {
            allow_origins: vec!["https://shop.example".to_owned()],
            allow_methods: vec!["GET".to_owned(), "POST".to_owned()],
            allow_headers: vec!["authorization".to_owned()],
            expose_headers: vec!["retry-after".to_owned()],
            max_age: Some(600),
            allow_credentials: None,
        };
        let preflight = preflight_response(&cors, Some("https://shop.example"));
        assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            preflight.headers()[header::ACCESS_CONTROL_ALLOW_METHODS],
            "GET,POST"
        );
        assert_eq!(preflight.headers()[header::ACCESS_CONTROL_MAX_AGE], "600");
        let mut response = json_response(StatusCode::OK, json!({}));
        add_cors_headers(&mut response, &cors, "https://shop.example");
        assert_eq!(
            response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://shop.example"
        );
        let mut foreign = json_response(StatusCode::OK, json!({}));
        add_cors_headers(&mut foreign, &cors, "https://evil.example");
        assert!(
            !foreign
                .headers()
                .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        );
    }

    #[test]
    fn a_function_result_without_status_code_is_a_200_json_body() {
        let response = gateway_response(json!({"ok": true}));
        assert_eq!(response.status(), StatusCode::OK);
        let response = gateway_response(json!({
            "statusCode": 202,
            "headers": {"content-type": "application/json", "x-a": "1"},
            "cookies": ["a=b"],
            "body": "{}",
        }));
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(response.headers()["x-a"], "1");
        assert_eq!(response.headers()[header::SET_COOKIE], "a=b");
    }
}
