//! [`DynamoStore`]: sales, stock and orders in one DynamoDB table.
//!
//! Every state change is one `TransactWriteItems` whose conditions enforce the order
//! state machine, so stock leaves a shard only with a hold and comes back only with the
//! hold's end. When a transaction is refused, a consistent read tells the caller why.

mod item;
mod transact;

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::BuildError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
    Update,
};
use chrono::{DateTime, Utc};
use flashsale_domain::ports::{
    Blocklist, OpenOutcome, OrderBook, PayOutcome, ReserveRefusal, SaleCatalog, Settlement,
    StockLedger,
};
use flashsale_domain::sale::{MAX_ABANDONED_HOLDS, StockCounts};
use flashsale_domain::{
    Order, OrderId, OrderStatus, ReleaseReason, Reservation, Sale, SaleId, StoreError, UserId,
};

use self::item::{
    ABANDONED, ACTIVE, AVAILABLE, EXPIRES_AT_MS, GSI1, GSI1_PK, GSI1_SK, Hold, Item, PK, SHARD,
    STATUS, n, s,
};
pub use self::item::{CorruptItem, ItemError};
pub use self::transact::{ContentionExhausted, UnexpectedRefusal};
use self::transact::{Refusal, transact};
use crate::classify::store_error;
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
}

/// DynamoDB kept leaving keys unprocessed (it does so under throttling).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{unprocessed} keys still unprocessed after {attempts} attempts")]
pub struct UnprocessedKeys {
    pub unprocessed: usize,
    pub attempts: u32,
}

const CREATE_SALE: &str = "dynamodb.create_sale";
const FIND_SALE: &str = "dynamodb.find_sale";
const RESERVE: &str = "dynamodb.reserve";
const AVAILABILITY: &str = "dynamodb.availability";
const RELEASE: &str = "dynamodb.release";
const OPEN: &str = "dynamodb.open";
const PAY: &str = "dynamodb.pay";
const FIND: &str = "dynamodb.find";
const COUNT: &str = "dynamodb.count";
const SALES_ENDING_AFTER: &str = "dynamodb.sales_ending_after";
const OPEN_HOLDS: &str = "dynamodb.open_holds";
const BLOCK: &str = "dynamodb.block";
const UNBLOCK: &str = "dynamodb.unblock";
const BLOCKED: &str = "dynamodb.blocked";

/// How fresh a read of the shards must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consistency {
    /// Sees every write acknowledged before it; twice the read cost.
    Strong,
    /// May miss the last second's writes.
    Eventual,
}

/// Implements [`SaleCatalog`], [`StockLedger`], [`OrderBook`] and [`Blocklist`] on one table laid out
/// as the brief's data model (`pk`/`sk`, GSI `gsi1`, TTL `ttl`).
///
/// One difference from the in-memory fake a caller can see: when the shard is empty
/// *and* the user is at the limit, `reserve` answers `LimitReached` (the fake answers
/// `ShardEmpty`), so a grab stops at once instead of trying every other shard first.
/// And `AlreadyHeld` is found on the user's item, so an order id counts as held only for
/// the user it was reserved for (the fake knows it for any user); the grab token binds
/// the order id to its user, so no caller sees that.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    contention: RetryPolicy,
}

fn names(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(placeholder, name)| ((*placeholder).to_owned(), (*name).to_owned()))
            .collect(),
    )
}

fn values<const N: usize>(
    pairs: [(&str, AttributeValue); N],
) -> Option<HashMap<String, AttributeValue>> {
    Some(
        pairs
            .into_iter()
            .map(|(placeholder, value)| (placeholder.to_owned(), value))
            .collect(),
    )
}

fn built<T>(operation: &'static str, result: Result<T, BuildError>) -> Result<T, StoreError> {
    result.map_err(|error| StoreError::permanent(operation, error))
}

fn corrupt(operation: &'static str, key: &Item, error: ItemError) -> StoreError {
    StoreError::permanent(operation, CorruptItem::new(key, error))
}

impl DynamoStore {
    pub fn new(client: Client, table_name: impl Into<String>) -> Self {
        Self {
            client,
            table: table_name.into(),
            contention: RetryPolicy::CONTENTION,
        }
    }

    fn update(&self, key: Item) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        Update::builder().table_name(&self.table).set_key(Some(key))
    }

    fn put(&self, item: Item) -> aws_sdk_dynamodb::types::builders::PutBuilder {
        Put::builder().table_name(&self.table).set_item(Some(item))
    }

    /// Writes the order item in its final `status`, unless it is already settled: the
    /// order's part of a pay or release transaction. The item may not exist yet (the
    /// consumer has not opened the order), hence the put.
    fn settle_order_item(
        &self,
        operation: &'static str,
        reservation: &Reservation,
        status: OrderStatus,
        now: DateTime<Utc>,
    ) -> Result<Put, StoreError> {
        built(
            operation,
            self.put(item::order_item(reservation, status, now))
                .condition_expression(
                    "attribute_not_exists(#pk) OR #status IN (:reserved, :pending)",
                )
                .set_expression_attribute_names(names(&[("#pk", PK), ("#status", STATUS)]))
                .set_expression_attribute_values(values([
                    (":reserved", s(OrderStatus::Reserved.as_str())),
                    (":pending", s(OrderStatus::PendingPayment.as_str())),
                ]))
                .build(),
        )
    }

    async fn run(
        &self,
        operation: &'static str,
        items: Vec<TransactWriteItem>,
    ) -> Result<Result<(), Refusal>, StoreError> {
        transact(&self.client, &self.contention, operation, items).await
    }

    /// A consistent read of one item, or of some of its attributes.
    async fn get(
        &self,
        operation: &'static str,
        key: Item,
        projection: Option<(&str, &str)>,
    ) -> Result<Option<Item>, StoreError> {
        let mut request = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true);
        if let Some((placeholder, attribute)) = projection {
            request = request
                .projection_expression(placeholder)
                .set_expression_attribute_names(names(&[(placeholder, attribute)]));
        }
        let output = request
            .send()
            .await
            .map_err(|error| store_error(operation, error))?;
        Ok(output.item)
    }

    /// The hold of `order_id` on `user`'s item for the order's sale.
    async fn read_hold(
        &self,
        operation: &'static str,
        order_id: &OrderId,
        user_id: &UserId,
    ) -> Result<Option<Hold>, StoreError> {
        let key = item::user_key(order_id.sale_id(), user_id);
        let attribute = item::hold_attribute(order_id);
        let Some(found) = self
            .get(operation, key.clone(), Some(("#hold", &attribute)))
            .await?
        else {
            return Ok(None);
        };
        found
            .get(&attribute)
            .map(|value| Hold::parse(&attribute, value))
            .transpose()
            .map_err(|error| corrupt(operation, &key, error))
    }

    async fn read_order(
        &self,
        operation: &'static str,
        order_id: &OrderId,
    ) -> Result<Option<(Reservation, OrderStatus)>, StoreError> {
        let key = item::order_key(order_id);
        let Some(found) = self.get(operation, key.clone(), None).await? else {
            return Ok(None);
        };
        item::parse_order(&found)
            .map(Some)
            .map_err(|error| corrupt(operation, &key, error))
    }

    /// Why a release's first item (the hold) refused: the hold is settled or unknown.
    async fn settlement_after_refusal(
        &self,
        reservation: &Reservation,
    ) -> Result<Settlement, StoreError> {
        let id = &reservation.order_id;
        match self.read_hold(RELEASE, id, &reservation.user_id).await? {
            // An open hold that refused names another shard, so it is not this
            // reservation's.
            Some(hold) if hold.status.is_open() => Ok(Settlement::Unknown),
            Some(hold) => Ok(Settlement::AlreadySettled(hold.status)),
            // Holds are kept once settled, so no hold means no such reservation.
            None => Ok(Settlement::Unknown),
        }
    }

    /// Every item of `gsi1` under the key condition, page by page.
    async fn query_index(
        &self,
        operation: &'static str,
        key_condition: &str,
        attribute_names: &[(&str, &str)],
        attribute_values: Option<HashMap<String, AttributeValue>>,
        mut visit: impl FnMut(Item) -> Result<(), StoreError> + Send,
    ) -> Result<(), StoreError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(GSI1)
            .key_condition_expression(key_condition)
            .set_expression_attribute_names(names(attribute_names))
            .set_expression_attribute_values(attribute_values)
            .into_paginator()
            .items()
            .send();
        while let Some(found) = pages.next().await {
            visit(found.map_err(|error| store_error(operation, error))?)?;
        }
        Ok(())
    }

    /// Every hold of the sale, in any status, read from the user items in the sale's
    /// stats buckets `0..sale.shards` of `gsi1`. Holds are the whole record: every order
    /// item is written in the same transaction as its hold and carries the same status,
    /// so the order items are skipped by the key condition. DynamoDB updates the index
    /// asynchronously, so this may miss the last few writes.
    async fn read_holds(
        &self,
        operation: &'static str,
        sale: &Sale,
        mut visit: impl FnMut(Reservation, OrderStatus) + Send,
    ) -> Result<(), StoreError> {
        for bucket in 0..sale.shards {
            let attribute_values = HashMap::from([
                (
                    ":bucket".to_owned(),
                    s(item::bucket_pk(&sale.sale_id, bucket)),
                ),
                (":users".to_owned(), item::user_gsi_prefix()),
            ]);
            self.query_index(
                operation,
                "#gsi1pk = :bucket AND begins_with(#gsi1sk, :users)",
                &[("#gsi1pk", GSI1_PK), ("#gsi1sk", GSI1_SK)],
                Some(attribute_values),
                |found| {
                    for (reservation, status) in item::parse_holds(&found)
                        .map_err(|error| corrupt(operation, &found, error))?
                    {
                        visit(reservation, status);
                    }
                    Ok(())
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Reads every shard's `available` in one or a few batches.
    async fn shard_stock(
        &self,
        operation: &'static str,
        sale: &Sale,
        read: Consistency,
    ) -> Result<Vec<u64>, StoreError> {
        let shard_of: HashMap<String, u16> = (0..sale.shards)
            .map(|shard| (item::shard_pk(&sale.sale_id, shard), shard))
            .collect();
        let mut pending = built(
            operation,
            KeysAndAttributes::builder()
                .set_keys(Some(
                    (0..sale.shards)
                        .map(|shard| item::shard_key(&sale.sale_id, shard))
                        .collect(),
                ))
                .consistent_read(read == Consistency::Strong)
                .projection_expression("#pk, #available")
                .set_expression_attribute_names(names(&[("#pk", PK), ("#available", AVAILABLE)]))
                .build(),
        )?;
        let mut stock: Vec<Option<u64>> = vec![None; usize::from(sale.shards)];
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            let output = self
                .client
                .batch_get_item()
                .request_items(&self.table, pending.clone())
                .send()
                .await
                .map_err(|error| store_error(operation, error))?;
            for found in output
                .responses
                .and_then(|mut tables| tables.remove(&self.table))
                .unwrap_or_default()
            {
                let shard = found
                    .get(PK)
                    .and_then(|pk| pk.as_s().ok())
                    .and_then(|pk| shard_of.get(pk))
                    .copied()
                    .ok_or_else(|| corrupt(operation, &found, ItemError::Missing(PK.to_owned())))?;
                let available = item::parse_available(&found)
                    .map_err(|error| corrupt(operation, &found, error))?;
                stock[usize::from(shard)] = Some(available);
            }
            match output
                .unprocessed_keys
                .and_then(|mut tables| tables.remove(&self.table))
            {
                Some(unprocessed) if !unprocessed.keys().is_empty() => {
                    if !self.contention.allows_another(attempts) {
                        return Err(StoreError::transient(
                            operation,
                            UnprocessedKeys {
                                unprocessed: unprocessed.keys().len(),
                                attempts,
                            },
                        ));
                    }
                    tokio::time::sleep(self.contention.delay(attempts - 1)).await;
                    pending = unprocessed;
                }
                _ => break,
            }
        }
        stock
            .into_iter()
            .zip(0..)
            .map(|(available, shard)| {
                available.ok_or_else(|| {
                    StoreError::permanent(
                        operation,
                        Inconsistency::MissingShard {
                            sale_id: sale.sale_id.clone(),
                            shard,
                        },
                    )
                })
            })
            .collect()
    }
}

#[async_trait]
impl SaleCatalog for DynamoStore {
    async fn create_sale(&self, sale: &Sale) -> Result<bool, StoreError> {
        let meta = built(
            CREATE_SALE,
            self.put(item::sale_item(sale))
                .condition_expression("attribute_not_exists(#pk)")
                .set_expression_attribute_names(names(&[("#pk", PK)]))
                .build(),
        )?;
        let mut items = vec![TransactWriteItem::builder().put(meta).build()];
        for shard in 0..sale.shards {
            let stock = item::shard_item(&sale.sale_id, shard, sale.shard_stock(shard));
            let put = built(CREATE_SALE, self.put(stock).build())?;
            items.push(TransactWriteItem::builder().put(put).build());
        }
        match self.run(CREATE_SALE, items).await? {
            Ok(()) => Ok(true),
            Err(refusal) if refusal.failed(0) => Ok(false),
            Err(refusal) => Err(refusal.unexpected(CREATE_SALE)),
        }
    }

    async fn find_sale(&self, sale_id: &SaleId) -> Result<Option<Sale>, StoreError> {
        let key = item::sale_key(sale_id);
        let Some(found) = self.get(FIND_SALE, key.clone(), None).await? else {
            return Ok(None);
        };
        item::parse_sale(&found)
            .map(Some)
            .map_err(|error| corrupt(FIND_SALE, &key, error))
    }

    /// Reads the sales' `gsi1` partition from the cutoff on, so the cost follows the
    /// sales that can still matter, not every sale ever made.
    async fn sales_ending_after(&self, cutoff: DateTime<Utc>) -> Result<Vec<Sale>, StoreError> {
        let mut sales = Vec::new();
        self.query_index(
            SALES_ENDING_AFTER,
            "#gsi1pk = :sales AND #gsi1sk >= :from",
            &[("#gsi1pk", GSI1_PK), ("#gsi1sk", GSI1_SK)],
            values([
                (":sales", item::sales_gsi_pk()),
                (":from", item::sales_ending_from(cutoff)),
            ]),
            |found| {
                let sale = item::parse_sale(&found)
                    .map_err(|error| corrupt(SALES_ENDING_AFTER, &found, error))?;
                // The key's time is clamped to years 0 to 9999, so near those ends the
                // range can let in a sale that ended before the cutoff.
                if sale.ends_at >= cutoff {
                    sales.push(sale);
                }
                Ok(())
            },
        )
        .await?;
        sales.sort_by(|a, b| a.sale_id.cmp(&b.sale_id));
        Ok(sales)
    }
}

#[async_trait]
impl StockLedger for DynamoStore {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        if shard >= sale.shards {
            let error = InvalidRequest::ShardOutOfRange {
                shard,
                shards: sale.shards,
            };
            return Err(StoreError::permanent(RESERVE, error));
        }
        if reservation.shard != shard
            || reservation.sale_id != sale.sale_id
            || reservation.order_id.sale_id() != &sale.sale_id
        {
            let error = InvalidRequest::ReservationMismatch {
                sale: sale.sale_id.clone(),
                shard,
                reservation_sale: reservation.sale_id.clone(),
                reservation_shard: reservation.shard,
            };
            return Err(StoreError::permanent(RESERVE, error));
        }
        let take = built(
            RESERVE,
            self.update(item::shard_key(&sale.sale_id, shard))
                .update_expression("SET #available = #available - :one")
                .condition_expression("#available > :zero")
                .set_expression_attribute_names(names(&[("#available", AVAILABLE)]))
                .set_expression_attribute_values(values([(":one", n(1)), (":zero", n(0))]))
                .build(),
        )?;
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let bucket = item::bucket_pk(&sale.sale_id, sale.bucket_of(&reservation.user_id));
        // `attribute_not_exists(#hold)`: a retried grab whose first call committed must
        // get its order back, not a second unit. `AllOld` returns the user item when a
        // condition fails, so the refusal itself tells "already held" from "at the
        // limit" without another read.
        let hold = built(
            RESERVE,
            self.update(item::user_key(&sale.sale_id, &reservation.user_id))
                .update_expression(
                    "SET #active = if_not_exists(#active, :zero) + :one, #hold = :hold, \
                     #gsi1pk = :gsi1pk, #gsi1sk = :gsi1sk",
                )
                .condition_expression(
                    "(attribute_not_exists(#active) OR #active < :limit) \
                     AND (attribute_not_exists(#abandoned) OR #abandoned < :abandon_limit) \
                     AND attribute_not_exists(#hold)",
                )
                .set_expression_attribute_names(names(&[
                    ("#active", ACTIVE),
                    ("#abandoned", ABANDONED),
                    ("#hold", &hold_attribute),
                    ("#gsi1pk", GSI1_PK),
                    ("#gsi1sk", GSI1_SK),
                ]))
                .set_expression_attribute_values(values([
                    (":zero", n(0)),
                    (":one", n(1)),
                    (":limit", n(sale.per_user_limit)),
                    (":abandon_limit", n(MAX_ABANDONED_HOLDS)),
                    (":hold", Hold::reserved(reservation).to_value()),
                    (":gsi1pk", s(bucket)),
                    (":gsi1sk", s(item::user_gsi_sk(&reservation.user_id))),
                ]))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build(),
        )?;
        let items = vec![
            TransactWriteItem::builder().update(take).build(),
            TransactWriteItem::builder().update(hold).build(),
        ];
        match self.run(RESERVE, items).await? {
            Ok(()) => Ok(Ok(())),
            // The user's refusal wins when both failed: a retry gets its order back
            // whatever the shard holds now, and a user at the limit is told so rather
            // than sent on to try every other shard.
            Err(refusal) if refusal.failed(1) => {
                let held = match refusal.old_item(1) {
                    Some(old) => old.contains_key(&hold_attribute),
                    // The condition cannot fail on a missing user item, so no old item
                    // means DynamoDB did not send it: ask.
                    None => self
                        .read_hold(RESERVE, &reservation.order_id, &reservation.user_id)
                        .await?
                        .is_some(),
                };
                Ok(Err(if held {
                    ReserveRefusal::AlreadyHeld
                } else {
                    ReserveRefusal::LimitReached
                }))
            }
            Err(refusal) if refusal.failed(0) => Ok(Err(ReserveRefusal::ShardEmpty)),
            Err(refusal) => Err(refusal.unexpected(RESERVE)),
        }
    }

    async fn availability(&self, sale: &Sale) -> Result<Vec<u64>, StoreError> {
        // The public sale page's number, read on every view: half the read cost,
        // served by any replica instead of the shard leaders the grabs are writing to.
        self.shard_stock(AVAILABILITY, sale, Consistency::Eventual)
            .await
    }

    async fn release(
        &self,
        reservation: &Reservation,
        reason: ReleaseReason,
        now: DateTime<Utc>,
    ) -> Result<Settlement, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        // The hold stays, with its final status, so that a late retry of the grab that
        // made it finds it and cannot reserve the order id again. An expiry records
        // when it committed, so its lateness can be read back with the order.
        let end_hold = built(
            RELEASE,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression(
                    "SET #hold.#status = :final, #hold.#settled = :settled, \
                     #active = #active - :one ADD #abandoned :one",
                )
                .condition_expression(
                    "#hold.#status IN (:reserved, :pending) AND #hold.#shard = :shard",
                )
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#active", ACTIVE),
                    ("#abandoned", ABANDONED),
                    ("#status", STATUS),
                    ("#shard", SHARD),
                    ("#settled", item::settled_at_attribute(reason)),
                ]))
                .set_expression_attribute_values(values([
                    (":one", n(1)),
                    (":settled", item::time(now)),
                    (":final", s(reason.final_status().as_str())),
                    (":reserved", s(OrderStatus::Reserved.as_str())),
                    (":pending", s(OrderStatus::PendingPayment.as_str())),
                    (":shard", n(reservation.shard)),
                ]))
                .build(),
        )?;
        let record = self.settle_order_item(RELEASE, reservation, reason.final_status(), now)?;
        let give_back = built(
            RELEASE,
            self.update(item::shard_key(&reservation.sale_id, reservation.shard))
                .update_expression("SET #available = #available + :one")
                .condition_expression("attribute_exists(#pk)")
                .set_expression_attribute_names(names(&[("#pk", PK), ("#available", AVAILABLE)]))
                .set_expression_attribute_values(values([(":one", n(1))]))
                .build(),
        )?;
        let items = vec![
            TransactWriteItem::builder().update(end_hold).build(),
            TransactWriteItem::builder().put(record).build(),
            TransactWriteItem::builder().update(give_back).build(),
        ];
        match self.run(RELEASE, items).await? {
            Ok(()) => Ok(Settlement::Applied),
            Err(refusal) if refusal.failed(0) => self.settlement_after_refusal(reservation).await,
            Err(refusal) => Err(refusal.unexpected(RELEASE)),
        }
    }
}

#[async_trait]
impl OrderBook for DynamoStore {
    async fn open(&self, reservation: &Reservation) -> Result<OpenOutcome, StoreError> {
        let record = built(
            OPEN,
            self.put(item::order_item(
                reservation,
                OrderStatus::PendingPayment,
                Utc::now(),
            ))
            .condition_expression("attribute_not_exists(#pk)")
            .set_expression_attribute_names(names(&[("#pk", PK)]))
            .build(),
        )?;
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let advance = built(
            OPEN,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression("SET #hold.#status = :pending")
                .condition_expression("#hold.#status = :reserved AND #hold.#shard = :shard")
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#status", STATUS),
                    ("#shard", SHARD),
                ]))
                .set_expression_attribute_values(values([
                    (":reserved", s(OrderStatus::Reserved.as_str())),
                    (":pending", s(OrderStatus::PendingPayment.as_str())),
                    (":shard", n(reservation.shard)),
                ]))
                .build(),
        )?;
        let items = vec![
            TransactWriteItem::builder().put(record).build(),
            TransactWriteItem::builder().update(advance).build(),
        ];
        match self.run(OPEN, items).await? {
            Ok(()) => Ok(OpenOutcome::AwaitingPayment),
            // The order item exists: this is a redelivery, or pay/release came first.
            Err(refusal) if refusal.failed(0) => {
                Ok(match self.read_order(OPEN, &reservation.order_id).await? {
                    Some((_, OrderStatus::PendingPayment)) => OpenOutcome::AwaitingPayment,
                    Some((_, status)) if !status.is_open() => OpenOutcome::AlreadySettled(status),
                    _ => OpenOutcome::Unknown,
                })
            }
            Err(_) => Ok(OpenOutcome::Unknown),
        }
    }

    async fn pay(
        &self,
        reservation: &Reservation,
        now: DateTime<Utc>,
    ) -> Result<PayOutcome, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let settle_hold = built(
            PAY,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression("SET #hold.#status = :paid")
                .condition_expression(
                    "#hold.#status IN (:reserved, :pending) AND #hold.#expires > :now \
                     AND #hold.#shard = :shard",
                )
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#status", STATUS),
                    ("#expires", EXPIRES_AT_MS),
                    ("#shard", SHARD),
                ]))
                .set_expression_attribute_values(values([
                    (":paid", s(OrderStatus::Paid.as_str())),
                    (":reserved", s(OrderStatus::Reserved.as_str())),
                    (":pending", s(OrderStatus::PendingPayment.as_str())),
                    (":now", n(now.timestamp_millis())),
                    (":shard", n(reservation.shard)),
                ]))
                .build(),
        )?;
        let record = self.settle_order_item(PAY, reservation, OrderStatus::Paid, now)?;
        let items = vec![
            TransactWriteItem::builder().update(settle_hold).build(),
            TransactWriteItem::builder().put(record).build(),
        ];
        match self.run(PAY, items).await? {
            Ok(()) => return Ok(PayOutcome::Paid),
            // The hold refused: it is paid, released, past its window, or not this one.
            Err(refusal) if refusal.failed(0) => {}
            Err(refusal) => return Err(refusal.unexpected(PAY)),
        }
        let id = &reservation.order_id;
        match self.read_hold(PAY, id, &reservation.user_id).await? {
            Some(hold) if hold.status == OrderStatus::Paid => Ok(PayOutcome::Paid),
            Some(hold)
                if hold.status.is_open()
                    && hold.shard == reservation.shard
                    && now >= hold.expires_at =>
            {
                Ok(PayOutcome::WindowClosed)
            }
            Some(hold) if hold.status.is_open() => Ok(PayOutcome::Unknown),
            Some(hold) => Ok(PayOutcome::Settled(hold.status)),
            None => Ok(PayOutcome::Unknown),
        }
    }

    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError> {
        // The hold is keyed by the caller, so finding it proves ownership (another
        // user's order is simply not there); it exists before the consumer has written
        // the order item, and a settled one keeps its final status. One read.
        Ok(self
            .read_hold(FIND, order_id, user)
            .await?
            .map(|hold| hold.order(order_id, user)))
    }

    /// Only user items are read, so paid holds are read too but settled orders are not.
    async fn open_holds(&self, sale: &Sale) -> Result<Vec<(Reservation, OrderStatus)>, StoreError> {
        let mut open = Vec::new();
        self.read_holds(OPEN_HOLDS, sale, |reservation, status| {
            if status.is_open() {
                open.push((reservation, status));
            }
        })
        .await?;
        open.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
        Ok(open)
    }

    /// Shards are read consistently; holds through `gsi1`, which DynamoDB updates
    /// asynchronously, so a count taken mid-surge may miss the last few writes (and not
    /// reconcile) until the index catches up. Every unit is counted once, from its hold.
    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError> {
        let mut counts = StockCounts {
            available: self
                .shard_stock(COUNT, sale, Consistency::Strong)
                .await?
                .iter()
                .sum(),
            ..StockCounts::default()
        };
        self.read_holds(COUNT, sale, |_, status| {
            let counter = match status {
                OrderStatus::Reserved => &mut counts.reserved,
                OrderStatus::PendingPayment => &mut counts.pending_payment,
                OrderStatus::Paid => &mut counts.paid,
                OrderStatus::Cancelled => &mut counts.cancelled,
                OrderStatus::Expired => &mut counts.expired,
            };
            *counter += 1;
        })
        .await?;
        Ok(counts)
    }
}

/// The blocklist: one item per blocked user, pk `BLOCKLIST`, sk `USER#{user_id}`.
#[async_trait]
impl Blocklist for DynamoStore {
    async fn block(&self, user: &UserId) -> Result<(), StoreError> {
        // Unconditional: putting the same key again is the idempotent block.
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item::blocked_user_key(user)))
            .send()
            .await
            .map_err(|error| store_error(BLOCK, error))?;
        Ok(())
    }

    async fn unblock(&self, user: &UserId) -> Result<(), StoreError> {
        // Deleting a missing key succeeds, which is the idempotent unblock.
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::blocked_user_key(user)))
            .send()
            .await
            .map_err(|error| store_error(UNBLOCK, error))?;
        Ok(())
    }

    async fn blocked(&self) -> Result<Vec<UserId>, StoreError> {
        // Consistent, so an admin who lists right after a block sees it; the grab reads
        // this only once per refresh interval per process, so the double cost is noise.
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :blocklist")
            .set_expression_attribute_names(names(&[("#pk", PK), ("#sk", item::SK)]))
            .set_expression_attribute_values(values([(":blocklist", item::blocklist_pk())]))
            .projection_expression("#pk, #sk")
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut users = Vec::new();
        while let Some(found) = pages.next().await {
            let found = found.map_err(|error| store_error(BLOCKED, error))?;
            users.push(
                item::parse_blocked_user(&found)
                    .map_err(|error| corrupt(BLOCKED, &found, error))?,
            );
        }
        Ok(users)
    }
}
