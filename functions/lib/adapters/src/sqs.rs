//! [`SqsOrderQueue`]: the orders FIFO queue between the grab and the order consumer.

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use flashsale_domain::ports::OrderQueue;
use flashsale_domain::{Reservation, StoreError};

use crate::classify::store_error;

const ENQUEUE: &str = "sqs.enqueue";

/// Implements [`OrderQueue`] on an SQS FIFO queue.
///
/// The order id is both the message group (orders are independent, so each is its own
/// group and none waits behind another) and the deduplication id (a grab that retries
/// its send within SQS's five-minute window does not produce a second message).
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
    async fn enqueue(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let body = crate::correlation::reservation_json(reservation)
            .map_err(|error| StoreError::permanent(ENQUEUE, error))?;
        let order_id = reservation.order_id.to_string();
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_group_id(&order_id)
            .message_deduplication_id(order_id)
            .send()
            .await
            .map_err(|error| store_error(ENQUEUE, error))?;
        Ok(())
    }
}
