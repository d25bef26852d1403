//! The counting proxy against a tiny upstream on loopback that records what reached it.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::http::HeaderMap;
use flashsale_emulators::proxy::{Counts, Fault, FaultRule, Proxy};
use serde_json::{Value, json};
use support::Upstream;

/// An upstream that answers 200 with the target it got, 404 on `/missing` and 200 after
/// 3 s on `/slow`, and counts.
async fn upstream() -> Upstream {
    Upstream::serve(|counter| {
        Router::new()
            .route(
                "/missing",
                axum::routing::any(|| async { (axum::http::StatusCode::NOT_FOUND, "{}") }),
            )
            .route(
                "/slow",
                axum::routing::any(|| async {
                    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                    "{}"
                }),
            )
            .fallback(move |headers: HeaderMap, body: String| {
                let counter = Arc::clone(&counter);
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let target = headers
                        .get("x-amz-target")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    axum::Json(json!({ "target": target, "body": body }))
                }
            })
    })
    .await
}

async fn call(proxy: &Proxy, target: &str) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{}/", proxy.url()))
        .header("x-amz-target", target)
        .header("content-type", "application/x-amz-json-1.0")
        .body(r#"{"TableName":"t"}"#)
        .send()
        .await
}

const GET_ITEM: &str = "DynamoDB_20120810.GetItem";
const TRANSACT: &str = "DynamoDB_20120810.TransactWriteItems";
const SEND: &str = "AmazonSQS.SendMessage";

#[tokio::test]
async fn requests_are_forwarded_and_counted_by_operation_and_status() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    for target in [GET_ITEM, GET_ITEM, TRANSACT, SEND] {
        let answer = call(&proxy, target).await.expect("an answer");
        assert_eq!(answer.status(), 200);
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["target"], target, "the header reached the upstream");
        assert_eq!(body["body"], r#"{"TableName":"t"}"#, "so did the body");
    }
    // A REST call (Scheduler's protocol) has no target: method and first path segment.
    let rest = reqwest::Client::new()
        .post(format!("{}/schedules/order-1?groupName=g", proxy.url()))
        .send()
        .await
        .expect("answer");
    assert_eq!(rest.status(), 200);
    let missing = reqwest::get(format!("{}/missing", proxy.url()))
        .await
        .expect("answer");
    assert_eq!(missing.status(), 404);

    let counts = proxy.counts();
    assert_eq!(counts.of(GET_ITEM), 2);
    assert_eq!(counts.of(TRANSACT), 1);
    assert_eq!(counts.of(SEND), 1);
    assert_eq!(counts.of("POST /schedules"), 1);
    assert_eq!(counts.operations["GET /missing"].by_outcome["404"], 1);
    assert_eq!(counts.total(), 6);
    assert_eq!(upstream.hits(), 5);

    // The same counts over HTTP, then a reset over HTTP.
    let over_http: Counts = reqwest::get(format!("{}/__counts", proxy.url()))
        .await
        .expect("counts")
        .json()
        .await
        .expect("json");
    assert_eq!(over_http, counts);
    let before = proxy.counts();
    call(&proxy, GET_ITEM).await.expect("answer");
    assert_eq!(proxy.counts().since(&before).total(), 1);
    let reset = reqwest::Client::new()
        .post(format!("{}/__reset", proxy.url()))
        .send()
        .await
        .expect("reset");
    assert_eq!(reset.status(), 200);
    assert_eq!(proxy.counts().total(), 0);
}

/// A caller that hangs up while its request is at the upstream may still have had it
/// applied there: the proxy counts it once, as `caller_gone`, not never.
#[tokio::test]
async fn a_request_whose_caller_hung_up_before_its_answer_is_counted_as_caller_gone() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .expect("a client");
    let answer = impatient
        .post(format!("{}/slow", proxy.url()))
        .header("x-amz-target", TRANSACT)
        .body(r#"{"TableName":"t"}"#)
        .send()
        .await;
    assert!(answer.is_err_and(|error| error.is_timeout()));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while proxy.counts().total() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let counts = proxy.counts();
    assert_eq!(counts.total(), 1, "{counts:?}");
    assert_eq!(counts.operations[TRANSACT].by_outcome["caller_gone"], 1);
    assert_eq!(upstream.hits(), 0, "/slow is not the counting route");
}

#[tokio::test]
async fn a_throttle_rule_answers_the_service_throttle_without_forwarding_in_its_window() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy.set_faults(vec![FaultRule {
        operation: TRANSACT.to_owned(),
        fault: Fault::Throttle,
        skip: 1,
        times: Some(2),
        every: None,
    }]);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let answer = call(&proxy, TRANSACT).await.expect("an answer");
        let status = answer.status().as_u16();
        if status == 400 {
            let body: Value = answer.json().await.expect("json");
            assert_eq!(
                body["__type"],
                "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
            );
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 400, 400, 200]);
    // Other operations are untouched.
    assert_eq!(call(&proxy, GET_ITEM).await.expect("answer").status(), 200);
    assert_eq!(upstream.hits(), 3);
    let transact = &proxy.counts().operations[TRANSACT];
    assert_eq!((transact.total, transact.faults), (4, 2));
    assert_eq!(transact.by_outcome["400"], 2);
    assert_eq!(transact.by_outcome["200"], 2);
}

#[tokio::test]
async fn a_server_error_rule_set_over_http_answers_500_until_cleared() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    let http = reqwest::Client::new();
    let set = http
        .put(format!("{}/__faults", proxy.url()))
        .json(&json!([{ "operation": "*", "fault": { "kind": "server_error" } }]))
        .send()
        .await
        .expect("set");
    assert_eq!(set.status(), 200);
    for target in [SEND, GET_ITEM] {
        let answer = call(&proxy, target).await.expect("an answer");
        assert_eq!(answer.status(), 500);
    }
    assert_eq!(upstream.hits(), 0);
    let bad = http
        .put(format!("{}/__faults", proxy.url()))
        .body("[{\"operation\": 1}]")
        .send()
        .await
        .expect("answer");
    assert_eq!(bad.status(), 400, "a malformed rule is refused");
    http.delete(format!("{}/__faults", proxy.url()))
        .send()
        .await
        .expect("clear");
    assert_eq!(call(&proxy, SEND).await.expect("answer").status(), 200);
    assert_eq!(upstream.hits(), 1);
}

#[tokio::test]
async fn a_reset_never_reaches_the_upstream_and_a_drop_after_commit_does() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy.set_faults(vec![FaultRule::always(SEND, Fault::ConnectionReset)]);
    assert!(call(&proxy, SEND).await.is_err(), "no answer after a reset");
    assert_eq!(upstream.hits(), 0);

    proxy.set_faults(vec![FaultRule::always(TRANSACT, Fault::CommitThenDrop)]);
    assert!(
        call(&proxy, TRANSACT).await.is_err(),
        "no answer after a drop"
    );
    assert_eq!(upstream.hits(), 1, "the upstream acted on it");
    let counts = proxy.counts();
    assert_eq!(counts.operations[SEND].by_outcome["reset"], 1);
    assert_eq!(
        counts.operations[TRANSACT].by_outcome["dropped_after_commit"],
        1
    );
}

#[tokio::test]
async fn the_sdk_sees_an_injected_throttle_as_a_throttling_error_and_retries_it() {
    use aws_sdk_dynamodb::config::retry::RetryConfig;
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;

    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy.set_faults(vec![FaultRule::always(GET_ITEM, Fault::Throttle)]);
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .endpoint_url(proxy.url())
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(std::time::Duration::from_millis(1)),
        )
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let error = client
        .get_item()
        .table_name("t")
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("k".to_owned()),
        )
        .send()
        .await
        .expect_err("every attempt is throttled");
    assert_eq!(
        error.code(),
        Some("ProvisionedThroughputExceededException"),
        "{error:?}"
    );
    assert_eq!(proxy.counts().of(GET_ITEM), 3, "the SDK retried a throttle");
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn an_every_rule_faults_each_nth_request_after_the_skip_up_to_its_limit() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy.set_faults(vec![FaultRule {
        skip: 1,
        times: Some(2),
        ..FaultRule::every(SEND, Fault::ServerError, 3)
    }]);
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(
            call(&proxy, SEND)
                .await
                .expect("an answer")
                .status()
                .as_u16(),
        );
    }
    // Skip one, then the 3rd and 6th after it fault; the limit of two is then reached.
    assert_eq!(statuses, [200, 200, 200, 500, 200, 200, 500, 200, 200, 200]);
    let send = &proxy.counts().operations[SEND];
    assert_eq!((send.total, send.faults), (10, 2));
}
