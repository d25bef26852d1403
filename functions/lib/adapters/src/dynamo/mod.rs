//! [`DynamoStore`]: sales, stock, orders, their payments, the provider's processed
//! events and the blocklist in one DynamoDB table.
//!
//! Every state change is one `TransactWriteItems` whose conditions enforce the order
//! state machine, so stock leaves a shard only with a hold and comes back only with the
//! hold's end. Two exceptions, each idempotent by the shard's record of its takers: a
//! reserve on a shard hot enough that transactions cancel each other is the take then
//! the hold ([`ledger`]), and a release gives its unit back to the shard one write after
//! its transaction. When a transaction is refused, its items' old images, or a
//! consistent read, tell the caller why.
//!
//! One module per port ([`catalog`], [`ledger`], [`orders`], [`payments`],
//! [`blocklist`]); what they share (expressions, reads, the batch read of the shards)
//! is in [`requests`], the item layout in [`item`], and running a transaction in
//! [`transact`].

mod baseline;
mod blocklist;
mod catalog;
mod item;
mod ledger;
mod orders;
mod payments;
mod requests;
mod transact;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use flashsale_domain::{ReservePath, Sale, SaleId};

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

/// Implements [`SaleCatalog`], [`StockLedger`], [`OrderBook`], [`OrderPayments`],
/// [`ProviderEvents`] and [`Blocklist`] on one table laid out as the brief's data model
/// (`pk`/`sk`, GSI `gsi1`, TTL `ttl`).
///
/// One difference from the in-memory fake a caller can see: `AlreadyHeld` is found on the
/// user's item, so an order id counts as held only for the user it was reserved for (the
/// fake knows it for any user); the grab token binds the order id to its user, so no
/// caller sees that.
///
/// [`SaleCatalog`]: flashsale_domain::ports::SaleCatalog
/// [`StockLedger`]: flashsale_domain::ports::StockLedger
/// [`OrderBook`]: flashsale_domain::ports::OrderBook
/// [`OrderPayments`]: flashsale_domain::ports::OrderPayments
/// [`ProviderEvents`]: flashsale_domain::ports::ProviderEvents
/// [`Blocklist`]: flashsale_domain::ports::Blocklist
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    contention: RetryPolicy,
    reserve_mode: ReserveMode,
    /// Sales on one of whose shards this process met a transaction conflict, and until
    /// when it reserves them with plain writes ([`ReservePath::Adaptive`]). Shared by
    /// clones, as one Lambda container's store is.
    hot_sales: Arc<Mutex<HashMap<SaleId, Instant>>>,
}

/// How [`StockLedger::reserve`](flashsale_domain::ports::StockLedger::reserve) writes
/// (see [`ledger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveMode {
    /// As each sale's [`ReservePath`] says. An adaptive sale (the default) gets the
    /// brief's transaction (the take on the shard and the buyer's hold, both or
    /// neither), except once a transaction of this process met a conflict on one of its
    /// shards less than `plain_for` ago: then take then hold. On AWS a transaction on a
    /// hot item is cancelled by any other in flight on it, while plain writes queue; a
    /// conflict is the sign that the sale's surge is on, and it is on all its shards at
    /// once (buyers spread over them by hash), so the conflicted reserve goes on with
    /// plain writes, and so do the others of the sale: every transaction still sent to a
    /// hot shard would be cancelled, or would refuse the plain takes that meet it
    /// (measured: a first cut that marked one shard at a time refused two plain takes
    /// per unit sold in `make bench`'s surge). The default.
    AsTheSaleSays { plain_for: Duration },
    /// Always the transaction, whatever the sale says; a conflict on the shard is
    /// answered `Contended`: a test of that path alone.
    Transaction,
    /// Always take then hold, two plain conditional writes (the reserve before issue
    /// 40), whatever the sale says: a test of that path alone, and the bench's "today".
    TakeThenHold,
}

impl ReserveMode {
    /// How long a shard stays on plain writes after a conflict. A sale's surge sells
    /// out within seconds, so this spans it: each container pays one cancelled
    /// transaction per hot sale per period, and a sale that has gone quiet is back
    /// on the transaction soon after.
    pub const PLAIN_AFTER_A_CONFLICT: Duration = Duration::from_secs(2);
}

impl Default for ReserveMode {
    fn default() -> Self {
        Self::AsTheSaleSays {
            plain_for: Self::PLAIN_AFTER_A_CONFLICT,
        }
    }
}

/// How one reserve starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReserveStart {
    /// The transaction; on a conflict at the shard, take then hold if `adapts`, else
    /// `Contended`.
    Transaction {
        adapts: bool,
    },
    TakeThenHold,
}

impl DynamoStore {
    pub fn new(client: Client, table_name: impl Into<String>) -> Self {
        Self {
            client,
            table: table_name.into(),
            contention: RetryPolicy::CONTENTION,
            reserve_mode: ReserveMode::default(),
            hot_sales: Arc::default(),
        }
    }

    /// This store, reserving as `mode` says.
    #[must_use]
    pub fn with_reserve_mode(mut self, mode: ReserveMode) -> Self {
        self.reserve_mode = mode;
        self
    }

    /// How a reserve in `sale` starts now.
    fn reserve_start(&self, sale: &Sale) -> ReserveStart {
        let path = match self.reserve_mode {
            ReserveMode::AsTheSaleSays { .. } => sale.reserve,
            ReserveMode::Transaction => ReservePath::Transaction,
            ReserveMode::TakeThenHold => ReservePath::TakeThenHold,
        };
        match path {
            ReservePath::Transaction => ReserveStart::Transaction { adapts: false },
            ReservePath::TakeThenHold => ReserveStart::TakeThenHold,
            ReservePath::Adaptive if self.is_hot(&sale.sale_id) => ReserveStart::TakeThenHold,
            ReservePath::Adaptive => ReserveStart::Transaction { adapts: true },
        }
    }

    fn is_hot(&self, sale: &SaleId) -> bool {
        let mut hot = self
            .hot_sales
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        // Bounded by the sales this process met conflicts in lately.
        hot.retain(|_, until| *until > now);
        hot.contains_key(sale)
    }

    /// A transaction on a shard of `sale` met a conflict there: plain writes in the
    /// sale for a while, if the mode adapts.
    fn note_hot_sale(&self, sale: &SaleId) {
        if let ReserveMode::AsTheSaleSays { plain_for } = self.reserve_mode {
            self.hot_sales
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(sale.clone(), Instant::now() + plain_for);
        }
    }
}
