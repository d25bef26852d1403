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

/// Where a page of a sale's orders goes on from: a place in the index, after a buyer
/// in a bucket (their bucket, then their id), or the start of a bucket. Written
/// `{bucket}.{the buyer's id's UTF-8 in hex}` (nothing after the dot for a bucket's
/// start): opaque to clients, and plain ASCII, so that it survives a header
/// (`X-Next-Cursor`) and a query string whatever the buyer's id holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerCursor {
    pub bucket: u16,
    /// The buyer id the page goes on after, in the bucket: the last one read, as the
    /// API wrote it (any text a client sends is a place in the index too); `None`: the
    /// bucket from its start.
    pub after: Option<String>,
}

impl BuyerCursor {
    /// The cursor that goes on after `user`'s orders in `sale`.
    pub fn after(sale: &Sale, user: &UserId) -> Self {
        Self {
            bucket: sale.bucket_of(user),
            after: Some(user.as_str().to_owned()),
        }
    }

    /// The cursor that goes on from the start of `bucket`.
    pub fn start_of(bucket: u16) -> Self {
        Self {
            bucket,
            after: None,
        }
    }

    /// A cursor a client sent back, as [`BuyerCursor::encode`] wrote it. One this API
    /// never wrote is harmless: a page goes on from that place in the sale's index
    /// (past its last bucket, nothing follows; bytes that are no UTF-8 are read as
    /// text with replacement characters).
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let invalid = || ValidationError::new("cursor", "is not a cursor this API answered");
        let (bucket, user) = raw.split_once('.').ok_or_else(invalid)?;
        let bucket: u16 = bucket.parse().map_err(|_| invalid())?;
        if user.is_empty() {
            return Ok(Self::start_of(bucket));
        }
        if user.len() % 2 != 0 || !user.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        let bytes = (0..user.len())
            .step_by(2)
            .map(|at| {
                user.get(at..at + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(invalid)?;
        Ok(Self {
            bucket,
            after: Some(String::from_utf8_lossy(&bytes).into_owned()),
        })
    }

    pub fn encode(&self) -> String {
        let user: String = self
            .after
            .iter()
            .flat_map(|user| user.bytes())
            .map(|byte| format!("{byte:02x}"))
            .collect();
        format!("{}.{user}", self.bucket)
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
    /// Its payment's state at the provider, as the last settlement read it: `captured`
    /// once the money moved; a paid order still `authorised` waits for its capture (the
    /// stats' `capture_pending`). Absent on an order no payment was opened for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment: Option<&'static str>,
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
            payment: order.payment.as_ref().map(|payment| payment.state.name()),
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
            let encoded = cursor.encode();
            assert!(
                encoded
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.')
            );
            assert_eq!(BuyerCursor::parse(&encoded).unwrap(), cursor);
        }
        assert_eq!(BuyerCursor::parse("3.").unwrap(), BuyerCursor::start_of(3));
        for raw in ["", "alice", "x.616c", "70000.616c", "3.616", "3.zz", "3.+6"] {
            assert!(BuyerCursor::parse(raw).is_err(), "{raw:?}");
        }
        // Well formed, though no buyer's: still a place to go on from.
        assert_eq!(
            BuyerCursor::parse("3.07").unwrap().after.as_deref(),
            Some("\u{7}")
        );
        assert_eq!(
            BuyerCursor::parse("3.c3").unwrap().after.as_deref(),
            Some("\u{fffd}")
        );
    }
}
