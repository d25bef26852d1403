//! Races the design must settle with DynamoDB conditions alone: pay against the timeout,
//! a release delivered twice, a queue message delivered twice.

mod common;

use std::time::Duration;

use common::Harness;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

const CONSUMER_LAG: Duration = Duration::from_secs(30);

/// Invokes the release function as Lambda's asynchronous retries would: an error (a
/// busy table under the test's load, or a deadline not quite reached) is tried again.
async fn release(harness: &Harness, timer: &Value) -> Value {
    let mut tries = 0;
    loop {
        match harness
            .stack
            .lambda()
            .invoke("ReleaseFunction", timer.clone())
            .await
        {
            Ok(outcome) => return outcome,
            Err(error) if tries < 10 => {
                eprintln!("release failed, retrying: {error}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("release kept failing: {error}"),
        }
    }
}

/// Grabs one unit per buyer and waits until the consumer has opened every order.
async fn open_orders(
    harness: &Harness,
    sale_id: &str,
    buyers: usize,
) -> Vec<(String, String, chrono::DateTime<chrono::Utc>)> {
    let grabs = (0..buyers).map(|n| async move {
        let user = harness.user(&format!("{sale_id}-buyer-{n}"));
        let (order_id, expires_at) = harness.grab_ok(&user, sale_id).await;
        (user, order_id, expires_at)
    });
    let orders = join_all(grabs).await;
    for (user, order_id, _) in &orders {
        harness
            .wait_for_status(user, order_id, "pending_payment", CONSUMER_LAG)
            .await;
    }
    orders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pay_against_the_timeout_has_exactly_one_winner_every_time() {
    const ORDERS: usize = 100;
    let harness = Harness::start("pay-race").await;
    // A window long enough to open all orders first; they share one deadline second.
    harness.active_sale("pay-race", ORDERS as u32, 4, 15).await;
    let orders = open_orders(&harness, "pay-race", ORDERS).await;
    let mut timers = Vec::new();
    for (_, order_id, _) in &orders {
        timers.push(
            harness
                .release_timer_input(order_id)
                .await
                .expect("a timer per order"),
        );
    }

    // Around each order's deadline its owner pays, some a little before and some a
    // little after, while its timer fires right at it (the Scheduler emulation fires it
    // too): three contenders for one hold, in flight together.
    let races =
        orders
            .iter()
            .zip(timers)
            .enumerate()
            .map(|(n, ((user, order_id, expires_at), timer))| {
                let harness = &harness;
                async move {
                    let offset =
                        chrono::Duration::milliseconds(i64::try_from(n % 21).unwrap() * 5 - 50);
                    let pay_at = *expires_at + offset;
                    let pay = async {
                        tokio::time::sleep(
                            (pay_at - chrono::Utc::now()).to_std().unwrap_or_default(),
                        )
                        .await;
                        harness.api.pay(user, order_id).await.expect("pay answers")
                    };
                    let fire = async {
                        tokio::time::sleep(
                            (*expires_at - chrono::Utc::now())
                                .to_std()
                                .unwrap_or_default(),
                        )
                        .await;
                        release(harness, &timer).await
                    };
                    let (paid, released) = tokio::join!(pay, fire);
                    (user, order_id, paid, released)
                }
            });
    let outcomes = join_all(races).await;

    let (mut paid_wins, mut timeout_wins) = (0, 0);
    for (user, order_id, paid, released) in outcomes {
        let final_status = harness.order_status(user, order_id).await;
        match paid.status {
            StatusCode::OK => {
                paid_wins += 1;
                assert_eq!(final_status, "paid", "pay said paid");
                assert_ne!(released["outcome"], json!("released"));
            }
            StatusCode::CONFLICT => {
                timeout_wins += 1;
                assert_eq!(paid.error_code(), Some("order_expired"), "{}", paid.body);
                // A refused pay settles the order before it answers (the timer, or pay
                // itself releasing a hold whose window closed), so this is not a lag.
                assert_eq!(final_status, "expired", "pay said expired");
            }
            other => panic!("pay answered {other}: {}", paid.body),
        }
    }
    eprintln!("pay vs timeout, {ORDERS} races: pay won {paid_wins}, timeout won {timeout_wins}");
    assert_eq!(paid_wins + timeout_wins, ORDERS);

    let stats = harness.stats("pay-race").await;
    assert_eq!(stats["paid"], paid_wins, "{stats}");
    assert_eq!(stats["expired"], timeout_wins, "{stats}");
    assert_eq!(
        stats["available"], timeout_wins,
        "each expired unit came back once: {stats}"
    );
    assert_eq!(stats["consistent"], true, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_delivered_twice_returns_the_unit_once() {
    let harness = Harness::start("release-twice").await;
    harness.active_sale("release-twice", 2, 1, 2).await;
    let orders = open_orders(&harness, "release-twice", 1).await;
    let (user, order_id, expires_at) = &orders[0];
    let timer = harness
        .release_timer_input(order_id)
        .await
        .expect("a timer");

    let until_due = (*expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until_due).await;
    let (first, second) = tokio::join!(release(&harness, &timer), release(&harness, &timer));
    let outcomes: Vec<Value> = [first, second]
        .into_iter()
        .map(|outcome| outcome["outcome"].clone())
        .collect();
    // At most one of them released (the Scheduler emulation may have beaten both).
    let released = outcomes
        .iter()
        .filter(|outcome| **outcome == "released")
        .count();
    assert!(released <= 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|outcome| *outcome == "released" || *outcome == "already_settled"),
        "{outcomes:?}"
    );
    assert_eq!(harness.order_status(user, order_id).await, "expired");
    assert_eq!(harness.shard_availability("release-twice", 1).await, [2]);
    let stats = harness.stats("release-twice").await;
    assert_eq!(
        (stats["expired"].as_u64(), stats["available"].as_u64()),
        (Some(1), Some(2)),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_handed_the_same_record_twice_creates_one_order_and_one_timer() {
    let harness = Harness::start("consume-twice").await;
    harness.active_sale("consume-twice", 5, 1, 900).await;
    let orders = open_orders(&harness, "consume-twice", 1).await;
    let (user, order_id, _) = &orders[0];
    let reservation = harness
        .release_timer_input(order_id)
        .await
        .expect("a timer");
    let items_before = harness.item_count().await;

    let record = |message_id: &str| {
        json!({
            "messageId": message_id,
            "receiptHandle": format!("handle-{message_id}"),
            "body": reservation.to_string(),
            "attributes": {
                "ApproximateReceiveCount": "2",
                "SentTimestamp": "1764400000000",
                "MessageGroupId": order_id,
                "MessageDeduplicationId": order_id,
                "SequenceNumber": "18890000000000000001",
            },
            "messageAttributes": {},
            "md5OfBody": "",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders.fifo",
            "awsRegion": "us-east-1",
        })
    };
    let event = json!({ "Records": [record("m-1"), record("m-2")] });
    let answer = harness
        .stack
        .lambda()
        .invoke("OrderConsumerFunction", event)
        .await
        .expect("the consumer answers");
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");

    assert_eq!(
        harness.order_status(user, order_id).await,
        "pending_payment"
    );
    assert_eq!(
        harness.item_count().await,
        items_before,
        "no second order item"
    );
    assert_eq!(
        harness.timers_in_group().await,
        1,
        "one timer for the one order"
    );
}
