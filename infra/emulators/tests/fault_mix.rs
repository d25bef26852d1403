//! The proxy's seeded fault mix: its rates over a few thousand requests, the same
//! sequence of draws for the same seed, and a 500 after the commit that really applied
//! the write (against DynamoDB Local, with the SDK).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use flashsale_emulators::proxy::{Fault, FaultMix, FaultRule, InvalidMix, MixDraw, Proxy};
use serde_json::{Value, json};
use support::{Upstream, dynamodb_through};

const GET_ITEM: &str = "DynamoDB_20120810.GetItem";
const PUT_ITEM: &str = "DynamoDB_20120810.PutItem";

/// An upstream that answers 200 to everything, and counts.
async fn upstream() -> Upstream {
    Upstream::serve(|hits| {
        axum::Router::new().fallback(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            async { "{}" }
        })
    })
    .await
}

async fn call(http: &reqwest::Client, proxy: &Proxy, target: &str) -> (u16, Duration) {
    let started = Instant::now();
    let answer = http
        .post(format!("{}/", proxy.url()))
        .header("x-amz-target", target)
        .header("content-type", "application/x-amz-json-1.0")
        .body(r#"{"TableName":"t"}"#)
        .send()
        .await
        .expect("an answer");
    (answer.status().as_u16(), started.elapsed())
}

/// The mix of issue 52's surges, with short delays so that thousands of requests take
/// seconds.
fn issue_52_mix(seed: u64) -> FaultMix {
    FaultMix {
        server_error: 0.05,
        commit_then_server_error: 0.05,
        throttle: 0.05,
        delay: 0.10,
        delay_ms: 1..=3,
        ..FaultMix::seeded(seed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_injects_each_kind_near_its_rate() {
    const REQUESTS: u64 = 4000;
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy
        .set_fault_mix(Some(issue_52_mix(52)))
        .expect("a valid mix");
    let proxy = Arc::new(proxy);
    // Sixteen callers at once, as the stack's functions call.
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let proxy = Arc::clone(&proxy);
        callers.spawn(async move {
            let http = reqwest::Client::new();
            let mut statuses = Vec::new();
            for _ in 0..REQUESTS / 16 {
                statuses.push(call(&http, &proxy, GET_ITEM).await.0);
            }
            statuses
        });
    }
    let statuses: Vec<u16> = callers.join_all().await.concat();
    let answered = statuses.iter().fold(BTreeMap::new(), |mut tally, status| {
        *tally.entry(*status).or_insert(0_u64) += 1;
        tally
    });
    let counts = proxy.counts();
    let kinds = counts.faults_by_kind();
    let kind = |name: &str| kinds.get(name).copied().unwrap_or(0);
    eprintln!("{REQUESTS} requests: answered {answered:?}, faults {kinds:?}");
    // 5 % of 4,000 is 200 (a standard deviation of 14), 10 % is 400 (19): within about
    // four deviations.
    for (name, expected) in [
        ("server_error", 200),
        ("commit_then_server_error", 200),
        ("throttle", 200),
        ("delay", 400),
    ] {
        let seen = kind(name);
        let margin = expected / 4 + 10;
        assert!(
            seen.abs_diff(expected) <= margin,
            "{name}: {seen} of {REQUESTS}, expected about {expected}: {kinds:?}"
        );
    }
    // Each kind does what it says: 500s before and after forwarding, throttles as 400,
    // a delayed request forwarded and answered by the upstream.
    let op = &counts.operations[GET_ITEM];
    assert_eq!(op.total, REQUESTS);
    assert_eq!(op.by_outcome["500"], kind("server_error"));
    assert_eq!(
        op.by_outcome["500_after_commit"],
        kind("commit_then_server_error")
    );
    assert_eq!(op.by_outcome["400"], kind("throttle"));
    assert_eq!(
        op.faults,
        kind("server_error") + kind("commit_then_server_error") + kind("throttle"),
        "a delay is not a fault that answers"
    );
    assert_eq!(
        answered[&500],
        kind("server_error") + kind("commit_then_server_error")
    );
    assert_eq!(answered[&400], kind("throttle"));
    assert_eq!(
        upstream.hits(),
        REQUESTS - kind("server_error") - kind("throttle"),
        "everything but a 500 before forwarding and a throttle reached the upstream"
    );
    assert_eq!(proxy.fault_mix().map(|(_, drawn)| drawn), Some(REQUESTS));
}

/// Issue 48's surges add connections closed without an answer: before forwarding (a
/// reset) and after the upstream acted (a write whose caller hears nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_closes_connections_before_and_after_forwarding_near_their_rates() {
    const REQUESTS: u64 = 2000;
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    proxy
        .set_fault_mix(Some(FaultMix {
            connection_reset: 0.05,
            commit_then_drop: 0.05,
            ..FaultMix::seeded(48)
        }))
        .expect("a valid mix");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client");
    let mut unanswered = 0_u64;
    for _ in 0..REQUESTS {
        let answer = http
            .post(format!("{}/", proxy.url()))
            .header("x-amz-target", GET_ITEM)
            .header("content-type", "application/x-amz-json-1.0")
            .body(r#"{"TableName":"t"}"#)
            .send()
            .await;
        if answer.is_err() {
            unanswered += 1;
        }
    }
    let kinds = proxy.counts().faults_by_kind();
    let kind = |name: &str| kinds.get(name).copied().unwrap_or(0);
    // 5 % of 2,000 is 100 (a standard deviation of about 10).
    for name in ["connection_reset", "commit_then_drop"] {
        assert!(
            kind(name).abs_diff(100) <= 40,
            "{name}: {} of {REQUESTS}: {kinds:?}",
            kind(name)
        );
    }
    assert_eq!(
        unanswered,
        kind("connection_reset") + kind("commit_then_drop"),
        "each closed connection is a request without an answer"
    );
    assert_eq!(
        upstream.hits(),
        REQUESTS - kind("connection_reset"),
        "a reset is not forwarded; a drop after the commit is"
    );
}

#[tokio::test]
async fn the_same_seed_gives_the_same_draws_and_the_proxy_plays_them_in_order() {
    let mix = FaultMix {
        delay_ms: 40..=60,
        ..issue_52_mix(7)
    };
    let predicted: Vec<MixDraw> = mix.draws().take(200).collect();
    assert_eq!(predicted, mix.draws().take(200).collect::<Vec<_>>());
    assert_ne!(
        predicted,
        issue_52_mix(8)
            .draws()
            .map(|draw| match draw {
                MixDraw::Delay(_) => MixDraw::Delay(Duration::ZERO),
                other => other,
            })
            .take(200)
            .collect::<Vec<_>>(),
        "another seed, another sequence"
    );
    for draw in &predicted {
        if let MixDraw::Delay(delay) = draw {
            assert!((40..=60).contains(&delay.as_millis()), "{delay:?}");
        }
    }

    // One request at a time, so the n-th request gets the n-th draw; twice, the second
    // time from the start of the sequence again.
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    let http = reqwest::Client::new();
    let mut runs = Vec::new();
    for _ in 0..2 {
        proxy.set_fault_mix(Some(mix.clone())).expect("a valid mix");
        let mut statuses = Vec::new();
        for draw in &predicted {
            let (status, took) = call(&http, &proxy, GET_ITEM).await;
            let expected = match draw {
                MixDraw::ServerError | MixDraw::CommitThenServerError => 500,
                MixDraw::Throttle => 400,
                MixDraw::Pass | MixDraw::Delay(_) => 200,
                MixDraw::ConnectionReset | MixDraw::CommitThenDrop => {
                    unreachable!("issue 52's mix closes no connection")
                }
            };
            assert_eq!(status, expected, "{draw:?}");
            if let MixDraw::Delay(delay) = draw {
                assert!(took >= *delay, "{draw:?} answered after {took:?}");
            }
            statuses.push(status);
        }
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    let delays = predicted
        .iter()
        .filter(|draw| matches!(draw, MixDraw::Delay(_)))
        .count();
    assert!(delays > 0, "200 draws at 10 % hold a delay");
    assert_eq!(
        proxy.counts().faults_by_kind().get("delay").copied(),
        Some(2 * u64::try_from(delays).expect("small"))
    );
}

#[tokio::test]
async fn a_rule_that_faults_wins_over_the_mix_and_the_mix_filters_by_operation() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    let http = reqwest::Client::new();
    proxy
        .set_fault_mix(Some(FaultMix {
            operation: PUT_ITEM.to_owned(),
            server_error: 1.0,
            ..FaultMix::seeded(1)
        }))
        .expect("a valid mix");
    assert_eq!(call(&http, &proxy, GET_ITEM).await.0, 200, "not the mix's");
    assert_eq!(call(&http, &proxy, PUT_ITEM).await.0, 500);
    proxy.set_faults(vec![FaultRule::always(PUT_ITEM, Fault::Throttle)]);
    assert_eq!(call(&http, &proxy, PUT_ITEM).await.0, 400, "the rule's");
    let kinds = proxy.counts().faults_by_kind();
    assert_eq!(kinds["server_error"], 1);
    assert_eq!(kinds["throttle"], 1);
    proxy.set_fault_mix(None).expect("no mix");
    proxy.set_faults(Vec::new());
    assert_eq!(call(&http, &proxy, PUT_ITEM).await.0, 200);
}

#[tokio::test]
async fn a_mix_is_set_and_cleared_over_http_and_a_bad_one_is_refused() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&upstream.url, 0).await.expect("proxy");
    let http = reqwest::Client::new();
    let set = http
        .put(format!("{}/__mix", proxy.url()))
        .json(&json!({"seed": 3, "throttle": 1.0}))
        .send()
        .await
        .expect("set");
    assert_eq!(set.status(), 200);
    let answer: Value = set.json().await.expect("json");
    assert_eq!(answer["mix"]["operation"], "*");
    assert_eq!(call(&http, &proxy, GET_ITEM).await.0, 400);
    let read: Value = http
        .get(format!("{}/__mix", proxy.url()))
        .send()
        .await
        .expect("read")
        .json()
        .await
        .expect("json");
    assert_eq!(read["drawn"], 1);
    for bad in [
        json!({"seed": 3, "throttle": 1.5}),
        json!({"seed": 3, "throttle": 0.6, "server_error": 0.6}),
        json!({"seed": 3, "delay": 0.1, "delay_ms": {"start": 9, "end": 1}}),
        json!({"throttle": 0.1}),
    ] {
        let refused = http
            .put(format!("{}/__mix", proxy.url()))
            .json(&bad)
            .send()
            .await
            .expect("answer");
        assert_eq!(refused.status(), 400, "{bad}");
    }
    assert_eq!(
        proxy.set_fault_mix(Some(FaultMix {
            delay: -0.1,
            ..FaultMix::seeded(1)
        })),
        Err(InvalidMix::Probability("delay", -0.1))
    );
    let cleared = http
        .delete(format!("{}/__mix", proxy.url()))
        .send()
        .await
        .expect("clear");
    assert_eq!(cleared.status(), 200);
    assert_eq!(call(&http, &proxy, GET_ITEM).await.0, 200);
    assert!(proxy.fault_mix().is_none());
}

/// The write is applied and its caller told 500: read straight from DynamoDB Local, the
/// item is there. (This is the answer the SDK retries; the retry of a conditional
/// write then meets its own first attempt.)
#[tokio::test]
async fn a_commit_then_server_error_applies_the_write() {
    let emulators = flashsale_emulators::shared().await;
    let proxy = Proxy::start(&emulators.dynamodb_endpoint, 0)
        .await
        .expect("a proxy starts");
    let through = dynamodb_through(&proxy, emulators).await;
    let direct = aws_sdk_dynamodb::Client::new(&emulators.sdk_config().await);
    let table = format!("mix-{}", flashsale_emulators::unique_suffix());
    direct
        .create_table()
        .table_name(&table)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .expect("a key"),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("an attribute"),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("CreateTable");
    proxy
        .set_fault_mix(Some(FaultMix {
            operation: PUT_ITEM.to_owned(),
            commit_then_server_error: 1.0,
            ..FaultMix::seeded(52)
        }))
        .expect("a valid mix");
    let put = || {
        through
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S("unit".to_owned()))
            .item("v", AttributeValue::S("taken".to_owned()))
            .condition_expression("attribute_not_exists(pk)")
            .send()
    };
    let error = put().await.expect_err("told it failed");
    assert_eq!(error.code(), Some("InternalServerError"), "{error:?}");
    let found = direct
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("unit".to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem");
    assert_eq!(
        found
            .item()
            .and_then(|item| item.get("v"))
            .and_then(|v| v.as_s().ok())
            .map(String::as_str),
        Some("taken"),
        "the write was applied"
    );
    // Its resend meets the write it made: the condition refuses it.
    proxy.set_fault_mix(None).expect("no mix");
    let resent = put().await.expect_err("the condition refuses the resend");
    assert_eq!(resent.code(), Some("ConditionalCheckFailedException"));
    let op = &proxy.counts().operations[PUT_ITEM];
    assert_eq!(op.by_outcome["500_after_commit"], 1);
    assert_eq!(op.by_fault["commit_then_server_error"], 1);
    assert_eq!(op.by_outcome["400"], 1);
}
