//! The textbook client: the reserve as one transaction on the shard and the user's item,
//! retried on the same shard after a conflict. Not a port: `make bench` measures the
//! grab against a client that reserves this way (issue 14 §3), on the same table and
//! proxy. Its transaction is the grab's own ([`super::ledger`]); what differs is what it
//! does on a conflict (waits and tries again, where the grab's reserve goes on with
//! plain writes).
//! It leaves the same items as [`StockLedger::reserve`](flashsale_domain::ports::StockLedger)
//! (the take among the shard's takers, the hold on the user's item), so the rest of the
//! system reads a sale bought this way like any other.

use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;
use flashsale_domain::ports::{ReserveRefusal, ShardTakers};
use flashsale_domain::{Reservation, Sale, StoreError};

use super::DynamoStore;
use super::ledger::reserving;
use super::transact::{Attempted, transact_once};

const RESERVE_IN_ONE_TRANSACTION: &str = "dynamodb.reserve_in_one_transaction";

impl DynamoStore {
    /// Takes one unit from `shard` and records the hold, in one `TransactWriteItems`:
    /// both or neither, the grab's own transaction. A conflict answers `Contended` at
    /// once, for the caller to retry on the same shard; a refused shard answers
    /// `ShardEmpty` without its takers (a refusal is not worth the old item to the
    /// textbook client, which only moves on), and the refused user item is read.
    pub async fn reserve_in_one_transaction(
        &self,
        sale: &Sale,
        shard: u16,
        reservation: &Reservation,
    ) -> Result<Result<(), ReserveRefusal>, StoreError> {
        const OPERATION: &str = RESERVE_IN_ONE_TRANSACTION;
        let items = self.reserve_items(
            OPERATION,
            sale,
            shard,
            reservation,
            ReturnValuesOnConditionCheckFailure::None,
        )?;
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
