//! Orders and their state machine.
//!
//! ```text
//!   grab ──► reserved ──pay──► paid
//!               └──cancel / timeout──► cancelled / expired ──late money refunded──► refunded
//!                                              ▲                                      │
//!                                              └────────── its refund failed ─────────┘
//! ```
//! `paid` is final; `cancelled` and `expired` are final for the unit, and become
//! `refunded` only when money the buyer paid for the order came in too late and all of
//! it is back with the buyer (see [`crate::service::PaymentService`]). A refund that the
//! provider reported succeeded can still fail later (the card's bank cannot take it):
//! the order goes back to where it was refunded from, and is refunded again. Stock leaves the shard at the grab and
//! comes back exactly once, on the move to `cancelled` or `expired`. The grab's hold is
//! the order from the start: the order consumer sets the release timer and writes
//! nothing, so a unit costs the table no write between the grab and its settlement.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{OrderId, SaleId, UserId};
use crate::payment::OrderPayment;
use crate::price::Price;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Reserved,
    Paid,
    Cancelled,
    Expired,
    /// Cancelled or expired, and the money the buyer's payment moved anyway (a capture
    /// that raced the timeout, an automatic capture) was given back.
    Refunded,
    /// Paid on our side, and then the provider would never give the money: the
    /// authorisation lapsed (a card's lasts 7 days) or was cancelled at the provider
    /// before a capture got through. The unit went back to its shard and no money moved.
    PaymentFailed,
}

impl OrderStatus {
    pub const ALL: [Self; 6] = [
        Self::Reserved,
        Self::Paid,
        Self::Cancelled,
        Self::Expired,
        Self::Refunded,
        Self::PaymentFailed,
    ];

    /// Statuses from which the order can still be paid, cancelled or expire: the stock
    /// is held for the buyer but not sold.
    pub const OPEN: [Self; 1] = [Self::Reserved];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Paid => "paid",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
            Self::Refunded => "refunded",
            Self::PaymentFailed => "payment_failed",
        }
    }

    pub fn is_open(self) -> bool {
        Self::OPEN.contains(&self)
    }

    /// Whether the order's unit went back to its shard: cancelled, expired, or either
    /// and then refunded, or paid and then its payment failed.
    pub fn gave_the_unit_back(self) -> bool {
        matches!(
            self,
            Self::Cancelled | Self::Expired | Self::Refunded | Self::PaymentFailed
        )
    }

    /// Whether the state machine allows `self → next`. Stores enforce the same edges
    /// with conditional writes; this is their specification.
    pub fn can_become(self, next: Self) -> bool {
        match (self, next) {
            (Self::Refunded, Self::Cancelled | Self::Expired) => true,
            (from, Self::Paid | Self::Cancelled | Self::Expired) => from.is_open(),
            (Self::Cancelled | Self::Expired, Self::Refunded) => true,
            (Self::Paid, Self::PaymentFailed) => true,
            _ => false,
        }
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown order status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for OrderStatus {
    type Err = UnknownStatus;
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == raw)
            .ok_or_else(|| UnknownStatus(raw.to_owned()))
    }
}

/// Why held stock goes back to the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The owner cancelled.
    Cancelled,
    /// The payment window closed.
    Expired,
}

impl ReleaseReason {
    pub fn final_status(self) -> OrderStatus {
        match self {
            Self::Cancelled => OrderStatus::Cancelled,
            Self::Expired => OrderStatus::Expired,
        }
    }
}

/// A unit of stock held for one buyer. It is what the grab commits, what the orders
/// queue carries and what the release schedule hands back, so every step can act on it
/// without reading anything first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub order_id: OrderId,
    pub sale_id: SaleId,
    pub user_id: UserId,
    pub shard: u16,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The price the unit is sold at: the sale's, copied by the grab from the sale it
    /// already read, so the hold records it in the write it makes anyway. `None` for a
    /// sale stored before prices, for a message or timer made before reservations
    /// carried one, and for the expired hold the reconciler records for a take no
    /// grab finished (nothing was sold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
}

/// What the grab hands the order consumer: the hold it committed, and whether the
/// request that committed it was a retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMessage {
    #[serde(flatten)]
    pub reservation: Reservation,
    /// The grab was a marked retry: its path's earlier request, perhaps in another
    /// process, may have taken a unit on another shard and never held it (a hold write
    /// in doubt, an invocation that died between its writes). No process knows of that
    /// take, and its unit is out of every shard, so the consumer looks for it and gives
    /// it back (see [`crate::service::OrderService::receive`]). Absent in messages from
    /// before it was sent: `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retried: bool,
}

impl OrderMessage {
    /// What makes two sends the same message, for the queue's deduplication: the
    /// order, and whether a retry sent it. A retry's message asks more of the consumer
    /// than the first try's, so it must not be dropped as a repeat of it.
    pub fn deduplication_id(&self) -> String {
        if self.retried {
            format!("{}.retry", self.reservation.order_id)
        } else {
            self.reservation.order_id.to_string()
        }
    }
}

/// An order as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: OrderId,
    pub sale_id: SaleId,
    #[serde(skip_serializing)]
    pub user_id: UserId,
    pub status: OrderStatus,
    /// What the buyer pays: the sale's price when the unit was reserved (see
    /// [`Reservation::price`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    pub expires_at: DateTime<Utc>,
    /// When the release that expired the order committed: how late after `expires_at`
    /// the unit came back, measurable from outside. Only on an `expired` order, and
    /// only on those released since it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<DateTime<Utc>>,
    /// When the pay that settled the order committed. Only on a `paid` order, and only
    /// on those paid since it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
    /// The buyer's payment at the provider, once one was opened for the order: for the
    /// settlement, not shown to the buyer (its state is the order's status).
    #[serde(skip)]
    pub payment: Option<OrderPayment>,
    /// The status a `refunded` order was refunded from (`cancelled` or `expired`): where
    /// it goes back to if its refund fails after all. Recorded by the refund.
    #[serde(skip)]
    pub refunded_from: Option<OrderStatus>,
}

impl Order {
    /// The order of `reservation` in `status`; `expired_at` is set by the store that
    /// knows it.
    pub fn from_reservation(reservation: &Reservation, status: OrderStatus) -> Self {
        Self {
            order_id: reservation.order_id.clone(),
            sale_id: reservation.sale_id.clone(),
            user_id: reservation.user_id.clone(),
            status,
            price: reservation.price,
            expires_at: reservation.expires_at,
            expired_at: None,
            paid_at: None,
            payment: None,
            refunded_from: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_open_orders_can_settle() {
        use OrderStatus::*;
        for from in OrderStatus::ALL {
            assert_eq!(from.can_become(Paid), from.is_open(), "{from} -> paid");
            for to in [Cancelled, Expired] {
                assert_eq!(
                    from.can_become(to),
                    from.is_open() || from == Refunded,
                    "{from} -> {to}: a refund that failed after all goes back"
                );
            }
            assert_eq!(
                from.can_become(Refunded),
                matches!(from, Cancelled | Expired),
                "{from} -> refunded"
            );
        }
        for from in OrderStatus::ALL {
            assert!(!from.can_become(Reserved), "{from} -> reserved");
            assert_eq!(
                from.can_become(PaymentFailed),
                from == Paid,
                "{from} -> payment_failed: only a paid order's payment fails after it"
            );
        }
    }

    #[test]
    fn a_reservation_carries_its_price_and_one_sent_before_prices_still_reads() {
        let before = serde_json::json!({
            "order_id": "phone.01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "sale_id": "phone",
            "user_id": "alice",
            "shard": 0,
            "created_at": "2026-01-01T00:00:00Z",
            "expires_at": "2026-01-01T00:15:00Z"
        });
        let reservation: Reservation = serde_json::from_value(before.clone()).unwrap();
        assert_eq!(reservation.price, None);
        assert_eq!(serde_json::to_value(&reservation).unwrap(), before);
        let priced = Reservation {
            price: Some(Price::new(129_900, "EUR").unwrap()),
            ..reservation
        };
        let json = serde_json::to_value(&priced).unwrap();
        assert_eq!(json["price"]["amount"], 129_900);
        assert_eq!(serde_json::from_value::<Reservation>(json).unwrap(), priced);
        let order = Order::from_reservation(&priced, OrderStatus::Reserved);
        assert_eq!(
            serde_json::to_value(&order).unwrap()["price"]["currency"],
            "EUR"
        );
    }

    #[test]
    fn status_names_round_trip() {
        for status in OrderStatus::ALL {
            assert_eq!(status.as_str().parse::<OrderStatus>().unwrap(), status);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        assert!("shipped".parse::<OrderStatus>().is_err());
    }
}
