use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use flashsale_local::{LocalStack, function_fn};
use serde_json::{Value, json};

use crate::{Recorder, eventually, options, start};

/// A consumer that reports as failed every record whose body starts with "fail", and
/// "fail-once" records only on their first delivery.
fn consumer(recorder: Recorder) -> std::sync::Arc<dyn flashsale_local::LambdaFunction> {
    function_fn(move |event: Value| {
        let recorder = recorder.clone();
        async move {
            recorder.record(&event);
            let parsed: SqsEvent = serde_json::from_value(event)?;
            let failures: Vec<Value> = parsed
                .records
                .iter()
                .filter(|r| {
                    let body = r.body.as_deref().unwrap_or_default();
                    let first = r
                        .attributes
                        .get("ApproximateReceiveCount")
                        .map(String::as_str)
                        == Some("1");
                    body.starts_with("fail-always") || (body.starts_with("fail-once") && first)
                })
                .map(|r| json!({"itemIdentifier": r.message_id}))
                .collect();
            Ok(json!({"batchItemFailures": failures}))
        }
    })
}

/// Every (body, ApproximateReceiveCount) the consumer was handed, in order.
fn deliveries(recorder: &Recorder) -> Vec<(String, String)> {
    recorder
        .snapshot()
        .iter()
        .flat_map(|(_, event)| event["Records"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["body"].as_str().unwrap_or_default().to_owned(),
                r["attributes"]["ApproximateReceiveCount"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

async fn send_batch(stack: &LocalStack, bodies: &[&str]) {
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk_config);
    let entries = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(*body)
                .message_group_id(format!("group-{body}"))
                .message_deduplication_id(format!("dedup-{body}"))
                .build()
                .expect("entry")
        })
        .collect();
    let out = sqs
        .send_message_batch()
        .queue_url(stack.queue_url("OrdersQueue").expect("orders queue"))
        .set_entries(Some(entries))
        .send()
        .await
        .expect("SendMessageBatch");
    assert!(out.failed().is_empty(), "{:?}", out.failed());
}

async fn messages_left(stack: &LocalStack, logical_id: &str) -> u64 {
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk_config);
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(stack.queue_url(logical_id).expect("queue"))
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default();
    [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
    ]
    .iter()
    .map(|k| {
        attributes
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    })
    .sum()
}

#[tokio::test]
async fn a_batch_with_one_failed_record_deletes_the_others_and_redelivers_the_failed_one() {
    let recorder = Recorder::default();
    let stack = start(
        options("esm-partial")
            .parameter("OrdersVisibilityTimeout", "1")
            .function("OrderConsumerFunction", consumer(recorder.clone())),
    )
    .await;
    send_batch(&stack, &["ok-1", "fail-once-2", "ok-3"]).await;

    eventually(
        Duration::from_secs(20),
        "the failed record's redelivery",
        || {
            deliveries(&recorder)
                .iter()
                .any(|(body, count)| body == "fail-once-2" && count == "2")
        },
    )
    .await;
    // SQS may answer a receive with fewer messages than are waiting (AWS's does too),
    // so how the three share invocations is not fixed; no invocation may exceed the
    // template's batch size, and every record is handed over.
    let invocations = recorder.snapshot();
    let batch_size = stack
        .model
        .function("OrderConsumerFunction")
        .and_then(|function| function.sqs_sources.first())
        .map(|source| usize::try_from(source.batch_size).expect("a positive batch size"))
        .expect("the consumer's SQS event");
    for (_, event) in &invocations {
        let records = event["Records"].as_array().map_or(0, Vec::len);
        assert!(
            (1..=batch_size).contains(&records),
            "{records} records in one invocation"
        );
    }
    let first = &invocations[0].1;
    let record = &first["Records"][0];
    assert_eq!(record["eventSource"], "aws:sqs");
    assert_eq!(record["awsRegion"], "us-east-1");
    assert_eq!(
        record["eventSourceARN"].as_str(),
        Some(
            stack
                .model
                .queue("OrdersQueue")
                .expect("queue")
                .arn
                .as_str()
        )
    );
    assert!(record["attributes"]["MessageGroupId"].is_string());
    assert!(record["attributes"]["SentTimestamp"].is_string());
    assert!(record["receiptHandle"].is_string());

    // Two more visibility timeouts: the successes must not come back.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut seen = deliveries(&recorder);
    seen.sort();
    assert_eq!(
        seen,
        [
            ("fail-once-2".to_owned(), "1".to_owned()),
            ("fail-once-2".to_owned(), "2".to_owned()),
            ("ok-1".to_owned(), "1".to_owned()),
            ("ok-3".to_owned(), "1".to_owned()),
        ]
    );
    assert_eq!(
        messages_left(&stack, "OrdersQueue").await,
        0,
        "processed records are deleted"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_record_that_always_fails_ends_in_the_dead_letter_queue() {
    let recorder = Recorder::default();
    let stack = start(
        options("esm-dlq")
            .parameter("OrdersVisibilityTimeout", "1")
            .function("OrderConsumerFunction", consumer(recorder.clone())),
    )
    .await;
    send_batch(&stack, &["fail-always-poison"]).await;

    let sqs = aws_sdk_sqs::Client::new(&stack.sdk_config);
    let dlq = stack.queue_url("OrdersDLQ").expect("dlq").to_owned();
    let mut parked = None;
    let started = std::time::Instant::now();
    while parked.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the record never reached the DLQ"
        );
        let out = sqs
            .receive_message()
            .queue_url(&dlq)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage on the DLQ");
        parked = out.messages.unwrap_or_default().into_iter().next();
    }
    assert_eq!(
        parked.and_then(|m| m.body),
        Some("fail-always-poison".to_owned())
    );
    let counts: Vec<String> = deliveries(&recorder)
        .into_iter()
        .map(|(_, count)| count)
        .collect();
    assert_eq!(
        counts,
        ["1", "2", "3", "4", "5"],
        "delivered maxReceiveCount times, then redriven"
    );
    assert_eq!(messages_left(&stack, "OrdersQueue").await, 0);
    stack.shutdown().await;
}
