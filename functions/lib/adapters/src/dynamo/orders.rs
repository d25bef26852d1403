//! [`OrderBook`]: the order items, moved along with their holds.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_domain::buyer_orders::{BuyerOrdersCursor, BuyerOrdersPage};
use flashsale_domain::fulfilment::{BuyerCursor, OrderPage};
use flashsale_domain::payment::OrderPayment;
use flashsale_domain::ports::{OrderBook, PayOutcome};
use flashsale_domain::sale::StockCounts;
use flashsale_domain::{Order, OrderId, OrderStatus, Reservation, Sale, StoreError, UserId};
use futures::{StreamExt, TryStreamExt, stream};

use super::DynamoStore;
use super::item::{
    self, EXPIRES_AT_MS, GSI1, GSI1_PK, GSI1_SK, GSI2, GSI2_PK, OPEN_HOLD, PAID_AT, PAYMENT_ID,
    PAYMENT_STATE, SHARD, STATUS, n, s,
};
use super::requests::{Consistency, built, corrupt, names, values};
use super::transact::{self, in_request_order};

const FIND: &str = "dynamodb.find";
const COUNT: &str = "dynamodb.count";
const OPEN_HOLDS: &str = "dynamodb.open_holds";
const SALE_ORDERS: &str = "dynamodb.sale_orders";
const BUYER_ORDERS: &str = "dynamodb.buyer_orders";
/// The most queries one page of a sale's orders makes: a sale of thousands of buckets
/// with few buyers each is then walked over several pages, each well within the
/// function's timeout, instead of one page querying every empty bucket in turn.
const MAX_QUERIES_PER_PAGE: usize = 100;

/// Stats buckets queried at once when reading a sale's holds.
const BUCKET_QUERIES_IN_FLIGHT: usize = 16;

/// The transaction items of `pay_with`.
mod paying {
    /// Marks the hold on the user's item paid.
    pub(super) const USER_ITEM: usize = 0;
    /// Records the order paid.
    pub(super) const ORDER_ITEM: usize = 1;
}

impl DynamoStore {
    /// Every hold of the sale, in any status, as the order it is and the reservation it
    /// records, read from the user items in the sale's stats buckets `0..sale.shards`
    /// of `gsi1`. Holds are the whole record: every order
    /// item is written in the same transaction as its hold and carries the same status,
    /// so the order items are skipped by the key condition. DynamoDB updates the index
    /// asynchronously, so this may miss the last few writes.
    pub(super) async fn read_holds(
        &self,
        operation: &'static str,
        sale: &Sale,
    ) -> Result<Vec<(Order, Reservation)>, StoreError> {
        // A sale may have up to a thousand buckets: one query after another would
        // take seconds.
        let buckets: Vec<Vec<(Order, Reservation)>> = stream::iter(0..sale.shards)
            .map(|bucket| self.read_bucket_holds(operation, sale, bucket))
            .buffer_unordered(BUCKET_QUERIES_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(buckets.into_iter().flatten().collect())
    }

    async fn read_bucket_holds(
        &self,
        operation: &'static str,
        sale: &Sale,
        bucket: u16,
    ) -> Result<Vec<(Order, Reservation)>, StoreError> {
        let attribute_values = HashMap::from([
            (
                ":bucket".to_owned(),
                s(item::bucket_pk(&sale.sale_id, bucket)),
            ),
            (":users".to_owned(), item::user_gsi_prefix()),
        ]);
        let mut holds = Vec::new();
        self.query_index(
            operation,
            "#gsi1pk = :bucket AND begins_with(#gsi1sk, :users)",
            &[("#gsi1pk", GSI1_PK), ("#gsi1sk", GSI1_SK)],
            Some(attribute_values),
            |found| {
                holds.extend(
                    item::parse_holds(&found).map_err(|error| corrupt(operation, &found, error))?,
                );
                Ok(())
            },
        )
        .await?;
        Ok(holds)
    }
}

impl DynamoStore {
    /// Marks an open hold paid with `payment` (which must be the order's, and whose
    /// state is recorded), atomically with the order's item, if its window is open at
    /// `now`: [`OrderPayments::pay_with`]. One conditional write decides between this,
    /// a cancel and the timeout; a refusal is read back to say which won.
    ///
    /// [`OrderPayments::pay_with`]: flashsale_domain::ports::OrderPayments::pay_with
    pub(super) async fn mark_paid(
        &self,
        operation: &'static str,
        reservation: &Reservation,
        payment: &OrderPayment,
        now: DateTime<Utc>,
    ) -> Result<PayOutcome, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let [reserved, legacy_pending] = item::open_hold_values();
        let settle_hold = built(
            operation,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression(
                    "SET #hold.#status = :paid, #hold.#payment_state = :payment_state, \
                     #hold.#paid_at = :paid_at",
                )
                .condition_expression(format!(
                    "{OPEN_HOLD} AND #hold.#expires > :now AND #hold.#shard = :shard \
                     AND #hold.#payment_id = :payment_id"
                ))
                .set_expression_attribute_names(names(&[
                    ("#hold", hold_attribute.as_str()),
                    ("#status", STATUS),
                    ("#expires", EXPIRES_AT_MS),
                    ("#shard", SHARD),
                    ("#payment_id", PAYMENT_ID),
                    ("#payment_state", PAYMENT_STATE),
                    ("#paid_at", PAID_AT),
                ]))
                .set_expression_attribute_values(values([
                    (":paid", s(OrderStatus::Paid.as_str())),
                    (":paid_at", item::time(now)),
                    reserved,
                    legacy_pending,
                    (":now", n(now.timestamp_millis())),
                    (":shard", n(reservation.shard)),
                    (":payment_id", s(payment.id.as_str())),
                    (":payment_state", s(payment.state.name())),
                ]))
                .build(),
        )?;
        let record = self.settle_order_item(operation, reservation, OrderStatus::Paid, now)?;
        let items = in_request_order([
            (paying::USER_ITEM, transact::update(settle_hold)),
            (paying::ORDER_ITEM, transact::put(record)),
        ]);
        // The SDK resends a transaction whose answer was lost with the same client
        // request token, which DynamoDB answers as done: so a refusal is not this call's
        // own write, and a hold found paid was paid by another call. (A write whose
        // answer is lost beyond the SDK's retries fails its call; whoever settles the
        // order next finds it paid by another: `Settled(Paid)`.)
        match self.run(operation, items).await? {
            Ok(()) => return Ok(PayOutcome::Paid),
            // The hold refused: it is paid, released, past its window, another
            // payment's, or not this one.
            Err(refusal) if refusal.failed(paying::USER_ITEM) => {}
            Err(refusal) => return Err(refusal.unexpected(operation)),
        }
        let id = &reservation.order_id;
        let paid_with = |hold: &item::Hold| {
            hold.payment
                .as_ref()
                .is_some_and(|recorded| recorded.id == payment.id)
        };
        Ok(
            match self.read_hold(operation, id, &reservation.user_id).await? {
                Some(hold)
                    if hold.status.is_open()
                        && hold.shard == reservation.shard
                        && paid_with(&hold)
                        && now >= hold.expires_at =>
                {
                    PayOutcome::WindowClosed
                }
                // Open, but on another shard or with another payment (or none): not this
                // order, or not its payment.
                Some(hold) if hold.status.is_open() => PayOutcome::Unknown,
                Some(hold) => PayOutcome::Settled(hold.status),
                None => PayOutcome::Unknown,
            },
        )
    }
}

#[async_trait]
impl OrderBook for DynamoStore {
    async fn find(
        &self,
        order_id: &OrderId,
        user: &UserId,
    ) -> Result<Option<(Order, Reservation)>, StoreError> {
        // The hold is keyed by the caller, so finding it proves ownership (another
        // user's order is simply not there); it is the order from the grab on, and a
        // settled one keeps its final status. One read.
        Ok(self
            .read_hold(FIND, order_id, user)
            .await?
            .map(|hold| hold.order(order_id, user)))
    }

    /// Bucket by bucket from the cursor's: queries of the bucket's `gsi1` partition (its
    /// user items only, one a buyer) from after the cursor's buyer, each asking for no
    /// more buyers than the page still holds, so a page reads about `limit` items
    /// whatever the sale's size, in at most [`MAX_QUERIES_PER_PAGE`] queries.
    async fn sale_orders(
        &self,
        sale: &Sale,
        after: Option<&BuyerCursor>,
        limit: usize,
    ) -> Result<OrderPage, StoreError> {
        let limit = limit.max(1);
        let mut orders = Vec::new();
        let mut buyers = 0_usize;
        let mut queries = 0_usize;
        let mut start = after.and_then(|cursor| {
            let buyer = cursor.after.as_deref()?;
            Some(item::buyer_index_key(&sale.sale_id, cursor.bucket, buyer))
        });
        for bucket in after.map_or(0, |cursor| cursor.bucket)..sale.shards {
            // The last buyer read in this bucket, where the next page goes on from.
            let mut last_buyer = after
                .filter(|cursor| cursor.bucket == bucket)
                .and_then(|cursor| cursor.after.clone());
            loop {
                if queries == MAX_QUERIES_PER_PAGE {
                    let next = BuyerCursor {
                        bucket,
                        after: last_buyer,
                    };
                    return Ok(OrderPage {
                        orders,
                        next: Some(next),
                    });
                }
                queries += 1;
                let asked = i32::try_from(limit - buyers).unwrap_or(i32::MAX);
                let output = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(GSI1)
                    .key_condition_expression("#gsi1pk = :bucket AND begins_with(#gsi1sk, :users)")
                    .set_expression_attribute_names(names(&[
                        ("#gsi1pk", GSI1_PK),
                        ("#gsi1sk", GSI1_SK),
                    ]))
                    .set_expression_attribute_values(values([
                        (":bucket", s(item::bucket_pk(&sale.sale_id, bucket))),
                        (":users", item::user_gsi_prefix()),
                    ]))
                    .limit(asked)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|error| crate::classify::store_error(SALE_ORDERS, error))?;
                for found in output.items() {
                    let parsed = item::user_item_owner(found)
                        .and_then(|(_, buyer)| Ok((buyer, item::parse_holds(found)?)));
                    let (buyer, holds) =
                        parsed.map_err(|error| corrupt(SALE_ORDERS, found, error))?;
                    let mut theirs: Vec<Order> =
                        holds.into_iter().map(|(order, _)| order).collect();
                    theirs.sort_by(|a, b| a.order_id.cmp(&b.order_id));
                    orders.extend(theirs);
                    buyers += 1;
                    last_buyer = Some(buyer.as_str().to_owned());
                }
                let more_here = output.last_evaluated_key().is_some();
                if buyers == limit {
                    let more = more_here || bucket + 1 < sale.shards;
                    let next = more.then_some(BuyerCursor {
                        bucket,
                        after: last_buyer,
                    });
                    return Ok(OrderPage { orders, next });
                }
                if !more_here {
                    break;
                }
                // The query's 1 MB page ended first: on from where it stopped.
                start = output.last_evaluated_key;
            }
        }
        Ok(OrderPage { orders, next: None })
    }

    /// One query of the buyer's partition of `gsi2`, latest first, for at most `limit`
    /// user items: each one sale's holds of the buyer's.
    async fn buyer_orders(
        &self,
        user: &UserId,
        after: Option<&BuyerOrdersCursor>,
        limit: usize,
    ) -> Result<BuyerOrdersPage, StoreError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(GSI2)
            .key_condition_expression("#gsi2pk = :buyer")
            .set_expression_attribute_names(names(&[("#gsi2pk", GSI2_PK)]))
            .set_expression_attribute_values(values([(":buyer", s(item::buyer_gsi_pk(user)))]))
            .scan_index_forward(false)
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .set_exclusive_start_key(after.map(|cursor| item::buyer_orders_index_key(user, cursor)))
            .send()
            .await
            .map_err(|error| crate::classify::store_error(BUYER_ORDERS, error))?;
        let mut orders = Vec::new();
        for found in output.items() {
            let mut holds =
                item::parse_holds(found).map_err(|error| corrupt(BUYER_ORDERS, found, error))?;
            holds.sort_unstable_by(|(_, a), (_, b)| {
                (b.created_at, &b.order_id).cmp(&(a.created_at, &a.order_id))
            });
            orders.extend(holds.into_iter().map(|(order, _)| order));
        }
        // The last key read holds its `gsi2sk`: the place the next page goes on from.
        let next = output
            .last_evaluated_key()
            .map(|last| {
                item::buyer_orders_cursor(last).map_err(|error| corrupt(BUYER_ORDERS, last, error))
            })
            .transpose()?;
        Ok(BuyerOrdersPage { orders, next })
    }

    /// Only user items are read, so paid holds are read too but settled orders are not.
    async fn open_holds(&self, sale: &Sale) -> Result<Vec<Reservation>, StoreError> {
        let mut open: Vec<_> = self
            .read_holds(OPEN_HOLDS, sale)
            .await?
            .into_iter()
            .filter(|(order, _)| order.status.is_open())
            .map(|(_, reservation)| reservation)
            .collect();
        open.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        Ok(open)
    }

    /// Shards are read consistently; holds through `gsi1`, which DynamoDB updates
    /// asynchronously, so a count taken mid-surge may miss the last few writes (and not
    /// reconcile) until the index catches up. Every unit is counted once, from its hold,
    /// and so is the state of its payment the hold records.
    async fn count(&self, sale: &Sale) -> Result<StockCounts, StoreError> {
        let mut counts = StockCounts {
            available: self
                .shard_stock(COUNT, sale, Consistency::Strong)
                .await?
                .iter()
                .sum(),
            ..StockCounts::default()
        };
        for (order, _) in self.read_holds(COUNT, sale).await? {
            counts.add(order.status, order.payment.as_ref());
        }
        Ok(counts)
    }
}
