//! The correlation id of the API request an order came from, carried along the order:
//! the grab's queue message and the release schedule's input carry it as an optional
//! `correlation_id` field next to the reservation, so the consumer's and the release's
//! log lines can be found from the buyer's request. Old messages without the field,
//! and readers that ignore it, work as before.
//!
//! The id travels in a task-local set by the handler around the work, so the ports
//! (and the domain behind them) need not know about it.

use std::future::Future;

use serde::{Deserialize, Serialize};

/// The JSON field that carries the id next to the reservation's fields.
pub const FIELD: &str = "correlation_id";

tokio::task_local! {
    static CURRENT: String;
}

/// Runs `work` with `id` as the current correlation id.
pub async fn scope<F: Future>(id: String, work: F) -> F::Output {
    CURRENT.scope(id, work).await
}

/// The current correlation id, if the handler set a non-empty one.
pub fn current() -> Option<String> {
    CURRENT
        .try_with(Clone::clone)
        .ok()
        .filter(|id| !id.is_empty())
}

/// A message (a reservation, a held order) as a JSON object, with the current
/// correlation id when there is one.
pub fn message_json(message: &impl Serialize) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(message)?;
    if let (Some(id), Some(fields)) = (current(), value.as_object_mut()) {
        fields.insert(FIELD.to_owned(), id.into());
    }
    serde_json::to_string(&value)
}

/// The correlation id a message or event carries, if any.
pub fn carried_by(json: &serde_json::Value) -> Option<String> {
    #[derive(Deserialize)]
    struct Carrier {
        correlation_id: Option<String>,
    }
    Carrier::deserialize(json)
        .ok()
        .and_then(|carrier| carrier.correlation_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_domain::Reservation;

    fn a_reservation() -> Reservation {
        serde_json::from_value(serde_json::json!({
            "order_id": "s1.01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "sale_id": "s1",
            "user_id": "alice",
            "shard": 0,
            "created_at": "2026-01-01T00:00:00Z",
            "expires_at": "2026-01-01T00:10:00Z"
        }))
        .expect("a reservation")
    }

    #[tokio::test]
    async fn the_id_rides_next_to_the_reservation_and_older_readers_ignore_it() {
        let reservation = a_reservation();
        let body = scope("req-42".into(), async { message_json(&reservation) })
            .await
            .expect("encode");
        let value: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(carried_by(&value).as_deref(), Some("req-42"));
        let read_back: Reservation = serde_json::from_str(&body).expect("still a reservation");
        assert_eq!(read_back, reservation);
    }

    #[test]
    fn without_a_scope_the_message_is_the_reservation_alone() {
        let body = message_json(&a_reservation()).expect("encode");
        let value: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(carried_by(&value), None);
        assert!(value.get(FIELD).is_none());
    }
}
