//! The SQS event source mapping: polls a queue, hands the function an `SqsEvent` shaped
//! like AWS's, and deletes what the function processed.
//!
//! Failed records are not deleted: they become visible again after the queue's
//! visibility timeout, and SQS's redrive policy (which the SQS emulator applies on receive: a
//! message already received `maxReceiveCount` times moves to the DLQ instead of being
//! delivered) takes them to the dead-letter queue, exactly as on AWS.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use base64::Engine;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::lambda::{LambdaService, error_chain};
use crate::model::SqsSourceSpec;

/// One poller's settings.
#[derive(Debug, Clone)]
pub struct PollerSettings {
    /// Long-poll wait per ReceiveMessage; short so that shutdown is quick.
    pub wait: Duration,
    /// Pause after a failed ReceiveMessage.
    pub error_backoff: Duration,
}

impl Default for PollerSettings {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(1),
            error_backoff: Duration::from_secs(1),
        }
    }
}

/// Which records of a batch the mapping deletes, given the function's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Delete every record.
    AllSucceeded,
    /// Delete every record except these message ids.
    PartialFailure(BTreeSet<String>),
    /// Delete nothing: the function failed, or reported an id that is not in the batch.
    AllFailed,
}

/// Lambda's reading of a function result for an SQS batch.
///
/// With `ReportBatchItemFailures`, a response listing `batchItemFailures` fails just
/// those records; an empty or null identifier, or one not in the batch, fails the whole
/// batch (AWS treats a malformed report as a complete failure). Without it, any
/// successful result succeeds the batch.
pub fn batch_outcome(
    result: Option<&Value>,
    report_batch_item_failures: bool,
    batch_ids: &BTreeSet<String>,
) -> BatchOutcome {
    let Some(result) = result else {
        return BatchOutcome::AllFailed;
    };
    if !report_batch_item_failures {
        return BatchOutcome::AllSucceeded;
    }
    let failures = match result.get("batchItemFailures") {
        None | Some(Value::Null) => return BatchOutcome::AllSucceeded,
        Some(Value::Array(items)) => items,
        Some(_) => return BatchOutcome::AllFailed,
    };
    let mut failed = BTreeSet::new();
    for item in failures {
        match item.get("itemIdentifier").and_then(Value::as_str) {
            Some(id) if !id.is_empty() && batch_ids.contains(id) => {
                failed.insert(id.to_owned());
            }
            _ => return BatchOutcome::AllFailed,
        }
    }
    if failed.is_empty() {
        BatchOutcome::AllSucceeded
    } else {
        BatchOutcome::PartialFailure(failed)
    }
}

/// The event AWS builds for a batch of messages.
pub fn sqs_event(messages: &[Message], source: &SqsSourceSpec, region: &str) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            let attributes: Map<String, Value> = m
                .attributes()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.as_str().to_owned(), Value::String(v.clone())))
                .collect();
            let message_attributes: Map<String, Value> = m
                .message_attributes()
                .into_iter()
                .flatten()
                .map(|(name, value)| {
                    let b64 = |blob: &aws_smithy_types::Blob| {
                        Value::String(base64::engine::general_purpose::STANDARD.encode(blob.as_ref()))
                    };
                    (
                        name.clone(),
                        json!({
                            "stringValue": value.string_value(),
                            "binaryValue": value.binary_value().map(b64),
                            "stringListValues": value.string_list_values(),
                            "binaryListValues": value.binary_list_values().iter().map(b64).collect::<Vec<_>>(),
                            "dataType": value.data_type(),
                        }),
                    )
                })
                .collect();
            let mut record = json!({
                "messageId": m.message_id(),
                "receiptHandle": m.receipt_handle(),
                "body": m.body().unwrap_or_default(),
                "attributes": attributes,
                "messageAttributes": message_attributes,
                "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs",
                "eventSourceARN": source.queue_arn,
                "awsRegion": region,
            });
            if let Some(md5) = m.md5_of_message_attributes() {
                record["md5OfMessageAttributes"] = Value::String(md5.to_owned());
            }
            record
        })
        .collect();
    json!({ "Records": records })
}

/// Polls `source` for `function` until `shutdown` turns true.
pub async fn run(
    lambda: LambdaService,
    function: String,
    source: SqsSourceSpec,
    sqs: aws_sdk_sqs::Client,
    settings: PollerSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let region = lambda.model().region.clone();
    let wait = i32::try_from(settings.wait.as_secs())
        .unwrap_or(1)
        .clamp(0, 20);
    tracing::info!(function, queue = %source.queue_url, batch_size = source.batch_size, "event source mapping started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        let receive = sqs
            .receive_message()
            .queue_url(&source.queue_url)
            .max_number_of_messages(source.batch_size)
            .wait_time_seconds(wait)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send();
        let received = tokio::select! {
            received = receive => received,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(function, error = %error_chain(&e), "ReceiveMessage failed");
                tokio::select! {
                    _ = tokio::time::sleep(settings.error_backoff) => continue,
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
            }
        };
        if messages.is_empty() {
            continue;
        }
        let event = sqs_event(&messages, &source, &region);
        let batch_ids: BTreeSet<String> = messages
            .iter()
            .filter_map(|m| m.message_id().map(str::to_owned))
            .collect();
        let result = match lambda.invoke(&function, event).await {
            Ok(result) => Some(result),
            Err(e) => {
                tracing::warn!(function, error = %error_chain(&e), records = messages.len(), "batch failed; its records will be redelivered");
                None
            }
        };
        let outcome = batch_outcome(
            result.as_ref(),
            source.report_batch_item_failures,
            &batch_ids,
        );
        let keep: BTreeSet<String> = match &outcome {
            BatchOutcome::AllSucceeded => BTreeSet::new(),
            BatchOutcome::PartialFailure(failed) => failed.clone(),
            BatchOutcome::AllFailed => batch_ids.clone(),
        };
        if !keep.is_empty() && result.is_some() {
            tracing::info!(
                function,
                failed = keep.len(),
                records = messages.len(),
                "records reported as failed; they will be redelivered"
            );
        }
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.message_id().is_some_and(|id| !keep.contains(id)))
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .set_receipt_handle(m.receipt_handle().map(str::to_owned))
                    .build()
                    .ok()
            })
            .collect();
        if entries.is_empty() {
            continue;
        }
        match sqs
            .delete_message_batch()
            .queue_url(&source.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) if !out.failed().is_empty() => {
                tracing::warn!(
                    function,
                    failed = out.failed().len(),
                    "some processed records could not be deleted; they will be redelivered"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(function, error = %error_chain(&e), "DeleteMessageBatch failed; the batch will be redelivered")
            }
        }
    }
    tracing::info!(function, "event source mapping stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn reported_failures_keep_only_those_records() {
        let result = json!({"batchItemFailures": [{"itemIdentifier": "b"}]});
        assert_eq!(
            batch_outcome(Some(&result), true, &ids(&["a", "b", "c"])),
            BatchOutcome::PartialFailure(ids(&["b"]))
        );
    }

    #[test]
    fn an_empty_report_succeeds_the_batch() {
        for result in [json!({"batchItemFailures": []}), json!({}), Value::Null] {
            assert_eq!(
                batch_outcome(Some(&result), true, &ids(&["a"])),
                BatchOutcome::AllSucceeded
            );
        }
    }

    #[test]
    fn an_unknown_or_empty_identifier_fails_the_whole_batch() {
        for item in [
            json!({"itemIdentifier": "zz"}),
            json!({"itemIdentifier": ""}),
            json!({}),
        ] {
            let result = json!({"batchItemFailures": [item]});
            assert_eq!(
                batch_outcome(Some(&result), true, &ids(&["a", "b"])),
                BatchOutcome::AllFailed
            );
        }
    }

    #[test]
    fn a_function_error_fails_the_whole_batch() {
        assert_eq!(
            batch_outcome(None, true, &ids(&["a"])),
            BatchOutcome::AllFailed
        );
        assert_eq!(
            batch_outcome(None, false, &ids(&["a"])),
            BatchOutcome::AllFailed
        );
    }

    #[test]
    fn without_report_batch_item_failures_a_report_is_ignored() {
        let result = json!({"batchItemFailures": [{"itemIdentifier": "a"}]});
        assert_eq!(
            batch_outcome(Some(&result), false, &ids(&["a"])),
            BatchOutcome::AllSucceeded
        );
    }
}
