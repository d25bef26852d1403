//! [`StockLedger`]: the shards and the holds on the users' items. The hot path.
//!
//! A reservation is two plain conditional writes: the *take* on the shard (one unit
//! out of `available`, the order into `takers`), then the *hold* on the user's item
//! (the limit's count and the hold). No transaction touches a shard: on AWS a
//! transaction on a hot item is cancelled by any other in flight on it, while plain
//! writes to one item queue and all succeed. Exactly once comes from the shard's takers
//! instead: a take, a give-back and an undo are each refused once they have applied,
//! and the refusal's old item says so, so every step may be sent again.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use chrono::{DateTime, Utc};
use flashsale_domain::ports::{
    ReserveRefusal, Settlement, ShardState, ShardTakers, StockLedger, Take, TakeReturn,
};
use flashsale_domain::sale::MAX_ABANDONED_HOLDS;
use flashsale_domain::{OrderStatus, ReleaseReason, Reservation, Sale, StoreError};

use super::item::{
    self, ABANDONED, ACTIVE, AVAILABLE, GSI1_PK, GSI1_SK, Hold, Item, SHARD, STATUS, TAKERS, n, s,
};
use super::requests::{Consistency, ShardPart, Written, built, corrupt, names, values};
use super::transact::{self, in_request_order};
use super::{DynamoStore, Inconsistency, InvalidRequest};

const RESERVE: &str = "dynamodb.reserve";
const AVAILABILITY: &str = "dynamodb.availability";
const RELEASE: &str = "dynamodb.release";
const SHARD_STATES: &str = "dynamodb.shard_states";
const UNACCOUNTED_TAKES: &str = "dynamodb.unaccounted_takes";
const RETURN_TAKE: &str = "dynamodb.return_take";

/// A give-back that met a transaction on the shard. No transaction of ours writes a
/// shard, so this is an operator's or a migration's; the caller's retry settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a transaction held shard {shard} while its unit was being given back")]
pub struct ShardContended {
    pub shard: u16,
}

/// The hold's write met a transaction on the buyer's item after the take committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a transaction held the buyer's item after the take on shard {shard}; the take stays for a retry on it"
)]
pub struct HoldContended {
    pub shard: u16,
}

/// What the take on a shard found.
enum Taken {
    /// This call took the unit.
    Now,
    /// This order's take was there already: an earlier call's, whose answer was lost.
    Before,
}

/// The take on a shard: one unit out of `available`, the order into `takers`, unless the
/// shard is empty or this order's take is there already. The reserve's, and the bench's
/// one-transaction baseline's; `infra/bench/shard_item_wcu.py` writes the same to measure it.
pub(super) const TAKE_UPDATE: &str = "SET #available = #available - :one, #takers.#order = :taker";
pub(super) const TAKE_CONDITION: &str =
    "#available > :zero AND attribute_not_exists(#takers.#order)";

/// [`TAKE_UPDATE`]'s names, for the order's entry under `takers`.
pub(super) fn take_names(taker: &str) -> Option<HashMap<String, String>> {
    names(&[
        ("#available", AVAILABLE),
        ("#takers", TAKERS),
        ("#order", taker),
    ])
}

/// [`TAKE_UPDATE`]'s values for this reservation.
/// [`TAKE_UPDATE`]'s values: the take records who took the unit and when it was
/// written, by this process's clock. Not the order's `created_at`: a grab may walk and
/// wait for up to its budget before this take, and a grab that finds the shard empty
/// waits out how young the take is (see [`StockLedger::reserve`]).
pub(super) fn take_values(
    reservation: &Reservation,
    taken_at: DateTime<Utc>,
) -> Option<HashMap<String, AttributeValue>> {
    values([
        (":one", n(1)),
        (":zero", n(0)),
        (":taker", item::taker_value(&reservation.user_id, taken_at)),
    ])
}

/// The hold's write on the user's item: the reserve's second write, and the user item of
/// the bench's one-transaction baseline ([`super::baseline`]). Counts the hold against
/// the user's limit and records it, unless the limits are reached or the order has a
/// hold already.
pub(super) const HOLD_UPDATE: &str = "SET #active = if_not_exists(#active, :zero) + :one, \
     #hold = :hold, #gsi1pk = :gsi1pk, #gsi1sk = :gsi1sk";
pub(super) const HOLD_CONDITION: &str = "(attribute_not_exists(#active) OR #active < :limit) \
     AND (attribute_not_exists(#abandoned) OR #abandoned < :abandon_limit) \
     AND attribute_not_exists(#hold)";

/// [`HOLD_UPDATE`]'s names, for the order's hold attribute.
pub(super) fn hold_names(hold_attribute: &str) -> Option<HashMap<String, String>> {
    names(&[
        ("#active", ACTIVE),
        ("#abandoned", ABANDONED),
        ("#hold", hold_attribute),
        ("#gsi1pk", GSI1_PK),
        ("#gsi1sk", GSI1_SK),
    ])
}

/// [`HOLD_UPDATE`]'s values for this reservation of `sale`.
pub(super) fn hold_values(
    sale: &Sale,
    reservation: &Reservation,
) -> Option<HashMap<String, AttributeValue>> {
    let bucket = item::bucket_pk(&sale.sale_id, sale.bucket_of(&reservation.user_id));
    values([
        (":zero", n(0)),
        (":one", n(1)),
        (":limit", n(sale.per_user_limit)),
        (":abandon_limit", n(MAX_ABANDONED_HOLDS)),
        (":hold", Hold::reserved(reservation).to_value()),
        (":gsi1pk", s(bucket)),
        (":gsi1sk", s(item::user_gsi_sk(&reservation.user_id))),
    ])
}

/// Whether a hold accounts for a take on `shard`: it holds or sold that shard's unit.
fn accounts_for(hold: &Hold, shard: u16) -> bool {
    hold.shard == shard && (hold.status.is_open() || hold.status == OrderStatus::Paid)
}

/// `release`'s transaction items; the shard is written after it, on its own.
mod releasing {
    /// Ends the hold on the user's item.
    pub(super) const USER_ITEM: usize = 0;
    /// Records the order's final status.
    pub(super) const ORDER_ITEM: usize = 1;
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

    /// Why a release's hold refused: the hold is settled or unknown. A hold released
    /// by a call that died before its shard write still has its take: given back here.
    async fn settlement_after_refusal(
        &self,
        reservation: &Reservation,
    ) -> Result<Settlement, StoreError> {
        let id = &reservation.order_id;
        match self.read_hold(RELEASE, id, &reservation.user_id).await? {
            // An open hold that refused names another shard, so it is not this
            // reservation's.
            Some(hold) if hold.status.is_open() => Ok(Settlement::Unknown),
            Some(hold) => {
                if hold.status != OrderStatus::Paid && hold.shard == reservation.shard {
                    self.give_back(RELEASE, reservation, hold.shard).await?;
                }
                Ok(Settlement::AlreadySettled(hold.status))
            }
            // Holds are kept once settled, so no hold means no such reservation.
            None => Ok(Settlement::Unknown),
        }
    }

    /// Takes one unit from `shard` for the reservation's order, unless the shard is
    /// empty; a take of this order already there is found, not repeated.
    async fn take(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<Taken, ReserveRefusal>, StoreError> {
        let key = item::shard_key(&sale.sale_id, shard);
        let taker = item::taker_name(&reservation.order_id);
        let take = self
            .update_item(key.clone())
            .update_expression(TAKE_UPDATE)
            .condition_expression(TAKE_CONDITION)
            .set_expression_attribute_names(take_names(&taker))
            .set_expression_attribute_values(take_values(reservation, Utc::now()))
            // The refusal tells "taken already" (a resent call) from "empty".
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let old = match self.write(RESERVE, take).await? {
            Written::Done => return Ok(Ok(Taken::Now)),
            Written::Contended => return Ok(Err(ReserveRefusal::Contended)),
            Written::Refused(Some(old)) => old,
            // The condition cannot fail on a missing shard without the old item, but a
            // missing old item means DynamoDB did not send it: ask.
            Written::Refused(None) => self
                .get(RESERVE, key.clone(), None)
                .await?
                .unwrap_or_default(),
        };
        if has_taker(&old, &taker) {
            return Ok(Ok(Taken::Before));
        }
        let takers = item::parse_takes(&sale.sale_id, shard, &old)
            .map_err(|error| corrupt(RESERVE, &key, error))?;
        Ok(Err(ReserveRefusal::ShardEmpty(ShardTakers::of_takes(
            takers.iter().map(|take| (&take.order_id, take.taken_at)),
        ))))
    }

    /// Gives the order's take on `shard` back, if the shard still records it. Whether
    /// this call gave it back.
    async fn give_back(
        &self,
        operation: &'static str,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        let taker = item::taker_name(&reservation.order_id);
        let give_back = self
            .update_item(item::shard_key(&reservation.sale_id, shard))
            .update_expression("SET #available = #available + :one REMOVE #takers.#order")
            .condition_expression("attribute_exists(#takers.#order)")
            .set_expression_attribute_names(names(&[
                ("#available", AVAILABLE),
                ("#takers", TAKERS),
                ("#order", &taker),
            ]))
            .set_expression_attribute_values(values([(":one", n(1))]));
        match self.write(operation, give_back).await? {
            Written::Done => Ok(true),
            Written::Refused(_) => Ok(false),
            Written::Contended => Err(StoreError::transient(operation, ShardContended { shard })),
        }
    }

    /// Undoes a take whose hold was refused. Failing to is logged, not raised: the
    /// refusal stands, and the reconciler returns a take no hold accounts for.
    async fn undo_take(&self, reservation: &Reservation, shard: u16) {
        if let Err(error) = self.give_back(RESERVE, reservation, shard).await {
            tracing::warn!(
                order_id = %reservation.order_id,
                shard,
                error = &error as &dyn std::error::Error,
                "undoing a take whose hold was refused failed; the reconciler returns it"
            );
        }
    }

    /// Records the reservation as a `reserved` hold on the user's item, within the
    /// user's limits, unless the order has a hold already.
    async fn hold(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let key = item::user_key(&sale.sale_id, &reservation.user_id);
        // `attribute_not_exists(#hold)`: a retried grab whose first call committed must
        // get its order back, not a second unit. `AllOld` returns the user item when a
        // condition fails, so the refusal itself tells "already held" from "at the
        // limit" without another read.
        let hold = self
            .update_item(key.clone())
            .update_expression(HOLD_UPDATE)
            .condition_expression(HOLD_CONDITION)
            .set_expression_attribute_names(hold_names(&hold_attribute))
            .set_expression_attribute_values(hold_values(sale, reservation))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let held = match self.write(RESERVE, hold).await? {
            Written::Done => return Ok(Ok(())),
            // A transaction holds the buyer's item: nothing decided. The take is not
            // undone, since another request of this order may share it and record the
            // hold (giving it back would leave that hold with no unit): the outcome is
            // unknown to the caller, whose next reserve on this shard finishes it.
            Written::Contended => {
                return Err(StoreError::transient(RESERVE, HoldContended { shard }));
            }
            Written::Refused(Some(old)) => old
                .get(&hold_attribute)
                .map(|value| Hold::parse(&hold_attribute, value))
                .transpose()
                .map_err(|error| corrupt(RESERVE, &key, error))?,
            // The condition cannot fail on a missing user item, so no old item means
            // DynamoDB did not send it: ask.
            Written::Refused(None) => {
                self.read_hold(RESERVE, &reservation.order_id, &reservation.user_id)
                    .await?
            }
        };
        match held {
            // This order's own hold on this shard: an earlier call finished the
            // reservation, and this take is the one it accounts for.
            Some(hold) if accounts_for(&hold, shard) => Ok(Err(ReserveRefusal::AlreadyHeld)),
            // Held elsewhere or settled: this take is not needed.
            Some(_) => {
                self.undo_take(reservation, shard).await;
                Ok(Err(ReserveRefusal::AlreadyHeld))
            }
            None => {
                self.undo_take(reservation, shard).await;
                Ok(Err(ReserveRefusal::LimitReached))
            }
        }
    }

    /// Records a settled hold for an order that has none, so that no reserve still on
    /// its way can record one after the unit went back. Whether it is recorded (now or
    /// before); `false`: the order has a hold of its own by now.
    async fn void_order(
        &self,
        take: &Take,
        now: chrono::DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let hold_attribute = item::hold_attribute(&take.order_id);
        let voided = Hold {
            shard: take.shard,
            status: OrderStatus::Expired,
            created_at: take.taken_at,
            expires_at: take.taken_at,
            expired_at: Some(now),
            // Nothing was sold: the void records no price.
            price: None,
        };
        // The user item's index keys, which a buyer who never held anything lacks: without
        // them `count` (which reads the holds through gsi1) would miss the voided order.
        // The bucket follows from the sale's shards; a rare path, so the sale is read.
        let sale_id = take.order_id.sale_id();
        let sale = self
            .read_item(RETURN_TAKE, item::sale_key(sale_id), item::parse_sale)
            .await?
            .ok_or_else(|| {
                StoreError::permanent(
                    RETURN_TAKE,
                    Inconsistency::MissingSale {
                        sale_id: sale_id.clone(),
                    },
                )
            })?;
        let bucket = item::bucket_pk(sale_id, sale.bucket_of(&take.user_id));
        let void = self
            .update_item(item::user_key(sale_id, &take.user_id))
            .update_expression(
                "SET #hold = :voided, #gsi1pk = if_not_exists(#gsi1pk, :gsi1pk), \
                 #gsi1sk = if_not_exists(#gsi1sk, :gsi1sk)",
            )
            .condition_expression("attribute_not_exists(#hold)")
            .set_expression_attribute_names(names(&[
                ("#hold", &hold_attribute),
                ("#gsi1pk", GSI1_PK),
                ("#gsi1sk", GSI1_SK),
            ]))
            .set_expression_attribute_values(values([
                (":voided", voided.to_value()),
                (":gsi1pk", s(bucket)),
                (":gsi1sk", s(item::user_gsi_sk(&take.user_id))),
            ]));
        match self.write(RETURN_TAKE, void).await? {
            Written::Done => Ok(true),
            Written::Refused(_) => Ok(false),
            Written::Contended => Err(StoreError::transient(
                RETURN_TAKE,
                ShardContended { shard: take.shard },
            )),
        }
    }
}

/// Whether a shard item records a take by `taker`.
fn has_taker(shard: &Item, taker: &str) -> bool {
    shard
        .get(TAKERS)
        .and_then(|takers| takers.as_m().ok())
        .is_some_and(|takers| takers.contains_key(taker))
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
        match self.take(sale, shard, reservation).await? {
            Ok(Taken::Now | Taken::Before) => {}
            Err(refusal) => return Ok(Err(refusal)),
        }
        // An error from here leaves the take: a call again on this shard finds it and
        // finishes, and the reconciler returns it if none comes. So even a hold the
        // breaker refused unsent is not "nothing happened": the grab must come back here.
        self.hold(sale, shard, reservation)
            .await
            .map_err(StoreError::after_a_step_that_happened)
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
        let [reserved, legacy_pending] = item::open_hold_values();
        let end_hold = built(
            RELEASE,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression(
                    "SET #hold.#status = :final, #hold.#settled = :settled, \
                     #active = #active - :one ADD #abandoned :one",
                )
                .condition_expression(format!("{} AND #hold.#shard = :shard", item::OPEN_HOLD))
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
                    reserved,
                    legacy_pending,
                    (":shard", n(reservation.shard)),
                ]))
                .build(),
        )?;
        let record = self.settle_order_item(RELEASE, reservation, reason.final_status(), now)?;
        let items = in_request_order([
            (releasing::USER_ITEM, transact::update(end_hold)),
            (releasing::ORDER_ITEM, transact::put(record)),
        ]);
        match self.run(RELEASE, items).await? {
            Ok(()) => {
                // An error here leaves the hold settled and the take on the shard: the
                // caller's retry (answered `AlreadySettled`) or the reconciler gives
                // the unit back.
                self.give_back(RELEASE, reservation, reservation.shard)
                    .await?;
                Ok(Settlement::Applied)
            }
            Err(refusal) if refusal.failed(releasing::USER_ITEM) => {
                self.settlement_after_refusal(reservation).await
            }
            Err(refusal) => Err(refusal.unexpected(RELEASE)),
        }
    }

    async fn shard_states(&self, sale: &Sale) -> Result<Vec<ShardState>, StoreError> {
        // The gate's recheck, once per process per interval: any replica will do, and
        // each shard's stock and takers come from one version of its item.
        let shards = self
            .shard_items(
                SHARD_STATES,
                sale,
                Consistency::Eventual,
                ShardPart::StockAndTakers,
            )
            .await?;
        shards
            .iter()
            .zip(0..)
            .map(|(found, shard)| {
                let available = item::parse_available(found)
                    .map_err(|error| corrupt(SHARD_STATES, found, error))?;
                let takes = item::parse_takes(&sale.sale_id, shard, found)
                    .map_err(|error| corrupt(SHARD_STATES, found, error))?;
                Ok(ShardState {
                    available,
                    takers: ShardTakers::of_takes(
                        takes.iter().map(|take| (&take.order_id, take.taken_at)),
                    ),
                })
            })
            .collect()
    }

    async fn drop_superseded_take(
        &self,
        reservation: &Reservation,
        shard: u16,
    ) -> Result<bool, StoreError> {
        self.give_back(RESERVE, reservation, shard).await
    }

    async fn unaccounted_takes(&self, sale: &Sale) -> Result<Vec<Take>, StoreError> {
        let mut takes = Vec::new();
        let shards = self
            .shard_items(
                UNACCOUNTED_TAKES,
                sale,
                Consistency::Strong,
                ShardPart::Takers,
            )
            .await?;
        for (found, shard) in shards.iter().zip(0..) {
            takes.extend(
                item::parse_takes(&sale.sale_id, shard, found)
                    .map_err(|error| corrupt(UNACCOUNTED_TAKES, found, error))?,
            );
        }
        let accounted: std::collections::HashSet<_> = self
            .read_holds(UNACCOUNTED_TAKES, sale)
            .await?
            .into_iter()
            .filter(|(_, status)| status.is_open() || *status == OrderStatus::Paid)
            .map(|(reservation, _)| (reservation.order_id, reservation.shard))
            .collect();
        takes.retain(|take| !accounted.contains(&(take.order_id.clone(), take.shard)));
        Ok(takes)
    }

    async fn return_take(&self, take: &Take, now: DateTime<Utc>) -> Result<TakeReturn, StoreError> {
        let hold = match self
            .read_hold(RETURN_TAKE, &take.order_id, &take.user_id)
            .await?
        {
            None if self.void_order(take, now).await? => None,
            // The reserve's hold landed between the read and the void.
            None => {
                self.read_hold(RETURN_TAKE, &take.order_id, &take.user_id)
                    .await?
            }
            found => found,
        };
        if hold.is_some_and(|hold| accounts_for(&hold, take.shard)) {
            return Ok(TakeReturn::Accounted);
        }
        Ok(
            if self
                .give_back(RETURN_TAKE, &take.as_lapsed_reservation(), take.shard)
                .await?
            {
                TakeReturn::Returned
            } else {
                TakeReturn::AlreadyReturned
            },
        )
    }
}
