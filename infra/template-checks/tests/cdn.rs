//! template.yaml's CDN layer <-> the HTTP API it fronts: every route is reachable through
//! the distribution with its method and its Authorization header, only the public sale
//! status is cached, the pages' bucket is readable by the distribution alone, and the
//! optional WAF limits the token and grab paths per IP and per buyer.

use std::collections::BTreeSet;

use flashsale_template_checks::stack::{self, Stack};
use flashsale_template_checks::workspace;
use serde_json::{Value, json};

const CACHING_DISABLED: &str = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad";
const ALL_VIEWER_EXCEPT_HOST: &str = "b689b0a8-53d0-40ab-baf2-68738e2966ac";
const API_ORIGIN: &str = "api";
const PAGES_ORIGIN: &str = "pages";

fn stack() -> &'static Stack {
    stack::workspace_stack()
}

fn distribution() -> &'static Value {
    &stack().raw_resource("PagesDistribution")["Properties"]["DistributionConfig"]
}

fn origin(id: &str) -> &'static Value {
    distribution()["Origins"]
        .as_array()
        .expect("origins")
        .iter()
        .find(|o| o["Id"] == id)
        .unwrap_or_else(|| panic!("the {id} origin"))
}

/// One route of the HTTP API: its method, path and whether it is public.
struct Route {
    method: String,
    path: String,
    public: bool,
}

impl Route {
    /// A concrete URL path of the route: each `{param}` stands for a sample value.
    fn sample_path(&self) -> String {
        self.path
            .split('/')
            .map(|s| if s.starts_with('{') { "p1" } else { s })
            .collect::<Vec<_>>()
            .join("/")
    }
}

fn routes() -> Vec<Route> {
    let body = &stack().expanded_resource("HttpApi")["Properties"]["Body"];
    let paths = body["paths"].as_object().expect("routes in the API body");
    let routes: Vec<Route> = paths
        .iter()
        .flat_map(|(path, methods)| {
            methods
                .as_object()
                .expect("methods")
                .iter()
                .map(|(method, operation)| Route {
                    method: method.to_uppercase(),
                    path: path.clone(),
                    public: operation["security"] == json!([{"NONE": []}]),
                })
        })
        .collect();
    assert!(!routes.is_empty());
    routes
}

/// CloudFront's path patterns: `*` is any run of characters (slashes included), `?` one.
fn pattern_matches(pattern: &[u8], path: &[u8]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            pattern_matches(&pattern[1..], path)
                || (!path.is_empty() && pattern_matches(pattern, &path[1..]))
        }
        (Some(b'?'), Some(_)) => pattern_matches(&pattern[1..], &path[1..]),
        (Some(p), Some(c)) if p == c => pattern_matches(&pattern[1..], &path[1..]),
        _ => false,
    }
}

/// The behaviour CloudFront picks for a path: the first ordered one that matches, else
/// the default.
fn behaviour_for(path: &str) -> &'static Value {
    distribution()["CacheBehaviors"]
        .as_array()
        .expect("ordered cache behaviours")
        .iter()
        .find(|b| {
            let pattern = b["PathPattern"].as_str().expect("a literal path pattern");
            pattern_matches(pattern.as_bytes(), path.as_bytes())
        })
        .unwrap_or(&distribution()["DefaultCacheBehavior"])
}

fn allows(behaviour: &Value, method: &str) -> bool {
    behaviour["AllowedMethods"]
        .as_array()
        .is_some_and(|methods| methods.iter().any(|m| m == method))
}

#[test]
fn path_patterns_match_as_cloudfront_matches_them() {
    let m = |p: &str, s: &str| pattern_matches(p.as_bytes(), s.as_bytes());
    assert!(m("/sales/*", "/sales/p1"));
    assert!(m("/sales/*", "/sales/p1/grab/t"));
    assert!(m("/sales/*/token", "/sales/p1/token"));
    assert!(!m("/sales/*/token", "/sales/p1"));
    assert!(m("/a?c", "/abc"));
    assert!(!m("/admin/*", "/admin.html"));
}

#[test]
fn every_api_route_reaches_the_api_through_the_distribution_with_its_method() {
    for route in routes() {
        let behaviour = behaviour_for(&route.sample_path());
        assert_eq!(
            behaviour["TargetOriginId"], API_ORIGIN,
            "{} {} would be answered by the pages' bucket",
            route.method, route.path
        );
        assert!(
            allows(behaviour, &route.method),
            "{} {}: CloudFront refuses the method on {}",
            route.method,
            route.path,
            behaviour["PathPattern"]
        );
    }
}

#[test]
fn every_api_behaviour_serves_a_route_and_no_page_path_reaches_the_api() {
    let served: BTreeSet<String> = routes()
        .iter()
        .filter_map(|r| behaviour_for(&r.sample_path())["PathPattern"].as_str())
        .map(str::to_owned)
        .collect();
    for behaviour in distribution()["CacheBehaviors"]
        .as_array()
        .expect("behaviours")
    {
        if behaviour["TargetOriginId"] == API_ORIGIN {
            let pattern = behaviour["PathPattern"].as_str().expect("pattern");
            assert!(
                served.contains(pattern),
                "{pattern} forwards to the API but is the first match of no route"
            );
        }
    }
    for page in [
        "/",
        "/index.html",
        "/admin.html",
        "/config.json",
        "/assets/buyer.js",
    ] {
        assert_eq!(
            behaviour_for(page)["TargetOriginId"],
            PAGES_ORIGIN,
            "{page} is a page"
        );
    }
    // The pages served from the bucket are the ones in web/.
    for page in ["index.html", "admin.html", "config.json"] {
        assert!(
            workspace::root().join("web").join(page).is_file(),
            "web/{page}"
        );
    }
}

#[test]
fn only_the_public_sale_status_is_cached_and_every_other_api_call_carries_its_authorization() {
    let cache_policy =
        &stack().raw_resource("SaleStatusCachePolicy")["Properties"]["CachePolicyConfig"];
    for route in routes() {
        let behaviour = behaviour_for(&route.sample_path());
        let what = format!("{} {}", route.method, route.path);
        if behaviour["CachePolicyId"] == CACHING_DISABLED {
            assert_eq!(
                behaviour["OriginRequestPolicyId"], ALL_VIEWER_EXCEPT_HOST,
                "{what}: uncached, with every viewer header (Authorization) forwarded"
            );
        } else {
            assert!(
                route.public && route.method == "GET",
                "{what} is cached by the CDN but needs a caller's token"
            );
            assert_eq!(
                behaviour["CachePolicyId"],
                json!({"Ref": "SaleStatusCachePolicy"})
            );
        }
    }
    // The origin's Cache-Control decides (max-age=1); nothing is cached without one.
    assert_eq!(cache_policy["MinTTL"], 0);
    assert_eq!(cache_policy["DefaultTTL"], 0);
    let max = cache_policy["MaxTTL"].as_u64().expect("a literal MaxTTL");
    assert!((1..=60).contains(&max), "MaxTTL {max}");
    let key = &cache_policy["ParametersInCacheKeyAndForwardedToOrigin"];
    assert_eq!(key["HeadersConfig"]["HeaderBehavior"], "none");
    assert_eq!(key["CookiesConfig"]["CookieBehavior"], "none");
    assert_eq!(key["QueryStringsConfig"]["QueryStringBehavior"], "none");
}

#[test]
fn the_api_origin_is_this_stacks_http_api_and_stage() {
    let api = origin(API_ORIGIN);
    assert_eq!(
        stack::references(&api["DomainName"]),
        ["HttpApi".to_owned()].into()
    );
    assert_eq!(
        stack::references(&api["OriginPath"]),
        ["Stage".to_owned()].into()
    );
    assert_eq!(
        api["CustomOriginConfig"]["OriginProtocolPolicy"],
        "https-only"
    );
}

#[test]
fn the_pages_bucket_is_private_and_readable_by_the_distribution_only() {
    let bucket = &stack().raw_resource("PagesBucket")["Properties"];
    for setting in [
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ] {
        assert_eq!(
            bucket["PublicAccessBlockConfiguration"][setting], true,
            "{setting}"
        );
    }
    let pages = origin(PAGES_ORIGIN);
    assert_eq!(
        stack::references(&pages["OriginAccessControlId"]),
        ["PagesOriginAccessControl".to_owned()].into()
    );
    let statements =
        stack().raw_resource("PagesBucketPolicy")["Properties"]["PolicyDocument"]["Statement"]
            .as_array()
            .expect("statements");
    for statement in statements.iter().filter(|s| s["Effect"] == "Allow") {
        assert_eq!(
            statement["Principal"],
            json!({"Service": "cloudfront.amazonaws.com"})
        );
        assert_eq!(statement["Action"], "s3:GetObject");
        let source = &statement["Condition"]["StringEquals"]["AWS:SourceArn"];
        assert!(
            stack::references(source).contains("PagesDistribution"),
            "only this distribution: {source}"
        );
    }
}

/// Whether a WAF statement (the subset the template uses) matches a URI path.
fn waf_matches(statement: &Value, path: &str) -> bool {
    if let Some(or) = statement["OrStatement"]["Statements"].as_array() {
        return or.iter().any(|s| waf_matches(s, path));
    }
    let byte_match = &statement["ByteMatchStatement"];
    assert!(
        byte_match["FieldToMatch"]["UriPath"].is_object(),
        "matches the URI path"
    );
    let needle = byte_match["SearchString"]
        .as_str()
        .expect("a search string");
    match byte_match["PositionalConstraint"].as_str() {
        Some("ENDS_WITH") => path.ends_with(needle),
        Some("STARTS_WITH") => path.starts_with(needle),
        Some("CONTAINS") => path.contains(needle),
        Some("EXACTLY") => path == needle,
        other => panic!("unexpected positional constraint {other:?}"),
    }
}

#[test]
fn the_optional_waf_limits_token_grab_and_payment_requests_per_ip_and_per_buyer() {
    let acl = stack().raw_resource("PagesWebAcl");
    assert_eq!(acl["Condition"], "HasWaf");
    assert_eq!(acl["Properties"]["Scope"], "CLOUDFRONT");
    assert_eq!(
        distribution()["WebACLId"],
        json!({"Fn::If": ["HasWaf", {"Fn::GetAtt": ["PagesWebAcl", "Arn"]}, {"Ref": "AWS::NoValue"}]})
    );
    let rules = acl["Properties"]["Rules"].as_array().expect("rules");
    let rate_rule = |is_key: &dyn Fn(&Value) -> bool| -> Vec<&Value> {
        rules
            .iter()
            .filter(|r| is_key(&r["Statement"]["RateBasedStatement"]))
            .collect()
    };
    let per_ip = rate_rule(&|s| s["AggregateKeyType"] == "IP");
    let per_buyer = rate_rule(&|s| {
        s["AggregateKeyType"] == "CUSTOM_KEYS"
            && s["CustomKeys"]
                == json!([{"Header": {"Name": "authorization", "TextTransformations": [{"Priority": 0, "Type": "NONE"}]}}])
    });
    assert_eq!(per_ip.len(), 1, "one per-IP rate rule");
    assert_eq!(
        per_buyer.len(),
        2,
        "two rate rules per Authorization header (one buyer): the grab's and the payment's"
    );
    let grab_route = |path: &str| path.ends_with("/token") || path.contains("/grab/");
    let payment_route =
        |path: &str| path.ends_with("/payment") || path.ends_with("/payment/confirm");
    let by_limit = |limit: &str| -> &Value {
        per_buyer
            .iter()
            .find(|rule| rule["Statement"]["RateBasedStatement"]["Limit"] == json!({"Ref": limit}))
            .unwrap_or_else(|| panic!("a per-buyer rule limited by {limit}"))
    };
    let routes = routes();
    for (rule, limit, hot) in [
        (
            per_ip[0],
            "WafGrabRateLimitPerIp",
            &grab_route as &dyn Fn(&str) -> bool,
        ),
        (
            by_limit("WafGrabRateLimitPerUser"),
            "WafGrabRateLimitPerUser",
            &grab_route,
        ),
        (
            by_limit("WafPaymentRateLimitPerUser"),
            "WafPaymentRateLimitPerUser",
            &payment_route,
        ),
    ] {
        let statement = &rule["Statement"]["RateBasedStatement"];
        assert_eq!(
            statement["Limit"],
            json!({"Ref": limit}),
            "{}",
            rule["Name"]
        );
        assert_eq!(
            statement["EvaluationWindowSec"],
            json!({"Ref": "WafRateWindowSecs"})
        );
        // The page waits out a 429's Retry-After; WAF's default 403 would read as a refusal.
        let custom = &rule["Action"]["Block"]["CustomResponse"];
        assert_eq!(custom["ResponseCode"], 429, "{}", rule["Name"]);
        assert_eq!(
            custom["ResponseHeaders"],
            json!([{"Name": "Retry-After", "Value": {"Fn::Sub": "${WafRateWindowSecs}"}}])
        );
        let body_key = custom["CustomResponseBodyKey"].as_str().expect("a body");
        let body: Value = serde_json::from_str(
            acl["Properties"]["CustomResponseBodies"][body_key]["Content"]
                .as_str()
                .expect("the body's content"),
        )
        .expect("the body is JSON");
        assert_eq!(body["error"], "rate_limited", "the API's error shape");
        assert!(body["message"].is_string());
        let scope = &statement["ScopeDownStatement"];
        for route in &routes {
            let path = route.sample_path();
            assert_eq!(
                waf_matches(scope, &path),
                hot(&route.path),
                "{}: {} {}: limited exactly on its own paths",
                rule["Name"],
                route.method,
                route.path
            );
        }
    }
    assert!(
        routes.iter().filter(|r| r.path.contains("/grab/")).count() == 1,
        "the grab route exists"
    );
    assert_eq!(
        routes.iter().filter(|r| payment_route(&r.path)).count(),
        2,
        "the payment routes exist: open and confirm"
    );
}
