//! DynamoDB's transaction-conflict rule, which DynamoDB Local never plays: it runs one
//! transaction at a time, so no two are ever in flight on an item.
//!
//! As the developer guide ("Transaction conflict handling in DynamoDB") has it: while a
//! `TransactWriteItems` is in flight on an item, another `TransactWriteItems` or a
//! `TransactGetItems` touching it is cancelled with `TransactionConflict` at that
//! item's index, and a `PutItem`, `UpdateItem` or `DeleteItem` of it fails with
//! `TransactionConflictException`. Plain writes hold nothing: they never cancel a
//! transaction. Reads and every other operation pass. A `TransactWriteItems` that
//! repeats the `ClientRequestToken` of one still in flight (the SDK's own retry of an
//! attempt that timed out) is refused with `TransactionInProgressException`, as
//! DynamoDB's idempotency rule has it, not cancelled as a conflict with itself: the
//! two answers tell the caller opposite things about whether its write may land. One
//! that repeats the token of a finished transaction (within DynamoDB's ten minutes) is
//! forwarded unchecked: DynamoDB answers it from the first one's outcome, never with a
//! conflict.
//!
//! This module decides; it knows nothing of HTTP. The proxy parses the request, fetches
//! key schemas from its upstream when a `Put` needs one, asks [`Conflicts::admit`] and
//! turns a [`Refusal`] into DynamoDB's error answer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::lock;

/// The conflict mode: each admitted transaction holds its items from its arrival until
/// its upstream answer plus `commit_time`, which stands for the time DynamoDB takes to
/// commit across items (and what makes conflicts likely on DynamoDB Local's short
/// round trips). As JSON: `{"commit_time_ms": 15}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictMode {
    #[serde(rename = "commit_time_ms", with = "millis")]
    pub commit_time: Duration,
}

impl ConflictMode {
    pub fn with_commit_time(commit_time: Duration) -> Self {
        Self { commit_time }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

/// How the rule treats an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// `TransactWriteItems`: cancelled on a held item, else holds all of its items.
    TransactWrite,
    /// `TransactGetItems`: cancelled on a held item; holds nothing.
    TransactGet,
    /// `PutItem`, `UpdateItem`, `DeleteItem`: refused on a held item; holds nothing.
    PlainWrite,
}

impl Rule {
    /// The rule for an operation as the proxy names it (`DynamoDB_20120810.PutItem`);
    /// `None` for everything that passes untouched.
    pub(super) fn of(operation: &str) -> Option<Self> {
        match operation.strip_prefix("DynamoDB_20120810.")? {
            "TransactWriteItems" => Some(Self::TransactWrite),
            "TransactGetItems" => Some(Self::TransactGet),
            "PutItem" | "UpdateItem" | "DeleteItem" => Some(Self::PlainWrite),
            _ => None,
        }
    }
}

/// One item: its table and its primary key (the key attributes' values only, sorted
/// by attribute name and serialised, so a `Put`'s whole item and an `Update`'s `Key`
/// name the same item alike).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct ItemKey {
    table: String,
    key: String,
}

impl ItemKey {
    fn new<'a>(table: &str, attributes: impl Iterator<Item = (&'a str, &'a Value)>) -> Self {
        let sorted: BTreeMap<&str, &Value> = attributes.collect();
        Self {
            table: table.to_owned(),
            key: serde_json::to_string(&sorted).unwrap_or_default(),
        }
    }
}

/// An item of a request, before its key is known: a `Put` names its whole item, the
/// others their `Key`.
struct Touched<'a> {
    table: &'a str,
    attributes: &'a serde_json::Map<String, Value>,
    whole_item: bool,
}

/// The items a request touches, in request order; `None` where the request does not
/// say (a malformed entry), which then neither conflicts nor holds.
fn touched(rule: Rule, request: &Value) -> Vec<Option<Touched<'_>>> {
    match rule {
        Rule::PlainWrite => vec![entry(request)],
        Rule::TransactWrite | Rule::TransactGet => request
            .get("TransactItems")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|item| {
                        // Each entry has exactly one action: Put, Update, Delete,
                        // ConditionCheck (writes) or Get.
                        let action = item.as_object()?.values().next()?;
                        entry(action)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The item one action names (`{"TableName": .., "Key": ..}` or `.. "Item": ..`).
fn entry(action: &Value) -> Option<Touched<'_>> {
    let table = action.get("TableName")?.as_str()?;
    if let Some(key) = action.get("Key").and_then(Value::as_object) {
        return Some(Touched {
            table,
            attributes: key,
            whole_item: false,
        });
    }
    let item = action.get("Item")?.as_object()?;
    Some(Touched {
        table,
        attributes: item,
        whole_item: true,
    })
}

/// The tables whose key schema the request's `Put` items need.
pub(super) fn tables_needing_key_schema(rule: Rule, request: &Value) -> Vec<String> {
    let mut tables: Vec<String> = touched(rule, request)
        .into_iter()
        .flatten()
        .filter(|item| item.whole_item)
        .map(|item| item.table.to_owned())
        .collect();
    tables.sort();
    tables.dedup();
    tables
}

/// The `DescribeTable` request body for a table.
pub(super) fn describe_table_request(table: &str) -> Vec<u8> {
    json!({ "TableName": table }).to_string().into_bytes()
}

/// The key attribute names a `DescribeTable` answer gives.
pub(super) fn key_schema_of(describe_table_answer: &Value) -> Option<Vec<String>> {
    let names: Vec<String> = describe_table_answer
        .pointer("/Table/KeySchema")?
        .as_array()?
        .iter()
        .filter_map(|element| element.get("AttributeName")?.as_str().map(str::to_owned))
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Why a request is refused, as DynamoDB answers it: HTTP 400 with this `__type` and
/// JSON body.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refusal {
    pub(super) error_type: &'static str,
    pub(super) body: Value,
}

const CONFLICT_MESSAGE: &str = "Transaction is ongoing for the item";

impl Refusal {
    /// `TransactionCanceledException`, one reason per item in request order.
    pub(super) fn cancelled(conflicting: &[bool]) -> Self {
        let error_type = "com.amazonaws.dynamodb.v20120810#TransactionCanceledException";
        let codes: Vec<&str> = conflicting
            .iter()
            .map(|held| if *held { "TransactionConflict" } else { "None" })
            .collect();
        let reasons: Vec<Value> = conflicting
            .iter()
            .map(|held| {
                if *held {
                    json!({ "Code": "TransactionConflict", "Message": CONFLICT_MESSAGE })
                } else {
                    json!({ "Code": "None" })
                }
            })
            .collect();
        let message = format!(
            "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
            codes.join(", ")
        );
        Self {
            error_type,
            body: json!({
                "__type": error_type,
                "CancellationReasons": reasons,
                "Message": message,
            }),
        }
    }

    /// `TransactionInProgressException`: a transaction with this request's token is in
    /// flight, so this request's outcome is that one's, still unknown.
    fn in_progress() -> Self {
        let error_type = "com.amazonaws.dynamodb.v20120810#TransactionInProgressException";
        Self {
            error_type,
            body: json!({
                "__type": error_type,
                "message": "The transaction with the given request token is already in progress.",
            }),
        }
    }

    /// `TransactionConflictException`, a plain write's refusal.
    pub(super) fn conflict() -> Self {
        let error_type = "com.amazonaws.dynamodb.v20120810#TransactionConflictException";
        Self {
            error_type,
            body: json!({ "__type": error_type, "message": CONFLICT_MESSAGE }),
        }
    }
}

/// What the rule made of a request.
#[derive(Debug)]
pub(super) enum Admission {
    /// Not concerned (a plain write or transactional read of free items, a request
    /// the rule cannot read): forward it.
    Free,
    /// A transaction admitted: forward it, and keep the hold until its answer is back
    /// and the commit time has passed.
    Held(Hold),
    /// Answer this instead of forwarding.
    Refused(Refusal),
}

/// How long DynamoDB remembers a transaction's `ClientRequestToken`.
const TOKEN_MEMORY: Duration = Duration::from_secs(600);
/// How often forgotten tokens are cleared away; `finished_recently` checks the age
/// itself, so a token kept a little longer is never wrongly remembered.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// What in-flight transactions hold: their items and their request tokens; and the
/// tokens of transactions that finished, with when.
#[derive(Debug, Default)]
struct InFlight {
    items: HashSet<ItemKey>,
    tokens: HashSet<String>,
    finished_tokens: HashMap<String, Instant>,
    /// When `finished_tokens` was last cleared of forgotten tokens: at most once a
    /// second, not on every transaction's end (a surge ends thousands a second).
    pruned_at: Option<Instant>,
}

impl InFlight {
    fn finished_recently(&self, token: &str) -> bool {
        self.finished_tokens
            .get(token)
            .is_some_and(|at| at.elapsed() < TOKEN_MEMORY)
    }

    fn finish(&mut self, token: &str) {
        self.tokens.remove(token);
        let now = Instant::now();
        if self
            .pruned_at
            .is_none_or(|at| now.duration_since(at) >= PRUNE_EVERY)
        {
            self.finished_tokens
                .retain(|_, at| now.duration_since(*at) < TOKEN_MEMORY);
            self.pruned_at = Some(now);
        }
        self.finished_tokens.insert(token.to_owned(), now);
    }
}

/// The in-flight state, shared by the mode and every hold it hands out.
type SharedInFlight = Arc<Mutex<InFlight>>;

/// The items an admitted transaction holds; released when dropped, so a request whose
/// connection went away mid-flight releases its items too.
#[derive(Debug)]
pub(super) struct Hold {
    items: Vec<ItemKey>,
    token: Option<String>,
    held: SharedInFlight,
    commit_time: Duration,
}

impl Hold {
    pub(super) fn commit_time(&self) -> Duration {
        self.commit_time
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        for item in &self.items {
            held.items.remove(item);
        }
        if let Some(token) = &self.token {
            held.finish(token);
        }
    }
}

/// The conflict mode's state: whether it is on, the items held, the key schemas seen.
#[derive(Debug, Default)]
pub(super) struct Conflicts {
    mode: Mutex<Option<ConflictMode>>,
    held: SharedInFlight,
    /// Key attribute names by table, fetched once per table. By table name alone, as
    /// the held items are: the emulators' callers all use one account and region.
    key_schemas: Mutex<HashMap<String, Arc<[String]>>>,
}

impl Conflicts {
    pub(super) fn new(mode: Option<ConflictMode>) -> Self {
        Self {
            mode: Mutex::new(mode),
            ..Self::default()
        }
    }

    pub(super) fn mode(&self) -> Option<ConflictMode> {
        *lock(&self.mode)
    }

    /// Switches the mode. Holds already taken stay until their transactions end.
    pub(super) fn set_mode(&self, mode: Option<ConflictMode>) {
        *lock(&self.mode) = mode;
    }

    pub(super) fn held_items(&self) -> usize {
        lock(&self.held).items.len()
    }

    pub(super) fn knows_key_schema(&self, table: &str) -> bool {
        lock(&self.key_schemas).contains_key(table)
    }

    pub(super) fn remember_key_schema(&self, table: &str, key_attributes: Vec<String>) {
        lock(&self.key_schemas).insert(table.to_owned(), key_attributes.into());
    }

    /// Checks the request's items against the held ones and, for an admitted
    /// transaction, holds them, all under one lock: two transactions arriving together
    /// cannot both be admitted on one item. `Free` when the mode is off.
    pub(super) fn admit(&self, rule: Rule, request: &Value) -> Admission {
        let Some(mode) = self.mode() else {
            return Admission::Free;
        };
        let items = self.keys(rule, request);
        let token = (rule == Rule::TransactWrite)
            .then(|| {
                request
                    .get("ClientRequestToken")?
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten();
        let mut held = lock(&self.held);
        if let Some(token) = &token {
            if held.tokens.contains(token) {
                return Admission::Refused(Refusal::in_progress());
            }
            if held.finished_recently(token) {
                return Admission::Free;
            }
        }
        let conflicting: Vec<bool> = items
            .iter()
            .map(|item| item.as_ref().is_some_and(|key| held.items.contains(key)))
            .collect();
        if conflicting.contains(&true) {
            return Admission::Refused(match rule {
                Rule::PlainWrite => Refusal::conflict(),
                Rule::TransactWrite | Rule::TransactGet => Refusal::cancelled(&conflicting),
            });
        }
        if rule != Rule::TransactWrite {
            return Admission::Free;
        }
        let mut items: Vec<ItemKey> = items.into_iter().flatten().collect();
        // DynamoDB refuses a transaction naming one item twice; should one come, hold
        // (and release) the item once.
        items.retain(|item| held.items.insert(item.clone()));
        if let Some(token) = &token {
            held.tokens.insert(token.clone());
        }
        Admission::Held(Hold {
            items,
            token,
            held: Arc::clone(&self.held),
            commit_time: mode.commit_time,
        })
    }

    /// The request's item keys, in request order; a `Put` on a table whose key schema
    /// is unknown (its `DescribeTable` failed) has none.
    fn keys(&self, rule: Rule, request: &Value) -> Vec<Option<ItemKey>> {
        let schemas = lock(&self.key_schemas);
        touched(rule, request)
            .into_iter()
            .map(|item| {
                let item = item?;
                if !item.whole_item {
                    let attributes = item.attributes.iter().map(|(n, v)| (n.as_str(), v));
                    return Some(ItemKey::new(item.table, attributes));
                }
                let schema = schemas.get(item.table)?;
                let attributes = schema
                    .iter()
                    .map(|name| Some((name.as_str(), item.attributes.get(name)?)))
                    .collect::<Option<Vec<_>>>()?;
                Some(ItemKey::new(item.table, attributes.into_iter()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "t";

    fn on(commit_time_ms: u64) -> Conflicts {
        let conflicts = Conflicts::new(Some(ConflictMode::with_commit_time(
            Duration::from_millis(commit_time_ms),
        )));
        conflicts.remember_key_schema(TABLE, vec!["pk".to_owned(), "sk".to_owned()]);
        conflicts
    }

    fn key(pk: &str) -> Value {
        json!({ "sk": { "S": "S" }, "pk": { "S": pk } })
    }

    fn update(pk: &str) -> Value {
        json!({ "Update": { "TableName": TABLE, "Key": key(pk), "UpdateExpression": "SET a = :a" } })
    }

    fn put(pk: &str) -> Value {
        json!({ "Put": { "TableName": TABLE, "Item": {
            "pk": { "S": pk }, "sk": { "S": "S" }, "payload": { "N": "1" }
        } } })
    }

    fn transact(items: &[Value]) -> Value {
        json!({ "TransactItems": items })
    }

    fn reasons(admission: &Admission) -> Vec<String> {
        let Admission::Refused(refusal) = admission else {
            panic!("not refused: {admission:?}");
        };
        refusal.body["CancellationReasons"]
            .as_array()
            .expect("reasons")
            .iter()
            .map(|reason| reason["Code"].as_str().expect("a code").to_owned())
            .collect()
    }

    #[test]
    fn a_transaction_on_a_held_item_is_cancelled_at_that_items_index() {
        let conflicts = on(10);
        let first = conflicts.admit(Rule::TransactWrite, &transact(&[update("a")]));
        assert!(matches!(first, Admission::Held(_)));
        assert_eq!(conflicts.held_items(), 1);
        let second = conflicts.admit(
            Rule::TransactWrite,
            &transact(&[update("b"), update("a"), put("c")]),
        );
        assert_eq!(reasons(&second), ["None", "TransactionConflict", "None"]);
        let Admission::Refused(refusal) = &second else {
            unreachable!()
        };
        assert_eq!(
            refusal.body["Message"],
            "Transaction cancelled, please refer cancellation reasons for specific reasons \
             [None, TransactionConflict, None]"
        );
        assert_eq!(conflicts.held_items(), 1, "a cancelled one holds nothing");
        drop(first);
        assert_eq!(conflicts.held_items(), 0);
        assert!(matches!(
            conflicts.admit(Rule::TransactWrite, &transact(&[update("a")])),
            Admission::Held(_)
        ));
    }

    #[test]
    fn a_repeated_token_is_in_progress_while_in_flight_and_unchecked_once_finished() {
        let conflicts = on(10);
        let with_token = |token: &str, pk: &str| json!({ "TransactItems": [update(pk)], "ClientRequestToken": token });
        let first = conflicts.admit(Rule::TransactWrite, &with_token("t-1", "a"));
        assert!(matches!(first, Admission::Held(_)));
        // The SDK's retry of the same request, the original still in flight.
        let Admission::Refused(repeat) =
            conflicts.admit(Rule::TransactWrite, &with_token("t-1", "a"))
        else {
            panic!("a repeated token is refused");
        };
        assert_eq!(
            repeat.error_type,
            "com.amazonaws.dynamodb.v20120810#TransactionInProgressException"
        );
        // Another request on the item is still a conflict.
        let other = conflicts.admit(Rule::TransactWrite, &with_token("t-2", "a"));
        assert_eq!(reasons(&other), ["TransactionConflict"]);
        // Once it finished, a repeat is answered from its outcome, whatever is held.
        drop(first);
        let _other_holds_it = conflicts.admit(Rule::TransactWrite, &with_token("t-3", "a"));
        assert!(matches!(
            conflicts.admit(Rule::TransactWrite, &with_token("t-1", "a")),
            Admission::Free
        ));
    }

    #[test]
    fn a_put_is_keyed_by_the_key_schema_alone() {
        let conflicts = on(10);
        let _held = conflicts.admit(Rule::TransactWrite, &transact(&[put("a")]));
        let update = conflicts.admit(Rule::TransactWrite, &transact(&[update("a")]));
        assert_eq!(reasons(&update), ["TransactionConflict"]);
        let read = json!({ "TransactItems": [{ "Get": { "TableName": TABLE, "Key": key("a") } }] });
        assert_eq!(
            reasons(&conflicts.admit(Rule::TransactGet, &read)),
            ["TransactionConflict"]
        );
        let other_table = json!({ "TransactItems": [{ "Update": {
            "TableName": "other", "Key": key("a")
        } }] });
        assert!(matches!(
            conflicts.admit(Rule::TransactWrite, &other_table),
            Admission::Held(_)
        ));
    }

    #[test]
    fn plain_writes_are_refused_on_held_items_and_hold_nothing() {
        let conflicts = on(10);
        let plain = json!({ "TableName": TABLE, "Key": key("a") });
        assert!(matches!(
            conflicts.admit(Rule::PlainWrite, &plain),
            Admission::Free
        ));
        assert_eq!(conflicts.held_items(), 0);
        let _held = conflicts.admit(Rule::TransactWrite, &transact(&[update("a")]));
        let Admission::Refused(refusal) = conflicts.admit(Rule::PlainWrite, &plain) else {
            panic!("a plain write on a held item is refused");
        };
        assert_eq!(
            refusal.error_type,
            "com.amazonaws.dynamodb.v20120810#TransactionConflictException"
        );
        assert_eq!(refusal.body["message"], CONFLICT_MESSAGE);
        let put_item = json!({ "TableName": TABLE, "Item": {
            "pk": { "S": "a" }, "sk": { "S": "S" }, "other": { "S": "x" }
        } });
        assert!(matches!(
            conflicts.admit(Rule::PlainWrite, &put_item),
            Admission::Refused(_)
        ));
    }

    #[test]
    fn with_the_mode_off_or_an_unknown_schema_nothing_conflicts() {
        let conflicts = on(10);
        conflicts.set_mode(None);
        let _ignored = conflicts.admit(Rule::TransactWrite, &transact(&[update("a")]));
        assert_eq!(conflicts.held_items(), 0);
        conflicts.set_mode(Some(ConflictMode::with_commit_time(Duration::ZERO)));
        let unknown = json!({ "TransactItems": [{ "Put": {
            "TableName": "unknown", "Item": { "pk": { "S": "a" } }
        } }] });
        let Admission::Held(hold) = conflicts.admit(Rule::TransactWrite, &unknown) else {
            panic!("admitted");
        };
        assert!(hold.items.is_empty());
    }

    #[test]
    fn requests_name_the_tables_whose_schema_their_puts_need() {
        let request = transact(&[put("a"), update("b"), put("c")]);
        assert_eq!(
            tables_needing_key_schema(Rule::TransactWrite, &request),
            [TABLE]
        );
        assert!(
            tables_needing_key_schema(Rule::TransactWrite, &transact(&[update("a")])).is_empty()
        );
        let described = json!({ "Table": { "KeySchema": [
            { "AttributeName": "pk", "KeyType": "HASH" },
            { "AttributeName": "sk", "KeyType": "RANGE" }
        ] } });
        assert_eq!(
            key_schema_of(&described),
            Some(vec!["pk".into(), "sk".into()])
        );
    }

    #[test]
    fn the_mode_reads_and_writes_milliseconds() {
        let mode: ConflictMode = serde_json::from_str(r#"{"commit_time_ms": 15}"#).expect("json");
        assert_eq!(mode.commit_time, Duration::from_millis(15));
        assert_eq!(
            serde_json::to_value(mode).expect("json"),
            json!({ "commit_time_ms": 15 })
        );
    }
}
