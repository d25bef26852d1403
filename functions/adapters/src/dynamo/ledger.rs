//! [`StockLedger`]: the shards and the holds on the users' items. The hot path.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;
use chrono::{DateTime, Utc};
use flashsale_domain::ports::{ReserveRefusal, Settlement, StockLedger};
use flashsale_domain::sale::MAX_ABANDONED_HOLDS;
use flashsale_domain::{OrderStatus, ReleaseReason, Reservation, Sale, StoreError};

use super::item::{
    self, ABANDONED, ACTIVE, AVAILABLE, GSI1_PK, GSI1_SK, Hold, PK, SHARD, STATUS, n, s,
};
use super::requests::{Consistency, built, names, values};
use super::transact::{self, Attempted, in_request_order};
use super::{DynamoStore, InvalidRequest};

const RESERVE: &str = "dynamodb.reserve";
const AVAILABILITY: &str = "dynamodb.availability";
const RELEASE: &str = "dynamodb.release";

/// `reserve`'s transaction items.
mod reserving {
    /// Takes the unit from the shard.
    pub(super) const SHARD_ITEM: usize = 0;
    /// Records the hold and counts it against the user's limit.
    pub(super) const USER_ITEM: usize = 1;
}

/// `release`'s transaction items.
mod releasing {
    /// Ends the hold on the user's item.
    pub(super) const USER_ITEM: usize = 0;
    /// Records the order's final status.
    pub(super) const ORDER_ITEM: usize = 1;
    /// Gives the unit back to its shard.
    pub(super) const SHARD_ITEM: usize = 2;
}

impl DynamoStore {
    /// Refuses a reservation that does not belong to `shard` of `sale`, before writing.
    fn check_reservation(
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<(), StoreError> {
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
        Ok(())
    }

    /// Why a release's hold refused: the hold is settled or unknown.
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
}

#[async_trait]
impl StockLedger for DynamoStore {
    async fn reserve(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        Self::check_reservation(sale, shard, reservation)?;
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
        let items = in_request_order([
            (reserving::SHARD_ITEM, transact::update(take)),
            (reserving::USER_ITEM, transact::update(hold)),
        ]);
        let refusal = match self.run_once(RESERVE, items).await? {
            Attempted::Committed => return Ok(Ok(())),
            // A hot shard admits one transaction at a time; the grab tries another
            // shard at once instead of waiting for this one.
            Attempted::Conflicted(_) => return Ok(Err(ReserveRefusal::Contended)),
            Attempted::Refused(refusal) => refusal,
        };
        match refusal {
            // The user's refusal wins when both failed: a retry gets its order back
            // whatever the shard holds now, and a user at the limit is told so rather
            // than sent on to try every other shard.
            refusal if refusal.failed(reserving::USER_ITEM) => {
                let held = match refusal.old_item(reserving::USER_ITEM) {
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
            refusal if refusal.failed(reserving::SHARD_ITEM) => Ok(Err(ReserveRefusal::ShardEmpty)),
            refusal => Err(refusal.unexpected(RESERVE)),
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
        let items = in_request_order([
            (releasing::USER_ITEM, transact::update(end_hold)),
            (releasing::ORDER_ITEM, transact::put(record)),
            (releasing::SHARD_ITEM, transact::update(give_back)),
        ]);
        match self.run(RELEASE, items).await? {
            Ok(()) => Ok(Settlement::Applied),
            Err(refusal) if refusal.failed(releasing::USER_ITEM) => {
                self.settlement_after_refusal(reservation).await
            }
            Err(refusal) => Err(refusal.unexpected(RELEASE)),
        }
    }
}
