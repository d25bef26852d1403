//! [`OrderPayments`] and [`ProviderEvents`]: the buyer's payment recorded in the order's
//! hold, and the provider's events a webhook processed.
//!
//! The payment lives inside the hold (`payment_id`, `payment_state`), not in an item of
//! its own: every write about it is then one write on the buyer's item, conditional on
//! the very hold it belongs to, and the money's side of pay is `pay`'s transaction with
//! one more condition, so it races a cancel and the timeout exactly as `pay` does.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;
use chrono::{DateTime, Utc};
use flashsale_domain::payment::{FollowedMoney, OrderPayment, PaymentId, PaymentState};
use flashsale_domain::ports::{
    OrderPayments, PayOutcome, PaymentAttach, PaymentRecorded, ProviderEvents,
};
use flashsale_domain::{Order, OrderStatus, Reservation, Sale, StoreError};

use super::DynamoStore;
use super::item::{
    self, ABANDONED, ACTIVE, DELIVERY, Hold, OPEN_HOLD, PAYMENT_ID, PAYMENT_STATE, PK,
    REFUNDED_FROM, SETTLED_RETENTION, SHARD, STATUS, TTL, n, s,
};
use super::requests::{built, corrupt, names, values};
use super::transact::{self, in_request_order};
use crate::classify::store_error;

const ATTACH_PAYMENT: &str = "dynamodb.attach_payment";
const PAY_WITH: &str = "dynamodb.pay_with";
const RECORD_PAYMENT: &str = "dynamodb.record_payment";
/// On a hold: a token of the call that last changed its payment's state.
const PAYMENT_RECORDED_BY: &str = "payment_recorded_by";
const RECORD_REFUND: &str = "dynamodb.record_refund";
const REOPEN_REFUND: &str = "dynamodb.reopen_refund";
const FAIL_PAYMENT: &str = "dynamodb.fail_payment";
const FOLLOW_MONEY: &str = "dynamodb.follow_money";
const UNFOLLOW_MONEY: &str = "dynamodb.unfollow_money";
const FOLLOWED_MONEY: &str = "dynamodb.followed_money";
const UNSETTLED_PAYMENTS: &str = "dynamodb.unsettled_payments";
const WAS_PROCESSED: &str = "dynamodb.was_processed";
const RECORD_PROCESSED: &str = "dynamodb.record_processed";

/// A write on the buyer's item met a transaction there (the buyer's pay, a release) on
/// every one of its tries: nothing was written, and the caller's retry settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a transaction held the buyer's item on each of {attempts} tries")]
pub struct BuyerItemContended {
    pub attempts: u32,
}

/// `record_refund`'s and `reopen_refund`'s transaction items.
mod refunding {
    /// Moves the released hold to `refunded`, or back.
    pub(super) const USER_ITEM: usize = 0;
    /// Moves the order's item, written by the release, along.
    pub(super) const ORDER_ITEM: usize = 1;
}

/// `fail_payment`'s transaction items.
mod failing {
    /// Moves the paid hold to `payment_failed`, out of the buyer's limit.
    pub(super) const USER_ITEM: usize = 0;
    /// Moves the order's item, written by the pay, along.
    pub(super) const ORDER_ITEM: usize = 1;
}

/// Whether `hold` records `payment` as the order's.
fn records(hold: &Hold, payment: &PaymentId) -> bool {
    hold.payment
        .as_ref()
        .is_some_and(|recorded| &recorded.id == payment)
}

impl DynamoStore {
    /// [`DynamoStore::write_in_turn`] on a buyer's item: contention that outlasts the
    /// retries is [`BuyerItemContended`].
    async fn write_on_buyer_item(
        &self,
        operation: &'static str,
        update: UpdateItemFluentBuilder,
    ) -> Result<bool, StoreError> {
        self.write_in_turn(operation, update)
            .await?
            .map_err(|outlasted| {
                StoreError::transient(
                    operation,
                    BuyerItemContended {
                        attempts: outlasted.attempts,
                    },
                )
            })
    }
}

#[async_trait]
impl OrderPayments for DynamoStore {
    async fn attach_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<PaymentAttach, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let [reserved, legacy_pending] = item::open_hold_values();
        let attach = self
            .update_item(item::user_key(&reservation.sale_id, &reservation.user_id))
            .update_expression("SET #hold.#payment_id = :payment_id, #hold.#payment_state = :open")
            .condition_expression(format!(
                "{OPEN_HOLD} AND #hold.#shard = :shard AND attribute_not_exists(#hold.#payment_id)"
            ))
            .set_expression_attribute_names(names(&[
                ("#hold", &hold_attribute),
                ("#status", STATUS),
                ("#shard", SHARD),
                ("#payment_id", PAYMENT_ID),
                ("#payment_state", PAYMENT_STATE),
            ]))
            .set_expression_attribute_values(values([
                (":payment_id", s(payment.as_str())),
                (":open", s(PaymentState::Open.name())),
                reserved,
                legacy_pending,
                (":shard", n(reservation.shard)),
            ]));
        if self.write_on_buyer_item(ATTACH_PAYMENT, attach).await? {
            return Ok(PaymentAttach::Attached);
        }
        // Refused: the hold records a payment already, is settled, or is not this one.
        // A payment once recorded stays, so the recorded one answers first, as it did
        // when the write was refused.
        let id = &reservation.order_id;
        Ok(
            match self
                .read_hold(ATTACH_PAYMENT, id, &reservation.user_id)
                .await?
            {
                Some(hold) if hold.shard != reservation.shard => PaymentAttach::Unknown,
                Some(hold) if records(&hold, payment) => PaymentAttach::Attached,
                Some(Hold {
                    payment: Some(recorded),
                    ..
                }) => PaymentAttach::Taken(recorded.id),
                Some(hold) if !hold.status.is_open() => PaymentAttach::Settled(hold.status),
                // An open hold with no payment can only have been missing when the write
                // was refused: a reserve that landed after it.
                Some(_) | None => PaymentAttach::Unknown,
            },
        )
    }

    async fn pay_with(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
        now: DateTime<Utc>,
    ) -> Result<PayOutcome, StoreError> {
        self.mark_paid(PAY_WITH, reservation, payment, now).await
    }

    async fn record_payment(
        &self,
        reservation: &Reservation,
        payment: &OrderPayment,
    ) -> Result<PaymentRecorded, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        // The payment id names the order's payment once and for all: whatever the hold's
        // status, a new state read is recorded, unless the recorded one is final (a stale
        // read arriving late must not undo it). Only a change applies, so one call, and
        // one only, changes it; it leaves a token of this call, so that a resend of it
        // after a lost answer, refused, still tells that it was this call's change.
        let token = format!("{:032x}", rand::random::<u128>());
        let record = self
            .update_item(item::user_key(&reservation.sale_id, &reservation.user_id))
            .update_expression("SET #hold.#payment_state = :state, #hold.#recorded_by = :token")
            .condition_expression(
                "#hold.#payment_id = :payment_id AND #hold.#payment_state <> :state \
                 AND NOT #hold.#payment_state IN (:captured, :cancelled)",
            )
            .set_expression_attribute_names(names(&[
                ("#hold", &hold_attribute),
                ("#payment_id", PAYMENT_ID),
                ("#payment_state", PAYMENT_STATE),
                ("#recorded_by", PAYMENT_RECORDED_BY),
            ]))
            .set_expression_attribute_values(values([
                (":state", s(payment.state.name())),
                (":payment_id", s(payment.id.as_str())),
                (":captured", s(PaymentState::Captured.name())),
                (":cancelled", s(PaymentState::Cancelled.name())),
                (":token", s(&token)),
            ]));
        if self.write_on_buyer_item(RECORD_PAYMENT, record).await? {
            return Ok(PaymentRecorded::Changed);
        }
        // Refused: this call's own change (its answer lost, the SDK's resend refused),
        // recorded already by another call, or not this order's to record.
        let found = self
            .get(
                RECORD_PAYMENT,
                item::user_key(&reservation.sale_id, &reservation.user_id),
                Some(("#hold", &hold_attribute)),
            )
            .await?;
        let hold = found
            .as_ref()
            .and_then(|found| found.get(&hold_attribute))
            .and_then(|hold| hold.as_m().ok());
        let field = |name: &str| {
            hold.and_then(|hold| hold.get(name))
                .and_then(|value| value.as_s().ok())
                .map(String::as_str)
        };
        Ok(
            if field(PAYMENT_ID) != Some(payment.id.as_str())
                || field(PAYMENT_STATE) != Some(payment.state.name())
            {
                PaymentRecorded::Refused
            } else if field(PAYMENT_RECORDED_BY) == Some(token.as_str()) {
                PaymentRecorded::Changed
            } else {
                PaymentRecorded::Unchanged
            },
        )
    }

    async fn record_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
    ) -> Result<bool, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let refunded = s(OrderStatus::Refunded.as_str());
        let end_hold = built(
            RECORD_REFUND,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression("SET #hold.#from = #hold.#status, #hold.#status = :refunded")
                .condition_expression(
                    "#hold.#status IN (:cancelled, :expired) AND #hold.#payment_id = :payment_id \
                     AND #hold.#payment_state = :captured",
                )
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#status", STATUS),
                    ("#from", REFUNDED_FROM),
                    ("#payment_id", PAYMENT_ID),
                    ("#payment_state", PAYMENT_STATE),
                ]))
                .set_expression_attribute_values(values([
                    (":refunded", refunded.clone()),
                    (":cancelled", s(OrderStatus::Cancelled.as_str())),
                    (":expired", s(OrderStatus::Expired.as_str())),
                    (":payment_id", s(payment.as_str())),
                    (":captured", s(PaymentState::Captured.name())),
                ]))
                .build(),
        )?;
        // The release wrote the order's item: updated, not put, so it keeps the TTL the
        // release gave it.
        let record = built(
            RECORD_REFUND,
            self.update(item::order_key(&reservation.order_id))
                .update_expression("SET #from = #status, #status = :refunded")
                .condition_expression("attribute_exists(#pk)")
                .set_expression_attribute_names(names(&[
                    ("#status", STATUS),
                    ("#from", REFUNDED_FROM),
                    ("#pk", PK),
                ]))
                .set_expression_attribute_values(values([(":refunded", refunded)]))
                .build(),
        )?;
        let items = in_request_order([
            (refunding::USER_ITEM, transact::update(end_hold)),
            (refunding::ORDER_ITEM, transact::update(record)),
        ]);
        match self.run(RECORD_REFUND, items).await? {
            Ok(()) => return Ok(true),
            // Refunded already, not released, or not this payment's order.
            Err(refusal) if refusal.failed(refunding::USER_ITEM) => {}
            // A released hold without its order's item contradicts the data model.
            Err(refusal) => return Err(refusal.unexpected(RECORD_REFUND)),
        }
        let id = &reservation.order_id;
        Ok(self
            .read_hold(RECORD_REFUND, id, &reservation.user_id)
            .await?
            .is_some_and(|hold| hold.status == OrderStatus::Refunded && records(&hold, payment)))
    }

    async fn reopen_refund(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        from: OrderStatus,
    ) -> Result<bool, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let back = s(from.as_str());
        let reopen_hold = built(
            REOPEN_REFUND,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression("SET #hold.#status = :from REMOVE #hold.#from")
                .condition_expression(
                    "#hold.#status = :refunded AND #hold.#from = :from \
                     AND #hold.#payment_id = :payment_id",
                )
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#status", STATUS),
                    ("#from", REFUNDED_FROM),
                    ("#payment_id", PAYMENT_ID),
                ]))
                .set_expression_attribute_values(values([
                    (":from", back.clone()),
                    (":refunded", s(OrderStatus::Refunded.as_str())),
                    (":payment_id", s(payment.as_str())),
                ]))
                .build(),
        )?;
        let reopen_order = built(
            REOPEN_REFUND,
            self.update(item::order_key(&reservation.order_id))
                .update_expression("SET #status = :from REMOVE #from")
                .condition_expression("attribute_exists(#pk)")
                .set_expression_attribute_names(names(&[
                    ("#status", STATUS),
                    ("#from", REFUNDED_FROM),
                    ("#pk", PK),
                ]))
                .set_expression_attribute_values(values([(":from", back)]))
                .build(),
        )?;
        let items = in_request_order([
            (refunding::USER_ITEM, transact::update(reopen_hold)),
            (refunding::ORDER_ITEM, transact::update(reopen_order)),
        ]);
        match self.run(REOPEN_REFUND, items).await? {
            Ok(()) => return Ok(true),
            // Reopened already, not refunded, or not this payment's order.
            Err(refusal) if refusal.failed(refunding::USER_ITEM) => {}
            Err(refusal) => return Err(refusal.unexpected(REOPEN_REFUND)),
        }
        Ok(self
            .read_hold(REOPEN_REFUND, &reservation.order_id, &reservation.user_id)
            .await?
            .is_some_and(|hold| hold.status == from && records(&hold, payment)))
    }

    async fn fail_payment(
        &self,
        reservation: &Reservation,
        payment: &PaymentId,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let failed = s(OrderStatus::PaymentFailed.as_str());
        let end_hold = built(
            FAIL_PAYMENT,
            self.update(item::user_key(&reservation.sale_id, &reservation.user_id))
                .update_expression(
                    "SET #hold.#status = :failed, #active = #active - :one ADD #abandoned :one",
                )
                .condition_expression(
                    "#hold.#status = :paid AND #hold.#shard = :shard \
                     AND #hold.#payment_id = :payment_id AND #hold.#payment_state = :cancelled",
                )
                .set_expression_attribute_names(names(&[
                    ("#hold", &hold_attribute),
                    ("#status", STATUS),
                    ("#shard", SHARD),
                    ("#payment_id", PAYMENT_ID),
                    ("#payment_state", PAYMENT_STATE),
                    ("#active", ACTIVE),
                    ("#abandoned", ABANDONED),
                ]))
                .set_expression_attribute_values(values([
                    (":failed", failed.clone()),
                    (":one", n(1)),
                    (":paid", s(OrderStatus::Paid.as_str())),
                    (":shard", n(reservation.shard)),
                    (":payment_id", s(payment.as_str())),
                    (":cancelled", s(PaymentState::Cancelled.name())),
                ]))
                .build(),
        )?;
        // The pay wrote the order's item: updated, and given the settled orders' TTL.
        let record = built(
            FAIL_PAYMENT,
            self.update(item::order_key(&reservation.order_id))
                .update_expression("SET #status = :failed, #updated = :now, #ttl = :ttl")
                .condition_expression("attribute_exists(#pk)")
                .set_expression_attribute_names(names(&[
                    ("#status", STATUS),
                    ("#updated", "updated_at"),
                    ("#ttl", TTL),
                    ("#pk", PK),
                ]))
                .set_expression_attribute_values(values([
                    (":failed", failed),
                    (":now", item::time(now)),
                    (":ttl", n((now + SETTLED_RETENTION).timestamp())),
                ]))
                .build(),
        )?;
        let items = in_request_order([
            (failing::USER_ITEM, transact::update(end_hold)),
            (failing::ORDER_ITEM, transact::update(record)),
        ]);
        let moved = match self.run(FAIL_PAYMENT, items).await? {
            Ok(()) => true,
            // Failed already, not paid, or not this payment's order.
            Err(refusal) if refusal.failed(failing::USER_ITEM) => false,
            // A paid hold without its order's item contradicts the data model.
            Err(refusal) => return Err(refusal.unexpected(FAIL_PAYMENT)),
        };
        if !moved {
            let failed_before = self
                .read_hold(FAIL_PAYMENT, &reservation.order_id, &reservation.user_id)
                .await?
                .is_some_and(|hold| {
                    hold.status == OrderStatus::PaymentFailed
                        && hold.shard == reservation.shard
                        && records(&hold, payment)
                });
            if !failed_before {
                return Ok(false);
            }
        }
        // An error here leaves the order failed and its take on the shard: a call again
        // (the next settlement) or the reconciler gives the unit back.
        self.give_back(FAIL_PAYMENT, reservation, reservation.shard)
            .await?;
        Ok(moved)
    }

    async fn follow_money(
        &self,
        reservation: &Reservation,
        since: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // Unconditional, the first `since` kept; the version raised, so that an unfollow
        // decided before this follow leaves it (a resend raises it again: harmless).
        self.update_item(item::followed_money_key(&reservation.order_id))
            .update_expression(
                "SET #buyer = :buyer, #since = if_not_exists(#since, :since) ADD #version :one",
            )
            .set_expression_attribute_names(names(&[
                ("#buyer", item::FOLLOWED_BUYER),
                ("#since", item::FOLLOWED_SINCE),
                ("#version", item::FOLLOWED_VERSION),
            ]))
            .set_expression_attribute_values(values([
                (":buyer", s(reservation.user_id.as_str())),
                (":since", item::time(since)),
                (":one", n(1)),
            ]))
            .send()
            .await
            .map_err(|error| store_error(FOLLOW_MONEY, error))?;
        Ok(())
    }

    async fn unfollow_money(&self, read: &FollowedMoney) -> Result<(), StoreError> {
        // Deleted only as read: a follow since raised the version, and the refusal
        // keeps it. A missing item is refused too: unfollowed already.
        let deleted = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::followed_money_key(&read.order_id)))
            .condition_expression("#version = :version")
            .set_expression_attribute_names(names(&[("#version", item::FOLLOWED_VERSION)]))
            .set_expression_attribute_values(values([(":version", n(read.version))]))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(error)
                if matches!(
                    error.as_service_error(),
                    Some(DeleteItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(store_error(UNFOLLOW_MONEY, error)),
        }
    }

    async fn followed_money(&self) -> Result<Vec<FollowedMoney>, StoreError> {
        // Eventually consistent: a follow a moment old is read on the next pass, and
        // each settlement reads the order and the payment afresh anyway.
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#pk = :money")
            .set_expression_attribute_names(names(&[("#pk", PK)]))
            .set_expression_attribute_values(values([(":money", item::followed_money_pk())]))
            .into_paginator()
            .items()
            .send();
        let mut followed = Vec::new();
        while let Some(found) = pages.next().await {
            let found = found.map_err(|error| store_error(FOLLOWED_MONEY, error))?;
            followed.push(
                item::parse_followed_money(&found)
                    .map_err(|error| corrupt(FOLLOWED_MONEY, &found, error))?,
            );
        }
        Ok(followed)
    }

    /// Read from the holds, as `open_holds` reads them: each hold carries its payment.
    async fn unsettled_payments(
        &self,
        sale: &Sale,
    ) -> Result<Vec<(Order, Reservation)>, StoreError> {
        let mut unsettled: Vec<_> = self
            .read_holds(UNSETTLED_PAYMENTS, sale)
            .await?
            .into_iter()
            .filter(|(order, _)| {
                order
                    .payment
                    .as_ref()
                    .is_some_and(|payment| payment.needs_settling(order.status))
            })
            .collect();
        unsettled.sort_by(|a, b| a.0.order_id.cmp(&b.0.order_id));
        Ok(unsettled)
    }
}

#[async_trait]
impl ProviderEvents for DynamoStore {
    async fn was_processed(&self, event_id: &str) -> Result<bool, StoreError> {
        Ok(self
            .get(WAS_PROCESSED, item::event_key(event_id), Some(("#pk", PK)))
            .await?
            .is_some())
    }

    async fn record_processed(
        &self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // The put carries a token of this call: when the SDK resends it after a lost
        // answer, the refusal's old item holds the same token, and tells this call that
        // it recorded the event after all.
        let delivery = format!("{:032x}", rand::random::<u128>());
        let error = match self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item::event_item(event_id, &delivery, now)))
            .condition_expression("attribute_not_exists(#pk)")
            .set_expression_attribute_names(names(&[("#pk", PK)]))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await
        {
            Ok(_) => return Ok(true),
            Err(error) => error,
        };
        match error.as_service_error() {
            Some(PutItemError::ConditionalCheckFailedException(refused)) => Ok(refused
                .item
                .as_ref()
                .and_then(|old| old.get(DELIVERY))
                .is_some_and(|old| old.as_s().is_ok_and(|old| *old == delivery))),
            _ => Err(store_error(RECORD_PROCESSED, error)),
        }
    }
}
