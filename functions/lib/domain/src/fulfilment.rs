//! The operator's export of a sale's orders for fulfilment: who bought what, at what
//! price and when they paid, a page at a time.
//!
//! Orders are read buyer by buyer in the order the store indexes them: each buyer's
//! stats bucket, then the buyer. A page is the orders of a bounded number of buyers, so
//! a sale of any size is read in bounded pages, each one index query per bucket it
//! touches, never a table scan.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::ValidationError;
use crate::ids::{OrderId, UserId};
use crate::order::{Order, OrderStatus};
use crate::price::Price;
use crate::sale::Sale;

/// Where a page of a sale's orders goes on from: the last buyer of the page before, by
/// their place (their bucket, then their id). Written `{bucket}.{user_id}`; opaque to
/// clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerCursor {
    pub bucket: u16,
    pub user_id: UserId,
}

impl BuyerCursor {
    /// The cursor that goes on after `user`'s orders in `sale`.
    pub fn after(sale: &Sale, user: &UserId) -> Self {
        Self {
            bucket: sale.bucket_of(user),
            user_id: user.clone(),
        }
    }

    /// A cursor a client sent back, as [`BuyerCursor::encode`] wrote it. One this API
    /// never wrote is harmless: a page goes on from that place in the index (past the
    /// last bucket, nothing follows).
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let invalid = || ValidationError::new("cursor", "is not a cursor this API answered");
        let (bucket, user) = raw.split_once('.').ok_or_else(invalid)?;
        let bucket: u16 = bucket.parse().map_err(|_| invalid())?;
        let user_id = UserId::parse(user).map_err(|_| invalid())?;
        Ok(Self { bucket, user_id })
    }

    pub fn encode(&self) -> String {
        format!("{}.{}", self.bucket, self.user_id)
    }
}

/// One page of a sale's orders, buyer by buyer, and where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPage {
    pub orders: Vec<Order>,
    /// `None` once no buyer follows.
    pub next: Option<BuyerCursor>,
}

/// One order as the operator ships it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FulfilmentLine {
    pub order_id: OrderId,
    /// The buyer's user id (the JWT subject).
    pub buyer: UserId,
    pub status: OrderStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// When the order was paid; absent on an order not paid, and on one paid before
    /// the time was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

impl From<&Order> for FulfilmentLine {
    fn from(order: &Order) -> Self {
        Self {
            order_id: order.order_id.clone(),
            buyer: order.user_id.clone(),
            status: order.status,
            price: order.price,
            paid_at: order.paid_at,
        }
    }
}

/// A page of the export, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FulfilmentPage {
    pub orders: Vec<FulfilmentLine>,
    /// Asks for the next page (`?cursor=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sale;

    #[test]
    fn a_cursor_round_trips_and_a_malformed_one_is_refused() {
        let sale = sale(100, 8).build();
        for name in ["alice", "a.b.c", "with space", "ü"] {
            let user = UserId::parse(name).unwrap();
            let cursor = BuyerCursor::after(&sale, &user);
            assert_eq!(BuyerCursor::parse(&cursor.encode()).unwrap(), cursor);
        }
        for raw in ["", "alice", "x.alice", "70000.alice", "3.", "3.\u{7}"] {
            assert!(BuyerCursor::parse(raw).is_err(), "{raw:?}");
        }
    }
}
