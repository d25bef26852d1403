//! [`SqsDeadLetterQueue`] against a real SQS API (the SQS emulator, via flashsale-emulators): a
//! parked record lands in a FIFO queue with its body, group and reason, once.

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use flashsale_order_consumer::dead_letter::{EMPTY_BODY_PLACEHOLDER, REASON_ATTRIBUTE};
use flashsale_order_consumer::{DeadLetter, DeadLetterQueue, SqsDeadLetterQueue};

async fn fifo_queue(client: &aws_sdk_sqs::Client) -> String {
    let name = format!(
        "flashsale-dlq-test-{}.fifo",
        flashsale_emulators::unique_suffix()
    );
    client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .expect("create the FIFO dead-letter queue")
        .queue_url
        .expect("a queue url")
}

#[tokio::test]
async fn a_parked_record_lands_once_with_its_body_group_and_reason() {
    let emulators = flashsale_emulators::shared().await;
    let client = aws_sdk_sqs::Client::new(&emulators.sdk_config().await);
    let queue_url = fifo_queue(&client).await;
    let dead_letters = SqsDeadLetterQueue::new(client.clone(), &queue_url);
    let letter = DeadLetter {
        body: r#"{"order_id": "#.to_owned(),
        group_id: "phone-launch.01JGZ7T2W6S8M1Q4X9V0B3C5DE".to_owned(),
        dedup_id: "059f36b4-87a3-44ab-83d2-661975830a7d".to_owned(),
        reason: "the record's body is not a reservation: EOF while parsing".to_owned(),
    };

    dead_letters.park(&letter).await.unwrap();
    // A redelivered poison record is parked again; the dedup id keeps one copy.
    dead_letters.park(&letter).await.unwrap();

    let received = client
        .receive_message()
        .queue_url(&queue_url)
        .max_number_of_messages(10)
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .message_attribute_names("All")
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let messages = received.messages();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let message = &messages[0];
    assert_eq!(message.body(), Some(letter.body.as_str()));
    let group = message
        .attributes()
        .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId));
    assert_eq!(group.map(String::as_str), Some(letter.group_id.as_str()));
    let reason = message
        .message_attributes()
        .and_then(|attributes| attributes.get(REASON_ATTRIBUTE))
        .and_then(|value| value.string_value());
    assert_eq!(reason, Some(letter.reason.as_str()));
}

#[tokio::test]
async fn a_record_without_a_body_is_parked_with_a_placeholder() {
    let emulators = flashsale_emulators::shared().await;
    let client = aws_sdk_sqs::Client::new(&emulators.sdk_config().await);
    let queue_url = fifo_queue(&client).await;
    let dead_letters = SqsDeadLetterQueue::new(client.clone(), &queue_url);

    dead_letters
        .park(&DeadLetter {
            body: String::new(),
            group_id: "g".to_owned(),
            dedup_id: "d".to_owned(),
            reason: "the record has no body".to_owned(),
        })
        .await
        .unwrap();

    let received = client
        .receive_message()
        .queue_url(&queue_url)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages()[0].body(), Some(EMPTY_BODY_PLACEHOLDER));
}

#[tokio::test]
async fn parking_in_a_missing_queue_fails_with_the_sdk_error_as_source() {
    let emulators = flashsale_emulators::shared().await;
    let client = aws_sdk_sqs::Client::new(&emulators.sdk_config().await);
    let missing = format!(
        "{}/123456789012/flashsale-no-such-queue-{}.fifo",
        emulators.sqs_endpoint,
        flashsale_emulators::unique_suffix()
    );
    let err = SqsDeadLetterQueue::new(client, missing)
        .park(&DeadLetter {
            body: "{}".to_owned(),
            group_id: "g".to_owned(),
            dedup_id: "d".to_owned(),
            reason: "test".to_owned(),
        })
        .await
        .unwrap_err();
    assert!(std::error::Error::source(&err).is_some());
}
