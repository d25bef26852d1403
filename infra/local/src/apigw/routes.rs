//! The template's routes, matched as API Gateway matches them, and each route's
//! throttle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::model::{RouteSpec, Throttle};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Segment {
    Literal(String),
    Param(String),
    Greedy(String),
}

#[derive(Debug, Clone)]
pub(super) struct Route {
    pub(super) function: String,
    pub(super) spec: RouteSpec,
    pub(super) segments: Vec<Segment>,
    pub(super) bucket: Option<Arc<Mutex<Bucket>>>,
}

/// API Gateway's token bucket for one route.
#[derive(Debug)]
pub(super) struct Bucket {
    throttle: Throttle,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    pub(super) fn new(throttle: Throttle) -> Self {
        Self {
            throttle,
            tokens: throttle.burst_limit as f64,
            refilled: Instant::now(),
        }
    }

    /// Takes a token if there is one.
    pub(super) fn admit(&mut self) -> bool {
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

pub(super) fn segments(path: &str) -> Vec<Segment> {
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
pub(super) fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .unwrap_or_else(|_| s.to_owned())
}

impl Route {
    /// Path parameters when `path` matches this route's path.
    pub(super) fn matches(&self, path: &str) -> Option<BTreeMap<String, String>> {
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
    pub(super) fn specificity(&self) -> (bool, bool, usize) {
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

/// `path` without the route's stage prefix: on AWS a named stage prefixes the URL;
/// locally both forms are served.
pub(super) fn unstaged<'p>(route: &Route, path: &'p str) -> &'p str {
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
