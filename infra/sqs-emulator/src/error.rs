//! SQS errors as the AWS JSON 1.0 protocol carries them.

/// An error answer: the JSON `__type` (shape name), the query-compatible code the SDK
/// reads from `x-amzn-query-error` (and matches its typed errors on), and who is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{query_code}: {message}")]
pub struct SqsError {
    /// The shape name, e.g. `QueueDoesNotExist`.
    pub shape: &'static str,
    /// The code of SQS's query protocol, e.g. `AWS.SimpleQueueService.NonExistentQueue`.
    pub query_code: &'static str,
    pub sender_fault: bool,
    pub message: String,
}

impl SqsError {
    fn sender(shape: &'static str, query_code: &'static str, message: impl Into<String>) -> Self {
        Self {
            shape,
            query_code,
            sender_fault: true,
            message: message.into(),
        }
    }

    pub fn queue_does_not_exist() -> Self {
        Self::sender(
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            "The specified queue does not exist.",
        )
    }

    pub fn invalid_address(url: &str) -> Self {
        Self::sender(
            "InvalidAddress",
            "InvalidAddress",
            format!("The address {url} is not valid for this endpoint."),
        )
    }

    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::sender("InvalidParameterValue", "InvalidParameterValue", message)
    }

    pub fn missing_parameter(name: &str) -> Self {
        Self::sender(
            "MissingParameter",
            "MissingParameter",
            format!("The request must contain the parameter {name}."),
        )
    }

    pub fn invalid_attribute_name(name: &str) -> Self {
        Self::sender(
            "InvalidAttributeName",
            "InvalidAttributeName",
            format!("Unknown Attribute {name}."),
        )
    }

    pub fn invalid_attribute_value(name: &str, reason: &str) -> Self {
        Self::sender(
            "InvalidAttributeValue",
            "InvalidAttributeValue",
            format!("Invalid value for the parameter {name}. Reason: {reason}"),
        )
    }

    pub fn invalid_message_contents(message: impl Into<String>) -> Self {
        Self::sender("InvalidMessageContents", "InvalidMessageContents", message)
    }

    pub fn queue_already_exists(attribute: &str) -> Self {
        Self::sender(
            "QueueNameExists",
            "QueueAlreadyExists",
            format!(
                "A queue already exists with the same name and a different value for attribute {attribute}"
            ),
        )
    }

    pub fn receipt_handle_is_invalid(handle: &str) -> Self {
        Self::sender(
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
        )
    }

    pub fn message_not_inflight() -> Self {
        Self::sender(
            "MessageNotInflight",
            "AWS.SimpleQueueService.MessageNotInflight",
            "The message referred to isn't in flight.",
        )
    }

    pub fn purge_in_progress(queue: &str) -> Self {
        Self::sender(
            "PurgeQueueInProgress",
            "AWS.SimpleQueueService.PurgeQueueInProgress",
            format!("Only one PurgeQueue operation on {queue} is allowed every 60 seconds."),
        )
    }

    pub fn empty_batch() -> Self {
        Self::sender(
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "There should be at least one entry in the request.",
        )
    }

    pub fn too_many_entries(count: usize) -> Self {
        Self::sender(
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            format!("Maximum number of entries per request are 10. You have sent {count}."),
        )
    }

    pub fn batch_ids_not_distinct(id: &str) -> Self {
        Self::sender(
            "BatchEntryIdsNotDistinct",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            format!("Id {id} repeated."),
        )
    }

    pub fn invalid_batch_entry_id(id: &str) -> Self {
        Self::sender(
            "InvalidBatchEntryId",
            "AWS.SimpleQueueService.InvalidBatchEntryId",
            format!(
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long: {id:?}"
            ),
        )
    }

    pub fn serialization(message: impl Into<String>) -> Self {
        Self::sender("SerializationException", "SerializationException", message)
    }

    pub fn unknown_operation(target: &str) -> Self {
        Self::sender(
            "UnknownOperationException",
            "AWS.SimpleQueueService.UnsupportedOperation",
            format!("The operation {target:?} is not supported by this emulator."),
        )
    }
}
