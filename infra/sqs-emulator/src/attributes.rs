//! Queue attributes (validated and rendered as SQS does) and message attributes.

use std::collections::BTreeMap;

use crate::error::SqsError;

/// A message attribute, as SendMessage takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageAttribute {
    pub data_type: String,
    pub string_value: Option<String>,
    pub binary_value: Option<Vec<u8>>,
}

impl MessageAttribute {
    /// Counted against MaximumMessageSize, as AWS counts it.
    pub fn size(&self) -> usize {
        self.data_type.len()
            + self.string_value.as_ref().map_or(0, String::len)
            + self.binary_value.as_ref().map_or(0, Vec::len)
    }

    pub fn validate(name: &str, attribute: &Self) -> Result<(), SqsError> {
        let name_ok = !name.is_empty()
            && name.len() <= 256
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !name.starts_with('.')
            && !name.ends_with('.')
            && !name.contains("..")
            && !name.to_ascii_lowercase().starts_with("aws.")
            && !name.to_ascii_lowercase().starts_with("amazon.");
        if !name_ok {
            return Err(SqsError::invalid_parameter(format!(
                "Message attribute name '{name}' is invalid."
            )));
        }
        let base = attribute.data_type.split('.').next().unwrap_or_default();
        let value_ok = match base {
            "String" | "Number" => attribute.string_value.is_some(),
            "Binary" => attribute.binary_value.is_some(),
            _ => {
                return Err(SqsError::invalid_parameter(format!(
                    "The message attribute '{name}' has an invalid message attribute type, the set of supported type prefixes is Binary, Number, and String."
                )));
            }
        };
        if !value_ok {
            return Err(SqsError::invalid_parameter(format!(
                "The message attribute '{name}' with type '{}' must use field '{}'.",
                attribute.data_type,
                if base == "Binary" { "Binary" } else { "String" }
            )));
        }
        Ok(())
    }
}

/// MD5OfMessageAttributes, by AWS's encoding: per attribute in name order, each of name,
/// data type and value as a 4-byte big-endian length and its bytes, the value preceded
/// by 1 (string) or 2 (binary).
pub fn attributes_md5(attributes: &BTreeMap<String, MessageAttribute>) -> Option<String> {
    use md5::Digest as _;
    fn put(digest: &mut md5::Md5, bytes: &[u8]) {
        let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        digest.update(length.to_be_bytes());
        digest.update(bytes);
    }
    if attributes.is_empty() {
        return None;
    }
    let mut digest = md5::Md5::new();
    for (name, attribute) in attributes {
        put(&mut digest, name.as_bytes());
        put(&mut digest, attribute.data_type.as_bytes());
        if let Some(value) = &attribute.string_value {
            digest.update([1u8]);
            put(&mut digest, value.as_bytes());
        } else if let Some(value) = &attribute.binary_value {
            digest.update([2u8]);
            put(&mut digest, value);
        }
    }
    Some(crate::queue::hex(&digest.finalize()))
}

/// A queue's RedrivePolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redrive {
    pub dead_letter_target_arn: String,
    pub max_receive_count: u32,
}

/// A queue's settable attributes, with SQS's defaults.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub visibility_timeout: u32,
    pub delay_seconds: u32,
    pub message_retention_period: u32,
    pub maximum_message_size: usize,
    pub receive_message_wait_time_seconds: u32,
    pub redrive: Option<Redrive>,
    pub content_based_deduplication: bool,
    pub deduplication_per_group: bool,
    /// Accepted and reported back, with no local effect (policies, encryption, throughput).
    pub stored: BTreeMap<String, String>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: 30,
            delay_seconds: 0,
            message_retention_period: 345_600,
            maximum_message_size: 262_144,
            receive_message_wait_time_seconds: 0,
            redrive: None,
            content_based_deduplication: false,
            deduplication_per_group: false,
            stored: BTreeMap::new(),
        }
    }
}

/// Attributes SQS computes; they can be read, never set.
pub const READ_ONLY: [&str; 6] = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
];

const FIFO_ONLY: [&str; 3] = [
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
];

const STORED: [&str; 5] = [
    "Policy",
    "RedriveAllowPolicy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
];

fn seconds(name: &str, value: &str, range: std::ops::RangeInclusive<u32>) -> Result<u32, SqsError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|v| range.contains(v))
        .ok_or_else(|| {
            SqsError::invalid_attribute_value(
                name,
                &format!(
                    "must be an integer between {} and {}",
                    range.start(),
                    range.end()
                ),
            )
        })
}

fn boolean(name: &str, value: &str) -> Result<bool, SqsError> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(SqsError::invalid_attribute_value(
            name,
            "must be true or false",
        )),
    }
}

fn redrive_policy(value: &str) -> Result<Option<Redrive>, SqsError> {
    if value.is_empty() {
        return Ok(None);
    }
    let invalid = |reason: &str| SqsError::invalid_attribute_value("RedrivePolicy", reason);
    let document: serde_json::Value = serde_json::from_str(value)
        .map_err(|_| invalid("Redrive policy is not a valid JSON map."))?;
    let arn = document
        .get("deadLetterTargetArn")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            invalid("Redrive policy does not contain mandatory attribute: deadLetterTargetArn.")
        })?;
    let count = document
        .get("maxReceiveCount")
        .and_then(|count| match count {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        })
        .ok_or_else(|| {
            invalid("Redrive policy does not contain mandatory attribute: maxReceiveCount.")
        })?;
    let max_receive_count = u32::try_from(count)
        .ok()
        .filter(|count| (1..=1000).contains(count))
        .ok_or_else(|| invalid("Value for maxReceiveCount must be between 1 and 1000."))?;
    Ok(Some(Redrive {
        dead_letter_target_arn: arn.to_owned(),
        max_receive_count,
    }))
}

impl QueueConfig {
    /// Applies CreateQueue's or SetQueueAttributes' attributes, all or none.
    pub fn apply(
        &mut self,
        fifo: bool,
        attributes: &BTreeMap<String, String>,
        creating: bool,
    ) -> Result<(), SqsError> {
        let mut next = self.clone();
        for (name, value) in attributes {
            let name = name.as_str();
            if FIFO_ONLY.contains(&name) && !fifo {
                return Err(SqsError::invalid_attribute_name(name));
            }
            match name {
                "VisibilityTimeout" => next.visibility_timeout = seconds(name, value, 0..=43_200)?,
                "DelaySeconds" => next.delay_seconds = seconds(name, value, 0..=900)?,
                "MessageRetentionPeriod" => {
                    next.message_retention_period = seconds(name, value, 60..=1_209_600)?;
                }
                "MaximumMessageSize" => {
                    next.maximum_message_size = seconds(name, value, 1024..=262_144)? as usize;
                }
                "ReceiveMessageWaitTimeSeconds" => {
                    next.receive_message_wait_time_seconds = seconds(name, value, 0..=20)?;
                }
                "RedrivePolicy" => next.redrive = redrive_policy(value)?,
                "ContentBasedDeduplication" => {
                    next.content_based_deduplication = boolean(name, value)?;
                }
                "DeduplicationScope" => {
                    next.deduplication_per_group = match value.as_str() {
                        "messageGroup" => true,
                        "queue" => false,
                        _ => {
                            return Err(SqsError::invalid_attribute_value(
                                name,
                                "must be messageGroup or queue",
                            ));
                        }
                    };
                    next.stored.insert(name.to_owned(), value.clone());
                }
                "FifoThroughputLimit" => {
                    if !matches!(value.as_str(), "perQueue" | "perMessageGroupId") {
                        return Err(SqsError::invalid_attribute_value(
                            name,
                            "must be perQueue or perMessageGroupId",
                        ));
                    }
                    next.stored.insert(name.to_owned(), value.clone());
                }
                "FifoQueue" if creating => {
                    if boolean(name, value)? != fifo {
                        return Err(SqsError::invalid_parameter(
                            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length. A FIFO queue's name must end with .fifo.",
                        ));
                    }
                }
                "SqsManagedSseEnabled" => {
                    boolean(name, value)?;
                    next.stored
                        .insert(name.to_owned(), value.to_ascii_lowercase());
                }
                _ if STORED.contains(&name) => {
                    next.stored.insert(name.to_owned(), value.clone());
                }
                _ => return Err(SqsError::invalid_attribute_name(name)),
            }
        }
        *self = next;
        Ok(())
    }

    /// The settable attributes as GetQueueAttributes reports them.
    pub fn render(&self, fifo: bool) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert(
            "VisibilityTimeout".to_owned(),
            self.visibility_timeout.to_string(),
        );
        out.insert("DelaySeconds".to_owned(), self.delay_seconds.to_string());
        out.insert(
            "MessageRetentionPeriod".to_owned(),
            self.message_retention_period.to_string(),
        );
        out.insert(
            "MaximumMessageSize".to_owned(),
            self.maximum_message_size.to_string(),
        );
        out.insert(
            "ReceiveMessageWaitTimeSeconds".to_owned(),
            self.receive_message_wait_time_seconds.to_string(),
        );
        if let Some(redrive) = &self.redrive {
            out.insert(
                "RedrivePolicy".to_owned(),
                serde_json::json!({
                    "deadLetterTargetArn": redrive.dead_letter_target_arn,
                    "maxReceiveCount": redrive.max_receive_count,
                })
                .to_string(),
            );
        }
        if fifo {
            out.insert("FifoQueue".to_owned(), "true".to_owned());
            out.insert(
                "ContentBasedDeduplication".to_owned(),
                self.content_based_deduplication.to_string(),
            );
            out.insert(
                "DeduplicationScope".to_owned(),
                if self.deduplication_per_group {
                    "messageGroup"
                } else {
                    "queue"
                }
                .to_owned(),
            );
            out.insert("FifoThroughputLimit".to_owned(), "perQueue".to_owned());
        }
        // New queues are encrypted with SQS-managed keys unless a KMS key is named.
        if !self.stored.contains_key("KmsMasterKeyId") {
            out.insert("SqsManagedSseEnabled".to_owned(), "true".to_owned());
        }
        out.extend(self.stored.clone());
        out
    }
}
