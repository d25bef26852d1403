//! [`DynamoStore`]: sales, stock, orders and the blocklist in one DynamoDB table.
//!
//! Every state change is one `TransactWriteItems` whose conditions enforce the order
//! state machine, so stock leaves a shard only with a hold and comes back only with the
//! hold's end. When a transaction is refused, a consistent read tells the caller why.
//!
//! One module per port ([`catalog`], [`ledger`], [`orders`], [`blocklist`]); what they
//! share (expressions, reads, the batch read of the shards) is in [`requests`], the
//! item layout in [`item`], and running a transaction in [`transact`].

mod baseline;
mod blocklist;
mod catalog;
mod item;
mod ledger;
mod orders;
mod requests;
mod transact;

use aws_sdk_dynamodb::Client;
use flashsale_domain::SaleId;

pub use self::item::{CorruptItem, ItemError};
pub use self::transact::{ContentionExhausted, UnexpectedRefusal};
use crate::retry::RetryPolicy;

/// A request this store refuses before sending anything, because obeying it would
/// break the data model. Always a caller's bug, so always `Permanent`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("shard {shard} is outside the sale's {shards} shards")]
    ShardOutOfRange { shard: u16, shards: u16 },
    #[error(
        "the reservation is for sale {reservation_sale} shard {reservation_shard}, not sale {sale} shard {shard}"
    )]
    ReservationMismatch {
        sale: SaleId,
        shard: u16,
        reservation_sale: SaleId,
        reservation_shard: u16,
    },
}

/// Stored data that contradicts the data model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inconsistency {
    #[error("shard {shard} of sale {sale_id} does not exist")]
    MissingShard { sale_id: SaleId, shard: u16 },
    /// A shard records a take for a sale whose meta item is gone.
    #[error("sale {sale_id} does not exist, yet one of its shards records a take")]
    MissingSale { sale_id: SaleId },
}

/// DynamoDB kept leaving keys unprocessed (it does so under throttling).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{unprocessed} keys still unprocessed after {attempts} attempts")]
pub struct UnprocessedKeys {
    pub unprocessed: usize,
    pub attempts: u32,
}

/// Implements [`SaleCatalog`], [`StockLedger`], [`OrderBook`] and [`Blocklist`] on one
/// table laid out as the brief's data model (`pk`/`sk`, GSI `gsi1`, TTL `ttl`).
///
/// One difference from the in-memory fake a caller can see: `AlreadyHeld` is found on the
/// user's item, so an order id counts as held only for the user it was reserved for (the
/// fake knows it for any user); the grab token binds the order id to its user, so no
/// caller sees that.
///
/// [`SaleCatalog`]: flashsale_domain::ports::SaleCatalog
/// [`StockLedger`]: flashsale_domain::ports::StockLedger
/// [`OrderBook`]: flashsale_domain::ports::OrderBook
/// [`Blocklist`]: flashsale_domain::ports::Blocklist
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    contention: RetryPolicy,
}

impl DynamoStore {
    pub fn new(client: Client, table_name: impl Into<String>) -> Self {
        Self {
            client,
            table: table_name.into(),
            contention: RetryPolicy::CONTENTION,
        }
    }
}
