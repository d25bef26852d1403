use flashsale_local::function_fn;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{Recorder, options, start};

fn recording(recorder: Recorder) -> std::sync::Arc<dyn flashsale_local::LambdaFunction> {
    function_fn(move |event: Value| {
        let recorder = recorder.clone();
        async move {
            recorder.record(&event);
            Ok(json!({"statusCode": 202, "body": "{}"}))
        }
    })
}

/// A stack whose grab function records its events, with these throttle parameters, and
/// the statuses of `paths` (under `/sales/s1/`) posted one after another by one buyer.
async fn statuses_through_throttles(
    name: &str,
    throttles: [(&str, &str); 2],
    paths: &[&str],
) -> (Vec<StatusCode>, usize) {
    let recorder = Recorder::default();
    let mut stack_options = options(name).function("GrabFunction", recording(recorder.clone()));
    for (parameter, value) in throttles {
        stack_options = stack_options.parameter(parameter, value);
    }
    let stack = start(stack_options).await;
    let token = stack.token("bob", false).expect("token");
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for path in paths {
        let response = client
            .post(format!("{}/sales/s1/{path}", stack.api_url))
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        statuses.push(response.status());
    }
    stack.shutdown().await;
    (statuses, recorder.count())
}

#[tokio::test]
async fn a_route_beyond_its_throttle_burst_answers_429_before_the_function_runs() {
    let (statuses, reached) = statuses_through_throttles(
        "gw-throttle",
        [
            ("GrabThrottleRateLimit", "1"),
            ("GrabThrottleBurstLimit", "2"),
        ],
        &["grab/t"; 3],
    )
    .await;
    assert_eq!(
        statuses,
        [
            StatusCode::ACCEPTED,
            StatusCode::ACCEPTED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        reached, 2,
        "the throttled request never reached the function"
    );
}

/// The token route has a throttle of its own: its bucket empty, grabs still pass.
#[tokio::test]
async fn the_token_route_is_throttled_apart_from_the_grab_route() {
    let (statuses, reached) = statuses_through_throttles(
        "gw-token-throttle",
        [
            ("TokenThrottleRateLimit", "1"),
            ("TokenThrottleBurstLimit", "1"),
        ],
        &["token", "token", "grab/t", "grab/t"],
    )
    .await;
    assert_eq!(
        statuses,
        [
            StatusCode::ACCEPTED,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::ACCEPTED,
            StatusCode::ACCEPTED
        ]
    );
    assert_eq!(reached, 3, "only the throttled token request was shed");
}

#[tokio::test]
async fn cors_preflights_are_answered_by_the_gateway_and_responses_carry_the_allowed_origin() {
    let stack = start(options("gw-cors").parameter("SalePageOrigin", "https://shop.example")).await;
    let client = reqwest::Client::new();
    let preflight = client
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/sales/s1/grab/t", stack.api_url),
        )
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("preflight");
    assert_eq!(
        preflight.status(),
        StatusCode::NO_CONTENT,
        "no token needed for a preflight"
    );
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    assert!(
        preflight.headers()["access-control-allow-methods"]
            .to_str()
            .expect("ascii")
            .contains("POST")
    );
    let page = client
        .get(format!("{}/sales/no-such-sale", stack.api_url))
        .header("origin", "https://shop.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        page.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    let foreign = client
        .get(format!("{}/sales/no-such-sale", stack.api_url))
        .header("origin", "https://elsewhere.example")
        .send()
        .await
        .expect("GET");
    assert!(
        !foreign
            .headers()
            .contains_key("access-control-allow-origin")
    );
    stack.shutdown().await;
}

/// The pages come with the headers of the template's CloudFront response headers policy,
/// so they are tried locally under the policy they are deployed with; API answers do not.
#[tokio::test]
async fn the_pages_carry_the_templates_security_headers() {
    let stack = start(options("gw-page-headers")).await;
    let client = reqwest::Client::new();
    let page = client
        .get(format!("{}/", stack.api_url))
        .send()
        .await
        .expect("the sale page");
    assert_eq!(page.status(), StatusCode::OK);
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    // Stripe's origins are the local Stripe's here (the stack's StripeJsOrigin and
    // StripeApiBase), as a deployed stack's are Stripe's own.
    let stripe = stack
        .stripe_endpoint
        .as_deref()
        .expect("card payments through the local Stripe");
    assert_eq!(
        header("content-security-policy"),
        Some(format!(
            "default-src 'none'; script-src 'self' {stripe}; style-src 'self'; img-src 'self'; \
             connect-src 'self' {stripe}; frame-src {stripe} https://hooks.stripe.com; \
             form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        ))
    );
    assert_eq!(
        header("strict-transport-security").as_deref(),
        Some("max-age=63072000; includeSubDomains")
    );
    assert_eq!(header("x-content-type-options").as_deref(), Some("nosniff"));
    assert_eq!(header("x-frame-options").as_deref(), Some("DENY"));
    assert_eq!(
        header("referrer-policy").as_deref(),
        Some("strict-origin-when-cross-origin")
    );
    let api = client
        .get(format!("{}/sales/nope", stack.api_url))
        .send()
        .await
        .expect("an API answer");
    assert!(api.headers().get("content-security-policy").is_none());
    stack.shutdown().await;
}

/// The pages' `config.json` names the local Stripe's Stripe.js, as a deployment's names
/// Stripe's: the sale page loads its card form from there.
#[tokio::test]
async fn the_pages_config_names_the_local_stripes_stripe_js() {
    let stack = start(options("gw-page-config")).await;
    let config: serde_json::Value = reqwest::get(format!("{}/config.json", stack.api_url))
        .await
        .expect("config.json")
        .json()
        .await
        .expect("JSON");
    let stripe = stack.stripe_endpoint.as_deref().expect("a local Stripe");
    assert_eq!(config["stripe_js"], format!("{stripe}/js.stripe.com/v3/"));
    assert_eq!(config["auth"], "local", "the file's own values stay");
}

/// A stack that stops takes its webhook off the local Stripe it shares with others, so
/// that Stripe posts only to stacks that are up.
#[tokio::test]
async fn a_stack_that_stops_removes_its_webhook_from_the_local_stripe() {
    let options = options("gw-webhook-gone");
    let id = options.stack_name.clone();
    let stack = start(options).await;
    let stripe = stack.stripe_endpoint.clone().expect("a local Stripe");
    stack.shutdown().await;
    // Removing it again finds nothing: the stack's own removal came first.
    let again: serde_json::Value = reqwest::Client::new()
        .delete(format!("{stripe}/_config/webhooks/{id}"))
        .send()
        .await
        .expect("the local Stripe answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(again["deleted"], false, "{again}");
}
