//! `SqsOrderQueue` against the SQS emulator.

mod support;

use std::error::Error as _;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use flashsale_adapters::SqsOrderQueue;
use flashsale_domain::ports::OrderQueue;
use flashsale_domain::{OrderMessage, Reservation, StoreError};

async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&support::sdk_config().await)
}

async fn receive_all(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> Vec<aws_sdk_sqs::types::Message> {
    client
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .message_system_attribute_names(MessageSystemAttributeName::MessageDeduplicationId)
        .send()
        .await
        .expect("receive")
        .messages
        .unwrap_or_default()
}

async fn delete(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    message: &aws_sdk_sqs::types::Message,
) {
    client
        .delete_message()
        .queue_url(queue_url)
        .receipt_handle(message.receipt_handle().expect("a receipt"))
        .send()
        .await
        .expect("delete");
}

fn a_reservation(user: &str) -> Reservation {
    let sale = support::sale(5, 1, 1);
    support::reservation(&sale, &support::user(user), 0)
}

fn a_first_try(reservation: &Reservation) -> OrderMessage {
    OrderMessage {
        reservation: reservation.clone(),
        retried: false,
    }
}

#[tokio::test]
async fn sending_the_same_reservation_twice_delivers_one_message_keyed_by_the_order() {
    let client = sqs().await;
    let queue_url = support::create_fifo_queue(&client).await;
    let queue = SqsOrderQueue::new(client.clone(), &queue_url);
    let reservation = a_reservation("alice");

    queue
        .enqueue(&a_first_try(&reservation))
        .await
        .expect("first send");
    queue
        .enqueue(&a_first_try(&reservation))
        .await
        .expect("repeated send");

    let attributes = client
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .expect("attributes")
        .attributes
        .unwrap_or_default();
    assert_eq!(
        attributes
            .get(&QueueAttributeName::ApproximateNumberOfMessages)
            .map(String::as_str),
        Some("1")
    );
    let messages = receive_all(&client, &queue_url).await;
    assert_eq!(messages.len(), 1, "deduplicated by order id");
    let message = &messages[0];
    let body: Reservation =
        serde_json::from_str(message.body().expect("a body")).expect("the body is a reservation");
    assert_eq!(body, reservation);
    let system = message.attributes().expect("system attributes");
    let order_id = reservation.order_id.to_string();
    assert_eq!(
        system.get(&MessageSystemAttributeName::MessageGroupId),
        Some(&order_id)
    );
    assert_eq!(
        system.get(&MessageSystemAttributeName::MessageDeduplicationId),
        Some(&order_id)
    );

    delete(&client, &queue_url, message).await;
    assert!(
        receive_all(&client, &queue_url).await.is_empty(),
        "no second copy"
    );
}

/// A retry's message asks the consumer for more than the first try's (the takes its
/// path left elsewhere): it must not be dropped as a repeat of it. Repeated itself, it
/// is one message.
#[tokio::test]
async fn a_retry_sends_its_message_after_the_first_tries_once() {
    let client = sqs().await;
    let queue_url = support::create_fifo_queue(&client).await;
    let queue = SqsOrderQueue::new(client.clone(), &queue_url);
    let reservation = a_reservation("alice");
    let retried = OrderMessage {
        retried: true,
        ..a_first_try(&reservation)
    };
    queue
        .enqueue(&a_first_try(&reservation))
        .await
        .expect("first try");
    queue.enqueue(&retried).await.expect("a retry");
    queue.enqueue(&retried).await.expect("another retry");

    let mut received = Vec::new();
    for _ in 0..3 {
        for message in receive_all(&client, &queue_url).await {
            delete(&client, &queue_url, &message).await;
            received.push(message);
        }
    }
    let bodies: Vec<OrderMessage> = received
        .iter()
        .map(|message| serde_json::from_str(message.body().expect("body")).expect("json"))
        .collect();
    assert_eq!(bodies, vec![a_first_try(&reservation), retried.clone()]);
    let retry_id = format!("{}.retry", reservation.order_id);
    assert_eq!(
        received[1]
            .attributes()
            .expect("system attributes")
            .get(&MessageSystemAttributeName::MessageDeduplicationId),
        Some(&retry_id)
    );
    let as_before: Reservation = serde_json::from_str(received[1].body().expect("body"))
        .expect("still a reservation to a reader that knows no retry mark");
    assert_eq!(as_before, reservation);
}

#[tokio::test]
async fn different_orders_travel_as_separate_messages_in_separate_groups() {
    let client = sqs().await;
    let queue_url = support::create_fifo_queue(&client).await;
    let queue = SqsOrderQueue::new(client.clone(), &queue_url);
    let (first, second) = (a_reservation("alice"), a_reservation("bob"));
    queue.enqueue(&a_first_try(&first)).await.expect("send");
    queue.enqueue(&a_first_try(&second)).await.expect("send");

    let mut received: Vec<Reservation> = receive_all(&client, &queue_url)
        .await
        .iter()
        .map(|message| serde_json::from_str(message.body().expect("body")).expect("json"))
        .collect();
    received.sort_by(|a, b| a.user_id.cmp(&b.user_id));
    assert_eq!(
        received,
        vec![first, second],
        "neither order waits behind the other"
    );
}

#[tokio::test]
async fn a_missing_queue_is_a_permanent_error() {
    let client = sqs().await;
    let existing = support::create_fifo_queue(&client).await;
    let missing = existing.replace("orders-", "missing-");
    let queue = SqsOrderQueue::new(client, missing);
    let error = queue
        .enqueue(&a_first_try(&a_reservation("alice")))
        .await
        .expect_err("no such queue");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    assert!(error.source().is_some(), "the SDK error is kept");
}

#[tokio::test]
async fn an_unreachable_queue_is_a_transient_error() {
    let config = aws_sdk_sqs::config::Builder::from(&support::sdk_config().await)
        .endpoint_url(support::closed_endpoint())
        .build();
    let queue = SqsOrderQueue::new(
        aws_sdk_sqs::Client::from_conf(config),
        "http://127.0.0.1/123456789012/orders.fifo",
    );
    let error = queue
        .enqueue(&a_first_try(&a_reservation("alice")))
        .await
        .expect_err("nobody listens");
    assert!(error.is_retryable(), "{error:?}");
}
