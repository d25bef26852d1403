//! What every port's requests share: expression names and values, the put and update
//! builders, running a transaction, and the reads that tell why one was refused.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_dynamodb::error::BuildError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::builders::{PutBuilder, UpdateBuilder};
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, Put, TransactWriteItem, Update};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use chrono::{DateTime, Utc};
use flashsale_domain::{OrderId, OrderStatus, Reservation, Sale, StoreError, UserId};

use super::item::{self, AVAILABLE, GSI1, Hold, Item, ItemError, PK, STATUS, TAKERS, s};
use super::transact::{Refusal, count_conflict, transact};
use super::{CorruptItem, DynamoStore, Inconsistency, UnprocessedKeys};
use crate::classify::store_error;
#[cfg(doc)]
use crate::retry::RetryPolicy;
use crate::retry::{Attempt, Outlasted};

/// `#placeholder` -> attribute name, for `ExpressionAttributeNames`.
pub(super) fn names(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(placeholder, name)| ((*placeholder).to_owned(), (*name).to_owned()))
            .collect(),
    )
}

/// `:placeholder` -> value, for `ExpressionAttributeValues`.
pub(super) fn values<'a>(
    pairs: impl IntoIterator<Item = (&'a str, AttributeValue)>,
) -> Option<HashMap<String, AttributeValue>> {
    Some(
        pairs
            .into_iter()
            .map(|(placeholder, value)| (placeholder.to_owned(), value))
            .collect(),
    )
}

/// A request that failed to build is our bug, never the caller's input.
pub(super) fn built<T>(
    operation: &'static str,
    result: Result<T, BuildError>,
) -> Result<T, StoreError> {
    result.map_err(|error| StoreError::permanent(operation, error))
}

pub(super) fn corrupt(operation: &'static str, key: &Item, error: ItemError) -> StoreError {
    StoreError::permanent(operation, CorruptItem::new(key, error))
}

/// The most keys one `BatchGetItem` may ask for (DynamoDB's limit).
const MAX_BATCH_GET_KEYS: usize = 100;

/// A write whose SDK resend met a transaction, after a try whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a resend met a transaction on the item after an earlier try's answer was lost")]
pub struct ConflictAfterALostAnswer;

/// Counts the tries of one call that were sent and got no answer, or a 5xx: each may
/// have applied.
#[derive(Debug, Clone, Default)]
struct LostAnswers {
    sent: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl LostAnswers {
    fn any(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Intercept for LostAnswers {
    fn name(&self) -> &'static str {
        "LostAnswers"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.sent.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // A try refused before it was sent (the breaker) did nothing.
        if self.sent.swap(false, Ordering::Relaxed)
            && context
                .response()
                .is_none_or(|response| !response.status().is_client_error())
        {
            self.lost.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What a plain conditional write came to.
#[derive(Debug)]
pub(super) enum Written {
    Done,
    /// The condition failed; nothing was written. The item as it was, when the request
    /// asked for it (`ReturnValuesOnConditionCheckFailure::AllOld`) and it exists.
    Refused(Option<Item>),
    /// A transaction was in flight on the item (`TransactionConflictException`);
    /// nothing was written and nothing decided.
    Contended,
    /// The same, but on the SDK's resend after a try whose answer was lost: that try
    /// may have applied, so the write's outcome is unknown.
    ContendedAfterALostAnswer,
}

/// Which attributes of the shards a read asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShardPart {
    /// `available`: what the page and the gate need.
    Stock,
    /// The takes, for the reconciler.
    Takers,
    /// Both, for the gate's recheck.
    StockAndTakers,
}

/// How fresh a read of the shards must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Consistency {
    /// Sees every write acknowledged before it; twice the read cost.
    Strong,
    /// May miss the last second's writes.
    Eventual,
}

impl DynamoStore {
    pub(super) fn update(&self, key: Item) -> UpdateBuilder {
        Update::builder().table_name(&self.table).set_key(Some(key))
    }

    pub(super) fn put(&self, item: Item) -> PutBuilder {
        Put::builder().table_name(&self.table).set_item(Some(item))
    }

    /// Writes the order item in its final `status`, unless it is already settled: the
    /// order's part of a pay or release transaction. Until then the order is only its
    /// hold, so the item is new: written once, when the hold settles (or there since the
    /// consumer of an earlier version opened it, as [`item::LEGACY_PENDING_PAYMENT`]).
    pub(super) fn settle_order_item(
        &self,
        operation: &'static str,
        reservation: &Reservation,
        status: OrderStatus,
        now: DateTime<Utc>,
    ) -> Result<Put, StoreError> {
        built(
            operation,
            self.put(item::order_item(reservation, status, now))
                .condition_expression("attribute_not_exists(#pk) OR #status = :legacy_pending")
                .set_expression_attribute_names(names(&[("#pk", PK), ("#status", STATUS)]))
                .set_expression_attribute_values(values([(
                    ":legacy_pending",
                    s(item::LEGACY_PENDING_PAYMENT),
                )]))
                .build(),
        )
    }

    /// A plain `UpdateItem` of the item at `key`, to send with [`DynamoStore::write`].
    pub(super) fn update_item(&self, key: Item) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
    }

    /// Sends a conditional `UpdateItem` as [`DynamoStore::write`] does, waiting its turn
    /// (jittered, bounded: [`RetryPolicy::until_uncontended`]) behind a transaction that
    /// holds the item, as the writes off the hot path do. Whether it applied (`false`:
    /// its condition refused it), or contention outlasted the tries. Only for a write
    /// that is safe to resend: once applied, its condition refuses it or it applies the
    /// same again.
    pub(super) async fn write_in_turn(
        &self,
        operation: &'static str,
        update: UpdateItemFluentBuilder,
    ) -> Result<Result<bool, Outlasted<()>>, StoreError> {
        self.contention
            .until_uncontended(operation, || async {
                Ok(match self.write(operation, update.clone()).await? {
                    Written::Done => Attempt::Finished(true),
                    Written::Refused(_) => Attempt::Finished(false),
                    // Sent again in turn: once applied, its condition refuses it.
                    Written::Contended | Written::ContendedAfterALostAnswer => {
                        Attempt::Contended(())
                    }
                })
            })
            .await
    }

    /// Sends a conditional `UpdateItem`. The SDK's own retries resend the same request,
    /// which is safe for every write here: each one's condition refuses it once it has
    /// applied, and the refusal's old item tells the caller so.
    ///
    /// But a conflict says nothing was written only of the try it answers: when the SDK
    /// resent the write after a try whose answer was lost, that try may have applied
    /// ([`Written::ContendedAfterALostAnswer`]).
    pub(super) async fn write(
        &self,
        operation: &'static str,
        update: UpdateItemFluentBuilder,
    ) -> Result<Written, StoreError> {
        let lost = LostAnswers::default();
        let error = match update.customize().interceptor(lost.clone()).send().await {
            Ok(_) => return Ok(Written::Done),
            Err(error) => error,
        };
        match error.as_service_error() {
            Some(UpdateItemError::ConditionalCheckFailedException(refused)) => {
                Ok(Written::Refused(refused.item.clone()))
            }
            Some(UpdateItemError::TransactionConflictException(_)) => {
                count_conflict(operation);
                if lost.any() {
                    return Ok(Written::ContendedAfterALostAnswer);
                }
                Ok(Written::Contended)
            }
            _ => Err(store_error(operation, error)),
        }
    }

    pub(super) async fn run(
        &self,
        operation: &'static str,
        items: Vec<TransactWriteItem>,
    ) -> Result<Result<(), Refusal>, StoreError> {
        transact(&self.client, &self.contention, operation, items).await
    }

    /// A consistent read of one item, or of some of its attributes.
    pub(super) async fn get(
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

    /// A consistent read of the whole item at `key`, parsed; one that does not parse is
    /// corrupt.
    pub(super) async fn read_item<T>(
        &self,
        operation: &'static str,
        key: Item,
        parse: fn(&Item) -> Result<T, ItemError>,
    ) -> Result<Option<T>, StoreError> {
        let Some(found) = self.get(operation, key.clone(), None).await? else {
            return Ok(None);
        };
        parse(&found)
            .map(Some)
            .map_err(|error| corrupt(operation, &key, error))
    }

    /// The hold of `order_id` on `user`'s item for the order's sale.
    pub(super) async fn read_hold(
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

    /// Every item of `gsi1` under the key condition, page by page.
    pub(super) async fn query_index(
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

    /// Every item of `request` that exists, asking again for the keys DynamoDB left
    /// unprocessed. At most [`MAX_BATCH_GET_KEYS`] keys.
    async fn batch_get(
        &self,
        operation: &'static str,
        mut request: KeysAndAttributes,
    ) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::with_capacity(request.keys().len());
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            let output = self
                .client
                .batch_get_item()
                .request_items(&self.table, request.clone())
                .send()
                .await
                .map_err(|error| store_error(operation, error))?;
            found.extend(
                output
                    .responses
                    .and_then(|mut tables| tables.remove(&self.table))
                    .unwrap_or_default(),
            );
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
                    request = unprocessed;
                }
                _ => return Ok(found),
            }
        }
    }

    /// Reads every shard's `available`, in batches of up to [`MAX_BATCH_GET_KEYS`].
    pub(super) async fn shard_stock(
        &self,
        operation: &'static str,
        sale: &Sale,
        read: Consistency,
    ) -> Result<Vec<u64>, StoreError> {
        self.shard_items(operation, sale, read, ShardPart::Stock)
            .await?
            .iter()
            .map(|found| {
                item::parse_available(found).map_err(|error| corrupt(operation, found, error))
            })
            .collect()
    }

    /// Every shard's item (index = shard), with the attributes `part` names, in
    /// batches of up to [`MAX_BATCH_GET_KEYS`]. A missing shard contradicts the sale.
    pub(super) async fn shard_items(
        &self,
        operation: &'static str,
        sale: &Sale,
        read: Consistency,
        part: ShardPart,
    ) -> Result<Vec<Item>, StoreError> {
        let shard_of: HashMap<String, u16> = (0..sale.shards)
            .map(|shard| (item::shard_pk(&sale.sale_id, shard), shard))
            .collect();
        let keys: Vec<Item> = (0..sale.shards)
            .map(|shard| item::shard_key(&sale.sale_id, shard))
            .collect();
        let (projection, attributes) = match part {
            ShardPart::Stock => (
                "#pk, #available",
                &[("#pk", PK), ("#available", AVAILABLE)][..],
            ),
            ShardPart::Takers => ("#pk, #takers", &[("#pk", PK), ("#takers", TAKERS)][..]),
            ShardPart::StockAndTakers => (
                "#pk, #available, #takers",
                &[("#pk", PK), ("#available", AVAILABLE), ("#takers", TAKERS)][..],
            ),
        };
        let mut items: Vec<Option<Item>> = vec![None; usize::from(sale.shards)];
        for batch in keys.chunks(MAX_BATCH_GET_KEYS) {
            let request = built(
                operation,
                KeysAndAttributes::builder()
                    .set_keys(Some(batch.to_vec()))
                    .consistent_read(read == Consistency::Strong)
                    .projection_expression(projection)
                    .set_expression_attribute_names(names(attributes))
                    .build(),
            )?;
            for found in self.batch_get(operation, request).await? {
                let shard = found
                    .get(PK)
                    .and_then(|pk| pk.as_s().ok())
                    .and_then(|pk| shard_of.get(pk))
                    .copied()
                    .ok_or_else(|| corrupt(operation, &found, ItemError::Missing(PK.to_owned())))?;
                items[usize::from(shard)] = Some(found);
            }
        }
        items
            .into_iter()
            .zip(0..)
            .map(|(found, shard)| {
                found.ok_or_else(|| {
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
