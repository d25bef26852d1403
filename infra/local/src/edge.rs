//! The edge, locally: the rate-based rules of the template's CloudFront web ACL (AWS
//! WAF), played in front of the HTTP API as WAF plays them in front of the distribution,
//! so a refused request never reaches a function.
//!
//! What is played is WAF's documented behaviour for the statements the template uses:
//! a rate-based statement counts, per aggregation key (the client's IP, or a custom key
//! such as one header), the matching requests of the last `EvaluationWindowSec` seconds,
//! blocked ones included; past `Limit`, the rule's action applies to each further
//! request. A request without the custom key's header is not counted by that rule. WAF
//! checks rates "frequently" and only near the limit; locally the count is exact, per
//! request, which is the stricter reading.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::Value;

/// One rate-based rule of the web ACL, evaluated.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeRateRule {
    pub name: String,
    pub priority: u64,
    pub key: RateKey,
    pub limit: u64,
    pub window: Duration,
    /// Which requests the rule counts; all of them when `None`.
    pub scope: Option<PathMatch>,
    pub block: BlockResponse,
}

/// What a rate-based rule counts requests by.
#[derive(Debug, Clone, PartialEq)]
pub enum RateKey {
    /// The viewer's IP address (`AggregateKeyType: IP`).
    Ip,
    /// One request header's value (`CUSTOM_KEYS` with one `Header` key), lower-case name.
    Header(String),
}

/// A scope-down statement on the URI path.
#[derive(Debug, Clone, PartialEq)]
pub enum PathMatch {
    Any(Vec<PathMatch>),
    Bytes {
        constraint: Positional,
        search: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Positional {
    Exactly,
    StartsWith,
    EndsWith,
    Contains,
}

impl PathMatch {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Any(statements) => statements.iter().any(|s| s.matches(path)),
            PathMatch::Bytes { constraint, search } => match constraint {
                Positional::Exactly => path == search,
                Positional::StartsWith => path.starts_with(search.as_str()),
                Positional::EndsWith => path.ends_with(search.as_str()),
                Positional::Contains => path.contains(search.as_str()),
            },
        }
    }
}

/// What a blocking rule answers: WAF's default 403, or the rule's custom response.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body and its content type.
    pub body: Option<(String, String)>,
}

impl BlockResponse {
    pub fn to_response(&self) -> axum::response::Response {
        let mut response = match &self.body {
            Some((content_type, body)) => {
                let mut response =
                    axum::response::Response::new(axum::body::Body::from(body.clone()));
                if let Ok(value) = HeaderValue::from_str(content_type) {
                    response
                        .headers_mut()
                        .insert(http::header::CONTENT_TYPE, value);
                }
                response
            }
            None => axum::response::Response::new(axum::body::Body::from("Forbidden")),
        };
        *response.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::FORBIDDEN);
        for (name, value) in &self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}

/// The web ACL's rate-based rules, with each key's recent requests.
pub struct EdgeLimiter {
    rules: Vec<EdgeRateRule>,
    /// Per (rule, key): the times of its latest `limit + 1` counted requests, oldest
    /// first. The count over the window exceeds the limit exactly when the oldest of
    /// those is still inside the window, so no more need be kept.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    by_key: HashMap<(usize, String), VecDeque<Instant>>,
    prune_at: usize,
}

/// Keys with nothing inside their window are dropped once the map holds this many; if
/// most are still live, the next prune waits for twice as many, so a crowd of live keys
/// costs one pass now and then, not one per request.
const PRUNE_AT: usize = 10_000;

impl EdgeLimiter {
    pub fn new(mut rules: Vec<EdgeRateRule>) -> Self {
        rules.sort_by_key(|rule| rule.priority);
        Self {
            rules,
            seen: Mutex::new(Seen {
                by_key: HashMap::new(),
                prune_at: PRUNE_AT,
            }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Counts the request under every rule that matches it, in priority order, and
    /// answers the first rule over its limit; `None` lets the request through.
    pub fn check(
        &self,
        path: &str,
        client_ip: IpAddr,
        headers: &HeaderMap,
        now: Instant,
    ) -> Option<&EdgeRateRule> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.by_key.len() >= seen.prune_at {
            let longest = self
                .rules
                .iter()
                .map(|r| r.window)
                .max()
                .unwrap_or_default();
            seen.by_key.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|last| now.duration_since(*last) < longest)
            });
            seen.prune_at = (seen.by_key.len() * 2).max(PRUNE_AT);
        }
        for (index, rule) in self.rules.iter().enumerate() {
            if rule
                .scope
                .as_ref()
                .is_some_and(|scope| !scope.matches(path))
            {
                continue;
            }
            let key = match &rule.key {
                RateKey::Ip => client_ip.to_string(),
                RateKey::Header(name) => match headers.get(name).and_then(|v| v.to_str().ok()) {
                    Some(value) if !value.is_empty() => value.to_owned(),
                    _ => continue,
                },
            };
            let times = seen.by_key.entry((index, key)).or_default();
            times.push_back(now);
            let keep = usize::try_from(rule.limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            while times.len() > keep {
                times.pop_front();
            }
            let over = times.len() == keep
                && times
                    .front()
                    .is_some_and(|oldest| now.duration_since(*oldest) < rule.window);
            if over {
                ::metrics::counter!("waf_blocked_requests", "rule" => rule.name.clone())
                    .increment(1);
                return Some(rule);
            }
        }
        None
    }
}

// ---------------------------------------------------------------- the template's web ACL

/// Why a web ACL cannot be played locally.
#[derive(Debug, thiserror::Error)]
pub enum WebAclError {
    #[error("rule {rule}: {what}")]
    Unsupported { rule: String, what: String },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub(crate) struct WebAclProperties {
    #[serde(rename = "Name")]
    _name: Option<Value>,
    pub(crate) scope: String,
    #[serde(rename = "DefaultAction")]
    default_action: Value,
    #[serde(rename = "VisibilityConfig")]
    _visibility: Option<Value>,
    #[serde(default)]
    custom_response_bodies: BTreeMap<String, CustomResponseBody>,
    #[serde(default)]
    rules: Vec<RuleProperties>,
    #[serde(rename = "Tags")]
    _tags: Option<Value>,
    #[serde(rename = "Description")]
    _description: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct CustomResponseBody {
    content_type: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct RuleProperties {
    name: String,
    #[serde(deserialize_with = "crate::model::lenient_u64")]
    priority: u64,
    action: Value,
    #[serde(rename = "VisibilityConfig")]
    _visibility: Option<Value>,
    statement: StatementProperties,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct StatementProperties {
    rate_based_statement: RateBasedStatement,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct RateBasedStatement {
    aggregate_key_type: String,
    #[serde(default)]
    custom_keys: Vec<Value>,
    #[serde(deserialize_with = "crate::model::lenient_u64")]
    limit: u64,
    #[serde(
        default = "default_window",
        deserialize_with = "crate::model::lenient_u64"
    )]
    evaluation_window_sec: u64,
    scope_down_statement: Option<Value>,
}

/// WAF's default evaluation window.
fn default_window() -> u64 {
    300
}

impl WebAclProperties {
    /// The web ACL's rules, as the local edge plays them. Only an `Allow` default and
    /// rate-based rules that block are known here: anything else is an error, not a rule
    /// silently skipped.
    pub(crate) fn rules(self) -> Result<Vec<EdgeRateRule>, WebAclError> {
        if self.default_action.get("Allow").is_none() {
            return Err(WebAclError::Unsupported {
                rule: "DefaultAction".to_owned(),
                what: format!(
                    "only Allow is played locally, found {}",
                    self.default_action
                ),
            });
        }
        self.rules
            .into_iter()
            .map(|rule| {
                let unsupported = |what: String| WebAclError::Unsupported {
                    rule: rule.name.clone(),
                    what,
                };
                let statement = &rule.statement.rate_based_statement;
                let key = match statement.aggregate_key_type.as_str() {
                    "IP" => RateKey::Ip,
                    "CUSTOM_KEYS" => match statement.custom_keys.as_slice() {
                        // Untransformed: the header's value as sent is the key.
                        [only] if untransformed(&only["Header"]["TextTransformations"]) => {
                            only["Header"]["Name"]
                                .as_str()
                                .map(|name| RateKey::Header(name.to_ascii_lowercase()))
                                .ok_or_else(|| {
                                    unsupported(format!("only one Header custom key, found {only}"))
                                })?
                        }
                        keys => {
                            return Err(unsupported(format!(
                                "only one untransformed Header custom key is played, found {keys:?}"
                            )));
                        }
                    },
                    other => return Err(unsupported(format!("AggregateKeyType {other}"))),
                };
                let scope = statement
                    .scope_down_statement
                    .as_ref()
                    .map(path_match)
                    .transpose()
                    .map_err(unsupported)?;
                let block = block_response(&rule.action, &self.custom_response_bodies)
                    .map_err(unsupported)?;
                Ok(EdgeRateRule {
                    name: rule.name.clone(),
                    priority: rule.priority,
                    key,
                    limit: statement.limit,
                    window: Duration::from_secs(statement.evaluation_window_sec),
                    scope,
                    block,
                })
            })
            .collect()
    }
}

/// Whether WAF's text transformations leave the value as it is.
fn untransformed(transformations: &Value) -> bool {
    transformations
        .as_array()
        .is_some_and(|t| t.iter().all(|t| t["Type"] == "NONE"))
}

/// An `OrStatement` of `ByteMatchStatement`s on the URI path, untransformed.
fn path_match(statement: &Value) -> Result<PathMatch, String> {
    if let Some(statements) = statement["OrStatement"]["Statements"].as_array() {
        return statements
            .iter()
            .map(path_match)
            .collect::<Result<_, _>>()
            .map(PathMatch::Any);
    }
    let bytes = &statement["ByteMatchStatement"];
    let on_path = bytes["FieldToMatch"].get("UriPath").is_some();
    match (
        on_path && untransformed(&bytes["TextTransformations"]),
        bytes["SearchString"].as_str(),
        serde_json::from_value::<Positional>(bytes["PositionalConstraint"].clone()),
    ) {
        (true, Some(search), Ok(constraint)) => Ok(PathMatch::Bytes {
            constraint,
            search: search.to_owned(),
        }),
        _ => Err(format!(
            "only Or of untransformed byte matches on the URI path is played, found {statement}"
        )),
    }
}

fn block_response(
    action: &Value,
    bodies: &BTreeMap<String, CustomResponseBody>,
) -> Result<BlockResponse, String> {
    let Some(block) = action.get("Block") else {
        return Err(format!("only Block actions are played, found {action}"));
    };
    let custom = &block["CustomResponse"];
    if custom.is_null() {
        return Ok(BlockResponse {
            status: 403,
            headers: Vec::new(),
            body: None,
        });
    }
    let status = match &custom["ResponseCode"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .and_then(|code| u16::try_from(code).ok())
    .ok_or_else(|| format!("a custom response needs a ResponseCode, found {custom}"))?;
    let headers = custom["ResponseHeaders"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            Some((
                h["Name"].as_str()?.to_owned(),
                crate::resolve::value_string(&h["Value"])?,
            ))
        })
        .collect();
    let body = match custom["CustomResponseBodyKey"].as_str() {
        None => None,
        Some(key) => {
            let body = bodies
                .get(key)
                .ok_or_else(|| format!("no custom response body {key}"))?;
            let content_type = match body.content_type.as_str() {
                "APPLICATION_JSON" => "application/json",
                "TEXT_HTML" => "text/html",
                _ => "text/plain",
            };
            Some((content_type.to_owned(), body.content.clone()))
        }
    };
    Ok(BlockResponse {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: RateKey, limit: u64) -> EdgeRateRule {
        EdgeRateRule {
            name: "r".to_owned(),
            priority: 0,
            key,
            limit,
            window: Duration::from_secs(60),
            scope: Some(PathMatch::Any(vec![PathMatch::Bytes {
                constraint: Positional::EndsWith,
                search: "/token".to_owned(),
            }])),
            block: BlockResponse {
                status: 429,
                headers: vec![("Retry-After".to_owned(), "60".to_owned())],
                body: None,
            },
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_str(token).unwrap());
        headers
    }

    #[test]
    fn a_key_over_its_limit_in_the_window_is_blocked_and_others_are_not() {
        let limiter = EdgeLimiter::new(vec![rule(RateKey::Header("authorization".to_owned()), 3)]);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let start = Instant::now();
        let check = |token: &str, at: u64| {
            limiter
                .check(
                    "/sales/s/token",
                    ip,
                    &bearer(token),
                    start + Duration::from_secs(at),
                )
                .is_some()
        };
        assert!(!check("a", 0) && !check("a", 1) && !check("a", 2));
        assert!(check("a", 3), "the fourth in a minute is over a limit of 3");
        assert!(!check("b", 3), "another buyer is not affected");
        assert!(check("a", 30), "still over");
        assert!(
            check("a", 61),
            "blocked requests count: 2, 3, 30 and 61 are four in the last minute"
        );
        assert!(!check("a", 200), "a quiet window later, admitted again");
    }

    #[test]
    fn requests_outside_the_scope_or_without_the_key_are_not_counted() {
        let limiter = EdgeLimiter::new(vec![rule(RateKey::Header("authorization".to_owned()), 1)]);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let now = Instant::now();
        for _ in 0..5 {
            assert!(limiter.check("/sales/s", ip, &bearer("a"), now).is_none());
            assert!(
                limiter
                    .check("/sales/s/token", ip, &HeaderMap::new(), now)
                    .is_none()
            );
        }
        assert!(
            limiter
                .check("/sales/s/token", ip, &bearer("a"), now)
                .is_none()
        );
        assert!(
            limiter
                .check("/sales/s/token", ip, &bearer("a"), now)
                .is_some()
        );
    }

    #[test]
    fn the_ip_rule_counts_every_buyer_of_one_address_together() {
        let limiter = EdgeLimiter::new(vec![rule(RateKey::Ip, 2)]);
        let shared: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let now = Instant::now();
        assert!(
            limiter
                .check("/sales/s/token", shared, &bearer("a"), now)
                .is_none()
        );
        assert!(
            limiter
                .check("/sales/s/token", shared, &bearer("b"), now)
                .is_none()
        );
        assert!(
            limiter
                .check("/sales/s/token", shared, &bearer("c"), now)
                .is_some()
        );
        assert!(
            limiter
                .check("/sales/s/token", other, &bearer("c"), now)
                .is_none()
        );
    }
}
