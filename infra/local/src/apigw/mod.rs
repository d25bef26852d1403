//! The HTTP API, locally: routes from the functions' `HttpApi` events, the JWT
//! authorizer in front, and each request turned into the payload-format-2.0 event API
//! Gateway would send, answered from the function's payload-format-2.0 response.
//!
//! - `routes`: the routes and their throttles;
//! - `cors`: preflights and CORS headers;
//! - `event`: the request as the event, the function's result as the response;
//! - `token`: the local-only token route.

mod cors;
mod event;
mod routes;
mod token;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::auth::LocalJwt;
use crate::edge::EdgeLimiter;
use crate::lambda::{LambdaService, error_chain};
use crate::model::{CorsSpec, RouteAuth};
use cors::{add_cors_headers, preflight_response};
use event::{EventParts, gateway_event, gateway_response};
use routes::{Bucket, Route, segments, unstaged};
use token::issue_token;

/// API Gateway's payload limit for HTTP APIs.
pub const MAX_PAYLOAD: usize = 10 * 1024 * 1024;

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

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::event::V1_AUTHORIZER_FIELDS;
    use super::routes::percent_decode;
    use super::*;
    use crate::auth::Verified;
    use crate::model::{RouteSpec, Throttle};

    fn route(method: &str, path: &str) -> Route {
        Route {
            function: "F".to_owned(),
            spec: RouteSpec {
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
