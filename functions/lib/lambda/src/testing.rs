//! Test support: API Gateway payload-format-2.0 events built from the realistic
//! fixtures in the repository's `events/` folder (the same files `sam local invoke -e`
//! and `cargo lambda invoke --data-file` take), adjusted per test.
//!
//! These helpers panic on a broken fixture: they run only in tests, where a panic with
//! a message is the clearest failure.

use std::path::PathBuf;

use http::Response;
use lambda_http::{Body, Request};
use serde_json::{Map, Value, json};

/// The repository's `events/` folder.
pub fn events_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../events")
}

/// A fixture from `events/`, as JSON.
pub fn fixture(name: &str) -> Value {
    let path = events_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read fixture {}: {err}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("fixture {} is not JSON: {err}", path.display()))
}

/// An API Gateway HTTP API event, starting from a fixture.
#[derive(Debug, Clone)]
pub struct ApiEvent(Value);

impl ApiEvent {
    pub fn fixture(name: &str) -> Self {
        Self(fixture(name))
    }

    fn claims(&mut self) -> &mut Map<String, Value> {
        // IndexMut turns a missing (null) member into an object, like `mkdir -p`.
        let claims = &mut self.0["requestContext"]["authorizer"]["jwt"]["claims"];
        if !claims.is_object() {
            *claims = json!({});
        }
        match claims {
            Value::Object(claims) => claims,
            _ => unreachable!("just made an object"),
        }
    }

    /// Sets a path parameter and rewrites `rawPath` and `requestContext.http.path` from
    /// the route key, as API Gateway would have produced them.
    /// A query parameter, as API Gateway passes it (parsed, and in `rawQueryString`);
    /// `None` removes it.
    pub fn query(mut self, name: &str, value: Option<&str>) -> Self {
        let params = &mut self.0["queryStringParameters"];
        if !params.is_object() {
            *params = json!({});
        }
        if let Value::Object(params) = params {
            match value {
                Some(value) => params.insert(name.to_owned(), json!(value)),
                None => params.remove(name),
            };
            // Percent-encoded, as a client sends it: API Gateway decodes the parsed copy.
            let encoded = |text: &str| -> String {
                text.bytes()
                    .map(|byte| match byte {
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                            char::from(byte).to_string()
                        }
                        _ => format!("%{byte:02X}"),
                    })
                    .collect()
            };
            let raw: Vec<String> = params
                .iter()
                .map(|(name, value)| {
                    format!("{name}={}", encoded(value.as_str().unwrap_or_default()))
                })
                .collect();
            self.0["rawQueryString"] = json!(raw.join("&"));
        }
        self
    }

    pub fn path_param(mut self, name: &str, value: &str) -> Self {
        self.0["pathParameters"][name] = json!(value);
        self.rebuild_path();
        self
    }

    fn rebuild_path(&mut self) {
        let route_key = self.0["routeKey"].as_str().unwrap_or_default().to_owned();
        let template = route_key.split_once(' ').map_or("", |(_, path)| path);
        let mut path = template.to_owned();
        if let Some(Value::Object(params)) = self.0.get("pathParameters") {
            for (name, value) in params {
                path = path.replace(&format!("{{{name}}}"), value.as_str().unwrap_or_default());
            }
        }
        let stage = self.0["requestContext"]["stage"]
            .as_str()
            .unwrap_or("$default");
        let raw_path = if stage == "$default" {
            path
        } else {
            format!("/{stage}{path}")
        };
        self.0["rawPath"] = json!(raw_path);
        self.0["requestContext"]["http"]["path"] = json!(raw_path);
    }

    /// The route key both at the top level and in the request context, and the method.
    pub fn route(mut self, route_key: &str) -> Self {
        self.0["routeKey"] = json!(route_key);
        let method = route_key
            .split_once(' ')
            .map_or("GET", |(method, _)| method);
        self.0["requestContext"]["routeKey"] = json!(route_key);
        self.0["requestContext"]["http"]["method"] = json!(method);
        self.rebuild_path();
        self
    }

    /// The caller's JWT `sub`.
    pub fn user(mut self, sub: &str) -> Self {
        self.claims().insert("sub".to_owned(), json!(sub));
        self
    }

    /// Any JWT claim, as API Gateway passes it (always a string).
    pub fn claim(mut self, name: &str, value: &str) -> Self {
        self.claims().insert(name.to_owned(), json!(value));
        self
    }

    pub fn without_claim(mut self, name: &str) -> Self {
        self.claims().remove(name);
        self
    }

    /// No authorizer at all, as on a route declared with `Auth: NONE`.
    pub fn anonymous(mut self) -> Self {
        if let Some(Value::Object(context)) = self.0.get_mut("requestContext") {
            context.remove("authorizer");
        }
        self
    }

    /// A raw text body, exactly as sent.
    pub fn body(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.0["body"] = json!(text);
        self.0["isBase64Encoded"] = json!(false);
        self.0["headers"]["content-length"] = json!(text.len().to_string());
        self
    }

    /// A request header, as API Gateway passes it (lower-case name).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.0["headers"][name.to_ascii_lowercase()] = json!(value);
        self
    }

    pub fn without_header(mut self, name: &str) -> Self {
        if let Some(Value::Object(headers)) = self.0.get_mut("headers") {
            headers.remove(&name.to_ascii_lowercase());
        }
        self
    }

    pub fn json(self, body: &Value) -> Self {
        self.body(body.to_string())
    }

    pub fn without_body(mut self) -> Self {
        if let Value::Object(map) = &mut self.0 {
            map.remove("body");
        }
        self.0["headers"]["content-length"] = json!("0");
        self
    }

    pub fn to_value(&self) -> Value {
        self.0.clone()
    }

    /// The event as the Lambda runtime hands it to the handler.
    pub fn into_request(self) -> Request {
        lambda_http::request::from_str(&self.0.to_string())
            .unwrap_or_else(|err| panic!("not an API Gateway v2 event: {err}"))
    }
}

/// A response's body as JSON.
pub fn body_json(response: &Response<Body>) -> Value {
    serde_json::from_slice(response.body()).unwrap_or_else(|err| {
        panic!(
            "response body is not JSON ({err}): {:?}",
            String::from_utf8_lossy(response.body())
        )
    })
}

/// The `error` code of an error response.
pub fn error_code(response: &Response<Body>) -> String {
    body_json(response)["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {:?}", response.body()))
        .to_owned()
}

/// That `response` is the refusal `status` with the error code `code`, the body shown
/// if not.
pub fn assert_refused(response: &Response<Body>, status: u16, code: &str) {
    let body = String::from_utf8_lossy(response.body());
    assert_eq!(response.status(), status, "{body}");
    assert_eq!(error_code(response), code, "{body}");
}
