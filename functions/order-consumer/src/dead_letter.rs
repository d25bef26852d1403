//! Parking poison records: a record that can never succeed goes to the dead-letter
//! queue at once, instead of being redelivered until the queue's redrive policy gives
//! up on it, holding back nothing but costing a retry cycle each time.

use async_trait::async_trait;
use aws_sdk_sqs::types::MessageAttributeValue;
use flashsale_domain::error::BoxError;

/// The message attribute that says why a record was parked.
pub const REASON_ATTRIBUTE: &str = "flashsale-park-reason";

/// SQS refuses empty bodies; a record that had none is parked with this instead.
pub const EMPTY_BODY_PLACEHOLDER: &str = "<empty>";

/// SQS's limit on a message attribute is far above this; a reason longer than a
/// kilobyte is noise, so it is cut here.
const MAX_REASON_CHARS: usize = 1024;

/// A record set aside, with what is needed to find, explain and redrive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The record's body exactly as received, so a fixed consumer can redrive it.
    pub body: String,
    /// The record's FIFO message group.
    pub group_id: String,
    /// The record's message id: parking the same record twice stores it once.
    pub dedup_id: String,
    /// Why it can never succeed.
    pub reason: String,
}

/// Parking failed; the record is reported as failed so that it comes back.
#[derive(Debug, thiserror::Error)]
#[error("could not park the record in the dead-letter queue")]
pub struct ParkError(#[source] pub BoxError);

/// Where poison records go.
#[async_trait]
pub trait DeadLetterQueue: Send + Sync {
    /// Stores the letter durably. Idempotent by `dedup_id` (within SQS's five-minute
    /// deduplication window).
    async fn park(&self, letter: &DeadLetter) -> Result<(), ParkError>;
}

/// The orders queue's FIFO dead-letter queue on SQS.
#[derive(Debug, Clone)]
pub struct SqsDeadLetterQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsDeadLetterQueue {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }
}

#[async_trait]
impl DeadLetterQueue for SqsDeadLetterQueue {
    async fn park(&self, letter: &DeadLetter) -> Result<(), ParkError> {
        let reason: String = letter.reason.chars().take(MAX_REASON_CHARS).collect();
        let reason = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(reason)
            .build()
            .map_err(|err| ParkError(err.into()))?;
        let body = if letter.body.is_empty() {
            EMPTY_BODY_PLACEHOLDER
        } else {
            letter.body.as_str()
        };
        // Whether the failure is transient or not, the answer is the same: report the
        // record as failed and let the queue bring it back. So no classification here.
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_group_id(&letter.group_id)
            .message_deduplication_id(&letter.dedup_id)
            .message_attributes(REASON_ATTRIBUTE, reason)
            .send()
            .await
            .map_err(|err| ParkError(err.into()))?;
        Ok(())
    }
}
