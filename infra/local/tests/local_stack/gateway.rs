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

#[tokio::test]
async fn a_route_beyond_its_throttle_burst_answers_429_before_the_function_runs() {
    let recorder = Recorder::default();
    let stack = start(
        options("gw-throttle")
            .parameter("GrabThrottleRateLimit", "1")
            .parameter("GrabThrottleBurstLimit", "2")
            .function("GrabFunction", recording(recorder.clone())),
    )
    .await;
    let token = stack.token("bob", false).expect("token");
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = client
            .post(format!("{}/sales/s1/grab/t", stack.api_url))
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::ACCEPTED,
            StatusCode::ACCEPTED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        recorder.count(),
        2,
        "the throttled request never reached the function"
    );
    stack.shutdown().await;
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
