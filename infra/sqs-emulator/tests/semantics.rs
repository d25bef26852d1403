//! AWS's SQS semantics, checked through the real aws-sdk-sqs client against the emulator.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Region};
use aws_sdk_sqs::types::{
    Message, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use flashsale_sqs_emulator::SqsEmulator;

/// A long poll that must not wait this long to count as woken.
const WAIT_SECONDS: i32 = 20;

fn client(emulator: &SqsEmulator) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(emulator.endpoint())
        .build();
    Client::from_conf(config)
}

fn emulator() -> SqsEmulator {
    SqsEmulator::start(0).expect("the emulator starts on a free port")
}

async fn queue(client: &Client, name: &str, attributes: &[(QueueAttributeName, &str)]) -> String {
    let mut request = client.create_queue().queue_name(name);
    for (key, value) in attributes {
        request = request.attributes(key.clone(), *value);
    }
    request
        .send()
        .await
        .expect("CreateQueue")
        .queue_url
        .expect("a queue url")
}

async fn fifo(client: &Client, name: &str) -> String {
    queue(client, name, &[(QueueAttributeName::FifoQueue, "true")]).await
}

async fn send(client: &Client, url: &str, body: &str, group: &str) -> String {
    client
        .send_message()
        .queue_url(url)
        .message_body(body)
        .message_group_id(group)
        .message_deduplication_id(body)
        .send()
        .await
        .expect("SendMessage")
        .message_id
        .expect("a message id")
}

async fn receive(client: &Client, url: &str, max: i32, visibility: i32, wait: i32) -> Vec<Message> {
    client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(max)
        .visibility_timeout(visibility)
        .wait_time_seconds(wait)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .expect("ReceiveMessage")
        .messages
        .unwrap_or_default()
}

fn bodies(messages: &[Message]) -> Vec<&str> {
    messages.iter().filter_map(Message::body).collect()
}

fn attribute(message: &Message, name: MessageSystemAttributeName) -> Option<&str> {
    message
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .map(String::as_str)
}

async fn delete(client: &Client, url: &str, message: &Message) {
    client
        .delete_message()
        .queue_url(url)
        .receipt_handle(message.receipt_handle().expect("a receipt handle"))
        .send()
        .await
        .expect("DeleteMessage");
}

async fn counts(client: &Client, url: &str) -> (u64, u64) {
    let attributes: HashMap<QueueAttributeName, String> = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default();
    let count = |name| {
        attributes
            .get(&name)
            .and_then(|value| value.parse().ok())
            .expect("a count")
    };
    (
        count(QueueAttributeName::ApproximateNumberOfMessages),
        count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Receives (long polling) until a message arrives or `within` passes.
async fn next_message(client: &Client, url: &str, within: Duration) -> Option<Message> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(message) = receive(client, url, 1, 30, 1).await.into_iter().next() {
            return Some(message);
        }
    }
    None
}

#[tokio::test]
async fn a_fifo_group_delivers_in_order_and_waits_while_one_of_its_messages_is_in_flight() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = fifo(&client, "orders.fifo").await;
    for body in ["a1", "a2", "a3"] {
        send(&client, &url, body, "a").await;
    }
    send(&client, &url, "b1", "b").await;

    let first = receive(&client, &url, 1, 30, 0).await;
    assert_eq!(bodies(&first), ["a1"]);
    let others = receive(&client, &url, 10, 30, 0).await;
    assert_eq!(
        bodies(&others),
        ["b1"],
        "group a is held while a1 is in flight"
    );
    assert!(receive(&client, &url, 10, 30, 0).await.is_empty());
    assert_eq!(counts(&client, &url).await, (2, 2));

    delete(&client, &url, &first[0]).await;
    let rest = receive(&client, &url, 10, 30, 0).await;
    assert_eq!(
        bodies(&rest),
        ["a2", "a3"],
        "the group goes on in send order"
    );
    let sequence: Vec<u128> = first
        .iter()
        .chain(&rest)
        .map(|m| {
            attribute(m, MessageSystemAttributeName::SequenceNumber)
                .expect("a sequence number")
                .parse()
                .expect("a number")
        })
        .collect();
    assert!(
        sequence.windows(2).all(|pair| pair[0] < pair[1]),
        "{sequence:?}"
    );
    assert_eq!(
        attribute(&rest[0], MessageSystemAttributeName::MessageGroupId),
        Some("a")
    );
}

#[tokio::test]
async fn a_deduplication_id_seen_within_five_minutes_returns_the_first_message_id() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = fifo(&client, "dedup.fifo").await;
    let first = send(&client, &url, "order-1", "g1").await;
    let again = send(&client, &url, "order-1", "g2").await;
    assert_eq!(first, again);
    assert_eq!(counts(&client, &url).await, (1, 0));

    // Still within the window after the message is gone.
    let received = receive(&client, &url, 10, 30, 0).await;
    delete(&client, &url, &received[0]).await;
    assert_eq!(send(&client, &url, "order-1", "g1").await, first);
    assert_eq!(counts(&client, &url).await, (0, 0));

    let missing = client
        .send_message()
        .queue_url(&url)
        .message_body("no dedup id")
        .message_group_id("g")
        .send()
        .await
        .expect_err("a FIFO queue without content-based deduplication needs an id");
    assert_eq!(
        missing.as_service_error().and_then(|e| {
            use aws_sdk_sqs::error::ProvideErrorMetadata as _;
            e.code()
        }),
        Some("InvalidParameterValue")
    );
}

#[tokio::test]
async fn content_based_deduplication_keys_on_the_body() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = queue(
        &client,
        "content.fifo",
        &[
            (QueueAttributeName::FifoQueue, "true"),
            (QueueAttributeName::ContentBasedDeduplication, "true"),
        ],
    )
    .await;
    let send_body = |body: &'static str| {
        let client = client.clone();
        let url = url.clone();
        async move {
            client
                .send_message()
                .queue_url(url)
                .message_body(body)
                .message_group_id("g")
                .send()
                .await
                .expect("SendMessage")
                .message_id
                .expect("an id")
        }
    };
    let first = send_body("same").await;
    assert_eq!(send_body("same").await, first);
    assert_ne!(send_body("other").await, first);
    let received = receive(&client, &url, 10, 30, 0).await;
    assert_eq!(bodies(&received), ["same", "other"]);
    // The id is the body's SHA-256, as AWS computes it.
    assert_eq!(
        attribute(
            &received[0],
            MessageSystemAttributeName::MessageDeduplicationId
        ),
        Some("0967115f2813a3541eaef77de9d9d5773f1c0c04314b0bbfe4ff3b3b1c55b5d5")
    );
}

#[tokio::test]
async fn a_message_not_deleted_comes_back_after_its_visibility_timeout_with_a_new_receipt() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = queue(&client, "plain", &[]).await;
    client
        .send_message()
        .queue_url(&url)
        .message_body("work")
        .send()
        .await
        .expect("send");

    let first = receive(&client, &url, 1, 1, 0).await;
    assert_eq!(bodies(&first), ["work"]);
    let again = next_message(&client, &url, Duration::from_secs(60))
        .await
        .expect("redelivered after the timeout");
    assert_eq!(again.message_id(), first[0].message_id());
    assert_ne!(again.receipt_handle(), first[0].receipt_handle());
    assert_eq!(
        attribute(&again, MessageSystemAttributeName::ApproximateReceiveCount),
        Some("2")
    );
    assert_eq!(
        attribute(
            &again,
            MessageSystemAttributeName::ApproximateFirstReceiveTimestamp
        ),
        attribute(
            &first[0],
            MessageSystemAttributeName::ApproximateFirstReceiveTimestamp
        ),
    );

    // The first receive's handle is stale: deleting with it succeeds and deletes nothing.
    delete(&client, &url, &first[0]).await;
    assert_eq!(counts(&client, &url).await, (0, 1));
    let stale = client
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(first[0].receipt_handle().expect("handle"))
        .visibility_timeout(0)
        .send()
        .await
        .expect_err("a stale handle cannot change visibility");
    assert!(stale.into_service_error().is_receipt_handle_is_invalid());

    // ChangeMessageVisibility to 0 hands it back at once.
    client
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(again.receipt_handle().expect("handle"))
        .visibility_timeout(0)
        .send()
        .await
        .expect("ChangeMessageVisibility");
    let third = receive(&client, &url, 1, 30, 0).await;
    assert_eq!(bodies(&third), ["work"]);
    delete(&client, &url, &third[0]).await;
    assert_eq!(counts(&client, &url).await, (0, 0));
    let gone = client
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(third[0].receipt_handle().expect("handle"))
        .visibility_timeout(10)
        .send()
        .await
        .expect_err("a deleted message is not in flight");
    assert!(gone.into_service_error().is_receipt_handle_is_invalid());
}

#[tokio::test]
async fn a_message_received_max_receive_count_times_moves_to_the_dead_letter_queue() {
    let emulator = emulator();
    let client = client(&emulator);
    let dlq = fifo(&client, "work-dlq.fifo").await;
    let dlq_arn = "arn:aws:sqs:us-east-1:123456789012:work-dlq.fifo";
    let url = queue(
        &client,
        "work.fifo",
        &[
            (QueueAttributeName::FifoQueue, "true"),
            (
                QueueAttributeName::RedrivePolicy,
                &format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"2"}}"#),
            ),
        ],
    )
    .await;
    send(&client, &url, "poison", "g").await;
    send(&client, &url, "next", "g").await;

    for round in 1..=2 {
        let got = receive(&client, &url, 1, 0, 0).await;
        assert_eq!(bodies(&got), ["poison"], "receive {round}");
        assert_eq!(
            attribute(&got[0], MessageSystemAttributeName::ApproximateReceiveCount),
            Some(round.to_string().as_str())
        );
    }
    // The third attempt moves it and goes on with the group.
    let after = receive(&client, &url, 1, 30, 0).await;
    assert_eq!(bodies(&after), ["next"]);
    let parked = receive(&client, &dlq, 10, 30, 0).await;
    assert_eq!(bodies(&parked), ["poison"]);
    assert_eq!(
        attribute(
            &parked[0],
            MessageSystemAttributeName::ApproximateReceiveCount
        ),
        Some("1")
    );
    assert_eq!(
        attribute(
            &parked[0],
            MessageSystemAttributeName::DeadLetterQueueSourceArn
        ),
        Some("arn:aws:sqs:us-east-1:123456789012:work.fifo")
    );
    assert_eq!(
        attribute(&parked[0], MessageSystemAttributeName::MessageGroupId),
        Some("g")
    );

    let policy = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .expect("attributes")
        .attributes
        .unwrap_or_default()
        .remove(&QueueAttributeName::RedrivePolicy)
        .expect("the policy");
    let policy: serde_json::Value = serde_json::from_str(&policy).expect("JSON");
    assert_eq!(policy["maxReceiveCount"], 2);
    assert_eq!(policy["deadLetterTargetArn"], dlq_arn);
}

#[tokio::test]
async fn a_redrive_policy_must_name_an_existing_queue_of_the_same_type() {
    let emulator = emulator();
    let client = client(&emulator);
    fifo(&client, "fifo-dlq.fifo").await;
    for target in ["nowhere.fifo", "fifo-dlq.fifo"] {
        let policy = format!(
            r#"{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:{target}","maxReceiveCount":3}}"#
        );
        let refused = client
            .create_queue()
            .queue_name("standard")
            .attributes(QueueAttributeName::RedrivePolicy, policy)
            .send()
            .await;
        assert!(refused.is_err(), "{target}");
    }
}

#[tokio::test]
async fn a_long_poll_returns_as_soon_as_a_message_is_sent() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = fifo(&client, "wake.fifo").await;
    let started = Instant::now();
    let poll = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { receive(&client, &url, 10, 30, WAIT_SECONDS).await }
    });
    tokio::task::yield_now().await;
    send(&client, &url, "hello", "g").await;
    let got = poll.await.expect("the poll");
    assert_eq!(bodies(&got), ["hello"]);
    // Not woken, it would have answered only at the end of its wait.
    assert!(
        started.elapsed() < Duration::from_secs(u64::try_from(WAIT_SECONDS).expect("positive") - 5),
        "the poll waited {:?}",
        started.elapsed()
    );
    // With nothing to deliver, a poll answers empty when its wait is over.
    assert!(receive(&client, &url, 10, 30, 1).await.is_empty());
}

#[tokio::test]
async fn message_attributes_travel_with_their_md5() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = queue(&client, "attributes", &[]).await;
    let reason = MessageAttributeValue::builder()
        .data_type("String")
        .string_value("bad body")
        .build()
        .expect("attribute");
    let sent = client
        .send_message()
        .queue_url(&url)
        .message_body("body")
        .message_attributes("REASON", reason)
        .send()
        .await
        .expect("send");
    // The MD5s of AWS's encodings, as its SDKs verify them.
    assert_eq!(
        sent.md5_of_message_body(),
        Some("841a2d689ad86bd1611447453c22c6fc")
    );
    assert_eq!(
        sent.md5_of_message_attributes(),
        Some("710a33329643268c4cc6e0d7269a398f")
    );
    let received = receive(&client, &url, 1, 30, 0).await;
    let message = &received[0];
    assert_eq!(message.md5_of_body(), sent.md5_of_message_body());
    assert_eq!(
        message.md5_of_message_attributes(),
        sent.md5_of_message_attributes()
    );
    assert_eq!(
        message
            .message_attributes()
            .and_then(|attributes| attributes.get("REASON"))
            .and_then(MessageAttributeValue::string_value),
        Some("bad body")
    );
}

#[tokio::test]
async fn errors_come_back_as_the_sdk_types_them() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = fifo(&client, "errors.fifo").await;

    let missing = client
        .send_message()
        .queue_url(url.replace("errors", "missing"))
        .message_body("x")
        .send()
        .await
        .expect_err("no such queue");
    assert!(missing.into_service_error().is_queue_does_not_exist());
    let missing = client
        .get_queue_url()
        .queue_name("missing")
        .send()
        .await
        .expect_err("no such queue");
    assert!(missing.into_service_error().is_queue_does_not_exist());

    let conflict = client
        .create_queue()
        .queue_name("errors.fifo")
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::VisibilityTimeout, "5")
        .send()
        .await
        .expect_err("the same name with other attributes");
    assert!(conflict.into_service_error().is_queue_name_exists());
    assert_eq!(
        fifo(&client, "errors.fifo").await,
        url,
        "the same attributes are idempotent"
    );

    for (name, fifo_queue) in [
        ("no-suffix", "true"),
        ("suffix-without-attribute.fifo", "false"),
        ("bad name", "false"),
    ] {
        let refused = client
            .create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::FifoQueue, fifo_queue)
            .send()
            .await;
        assert!(refused.is_err(), "{name}");
    }

    let no_group = client
        .send_message()
        .queue_url(&url)
        .message_body("x")
        .message_deduplication_id("x")
        .send()
        .await
        .expect_err("a FIFO message needs a group");
    assert!(format!("{:?}", no_group.into_service_error()).contains("MessageGroupId"));

    let out_of_range = client
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(11)
        .send()
        .await;
    assert!(out_of_range.is_err(), "MaxNumberOfMessages is 1 to 10");
}

#[tokio::test]
async fn a_batch_reports_each_entry_and_counts_follow_the_messages() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = fifo(&client, "batch.fifo").await;
    let entry = |id: &str, group: Option<&str>| {
        SendMessageBatchRequestEntry::builder()
            .id(id)
            .message_body(format!("body-{id}"))
            .set_message_group_id(group.map(str::to_owned))
            .message_deduplication_id(id)
            .build()
            .expect("entry")
    };
    let out = client
        .send_message_batch()
        .queue_url(&url)
        .entries(entry("one", Some("g")))
        .entries(entry("two", None))
        .entries(entry("three", Some("g")))
        .send()
        .await
        .expect("SendMessageBatch");
    let ok: Vec<&str> = out.successful().iter().map(|e| e.id()).collect();
    assert_eq!(ok, ["one", "three"]);
    assert_eq!(out.failed().len(), 1);
    assert_eq!(out.failed()[0].id(), "two");
    assert!(out.failed()[0].sender_fault());

    let received = receive(&client, &url, 10, 30, 0).await;
    assert_eq!(bodies(&received), ["body-one", "body-three"]);
    assert_eq!(counts(&client, &url).await, (0, 2));
    let deleted = client
        .delete_message_batch()
        .queue_url(&url)
        .set_entries(Some(
            received
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().expect("handle"))
                        .build()
                        .expect("entry")
                })
                .collect(),
        ))
        .send()
        .await
        .expect("DeleteMessageBatch");
    assert_eq!(deleted.successful().len(), 2);
    assert_eq!(counts(&client, &url).await, (0, 0));

    let listed = client
        .list_queues()
        .queue_name_prefix("batch")
        .send()
        .await
        .expect("ListQueues");
    assert_eq!(listed.queue_urls(), [url]);
}

#[tokio::test]
async fn a_delayed_message_is_counted_as_delayed_and_not_received() {
    let emulator = emulator();
    let client = client(&emulator);
    let url = queue(&client, "delayed", &[]).await;
    client
        .send_message()
        .queue_url(&url)
        .message_body("later")
        .delay_seconds(900)
        .send()
        .await
        .expect("send");
    let delayed = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .expect("attributes")
        .attributes
        .unwrap_or_default()
        .remove(&QueueAttributeName::ApproximateNumberOfMessagesDelayed);
    assert_eq!(delayed.as_deref(), Some("1"));
    assert!(receive(&client, &url, 10, 30, 0).await.is_empty());
    assert_eq!(counts(&client, &url).await, (0, 0));

    let fifo_url = fifo(&client, "delayed.fifo").await;
    let refused = client
        .send_message()
        .queue_url(&fifo_url)
        .message_body("x")
        .message_group_id("g")
        .message_deduplication_id("x")
        .delay_seconds(5)
        .send()
        .await;
    assert!(refused.is_err(), "FIFO queues take a delay per queue only");
}
