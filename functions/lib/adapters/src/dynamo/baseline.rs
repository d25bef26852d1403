//! The reserve as one transaction on the shard and the user's item: the textbook design,
//! and what the grab used before issue 14. Not a port: `make bench` measures the grab
//! against a client that reserves this way (issue 14 §3), on the same table and proxy.
//! It leaves the same items as [`StockLedger::reserve`](flashsale_domain::ports::StockLedger)
//! (the take among the shard's takers, the hold on the user's item), so the rest of the
//! system reads a sale bought this way like any other.

use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, Update};
use chrono::Utc;
use flashsale_domain::ports::{ReserveRefusal, ShardTakers};
use flashsale_domain::{Reservation, Sale, StoreError};

use super::item;
use super::requests::built;
use super::transact::{self, Attempted, in_request_order, transact_once};
use super::{DynamoStore, ledger};

const RESERVE_IN_ONE_TRANSACTION: &str = "dynamodb.reserve_in_one_transaction";

/// The transaction's items.
mod reserving {
    /// Takes the unit from the shard.
    pub(super) const SHARD_ITEM: usize = 0;
    /// Records the hold and counts it against the user's limit.
    pub(super) const USER_ITEM: usize = 1;
}

impl DynamoStore {
    /// Takes one unit from `shard` and records the hold, in one `TransactWriteItems`:
    /// both or neither. A conflict answers `Contended` at once, for the caller to retry;
    /// a refused shard answers `ShardEmpty` without its takers (a transaction's refusal
    /// is not worth the old item to the textbook client, which only moves on).
    pub async fn reserve_in_one_transaction(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        const OPERATION: &str = RESERVE_IN_ONE_TRANSACTION;
        let taker = item::taker_name(&reservation.order_id);
        let take = built(
            OPERATION,
            Update::builder()
                .table_name(&self.table)
                .set_key(Some(item::shard_key(&sale.sale_id, shard)))
                .update_expression(ledger::TAKE_UPDATE)
                .condition_expression(ledger::TAKE_CONDITION)
                .set_expression_attribute_names(ledger::take_names(&taker))
                .set_expression_attribute_values(ledger::take_values(reservation, Utc::now()))
                .build(),
        )?;
        let hold_attribute = item::hold_attribute(&reservation.order_id);
        let hold = built(
            OPERATION,
            Update::builder()
                .table_name(&self.table)
                .set_key(Some(item::user_key(&sale.sale_id, &reservation.user_id)))
                .update_expression(ledger::HOLD_UPDATE)
                .condition_expression(ledger::HOLD_CONDITION)
                .set_expression_attribute_names(ledger::hold_names(&hold_attribute))
                .set_expression_attribute_values(ledger::hold_values(sale, reservation))
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
                .build(),
        )?;
        let items = in_request_order([
            (reserving::SHARD_ITEM, transact::update(take)),
            (reserving::USER_ITEM, transact::update(hold)),
        ]);
        match transact_once(&self.client, OPERATION, items).await? {
            Attempted::Committed => Ok(Ok(())),
            Attempted::Conflicted(_) => Ok(Err(ReserveRefusal::Contended)),
            Attempted::Refused(refusal) if refusal.failed(reserving::USER_ITEM) => {
                let held = self
                    .read_hold(OPERATION, &reservation.order_id, &reservation.user_id)
                    .await?
                    .is_some();
                Ok(Err(if held {
                    ReserveRefusal::AlreadyHeld
                } else {
                    ReserveRefusal::LimitReached
                }))
            }
            Attempted::Refused(refusal) if refusal.failed(reserving::SHARD_ITEM) => {
                Ok(Err(ReserveRefusal::ShardEmpty(ShardTakers::default())))
            }
            Attempted::Refused(refusal) => Err(refusal.unexpected(OPERATION)),
        }
    }
}
