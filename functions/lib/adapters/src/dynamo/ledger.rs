//! [`StockLedger`]: the shards and the holds on the users' items. The hot path.
//!
//! A reservation is the brief's transaction: one `TransactWriteItems` that takes one
//! unit from a shard (`available > :zero`, the order into the shard's `takers`) and
//! records the hold on the user's item within the per-user limit, both or neither. On
//! a quiet shard that is the whole reserve: one write.
//!
//! On AWS a transaction on a hot item is cancelled by any other in flight on it
//! (`TransactionConflict`), while plain writes to one item queue and all succeed. So
//! the sale says which path its reserves take ([`ReservePath`]):
//! - **adaptive**, the default: the transaction, until one conflicts on its shard. That
//!   marks the sale hot in this process for [`ReserveMode::PLAIN_AFTER_A_CONFLICT`],
//!   and the reserve goes on, as does every reserve of this process in that sale
//!   meanwhile, as *take then hold*: two plain conditional writes, the take on the
//!   shard, then the hold;
//! - **take then hold** from the first grab, for a sale whose surge is expected: on
//!   Lambda each container serves one grab at a time, so every container that the
//!   surge starts would otherwise learn that the sale is hot with a cancelled
//!   transaction of its own;
//! - **transaction** always, a conflict answered `Contended`.
//!
//! Take then hold is not atomic; exactly once comes from the shard's takers: a take, a
//! give-back and an undo are each refused once they have applied, and the refusal's old
//! item says so, so every step may be sent again. A take whose hold never lands is
//! found by the order's next reserve on that shard (either path) and finished, or
//! returned by the reconciler.
//!
//! Mixed traffic on one shard stays exact: a plain write that meets a transaction in
//! flight is refused `TransactionConflictException` (answered `Contended`), and a
//! transaction that meets the order's own take finishes it as take-then-hold would.
//!
//! [`ReserveMode::PLAIN_AFTER_A_CONFLICT`]: super::ReserveMode::PLAIN_AFTER_A_CONFLICT
//! [`ReservePath`]: flashsale_domain::ReservePath

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use chrono::{DateTime, Utc};
use flashsale_domain::ports::{
    ReserveRefusal, Settlement, ShardState, ShardTakers, StockLedger, Take, TakeReturn,
};
use flashsale_domain::sale::MAX_ABANDONED_HOLDS;
use flashsale_domain::{OrderId, OrderStatus, ReleaseReason, Reservation, Sale, StoreError};

use super::item::{
    self, ABANDONED, ACTIVE, AVAILABLE, GSI1_PK, GSI1_SK, GSI2_PK, GSI2_SK, Hold, Item, SHARD,
    STATUS, TAKERS, n, s,
};
use super::requests::{
    ConflictAfterALostAnswer, Consistency, ShardPart, Written, built, corrupt, names, values,
};
use super::transact::{self, Attempted, in_request_order, transact_once};
use super::{DynamoStore, Inconsistency, InvalidRequest, ReserveStart};

const RESERVE: &str = "dynamodb.reserve";
const AVAILABILITY: &str = "dynamodb.availability";
const RELEASE: &str = "dynamodb.release";
const SHARD_STATES: &str = "dynamodb.shard_states";
const SHARDS_TAKEN_BY: &str = "dynamodb.shards_taken_by";
const UNACCOUNTED_TAKES: &str = "dynamodb.unaccounted_takes";
const RETURN_TAKE: &str = "dynamodb.return_take";

/// A give-back that met a reserve's transaction on the shard on every one of its tries:
/// the caller's retry settles it.
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

/// The reserve's transaction items.
pub(super) mod reserving {
    /// Takes the unit from the shard.
    pub(in super::super) const SHARD_ITEM: usize = 0;
    /// Records the hold and counts it against the user's limit.
    pub(in super::super) const USER_ITEM: usize = 1;
}

/// What the reserve's transaction did.
enum InOneTransaction {
    /// Committed, or refused for a reason its items' old images tell.
    Answered(Result<(), ReserveRefusal>),
    /// This order's take is on the shard already (a take-then-hold whose hold never
    /// landed): finished as that path finishes it.
    TakeThere,
    /// Another transaction held the shard: it is hot.
    ShardContended,
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
     #hold = :hold, #gsi1pk = :gsi1pk, #gsi1sk = :gsi1sk, \
     #gsi2pk = :gsi2pk, #gsi2sk = if_not_exists(#gsi2sk, :gsi2sk)";
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
        ("#gsi2pk", GSI2_PK),
        ("#gsi2sk", GSI2_SK),
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
        (":gsi2pk", s(item::buyer_gsi_pk(&reservation.user_id))),
        (
            ":gsi2sk",
            s(item::buyer_gsi_sk(reservation.created_at, &sale.sale_id)),
        ),
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

    /// The reserve's transaction: [`TAKE_UPDATE`] on the shard and [`HOLD_UPDATE`] on
    /// the user's item, each returning its old image as `old_items` says when its
    /// condition fails.
    pub(super) fn reserve_items(
        &self,
        operation: &'static str,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
        old_items: ReturnValuesOnConditionCheckFailure,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let taker = item::taker_name(&reservation.order_id);
        let take = built(
            operation,
            Update::builder()
                .table_name(&self.table)
                .set_key(Some(item::shard_key(&sale.sale_id, shard)))
                .update_expression(TAKE_UPDATE)
                .condition_expression(TAKE_CONDITION)
                .set_expression_attribute_names(take_names(&taker))
                .set_expression_attribute_values(take_values(reservation, Utc::now()))
                .return_values_on_condition_check_failure(old_items.clone())
                .build(),
        )?;
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let hold = built(
            operation,
            Update::builder()
                .table_name(&self.table)
                .set_key(Some(item::user_key(&sale.sale_id, &reservation.user_id)))
                .update_expression(HOLD_UPDATE)
                .condition_expression(HOLD_CONDITION)
                .set_expression_attribute_names(hold_names(&hold_attribute))
                .set_expression_attribute_values(hold_values(sale, reservation))
                .return_values_on_condition_check_failure(old_items)
                .build(),
        )?;
        Ok(in_request_order([
            (reserving::SHARD_ITEM, transact::update(take)),
            (reserving::USER_ITEM, transact::update(hold)),
        ]))
    }

    /// The brief's reserve, in one transaction. A refusal is read from the old images
    /// DynamoDB sends with it, so it costs no read; nothing was written then.
    async fn reserve_in_a_transaction(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<InOneTransaction, StoreError> {
        let items = self.reserve_items(
            RESERVE,
            sale,
            shard,
            reservation,
            ReturnValuesOnConditionCheckFailure::AllOld,
        )?;
        let refusal = match transact_once(&self.client, RESERVE, items).await? {
            Attempted::Committed => return Ok(InOneTransaction::Answered(Ok(()))),
            Attempted::Conflicted(error)
                if transact::conflicted_at(&error, reserving::SHARD_ITEM) =>
            {
                return Ok(InOneTransaction::ShardContended);
            }
            // The buyer's own item is held (their pay or cancel, say): nothing written,
            // nothing decided.
            Attempted::Conflicted(_) => {
                return Ok(InOneTransaction::Answered(Err(ReserveRefusal::Contended)));
            }
            Attempted::Refused(refusal) => refusal,
        };
        // This order's hold, if the user's item refused: a retry of a reserve that
        // committed, here or on another shard.
        let held = if refusal.failed(reserving::USER_ITEM) {
            let old = refusal.old_item(reserving::USER_ITEM).cloned();
            Some(self.hold_in(old, reservation).await?)
        } else {
            None
        };
        if refusal.failed(reserving::SHARD_ITEM) {
            let old = match refusal.old_item(reserving::SHARD_ITEM) {
                Some(old) => old.clone(),
                // DynamoDB did not send it: ask.
                None => self
                    .get(RESERVE, item::shard_key(&sale.sale_id, shard), None)
                    .await?
                    .unwrap_or_default(),
            };
            if has_taker(&old, &item::taker_name(&reservation.order_id)) {
                return Ok(InOneTransaction::TakeThere);
            }
            if let Some(Some(_)) = held {
                return Ok(InOneTransaction::Answered(Err(ReserveRefusal::AlreadyHeld)));
            }
            let takers = item::parse_takes(&sale.sale_id, shard, &old)
                .map_err(|error| corrupt(RESERVE, &old, error))?;
            return Ok(InOneTransaction::Answered(Err(ReserveRefusal::ShardEmpty(
                ShardTakers::of_takes(takers.iter().map(|take| (&take.order_id, take.taken_at))),
            ))));
        }
        Ok(InOneTransaction::Answered(Err(match held {
            Some(Some(_)) => ReserveRefusal::AlreadyHeld,
            _ => ReserveRefusal::LimitReached,
        })))
    }

    /// This order's hold on the user's item whose old image a refused write returned,
    /// or, if DynamoDB did not send the image, as read now.
    async fn hold_in(
        &self,
        old_user_item: Option<Item>,
        reservation: &Reservation,
    ) -> Result<Option<Hold>, StoreError> {
        let Some(old) = old_user_item else {
            return self
                .read_hold(RESERVE, &reservation.order_id, &reservation.user_id)
                .await;
        };
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        old.get(&hold_attribute)
            .map(|value| Hold::parse(&hold_attribute, value))
            .transpose()
            .map_err(|error| corrupt(RESERVE, &old, error))
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
            // An earlier try may have taken the unit: not "nothing written".
            Written::ContendedAfterALostAnswer => {
                return Err(StoreError::transient(RESERVE, ConflictAfterALostAnswer));
            }
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
    pub(super) async fn give_back(
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
        // A reserve's transaction holds the shard for its round trip: the give-back
        // waits its turn, as the writes off the hot path do. Resending is safe: once
        // applied, the condition refuses it.
        self.write_in_turn(operation, give_back)
            .await?
            .map_err(|_| StoreError::transient(operation, ShardContended { shard }))
    }

    /// Undoes a take whose hold was refused. Failing to is the reserve's failure, not a
    /// refusal: the take stays with no hold, and a refusal would send the caller away and
    /// strand the unit for the reconciler's grace, minutes in which the sale looks sold
    /// out. As an error whose outcome is unknown, the caller's next reserve of this
    /// order on this shard finds the take, is refused again and undoes it.
    async fn undo_take(&self, reservation: &Reservation, shard: u16) -> Result<(), StoreError> {
        self.give_back(RESERVE, reservation, shard).await.map(drop)
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
            Written::Contended | Written::ContendedAfterALostAnswer => {
                return Err(StoreError::transient(RESERVE, HoldContended { shard }));
            }
            // The condition cannot fail on a missing user item, so no old item means
            // DynamoDB did not send it: `hold_in` asks.
            Written::Refused(old) => self.hold_in(old, reservation).await?,
        };
        match held {
            // This order's own hold on this shard: an earlier call finished the
            // reservation, and this take is the one it accounts for.
            Some(hold) if accounts_for(&hold, shard) => Ok(Err(ReserveRefusal::AlreadyHeld)),
            // Held elsewhere or settled: this take is not needed.
            Some(_) => {
                self.undo_take(reservation, shard).await?;
                Ok(Err(ReserveRefusal::AlreadyHeld))
            }
            None => {
                self.undo_take(reservation, shard).await?;
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
            paid_at: None,
            // Nothing was sold: the void records no price, and no payment was opened.
            price: None,
            payment: None,
            refunded_from: None,
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
            Written::Contended | Written::ContendedAfterALostAnswer => Err(StoreError::transient(
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
        if let ReserveStart::Transaction { adapts } = self.reserve_start(sale) {
            match self
                .reserve_in_a_transaction(sale, shard, reservation)
                .await?
            {
                InOneTransaction::Answered(answer) => return Ok(answer),
                InOneTransaction::TakeThere => {
                    return self
                        .hold(sale, shard, reservation)
                        .await
                        .map_err(StoreError::after_a_step_that_happened);
                }
                // The conflicted transaction wrote nothing: the same reserve goes on as
                // take-then-hold, which queues on the hot shard instead of cancelling.
                InOneTransaction::ShardContended if adapts => self.note_hot_sale(&sale.sale_id),
                InOneTransaction::ShardContended => {
                    return Ok(Err(ReserveRefusal::Contended));
                }
            }
        }
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

    async fn shards_taken_by(&self, sale: &Sale, order: &OrderId) -> Result<Vec<u16>, StoreError> {
        // The order consumer's, for a retry's order: a take its first try made a moment
        // ago must be seen.
        let shards = self
            .shard_items(
                SHARDS_TAKEN_BY,
                sale,
                Consistency::Strong,
                ShardPart::Takers,
            )
            .await?;
        let mut taken = Vec::new();
        for (found, shard) in shards.iter().zip(0..) {
            let takes = item::parse_takes(&sale.sale_id, shard, found)
                .map_err(|error| corrupt(SHARDS_TAKEN_BY, found, error))?;
            if takes.iter().any(|take| take.order_id == *order) {
                taken.push(shard);
            }
        }
        Ok(taken)
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
            .filter(|(order, _)| order.status.is_open() || order.status == OrderStatus::Paid)
            .map(|(_, reservation)| (reservation.order_id, reservation.shard))
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
