//! Running a `TransactWriteItems` and reading why DynamoDB cancelled it.
//!
//! DynamoDB reports one cancellation reason per item, in request order. The code at
//! each index is what tells "this shard is empty" from "this user is at the limit", and
//! contention (`TransactionConflict`) from a refusal that retrying cannot change. So
//! each transaction names its items' indexes once (`SHARD_ITEM`, `USER_ITEM`, ...),
//! builds its request with [`in_request_order`] and reads its refusal by those names.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Put, TransactWriteItem, Update,
};
use flashsale_domain::StoreError;

use crate::classify::store_error;
use crate::retry::{Attempt, Outlasted, RetryPolicy};

pub(crate) type TransactError = SdkError<TransactWriteItemsError, HttpResponse>;

/// Contention outlasted every retry. Transient: a later attempt may find it gone.
#[derive(Debug, thiserror::Error)]
#[error("transaction still conflicting after {attempts} attempts")]
pub struct ContentionExhausted {
    pub attempts: u32,
    #[source]
    pub source: TransactError,
}

/// DynamoDB refused the transaction in a way its caller did not expect (for example a
/// condition on an item that the data model says always holds).
#[derive(Debug, thiserror::Error)]
#[error("transaction refused unexpectedly (failed conditions at {failed:?})")]
pub struct UnexpectedRefusal {
    pub failed: Vec<usize>,
    #[source]
    pub source: TransactError,
}

/// What the cancellation reasons say, most actionable first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cancellation {
    /// Another transaction held one of the items: retry.
    Conflict,
    /// Capacity ran out for one of the items: the caller may retry later.
    Throttled,
    /// These item indexes failed their condition: a definite answer.
    Conditions(Vec<usize>),
    /// A validation error, an oversized item collection, or a code we do not know.
    Invalid,
}

pub(crate) fn read_reasons(reasons: &[CancellationReason]) -> Cancellation {
    let codes: Vec<&str> = reasons
        .iter()
        .map(|reason| reason.code().unwrap_or("None"))
        .collect();
    // A conflict comes first: the other failures may be artefacts of the race, and a
    // retry re-evaluates every condition anyway.
    if codes.contains(&"TransactionConflict") {
        return Cancellation::Conflict;
    }
    if codes
        .iter()
        .any(|code| matches!(*code, "ThrottlingError" | "ProvisionedThroughputExceeded"))
    {
        return Cancellation::Throttled;
    }
    let failed: Vec<usize> = codes
        .iter()
        .enumerate()
        .filter(|(_, code)| **code == "ConditionalCheckFailed")
        .map(|(index, _)| index)
        .collect();
    let only_conditions = codes
        .iter()
        .all(|code| matches!(*code, "None" | "ConditionalCheckFailed"));
    if !failed.is_empty() && only_conditions {
        Cancellation::Conditions(failed)
    } else {
        Cancellation::Invalid
    }
}

/// A transaction that was cancelled because conditions failed.
#[derive(Debug)]
pub(crate) struct Refusal {
    failed: Vec<usize>,
    error: TransactError,
}

impl Refusal {
    /// Whether the item at `index` (request order) failed its condition.
    pub(crate) fn failed(&self, index: usize) -> bool {
        self.failed.contains(&index)
    }

    /// The item at `index` (request order) as it was when its condition failed, if the
    /// request asked for it (`ReturnValuesOnConditionCheckFailure::AllOld`) and
    /// DynamoDB sent it.
    pub(crate) fn old_item(&self, index: usize) -> Option<&HashMap<String, AttributeValue>> {
        cancellation_reason(&self.error, index)?.item()
    }

    /// For refusals the data model says cannot happen.
    pub(crate) fn unexpected(self, operation: &'static str) -> StoreError {
        StoreError::permanent(
            operation,
            UnexpectedRefusal {
                failed: self.failed,
                source: self.error,
            },
        )
    }
}

/// Whether the item at `index` (request order) of a cancelled transaction met another
/// transaction (`TransactionConflict`), rather than another item of the request.
pub(crate) fn conflicted_at(error: &TransactError, index: usize) -> bool {
    cancellation_reason(error, index).and_then(CancellationReason::code)
        == Some("TransactionConflict")
}

fn cancellation_reason(error: &TransactError, index: usize) -> Option<&CancellationReason> {
    match error.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
            cancelled.cancellation_reasons().get(index)
        }
        _ => None,
    }
}

pub(crate) fn put(put: Put) -> TransactWriteItem {
    TransactWriteItem::builder().put(put).build()
}

pub(crate) fn update(update: Update) -> TransactWriteItem {
    TransactWriteItem::builder().update(update).build()
}

pub(crate) fn check(check: ConditionCheck) -> TransactWriteItem {
    TransactWriteItem::builder().condition_check(check).build()
}

/// The items of a transaction, each given with the index it takes in the request, in
/// request order. The indexes must be `0..N`, each once.
pub(crate) fn in_request_order<const N: usize>(
    mut items: [(usize, TransactWriteItem); N],
) -> Vec<TransactWriteItem> {
    items.sort_by_key(|(index, _)| *index);
    debug_assert!(
        items
            .iter()
            .zip(0..)
            .all(|((index, _), place)| *index == place),
        "a transaction's item indexes must be 0..N, each once"
    );
    items.into_iter().map(|(_, item)| item).collect()
}

/// What one `TransactWriteItems` request did.
#[derive(Debug)]
pub(crate) enum Attempted {
    Committed,
    /// Conditions failed; nothing was written.
    Refused(Refusal),
    /// Another transaction held one of the items (`TransactionConflict`); nothing was
    /// written and nothing was decided.
    Conflicted(TransactError),
}

/// Counts a `TransactionConflict` (or a plain write's `TransactionConflictException`)
/// that will be tried again, here or by the caller.
pub(crate) fn count_conflict(operation: &'static str) {
    // Named as in flashsale_lambda::metrics, which the adapters do not depend on.
    metrics::counter!("transaction_conflicts_retried", "operation" => operation).increment(1);
}

/// Sends the transaction once. A conflict is the caller's to handle: the grab tries
/// another shard rather than waiting on a busy one.
pub(crate) async fn transact_once(
    client: &Client,
    operation: &'static str,
    items: Vec<TransactWriteItem>,
) -> Result<Attempted, StoreError> {
    // The SDK fills in a fresh ClientRequestToken per call and reuses it on its own
    // retries, so a commit whose response was lost is not applied twice.
    let error = match client
        .transact_write_items()
        .set_transact_items(Some(items))
        .send()
        .await
    {
        Ok(_) => return Ok(Attempted::Committed),
        Err(error) => error,
    };
    let cancellation = match error.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
            read_reasons(cancelled.cancellation_reasons())
        }
        _ => return Err(store_error(operation, error)),
    };
    match cancellation {
        Cancellation::Conditions(failed) => Ok(Attempted::Refused(Refusal { failed, error })),
        Cancellation::Conflict => {
            count_conflict(operation);
            Ok(Attempted::Conflicted(error))
        }
        Cancellation::Throttled => Err(StoreError::transient(operation, error)),
        Cancellation::Invalid => Err(StoreError::permanent(operation, error)),
    }
}

/// Runs the transaction, retrying only on `TransactionConflict`, with full jitter: for
/// the writes off the hot path (open, pay, release), which have only one item set to
/// write and may as well wait their turn.
/// `Ok(Err(refusal))` means a condition failed and nothing was written.
pub(crate) async fn transact(
    client: &Client,
    policy: &RetryPolicy,
    operation: &'static str,
    items: Vec<TransactWriteItem>,
) -> Result<Result<(), Refusal>, StoreError> {
    let outcome = policy
        .until_uncontended(operation, || async {
            Ok(
                match transact_once(client, operation, items.clone()).await? {
                    Attempted::Committed => Attempt::Finished(Ok(())),
                    Attempted::Refused(refusal) => Attempt::Finished(Err(refusal)),
                    Attempted::Conflicted(error) => Attempt::Contended(error),
                },
            )
        })
        .await?;
    outcome.map_err(|Outlasted { attempts, last }| {
        StoreError::transient(
            operation,
            ContentionExhausted {
                attempts,
                source: last,
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn reasons(codes: &[&str]) -> Vec<CancellationReason> {
        codes
            .iter()
            .map(|code| CancellationReason::builder().code(*code).build())
            .collect()
    }

    #[test]
    fn items_take_the_places_their_indexes_name() {
        let tagged = |name: &str| {
            let put = Put::builder()
                .table_name(name)
                .set_item(Some(HashMap::new()))
                .build()
                .expect("a put");
            (name.to_owned(), put)
        };
        let (first, first_put) = tagged("first");
        let (second, second_put) = tagged("second");
        let items = in_request_order([(1, self::put(second_put)), (0, self::put(first_put))]);
        let tables: Vec<&str> = items
            .iter()
            .filter_map(|item| item.put())
            .map(Put::table_name)
            .collect();
        assert_eq!(tables, [first.as_str(), second.as_str()]);
    }

    #[test]
    fn failed_conditions_are_reported_by_index() {
        assert_eq!(
            read_reasons(&reasons(&["ConditionalCheckFailed", "None"])),
            Cancellation::Conditions(vec![0])
        );
        assert_eq!(
            read_reasons(&reasons(&[
                "ConditionalCheckFailed",
                "ConditionalCheckFailed"
            ])),
            Cancellation::Conditions(vec![0, 1])
        );
    }

    #[test]
    fn any_conflict_means_retry() {
        assert_eq!(
            read_reasons(&reasons(&["ConditionalCheckFailed", "TransactionConflict"])),
            Cancellation::Conflict
        );
        assert_eq!(
            read_reasons(&reasons(&["None", "TransactionConflict", "None"])),
            Cancellation::Conflict
        );
    }

    #[test]
    fn throttling_is_not_mistaken_for_a_refusal() {
        assert_eq!(
            read_reasons(&reasons(&["ConditionalCheckFailed", "ThrottlingError"])),
            Cancellation::Throttled
        );
        assert_eq!(
            read_reasons(&reasons(&["ProvisionedThroughputExceeded", "None"])),
            Cancellation::Throttled
        );
    }

    #[test]
    fn validation_errors_and_missing_reasons_are_invalid() {
        assert_eq!(
            read_reasons(&reasons(&["ValidationError", "ConditionalCheckFailed"])),
            Cancellation::Invalid
        );
        assert_eq!(
            read_reasons(&reasons(&["None", "None"])),
            Cancellation::Invalid
        );
        assert_eq!(read_reasons(&[]), Cancellation::Invalid);
    }
}
