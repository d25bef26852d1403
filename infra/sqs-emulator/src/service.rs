//! The queues of one emulator and the operations of the SQS API over them, on the wire
//! as AWS JSON 1.0.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::attributes::{MessageAttribute, QueueConfig, READ_ONLY};
use crate::error::SqsError;
use crate::queue::{Delivery, Outgoing, Queue, epoch_ms};
use crate::{ACCOUNT_ID, REGION};

const CONTENT_TYPE: &str = "application/x-amz-json-1.0";
const MAX_WAIT_SECONDS: i64 = 20;
const MAX_BATCH: usize = 10;

/// One queue with its lock and the signal long polls wait on.
#[derive(Debug)]
struct QueueHandle {
    url: String,
    arn: String,
    fifo: bool,
    state: Mutex<Queue>,
    changed: Notify,
}

impl QueueHandle {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock is a bug in this crate; the state is still
        // the best there is, so keep serving it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The queues of one emulator, by name.
#[derive(Debug)]
pub struct Sqs {
    base_url: String,
    queues: RwLock<HashMap<String, Arc<QueueHandle>>>,
}

pub fn router(sqs: Arc<Sqs>) -> Router {
    Router::new().fallback(handle).with_state(sqs)
}

async fn handle(State(sqs): State<Arc<Sqs>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let answer = match target.strip_prefix("AmazonSQS.") {
        Some(operation) => sqs.dispatch(operation, &body).await,
        None => Err(SqsError::unknown_operation(target)),
    };
    // A queue URL names the host the client reached, as AWS's do: through a
    // pass-through (the bench's counting proxy) the URLs lead back through it.
    let answer = match headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
    {
        Some(host) => answer.map(|value| sqs.as_seen_from(value, host)),
        None => answer,
    };
    let request_id = crate::queue::hex(&rand::random::<[u8; 16]>());
    let (status, body, query_error) = match answer {
        Ok(value) => (StatusCode::OK, value.to_string(), None),
        Err(error) => {
            let status = if error.sender_fault {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            let body = json!({
                "__type": format!("com.amazonaws.sqs#{}", error.shape),
                "message": error.message,
            });
            let fault = if error.sender_fault {
                "Sender"
            } else {
                "Receiver"
            };
            (
                status,
                body.to_string(),
                Some(format!("{};{fault}", error.query_code)),
            )
        }
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        headers.insert("x-amzn-requestid", value);
    }
    if let Some(value) = query_error.and_then(|code| HeaderValue::from_str(&code).ok()) {
        headers.insert("x-amzn-query-error", value);
    }
    response
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, SqsError> {
    let body = if body.is_empty() {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|error| SqsError::serialization(error.to_string()))
}

fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, SqsError> {
    value
        .as_deref()
        .ok_or_else(|| SqsError::missing_parameter(name))
}

fn in_range(name: &str, value: i64, range: std::ops::RangeInclusive<i64>) -> Result<u32, SqsError> {
    if !range.contains(&value) {
        return Err(SqsError::invalid_parameter(format!(
            "Value {value} for parameter {name} is invalid. Reason: Must be between {} and {}, if provided.",
            range.start(),
            range.end()
        )));
    }
    u32::try_from(value).map_err(|_| SqsError::invalid_parameter(format!("{name} is out of range")))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireAttribute {
    data_type: Option<String>,
    string_value: Option<String>,
    binary_value: Option<String>,
}

fn message_attributes(
    wire: Option<BTreeMap<String, WireAttribute>>,
) -> Result<BTreeMap<String, MessageAttribute>, SqsError> {
    let wire = wire.unwrap_or_default();
    if wire.len() > 10 {
        return Err(SqsError::invalid_parameter(
            "Number of message attributes [{}] exceeds the allowed maximum [10].",
        ));
    }
    let mut out = BTreeMap::new();
    for (name, attribute) in wire {
        let binary_value = attribute
            .binary_value
            .map(|text| {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|_| {
                        SqsError::invalid_parameter(format!(
                            "The message attribute '{name}' has a BinaryValue that is not base64."
                        ))
                    })
            })
            .transpose()?;
        let attribute = MessageAttribute {
            data_type: attribute.data_type.ok_or_else(|| {
                SqsError::invalid_parameter(format!(
                    "The message attribute '{name}' must contain a non-empty attribute type."
                ))
            })?,
            string_value: attribute.string_value,
            binary_value,
        };
        MessageAttribute::validate(&name, &attribute)?;
        out.insert(name, attribute);
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SendEntry {
    id: Option<String>,
    message_body: Option<String>,
    delay_seconds: Option<i64>,
    message_attributes: Option<BTreeMap<String, WireAttribute>>,
    message_system_attributes: Option<BTreeMap<String, WireAttribute>>,
    message_deduplication_id: Option<String>,
    message_group_id: Option<String>,
}

impl SendEntry {
    fn outgoing(self) -> Result<Outgoing, SqsError> {
        let trace_header = self
            .message_system_attributes
            .unwrap_or_default()
            .remove("AWSTraceHeader")
            .and_then(|attribute| attribute.string_value);
        Ok(Outgoing {
            body: self
                .message_body
                .ok_or_else(|| SqsError::missing_parameter("MessageBody"))?,
            attributes: message_attributes(self.message_attributes)?,
            delay_seconds: self
                .delay_seconds
                .map(|delay| in_range("DelaySeconds", delay, 0..=900))
                .transpose()?,
            group_id: self.message_group_id,
            deduplication_id: self.message_deduplication_id,
            trace_header,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct QueueUrlOnly {
    queue_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SendMessage {
    queue_url: Option<String>,
    #[serde(flatten)]
    entry: SendEntry,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Batch<T> {
    queue_url: Option<String>,
    entries: Option<Vec<T>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ReceiveMessage {
    queue_url: Option<String>,
    attribute_names: Option<Vec<String>>,
    message_system_attribute_names: Option<Vec<String>>,
    message_attribute_names: Option<Vec<String>>,
    max_number_of_messages: Option<i64>,
    visibility_timeout: Option<i64>,
    wait_time_seconds: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HandleEntry {
    id: Option<String>,
    queue_url: Option<String>,
    receipt_handle: Option<String>,
    visibility_timeout: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CreateQueue {
    queue_name: Option<String>,
    attributes: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetQueueUrl {
    queue_name: Option<String>,
    #[serde(rename = "QueueOwnerAWSAccountId")]
    owner: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetQueueAttributes {
    queue_url: Option<String>,
    attribute_names: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SetQueueAttributes {
    queue_url: Option<String>,
    attributes: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListQueues {
    queue_name_prefix: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

/// Queue names: 1-80 characters of `A-Za-z0-9-_`, a FIFO queue's ending in `.fifo`.
fn check_queue_name(name: &str, fifo: bool) -> Result<(), SqsError> {
    let stem = if fifo {
        name.strip_suffix(".fifo")
    } else {
        Some(name)
    };
    let valid = stem.is_some_and(|stem| {
        !stem.is_empty()
            && name.len() <= 80
            && stem
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    if valid {
        Ok(())
    } else if fifo || name.ends_with(".fifo") {
        Err(SqsError::invalid_parameter(
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length.",
        ))
    } else {
        Err(SqsError::invalid_parameter(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ))
    }
}

/// Whether a receive asked for this system attribute.
fn wanted(names: &BTreeSet<String>, name: &str) -> bool {
    names.contains("All") || names.contains(name)
}

/// Whether a receive asked for this message attribute (`All`, `.*`, `prefix.*` or the name).
fn wanted_message_attribute(names: &[String], name: &str) -> bool {
    names.iter().any(|pattern| {
        pattern == "All"
            || pattern == ".*"
            || pattern == name
            || pattern
                .strip_suffix(".*")
                .is_some_and(|prefix| name.starts_with(&format!("{prefix}.")))
    })
}

fn render_delivery(
    delivery: Delivery,
    system_names: &BTreeSet<String>,
    attribute_names: &[String],
) -> Value {
    let mut message = Map::new();
    message.insert("MessageId".to_owned(), Value::String(delivery.message_id));
    message.insert(
        "ReceiptHandle".to_owned(),
        Value::String(delivery.receipt_handle),
    );
    message.insert("MD5OfBody".to_owned(), Value::String(delivery.md5_of_body));
    message.insert("Body".to_owned(), Value::String(delivery.body));
    let system: Map<String, Value> = delivery
        .system_attributes
        .into_iter()
        .filter(|(name, _)| wanted(system_names, name))
        .map(|(name, value)| (name.to_owned(), Value::String(value)))
        .collect();
    if !system.is_empty() {
        message.insert("Attributes".to_owned(), Value::Object(system));
    }
    let selected: BTreeMap<String, MessageAttribute> = delivery
        .attributes
        .into_iter()
        .filter(|(name, _)| wanted_message_attribute(attribute_names, name))
        .collect();
    if let Some(md5) = crate::attributes::attributes_md5(&selected) {
        message.insert("MD5OfMessageAttributes".to_owned(), Value::String(md5));
        let rendered: Map<String, Value> = selected
            .into_iter()
            .map(|(name, attribute)| {
                let mut value = Map::new();
                value.insert("DataType".to_owned(), Value::String(attribute.data_type));
                if let Some(text) = attribute.string_value {
                    value.insert("StringValue".to_owned(), Value::String(text));
                }
                if let Some(bytes) = attribute.binary_value {
                    value.insert(
                        "BinaryValue".to_owned(),
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                    );
                }
                (name, Value::Object(value))
            })
            .collect();
        message.insert("MessageAttributes".to_owned(), Value::Object(rendered));
    }
    Value::Object(message)
}

/// Checks a batch's entries (1 to 10, ids distinct and well formed), returning their ids.
fn batch_ids<T>(entries: &[T], id: impl Fn(&T) -> Option<&str>) -> Result<Vec<String>, SqsError> {
    if entries.is_empty() {
        return Err(SqsError::empty_batch());
    }
    if entries.len() > MAX_BATCH {
        return Err(SqsError::too_many_entries(entries.len()));
    }
    let mut seen = BTreeSet::new();
    let mut ids = Vec::with_capacity(entries.len());
    for entry in entries {
        let id = id(entry).ok_or_else(|| SqsError::missing_parameter("Id"))?;
        let well_formed = !id.is_empty()
            && id.len() <= 80
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !well_formed {
            return Err(SqsError::invalid_batch_entry_id(id));
        }
        if !seen.insert(id.to_owned()) {
            return Err(SqsError::batch_ids_not_distinct(id));
        }
        ids.push(id.to_owned());
    }
    Ok(ids)
}

fn failed_entry(id: &str, error: &SqsError) -> Value {
    json!({
        "Id": id,
        "SenderFault": error.sender_fault,
        "Code": error.query_code,
        "Message": error.message,
    })
}

impl Sqs {
    /// Queues whose URLs start with `base_url` (the endpoint clients use).
    pub fn new(base_url: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            queues: RwLock::new(HashMap::new()),
        }
    }

    /// `answer` with every queue URL in it (`QueueUrl`, `QueueUrls`) on `host`.
    fn as_seen_from(&self, mut answer: Value, host: &str) -> Value {
        let seen = format!("http://{host}");
        if seen == self.base_url {
            return answer;
        }
        let rehost = |url: &mut Value| {
            if let Some(path) = url
                .as_str()
                .and_then(|url| url.strip_prefix(&self.base_url))
            {
                *url = Value::String(format!("{seen}{path}"));
            }
        };
        if let Some(url) = answer.get_mut("QueueUrl") {
            rehost(url);
        }
        if let Some(Value::Array(urls)) = answer.get_mut("QueueUrls") {
            urls.iter_mut().for_each(rehost);
        }
        answer
    }

    fn queues(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<QueueHandle>>> {
        self.queues
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The queue a URL names: `.../{account}/{name}`, whatever the host (AWS resolves
    /// by path too).
    fn queue(&self, url: &Option<String>) -> Result<Arc<QueueHandle>, SqsError> {
        let url = required(url, "QueueUrl")?;
        let path = url.split_once("://").map_or(url, |(_, rest)| {
            rest.split_once('/').map_or("", |(_, path)| path)
        });
        let mut segments = path.trim_matches('/').rsplit('/');
        let (Some(name), Some(account)) = (segments.next(), segments.next()) else {
            return Err(SqsError::invalid_address(url));
        };
        if account != ACCOUNT_ID {
            return Err(SqsError::queue_does_not_exist());
        }
        self.queues()
            .get(name)
            .cloned()
            .ok_or_else(SqsError::queue_does_not_exist)
    }

    fn queue_by_arn(&self, arn: &str) -> Option<Arc<QueueHandle>> {
        let name = arn.rsplit(':').next()?;
        self.queues()
            .get(name)
            .filter(|queue| queue.arn == arn)
            .cloned()
    }

    /// A redrive policy must name an existing queue of the same type.
    fn check_redrive(&self, config: &QueueConfig, fifo: bool) -> Result<(), SqsError> {
        let Some(redrive) = &config.redrive else {
            return Ok(());
        };
        match self.queue_by_arn(&redrive.dead_letter_target_arn) {
            None => Err(SqsError::invalid_parameter(format!(
                "Value {{\"deadLetterTargetArn\":\"{}\",\"maxReceiveCount\":\"{}\"}} for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist.",
                redrive.dead_letter_target_arn, redrive.max_receive_count
            ))),
            Some(target) if target.fifo != fifo => Err(SqsError::invalid_parameter(
                "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter queue must be same type of queue as the source.",
            )),
            Some(_) => Ok(()),
        }
    }

    async fn dispatch(&self, operation: &str, body: &[u8]) -> Result<Value, SqsError> {
        match operation {
            "SendMessage" => self.send_message(parse(body)?),
            "SendMessageBatch" => self.send_message_batch(parse(body)?),
            "ReceiveMessage" => self.receive_message(parse(body)?).await,
            "DeleteMessage" => self.delete_message(parse(body)?),
            "DeleteMessageBatch" => self.delete_message_batch(parse(body)?),
            "ChangeMessageVisibility" => self.change_message_visibility(parse(body)?),
            "ChangeMessageVisibilityBatch" => self.change_message_visibility_batch(parse(body)?),
            "CreateQueue" => self.create_queue(parse(body)?),
            "GetQueueUrl" => self.get_queue_url(parse(body)?),
            "GetQueueAttributes" => self.get_queue_attributes(parse(body)?),
            "SetQueueAttributes" => self.set_queue_attributes(parse(body)?),
            "ListQueues" => self.list_queues(parse(body)?),
            "PurgeQueue" => self.purge_queue(parse(body)?),
            "DeleteQueue" => self.delete_queue(parse(body)?),
            other => Err(SqsError::unknown_operation(other)),
        }
    }

    fn send_message(&self, request: SendMessage) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let sent = queue
            .lock()
            .send(Instant::now(), request.entry.outgoing()?)?;
        queue.changed.notify_waiters();
        let mut out = json!({"MessageId": sent.message_id, "MD5OfMessageBody": sent.md5_of_body});
        if let Some(md5) = sent.md5_of_attributes {
            out["MD5OfMessageAttributes"] = Value::String(md5);
        }
        if let Some(sequence) = sent.sequence_number {
            out["SequenceNumber"] = Value::String(sequence);
        }
        Ok(out)
    }

    fn send_message_batch(&self, request: Batch<SendEntry>) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let entries = request.entries.unwrap_or_default();
        let ids = batch_ids(&entries, |entry| entry.id.as_deref())?;
        let total: usize = entries
            .iter()
            .map(|entry| entry.message_body.as_ref().map_or(0, String::len))
            .sum();
        let limit = queue.lock().config.maximum_message_size;
        if total > limit {
            return Err(SqsError {
                shape: "BatchRequestTooLong",
                query_code: "AWS.SimpleQueueService.BatchRequestTooLong",
                sender_fault: true,
                message: format!(
                    "Batch requests cannot be longer than {limit} bytes. You have sent {total} bytes."
                ),
            });
        }
        let mut successful = Vec::new();
        let mut failed = Vec::new();
        for (id, entry) in ids.into_iter().zip(entries) {
            let sent = entry
                .outgoing()
                .and_then(|outgoing| queue.lock().send(Instant::now(), outgoing));
            match sent {
                Ok(sent) => {
                    let mut out = json!({"Id": id, "MessageId": sent.message_id, "MD5OfMessageBody": sent.md5_of_body});
                    if let Some(md5) = sent.md5_of_attributes {
                        out["MD5OfMessageAttributes"] = Value::String(md5);
                    }
                    if let Some(sequence) = sent.sequence_number {
                        out["SequenceNumber"] = Value::String(sequence);
                    }
                    successful.push(out);
                }
                Err(error) => failed.push(failed_entry(&id, &error)),
            }
        }
        queue.changed.notify_waiters();
        Ok(json!({"Successful": successful, "Failed": failed}))
    }

    async fn receive_message(&self, request: ReceiveMessage) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let max = request
            .max_number_of_messages
            .map(|max| in_range("MaxNumberOfMessages", max, 1..=10))
            .transpose()?
            .unwrap_or(1) as usize;
        let (default_visibility, default_wait, redrive) = {
            let state = queue.lock();
            (
                state.config.visibility_timeout,
                state.config.receive_message_wait_time_seconds,
                state.config.redrive.clone(),
            )
        };
        let visibility = request
            .visibility_timeout
            .map(|timeout| in_range("VisibilityTimeout", timeout, 0..=43_200))
            .transpose()?
            .unwrap_or(default_visibility);
        let wait = request
            .wait_time_seconds
            .map(|wait| in_range("WaitTimeSeconds", wait, 0..=MAX_WAIT_SECONDS))
            .transpose()?
            .unwrap_or(default_wait);
        let system_names: BTreeSet<String> = request
            .attribute_names
            .into_iter()
            .chain(request.message_system_attribute_names)
            .flatten()
            .collect();
        let attribute_names = request.message_attribute_names.unwrap_or_default();
        // A redrive whose target is gone delivers on, rather than lose messages.
        let dead_letter = redrive.and_then(|redrive| {
            self.queue_by_arn(&redrive.dead_letter_target_arn)
                .map(|target| (target, redrive.max_receive_count))
        });
        let deadline = Instant::now() + Duration::from_secs(u64::from(wait));
        let visibility = Duration::from_secs(u64::from(visibility));
        loop {
            // Registered before looking, so a send between the look and the wait wakes us.
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let (delivered, redriven, next_event) = {
                let mut state = queue.lock();
                let (delivered, redriven) = state.receive(
                    now,
                    max,
                    visibility,
                    dead_letter.as_ref().map(|(_, count)| *count),
                );
                (delivered, redriven, state.next_event())
            };
            if let Some((target, _)) = dead_letter.as_ref().filter(|_| !redriven.is_empty()) {
                {
                    let mut target_state = target.lock();
                    for message in redriven {
                        target_state.accept_redriven(now, message, &queue.arn);
                    }
                }
                target.changed.notify_waiters();
            }
            if !delivered.is_empty() || now >= deadline {
                let messages: Vec<Value> = delivered
                    .into_iter()
                    .map(|delivery| render_delivery(delivery, &system_names, &attribute_names))
                    .collect();
                return Ok(if messages.is_empty() {
                    json!({})
                } else {
                    json!({ "Messages": messages })
                });
            }
            let wake = next_event.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            }
        }
    }

    fn delete_message(&self, request: HandleEntry) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let handle = required(&request.receipt_handle, "ReceiptHandle")?;
        let deleted = queue.lock().delete(Instant::now(), handle)?;
        if deleted && queue.fifo {
            // The group may deliver again.
            queue.changed.notify_waiters();
        }
        Ok(json!({}))
    }

    fn delete_message_batch(&self, request: Batch<HandleEntry>) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let entries = request.entries.unwrap_or_default();
        let ids = batch_ids(&entries, |entry| entry.id.as_deref())?;
        let mut successful = Vec::new();
        let mut failed = Vec::new();
        {
            let mut state = queue.lock();
            let now = Instant::now();
            for (id, entry) in ids.into_iter().zip(entries) {
                let deleted = required(&entry.receipt_handle, "ReceiptHandle")
                    .and_then(|handle| state.delete(now, handle));
                match deleted {
                    Ok(_) => successful.push(json!({"Id": id})),
                    Err(error) => failed.push(failed_entry(&id, &error)),
                }
            }
        }
        queue.changed.notify_waiters();
        Ok(json!({"Successful": successful, "Failed": failed}))
    }

    fn change_visibility(
        queue: &QueueHandle,
        handle: Option<&str>,
        timeout: Option<i64>,
    ) -> Result<(), SqsError> {
        let handle = handle.ok_or_else(|| SqsError::missing_parameter("ReceiptHandle"))?;
        let timeout = timeout.ok_or_else(|| SqsError::missing_parameter("VisibilityTimeout"))?;
        let timeout = in_range("VisibilityTimeout", timeout, 0..=43_200)?;
        queue.lock().change_visibility(
            Instant::now(),
            handle,
            Duration::from_secs(u64::from(timeout)),
        )
    }

    fn change_message_visibility(&self, request: HandleEntry) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        Self::change_visibility(
            &queue,
            request.receipt_handle.as_deref(),
            request.visibility_timeout,
        )?;
        queue.changed.notify_waiters();
        Ok(json!({}))
    }

    fn change_message_visibility_batch(
        &self,
        request: Batch<HandleEntry>,
    ) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let entries = request.entries.unwrap_or_default();
        let ids = batch_ids(&entries, |entry| entry.id.as_deref())?;
        let mut successful = Vec::new();
        let mut failed = Vec::new();
        for (id, entry) in ids.into_iter().zip(entries) {
            match Self::change_visibility(
                &queue,
                entry.receipt_handle.as_deref(),
                entry.visibility_timeout,
            ) {
                Ok(()) => successful.push(json!({"Id": id})),
                Err(error) => failed.push(failed_entry(&id, &error)),
            }
        }
        queue.changed.notify_waiters();
        Ok(json!({"Successful": successful, "Failed": failed}))
    }

    fn create_queue(&self, request: CreateQueue) -> Result<Value, SqsError> {
        let name = required(&request.queue_name, "QueueName")?;
        let attributes = request.attributes.unwrap_or_default();
        let fifo = match attributes.get("FifoQueue").map(|v| v.to_ascii_lowercase()) {
            Some(value) if value == "true" => true,
            Some(value) if value == "false" => false,
            Some(_) => {
                return Err(SqsError::invalid_attribute_value(
                    "FifoQueue",
                    "must be true or false",
                ));
            }
            None => false,
        };
        check_queue_name(name, fifo)?;
        let queues = self.queues();
        if let Some(existing) = queues.get(name) {
            // Idempotent with the same attributes; a conflict with different ones.
            if existing.fifo != fifo {
                return Err(SqsError::queue_already_exists("FifoQueue"));
            }
            let state = existing.lock();
            let mut requested = state.config.clone();
            requested.apply(fifo, &attributes, true)?;
            let (now, asked) = (state.config.render(fifo), requested.render(fifo));
            if let Some((name, _)) = asked.iter().find(|(k, v)| now.get(*k) != Some(*v)) {
                return Err(SqsError::queue_already_exists(name));
            }
            return Ok(json!({"QueueUrl": existing.url}));
        }
        let mut config = QueueConfig::default();
        config.apply(fifo, &attributes, true)?;
        drop(queues);
        self.check_redrive(&config, fifo)?;
        let mut queues = self
            .queues
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let url = format!("{}/{ACCOUNT_ID}/{name}", self.base_url);
        let arn = format!("arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}");
        let handle = queues.entry(name.to_owned()).or_insert_with(|| {
            Arc::new(QueueHandle {
                url: url.clone(),
                arn,
                fifo,
                state: Mutex::new(Queue::new(name.to_owned(), fifo, config)),
                changed: Notify::new(),
            })
        });
        Ok(json!({"QueueUrl": handle.url}))
    }

    fn get_queue_url(&self, request: GetQueueUrl) -> Result<Value, SqsError> {
        let name = required(&request.queue_name, "QueueName")?;
        if request
            .owner
            .as_deref()
            .is_some_and(|owner| owner != ACCOUNT_ID)
        {
            return Err(SqsError::queue_does_not_exist());
        }
        self.queues()
            .get(name)
            .map(|queue| json!({"QueueUrl": queue.url}))
            .ok_or_else(SqsError::queue_does_not_exist)
    }

    fn get_queue_attributes(&self, request: GetQueueAttributes) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let names = request.attribute_names.unwrap_or_default();
        let mut state = queue.lock();
        state.tick(Instant::now());
        let counts = state.counts();
        let mut all = state.config.render(queue.fifo);
        for (name, value) in [
            ("ApproximateNumberOfMessages", counts.visible.to_string()),
            (
                "ApproximateNumberOfMessagesNotVisible",
                counts.in_flight.to_string(),
            ),
            (
                "ApproximateNumberOfMessagesDelayed",
                counts.delayed.to_string(),
            ),
            ("CreatedTimestamp", (state.created_ms / 1000).to_string()),
            (
                "LastModifiedTimestamp",
                (state.modified_ms / 1000).to_string(),
            ),
            ("QueueArn", queue.arn.clone()),
        ] {
            all.insert(name.to_owned(), value);
        }
        drop(state);
        let mut out = Map::new();
        for name in &names {
            if name == "All" {
                out.extend(
                    all.iter()
                        .map(|(k, v)| (k.clone(), Value::String(v.clone()))),
                );
            } else if let Some(value) = all.get(name) {
                out.insert(name.clone(), Value::String(value.clone()));
            } else if !matches!(
                name.as_str(),
                "Policy"
                    | "RedrivePolicy"
                    | "RedriveAllowPolicy"
                    | "KmsMasterKeyId"
                    | "KmsDataKeyReusePeriodSeconds"
                    | "SqsManagedSseEnabled"
            ) && !READ_ONLY.contains(&name.as_str())
            {
                return Err(SqsError::invalid_attribute_name(name));
            }
        }
        Ok(if out.is_empty() {
            json!({})
        } else {
            json!({ "Attributes": out })
        })
    }

    fn set_queue_attributes(&self, request: SetQueueAttributes) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let attributes = request.attributes.unwrap_or_default();
        if let Some(name) = attributes
            .keys()
            .find(|name| READ_ONLY.contains(&name.as_str()) || *name == "FifoQueue")
        {
            return Err(SqsError::invalid_attribute_name(name));
        }
        let mut config = queue.lock().config.clone();
        config.apply(queue.fifo, &attributes, false)?;
        self.check_redrive(&config, queue.fifo)?;
        {
            let mut state = queue.lock();
            state.config = config;
            state.modified_ms = epoch_ms();
        }
        queue.changed.notify_waiters();
        Ok(json!({}))
    }

    fn list_queues(&self, request: ListQueues) -> Result<Value, SqsError> {
        let prefix = request.queue_name_prefix.unwrap_or_default();
        let max = request
            .max_results
            .map(|max| in_range("MaxResults", max, 1..=1000))
            .transpose()?;
        let queues = self.queues();
        let mut names: Vec<&String> = queues
            .keys()
            .filter(|name| name.starts_with(&prefix))
            .filter(|name| {
                request
                    .next_token
                    .as_ref()
                    .is_none_or(|after| *name > after)
            })
            .collect();
        names.sort();
        let limit = max.map_or(1000, |max| max as usize);
        let more = names.len() > limit;
        names.truncate(limit);
        let urls: Vec<&str> = names
            .iter()
            .filter_map(|name| queues.get(*name).map(|queue| queue.url.as_str()))
            .collect();
        let mut out = json!({ "QueueUrls": urls });
        // AWS pages only when MaxResults is given.
        if more
            && max.is_some()
            && let Some(last) = names.last()
        {
            out["NextToken"] = Value::String((*last).clone());
        }
        Ok(out)
    }

    fn purge_queue(&self, request: QueueUrlOnly) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        queue.lock().purge(Instant::now())?;
        Ok(json!({}))
    }

    fn delete_queue(&self, request: QueueUrlOnly) -> Result<Value, SqsError> {
        let queue = self.queue(&request.queue_url)?;
        let name = queue.url.rsplit('/').next().unwrap_or_default().to_owned();
        self.queues
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&name);
        queue.changed.notify_waiters();
        Ok(json!({}))
    }
}
