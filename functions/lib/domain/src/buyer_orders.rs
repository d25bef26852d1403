//! A buyer's own orders across sales, newest first: what a reload or another device
//! shows the buyer, so that a held order and its payment deadline are never lost with
//! a browser tab.
//!
//! Orders are kept per sale and buyer (one record each, holding every order the buyer
//! has in that sale), so the list goes sale by sale: the sales in which the buyer held
//! something, the latest first by when their first hold there was recorded, and in
//! each sale the buyer's orders, the newest first.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::ValidationError;
use crate::ids::SaleId;
use crate::order::Order;
use crate::sale::{encode_place, parse_place};

/// Where a page of a buyer's orders goes on from: after the sale whose first hold was
/// recorded at `held_at`. Opaque to clients, written `{seconds}.{nanoseconds}.{sale_id}`.
/// One this API never wrote is harmless: it is a place in the buyer's own list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerOrdersCursor {
    /// When the buyer's first hold in the sale was recorded.
    pub held_at: DateTime<Utc>,
    pub sale_id: SaleId,
}

impl BuyerOrdersCursor {
    /// A cursor a client sent back, as [`BuyerOrdersCursor::encode`] wrote it.
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let (held_at, sale_id) = parse_place(raw)?;
        Ok(Self { held_at, sale_id })
    }

    pub fn encode(&self) -> String {
        encode_place(self.held_at, &self.sale_id)
    }
}

/// One page of a buyer's orders, and where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerOrdersPage {
    pub orders: Vec<Order>,
    /// `None` once no sale follows.
    pub next: Option<BuyerOrdersCursor>,
}

/// A page of the buyer's orders, as the API answers it: each order as
/// `GET /orders/{order_id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuyerOrders {
    pub orders: Vec<Order>,
    /// Asks for the next page (`?cursor=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

impl From<BuyerOrdersPage> for BuyerOrders {
    fn from(page: BuyerOrdersPage) -> Self {
        Self {
            orders: page.orders,
            next_cursor: page.next.as_ref().map(BuyerOrdersCursor::encode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote_and_nothing_else() {
        let cursor = BuyerOrdersCursor {
            held_at: DateTime::from_timestamp(1_767_225_660, 123_456_789).unwrap(),
            sale_id: SaleId::parse("phone_2").unwrap(),
        };
        assert_eq!(cursor.encode(), "1767225660.123456789.phone_2");
        assert_eq!(BuyerOrdersCursor::parse(&cursor.encode()), Ok(cursor));
        for bad in ["", "1767225660", "1767225660.0", "x.0.phone", "1.0.a b"] {
            let error = BuyerOrdersCursor::parse(bad).expect_err(bad);
            assert_eq!(error.field, "cursor", "{bad}");
        }
    }
}
