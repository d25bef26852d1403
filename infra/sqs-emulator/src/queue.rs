//! One queue and AWS's semantics over it, with no I/O: every operation takes `now`.
//!
//! Every operation costs the same whatever the depth: messages live in a map by key,
//! standard queues deliver from a deque of visible keys, FIFO queues from a deque of
//! groups that may deliver (a group with a message in flight is not in it), and
//! visibility timeouts, delays, retention and the deduplication window are queues or
//! heaps ordered by time, each entry looked at once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::attributes::{MessageAttribute, QueueConfig, attributes_md5};
use crate::error::SqsError;

/// How long SQS remembers a deduplication id.
pub const DEDUPLICATION_WINDOW: Duration = Duration::from_secs(300);
/// AWS allows one PurgeQueue per queue every 60 s.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
const MAX_ID_LENGTH: usize = 128;

/// A message as a client sends it.
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    pub body: String,
    pub attributes: BTreeMap<String, MessageAttribute>,
    pub delay_seconds: Option<u32>,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    pub trace_header: Option<String>,
}

/// What SendMessage answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub message_id: String,
    pub md5_of_body: String,
    pub md5_of_attributes: Option<String>,
    pub sequence_number: Option<String>,
}

/// A message as one receive hands it out.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    pub md5_of_body: String,
    pub system_attributes: BTreeMap<&'static str, String>,
    pub attributes: BTreeMap<String, MessageAttribute>,
}

/// A message leaving its queue for the dead-letter queue.
#[derive(Debug, Clone)]
pub struct Redriven {
    message: Message,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Delayed,
    Visible,
    InFlight { until: Instant },
}

#[derive(Debug, Clone)]
struct Message {
    message_id: String,
    body: String,
    md5_of_body: String,
    attributes: BTreeMap<String, MessageAttribute>,
    group_id: Option<String>,
    deduplication_id: Option<String>,
    sequence_number: Option<String>,
    trace_header: Option<String>,
    dead_letter_source: Option<String>,
    sent_at_ms: u64,
    first_receive_ms: Option<u64>,
    receive_count: u32,
    /// Generation of the newest receipt handle; a handle of an older one is stale.
    receipt: u64,
    state: State,
}

#[derive(Debug, Default)]
struct Group {
    /// The group's messages in send order; the ones in flight are a prefix.
    keys: VecDeque<u64>,
    in_flight: u32,
    /// Whether the group has an entry in `ready_groups`.
    queued: bool,
}

#[derive(Debug, Clone)]
struct Remembered {
    sent: Sent,
    at: Instant,
}

/// Message counts, as GetQueueAttributes reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub visible: usize,
    pub in_flight: usize,
    pub delayed: usize,
}

#[derive(Debug)]
pub struct Queue {
    pub name: String,
    pub fifo: bool,
    pub config: QueueConfig,
    pub created_ms: u64,
    pub modified_ms: u64,
    /// Tells this queue's receipt handles from another's (or a recreated one's).
    incarnation: u64,
    next_key: u64,
    next_sequence: u128,
    messages: HashMap<u64, Message>,
    /// Standard queues: visible keys in arrival order (deleted keys are skipped).
    ready: VecDeque<u64>,
    groups: HashMap<String, Group>,
    ready_groups: VecDeque<String>,
    visibility_deadlines: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    delays: BinaryHeap<Reverse<(Instant, u64)>>,
    retention: VecDeque<(Instant, u64)>,
    deduplication: HashMap<(String, String), Remembered>,
    deduplication_expiry: VecDeque<(Instant, (String, String))>,
    counts: Counts,
    last_purge: Option<Instant>,
}

pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest as _;
    hex(&md5::Md5::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn new_message_id() -> String {
    let bits: u128 = rand::random();
    // A version-4 UUID, as SQS's message ids are.
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Valid characters of a message body, per the SQS documentation.
fn valid_body_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..='\u{10ffff}')
}

/// Group and deduplication ids: 1-128 characters of `a-zA-Z0-9` and punctuation.
fn check_id(name: &str, value: &str) -> Result<(), SqsError> {
    if value.is_empty()
        || value.len() > MAX_ID_LENGTH
        || !value.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(SqsError::invalid_parameter(format!(
            "Value {value} for parameter {name} is invalid. Reason: it must be 1 to 128 alphanumeric or punctuation characters."
        )));
    }
    Ok(())
}

impl Queue {
    pub fn new(name: String, fifo: bool, config: QueueConfig) -> Self {
        let now = epoch_ms();
        Self {
            name,
            fifo,
            config,
            created_ms: now,
            modified_ms: now,
            incarnation: rand::random::<u64>() >> 16,
            next_key: 0,
            next_sequence: 0,
            messages: HashMap::new(),
            ready: VecDeque::new(),
            groups: HashMap::new(),
            ready_groups: VecDeque::new(),
            visibility_deadlines: BinaryHeap::new(),
            delays: BinaryHeap::new(),
            retention: VecDeque::new(),
            deduplication: HashMap::new(),
            deduplication_expiry: VecDeque::new(),
            counts: Counts::default(),
            last_purge: None,
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Applies everything due by `now`: delays ending, visibility timeouts expiring,
    /// retention and the deduplication window running out.
    pub fn tick(&mut self, now: Instant) {
        while let Some(Reverse((at, key))) = self.delays.peek().copied() {
            if at > now {
                break;
            }
            self.delays.pop();
            if self
                .messages
                .get(&key)
                .is_some_and(|m| m.state == State::Delayed)
            {
                self.counts.delayed -= 1;
                self.enqueue_visible(key, true);
            }
        }
        while let Some(Reverse((until, key, receipt))) = self.visibility_deadlines.peek().copied() {
            if until > now {
                break;
            }
            self.visibility_deadlines.pop();
            let current = self
                .messages
                .get(&key)
                .is_some_and(|m| m.receipt == receipt && m.state == State::InFlight { until });
            if current {
                self.counts.in_flight -= 1;
                self.enqueue_visible(key, false);
            }
        }
        let retention = Duration::from_secs(u64::from(self.config.message_retention_period));
        while let Some((at, key)) = self.retention.front().copied() {
            // Deleted messages leave their entry behind; drop those as they surface.
            if at + retention > now && self.messages.contains_key(&key) {
                break;
            }
            self.retention.pop_front();
            self.remove(key);
        }
        while let Some((at, _)) = self.deduplication_expiry.front() {
            if *at + DEDUPLICATION_WINDOW > now {
                break;
            }
            if let Some((at, id)) = self.deduplication_expiry.pop_front()
                && self
                    .deduplication
                    .get(&id)
                    .is_some_and(|remembered| remembered.at == at)
            {
                self.deduplication.remove(&id);
            }
        }
    }

    /// When the next delay or visibility timeout runs out, so a long poll can wake.
    pub fn next_event(&self) -> Option<Instant> {
        let delay = self.delays.peek().map(|Reverse((at, _))| *at);
        let visibility = self
            .visibility_deadlines
            .peek()
            .map(|Reverse((at, _, _))| *at);
        match (delay, visibility) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Makes a message visible. A new FIFO message joins the end of its group; one
    /// whose visibility timed out keeps its place at the front.
    fn enqueue_visible(&mut self, key: u64, arriving: bool) {
        let Some(message) = self.messages.get_mut(&key) else {
            return;
        };
        message.state = State::Visible;
        self.counts.visible += 1;
        let Some(group_id) = message.group_id.clone().filter(|_| self.fifo) else {
            self.ready.push_back(key);
            return;
        };
        let group = self.groups.entry(group_id.clone()).or_default();
        if arriving {
            group.keys.push_back(key);
        } else {
            group.in_flight -= 1;
        }
        if group.in_flight == 0 && !group.queued {
            group.queued = true;
            self.ready_groups.push_back(group_id);
        }
    }

    /// Removes a message wherever it is.
    fn remove(&mut self, key: u64) -> Option<Message> {
        let message = self.messages.remove(&key)?;
        match message.state {
            State::Delayed => self.counts.delayed -= 1,
            State::Visible => self.counts.visible -= 1,
            State::InFlight { .. } => self.counts.in_flight -= 1,
        }
        if let Some(group_id) = message.group_id.as_ref().filter(|_| self.fifo)
            && let Some(group) = self.groups.get_mut(group_id)
        {
            // The message is at (or, in flight, near) the front of its group.
            if let Some(position) = group.keys.iter().position(|k| *k == key) {
                group.keys.remove(position);
            }
            if matches!(message.state, State::InFlight { .. }) {
                group.in_flight -= 1;
            }
            if group.keys.is_empty() {
                self.groups.remove(group_id);
            } else if group.in_flight == 0 && !group.queued {
                group.queued = true;
                self.ready_groups.push_back(group_id.clone());
            }
        }
        Some(message)
    }

    pub fn send(&mut self, now: Instant, outgoing: Outgoing) -> Result<Sent, SqsError> {
        self.tick(now);
        let md5_of_body = self.validate(&outgoing)?;
        let md5_of_attributes = attributes_md5(&outgoing.attributes);
        let deduplication_key = if self.fifo {
            let id = match (
                &outgoing.deduplication_id,
                self.config.content_based_deduplication,
            ) {
                (Some(id), _) => id.clone(),
                (None, true) => {
                    use sha2::Digest as _;
                    hex(&sha2::Sha256::digest(outgoing.body.as_bytes()))
                }
                (None, false) => {
                    return Err(SqsError::invalid_parameter(
                        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly",
                    ));
                }
            };
            let scope = if self.config.deduplication_per_group {
                outgoing.group_id.clone().unwrap_or_default()
            } else {
                String::new()
            };
            Some((scope, id))
        } else {
            None
        };
        if let Some(key) = &deduplication_key
            && let Some(remembered) = self.deduplication.get(key)
        {
            // Accepted and dropped: the answer names the message already sent.
            return Ok(Sent {
                md5_of_body,
                md5_of_attributes,
                ..remembered.sent.clone()
            });
        }
        let sequence_number = self.fifo.then(|| {
            self.next_sequence += 1;
            format!(
                "{:020}",
                18_000_000_000_000_000_000u128 + self.next_sequence
            )
        });
        let sent = Sent {
            message_id: new_message_id(),
            md5_of_body: md5_of_body.clone(),
            md5_of_attributes,
            sequence_number: sequence_number.clone(),
        };
        if let Some(key) = deduplication_key.clone() {
            self.deduplication.insert(
                key.clone(),
                Remembered {
                    sent: sent.clone(),
                    at: now,
                },
            );
            self.deduplication_expiry.push_back((now, key));
        }
        let delay = outgoing.delay_seconds.unwrap_or(self.config.delay_seconds);
        self.admit(
            now,
            Message {
                message_id: sent.message_id.clone(),
                body: outgoing.body,
                md5_of_body,
                attributes: outgoing.attributes,
                group_id: outgoing.group_id,
                deduplication_id: deduplication_key.map(|(_, id)| id),
                sequence_number,
                trace_header: outgoing.trace_header,
                dead_letter_source: None,
                sent_at_ms: epoch_ms(),
                first_receive_ms: None,
                receive_count: 0,
                receipt: 0,
                state: State::Delayed,
            },
            delay,
        );
        Ok(sent)
    }

    /// Puts a message into the queue, visible now or after `delay_seconds`.
    fn admit(&mut self, now: Instant, message: Message, delay_seconds: u32) {
        let key = self.next_key;
        self.next_key += 1;
        self.messages.insert(key, message);
        self.retention.push_back((now, key));
        if delay_seconds == 0 {
            self.enqueue_visible(key, true);
        } else {
            self.counts.delayed += 1;
            self.delays.push(Reverse((
                now + Duration::from_secs(u64::from(delay_seconds)),
                key,
            )));
        }
    }

    /// Takes a message another queue's redrive policy moved here, as AWS does: same id,
    /// body and attributes, received zero times, bypassing deduplication.
    pub fn accept_redriven(&mut self, now: Instant, redriven: Redriven, source_arn: &str) {
        self.tick(now);
        let mut message = redriven.message;
        message.receive_count = 0;
        message.first_receive_ms = None;
        message.receipt = 0;
        message.state = State::Delayed;
        message.dead_letter_source = Some(source_arn.to_owned());
        if self.fifo {
            self.next_sequence += 1;
            message.sequence_number = Some(format!(
                "{:020}",
                18_000_000_000_000_000_000u128 + self.next_sequence
            ));
            if message.group_id.is_none() {
                message.group_id = Some(message.message_id.clone());
            }
        } else {
            message.sequence_number = None;
        }
        self.admit(now, message, 0);
    }

    fn validate(&self, outgoing: &Outgoing) -> Result<String, SqsError> {
        if outgoing.body.is_empty() {
            return Err(SqsError::missing_parameter("MessageBody"));
        }
        if let Some(bad) = outgoing.body.chars().find(|c| !valid_body_char(*c)) {
            return Err(SqsError::invalid_message_contents(format!(
                "Invalid characters found. Invalid character: {:#x}",
                u32::from(bad)
            )));
        }
        let size = outgoing.body.len()
            + outgoing
                .attributes
                .iter()
                .map(|(name, value)| name.len() + value.size())
                .sum::<usize>();
        if size > self.config.maximum_message_size {
            return Err(SqsError::invalid_parameter(format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {} bytes.",
                self.config.maximum_message_size
            )));
        }
        if let Some(delay) = outgoing.delay_seconds {
            if self.fifo {
                return Err(SqsError::invalid_parameter(
                    "Value for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for this queue type.",
                ));
            }
            if delay > 900 {
                return Err(SqsError::invalid_parameter(format!(
                    "Value {delay} for parameter DelaySeconds is invalid. Reason: must be between 0 and 900, if provided."
                )));
            }
        }
        if self.fifo {
            match &outgoing.group_id {
                None => return Err(SqsError::missing_parameter("MessageGroupId")),
                Some(group) => check_id("MessageGroupId", group)?,
            }
        } else if outgoing.deduplication_id.is_some() {
            return Err(SqsError::invalid_parameter(
                "Value for parameter MessageDeduplicationId is invalid. Reason: The request include parameter that is not valid for this queue type.",
            ));
        } else if let Some(group) = &outgoing.group_id {
            // Standard queues take a group id for fair queueing; it orders nothing.
            check_id("MessageGroupId", group)?;
        }
        if let Some(id) = &outgoing.deduplication_id {
            check_id("MessageDeduplicationId", id)?;
        }
        Ok(md5_hex(outgoing.body.as_bytes()))
    }

    /// Receives up to `max` messages, each hidden for `visibility`. A message already
    /// received `maxReceiveCount` times is not delivered again: with `redrive` it is
    /// returned for the dead-letter queue instead, as AWS moves it on this receive.
    pub fn receive(
        &mut self,
        now: Instant,
        max: usize,
        visibility: Duration,
        max_receive_count: Option<u32>,
    ) -> (Vec<Delivery>, Vec<Redriven>) {
        self.tick(now);
        let mut delivered = Vec::new();
        let mut redriven = Vec::new();
        let over_limit =
            |m: &Message| max_receive_count.is_some_and(|limit| m.receive_count >= limit);
        if self.fifo {
            while delivered.len() < max {
                let Some(group_id) = self.ready_groups.pop_front() else {
                    break;
                };
                let Some(group) = self.groups.get_mut(&group_id) else {
                    continue;
                };
                group.queued = false;
                if group.in_flight > 0 {
                    continue;
                }
                // As many of the group's messages as fit, in order (AWS returns messages
                // of one group together).
                let mut index = 0;
                let mut moved = Vec::new();
                while delivered.len() < max {
                    let Some(group) = self.groups.get(&group_id) else {
                        break;
                    };
                    let Some(key) = group.keys.get(index).copied() else {
                        break;
                    };
                    if self.messages.get(&key).is_some_and(over_limit) {
                        moved.push(key);
                        index += 1;
                        continue;
                    }
                    if let Some(delivery) = self.deliver(now, key, visibility) {
                        delivered.push(delivery);
                        if let Some(group) = self.groups.get_mut(&group_id) {
                            group.in_flight += 1;
                        }
                    }
                    index += 1;
                }
                for key in moved {
                    if let Some(message) = self.remove(key) {
                        redriven.push(Redriven { message });
                    }
                }
            }
        } else {
            while delivered.len() < max {
                let Some(key) = self.ready.pop_front() else {
                    break;
                };
                let Some(message) = self.messages.get(&key) else {
                    continue;
                };
                if message.state != State::Visible {
                    continue;
                }
                if over_limit(message) {
                    if let Some(message) = self.remove(key) {
                        redriven.push(Redriven { message });
                    }
                    continue;
                }
                if let Some(delivery) = self.deliver(now, key, visibility) {
                    delivered.push(delivery);
                }
            }
        }
        (delivered, redriven)
    }

    fn deliver(&mut self, now: Instant, key: u64, visibility: Duration) -> Option<Delivery> {
        let incarnation = self.incarnation;
        let message = self.messages.get_mut(&key)?;
        let until = now + visibility;
        message.state = State::InFlight { until };
        message.receive_count += 1;
        message.receipt += 1;
        let first_receive = *message.first_receive_ms.get_or_insert_with(epoch_ms);
        self.counts.visible -= 1;
        self.counts.in_flight += 1;
        self.visibility_deadlines
            .push(Reverse((until, key, message.receipt)));
        let mut system = BTreeMap::new();
        system.insert("SenderId", crate::ACCOUNT_ID.to_owned());
        system.insert("SentTimestamp", message.sent_at_ms.to_string());
        system.insert("ApproximateReceiveCount", message.receive_count.to_string());
        system.insert(
            "ApproximateFirstReceiveTimestamp",
            first_receive.to_string(),
        );
        if let Some(group) = &message.group_id {
            system.insert("MessageGroupId", group.clone());
        }
        if let Some(id) = &message.deduplication_id {
            system.insert("MessageDeduplicationId", id.clone());
        }
        if let Some(sequence) = &message.sequence_number {
            system.insert("SequenceNumber", sequence.clone());
        }
        if let Some(trace) = &message.trace_header {
            system.insert("AWSTraceHeader", trace.clone());
        }
        if let Some(source) = &message.dead_letter_source {
            system.insert("DeadLetterQueueSourceArn", source.clone());
        }
        Some(Delivery {
            message_id: message.message_id.clone(),
            receipt_handle: format!("{incarnation:x}-{key:x}-{:x}", message.receipt),
            body: message.body.clone(),
            md5_of_body: message.md5_of_body.clone(),
            system_attributes: system,
            attributes: message.attributes.clone(),
        })
    }

    /// The message a receipt handle names, if the handle is this queue's newest for it.
    /// `Ok(None)`: a well-formed handle of a message deleted since, or an older handle.
    fn resolve(&self, handle: &str) -> Result<Option<u64>, SqsError> {
        let invalid = || SqsError::receipt_handle_is_invalid(handle);
        let mut parts = handle.split('-');
        let mut next = || {
            parts
                .next()
                .and_then(|part| u64::from_str_radix(part, 16).ok())
                .ok_or_else(invalid)
        };
        let (incarnation, key, receipt) = (next()?, next()?, next()?);
        if parts.next().is_some() || incarnation != self.incarnation {
            return Err(invalid());
        }
        Ok(self
            .messages
            .get(&key)
            .filter(|message| message.receipt == receipt)
            .map(|_| key))
    }

    /// Deletes the message of a receipt handle. As on AWS, deleting with a handle of
    /// an earlier receive, or deleting twice, succeeds and deletes nothing.
    pub fn delete(&mut self, now: Instant, handle: &str) -> Result<bool, SqsError> {
        self.tick(now);
        match self.resolve(handle)? {
            Some(key) => Ok(self.remove(key).is_some()),
            None => Ok(false),
        }
    }

    /// Changes the visibility timeout of an in-flight message, counted from now.
    pub fn change_visibility(
        &mut self,
        now: Instant,
        handle: &str,
        timeout: Duration,
    ) -> Result<(), SqsError> {
        self.tick(now);
        let key = self
            .resolve(handle)?
            .ok_or_else(|| SqsError::receipt_handle_is_invalid(handle))?;
        let message = self.messages.get_mut(&key).expect("resolved keys exist");
        if !matches!(message.state, State::InFlight { .. }) {
            return Err(SqsError::message_not_inflight());
        }
        let until = now + timeout;
        message.state = State::InFlight { until };
        self.visibility_deadlines
            .push(Reverse((until, key, message.receipt)));
        self.tick(now);
        Ok(())
    }

    /// Deletes every message; AWS allows it once a minute.
    pub fn purge(&mut self, now: Instant) -> Result<(), SqsError> {
        if self
            .last_purge
            .is_some_and(|last| now.duration_since(last) < PURGE_INTERVAL)
        {
            return Err(SqsError::purge_in_progress(&self.name));
        }
        self.last_purge = Some(now);
        self.messages.clear();
        self.ready.clear();
        self.groups.clear();
        self.ready_groups.clear();
        self.visibility_deadlines.clear();
        self.delays.clear();
        self.retention.clear();
        self.counts = Counts::default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo_queue() -> Queue {
        Queue::new("q.fifo".to_owned(), true, QueueConfig::default())
    }

    fn message(body: &str, group: &str) -> Outgoing {
        Outgoing {
            body: body.to_owned(),
            group_id: Some(group.to_owned()),
            deduplication_id: Some(body.to_owned()),
            ..Outgoing::default()
        }
    }

    fn bodies(deliveries: &[Delivery]) -> Vec<&str> {
        deliveries.iter().map(|d| d.body.as_str()).collect()
    }

    #[test]
    fn a_deduplication_id_is_forgotten_after_five_minutes() {
        let mut queue = fifo_queue();
        let start = Instant::now();
        let first = queue.send(start, message("m", "g")).expect("send");
        let within = start + DEDUPLICATION_WINDOW - Duration::from_secs(1);
        assert_eq!(queue.send(within, message("m", "g")).expect("send"), first);
        assert_eq!(queue.counts().visible, 1);
        let after = start + DEDUPLICATION_WINDOW + Duration::from_secs(1);
        let second = queue.send(after, message("m", "g")).expect("send");
        assert_ne!(second.message_id, first.message_id);
        assert_eq!(queue.counts().visible, 2);
    }

    #[test]
    fn a_timed_out_fifo_message_keeps_its_place_at_the_front_of_its_group() {
        let mut queue = fifo_queue();
        let start = Instant::now();
        for body in ["1", "2"] {
            queue.send(start, message(body, "g")).expect("send");
        }
        let (first, _) = queue.receive(start, 1, Duration::from_secs(10), None);
        assert_eq!(bodies(&first), ["1"]);
        let held = start + Duration::from_secs(9);
        assert!(
            queue
                .receive(held, 10, Duration::from_secs(10), None)
                .0
                .is_empty()
        );
        let expired = start + Duration::from_secs(10);
        assert_eq!(queue.next_event(), Some(expired));
        let (again, _) = queue.receive(expired, 10, Duration::from_secs(10), None);
        assert_eq!(bodies(&again), ["1", "2"]);
    }

    #[test]
    fn messages_older_than_the_retention_period_are_dropped() {
        let mut queue = Queue::new("q".to_owned(), false, QueueConfig::default());
        let start = Instant::now();
        queue
            .send(
                start,
                Outgoing {
                    body: "old".to_owned(),
                    ..Outgoing::default()
                },
            )
            .expect("send");
        let retention = Duration::from_secs(u64::from(queue.config.message_retention_period));
        queue.tick(start + retention - Duration::from_secs(1));
        assert_eq!(queue.counts().visible, 1);
        queue.tick(start + retention);
        assert_eq!(queue.counts(), Counts::default());
        assert!(
            queue
                .receive(start + retention, 10, Duration::ZERO, None)
                .0
                .is_empty()
        );
    }

    #[test]
    fn a_delayed_message_becomes_visible_when_its_delay_ends() {
        let mut queue = Queue::new("q".to_owned(), false, QueueConfig::default());
        let start = Instant::now();
        queue
            .send(
                start,
                Outgoing {
                    body: "later".to_owned(),
                    delay_seconds: Some(5),
                    ..Outgoing::default()
                },
            )
            .expect("send");
        assert_eq!(queue.counts().delayed, 1);
        assert!(queue.receive(start, 10, Duration::ZERO, None).0.is_empty());
        let due = start + Duration::from_secs(5);
        assert_eq!(queue.next_event(), Some(due));
        let (got, _) = queue.receive(due, 10, Duration::from_secs(30), None);
        assert_eq!(bodies(&got), ["later"]);
    }

    #[test]
    fn many_groups_waiting_do_not_slow_a_receive_of_one() {
        // Structural, not timed: a receive looks only at the groups it takes from.
        let mut queue = fifo_queue();
        let start = Instant::now();
        for n in 0..10_000 {
            queue
                .send(start, message(&format!("m{n}"), &format!("g{n}")))
                .expect("send");
        }
        let (got, _) = queue.receive(start, 1, Duration::from_secs(30), None);
        assert_eq!(bodies(&got), ["m0"]);
        assert_eq!(queue.ready_groups.len(), 9_999);
        assert_eq!(queue.counts().visible, 9_999);
    }
}
