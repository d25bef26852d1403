//! [`SqsOrderQueue`]: the orders FIFO queue between the grab and the order consumer.

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use flashsale_domain::ports::OrderQueue;
use flashsale_domain::{OrderMessage, StoreError};

use crate::classify::store_error;

const ENQUEUE: &str = "sqs.enqueue";

/// Implements [`OrderQueue`] on an SQS FIFO queue.
///
/// The order id is the message group (orders are independent, so each is its own
/// group and none waits behind another), and with the retry mark the deduplication id
/// (a grab that repeats its send within SQS's five-minute window does not produce a
/// second message; a retry's does, once).
#[derive(Debug, Clone)]
pub struct SqsOrderQueue {
    client: Client,
    queue_url: String,
}

impl SqsOrderQueue {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }
}

#[async_trait]
impl OrderQueue for SqsOrderQueue {
    async fn enqueue(&self, message: &OrderMessage) -> Result<(), StoreError> {
        let body = crate::correlation::message_json(message)
            .map_err(|error| StoreError::permanent(ENQUEUE, error))?;
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_group_id(message.reservation.order_id.to_string())
            .message_deduplication_id(message.deduplication_id())
            .send()
            .await
            .map_err(|error| store_error(ENQUEUE, error))?;
        Ok(())
    }
}
