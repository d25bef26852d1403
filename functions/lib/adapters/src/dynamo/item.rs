//! The single-table layout: keys, and the items' (de)serialization.
//!
//! Everything that knows attribute names lives here, so the transactions in the port
//! modules read as the data model in the brief. Reading is strict: an item that does not
//! parse is corrupt, and [`CorruptItem`] names it and the attribute at fault.

use std::collections::HashMap;
use std::num::ParseIntError;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Datelike, Duration, SecondsFormat, Utc};
use flashsale_domain::buyer_orders::BuyerOrdersCursor;
use flashsale_domain::challenge::ChallengeWork;
use flashsale_domain::order::UnknownStatus;
use flashsale_domain::payment::{FollowedMoney, OrderPayment, PaymentId, PaymentState};
use flashsale_domain::ports::{PROCESSED_EVENT_RETENTION, Take};
use flashsale_domain::{
    Order, OrderId, OrderStatus, Price, ReleaseReason, Reservation, ReservePath, Sale, SaleAction,
    SaleAudit, SaleControl, SaleCursor, SaleId, UserId, ValidationError,
};

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) const PK: &str = "pk";
pub(crate) const SK: &str = "sk";
pub(crate) const GSI1: &str = "gsi1";
pub(crate) const GSI1_PK: &str = "gsi1pk";
pub(crate) const GSI1_SK: &str = "gsi1sk";
/// The buyers' index: each user item under its buyer, by when the buyer's first hold
/// in its sale was recorded ([`buyer_gsi_sk`]), for a buyer's own list of orders.
pub(crate) const GSI2: &str = "gsi2";
pub(crate) const GSI2_PK: &str = "gsi2pk";
pub(crate) const GSI2_SK: &str = "gsi2sk";
pub(crate) const TTL: &str = "ttl";

pub(crate) const AVAILABLE: &str = "available";
pub(crate) const TOTAL: &str = "total";
/// On a shard item: the orders holding one of its units, by the order id's unique part,
/// each with who took it and when (see [`taker_value`]). A unit leaves `available` and
/// joins the takers in one conditional write, and comes back the same way, so a shard
/// always has `total - available` takers, and a repeated take or give-back can see that
/// it happened already.
pub(crate) const TAKERS: &str = "takers";
const TAKER_USER: &str = "u";
const TAKER_AT_MS: &str = "t";
pub(crate) const ACTIVE: &str = "active";
/// On a user item: holds of the sale the user cancelled or let lapse.
pub(crate) const ABANDONED: &str = "abandoned";
pub(crate) const STATUS: &str = "status";
/// The status the order consumer gave a hold before the hold became the order
/// (`pending_payment`: reserved, with its timer set). A stack upgraded with orders
/// open still holds some, and the consumer of the version before may write more while
/// CloudFormation updates the functions one by one: they are read as `reserved`, and
/// pay and release accept them. Remove once no stack can hold one.
pub(crate) const LEGACY_PENDING_PAYMENT: &str = "pending_payment";
/// A hold that can still be paid or released: `reserved`, or an earlier version's
/// [`LEGACY_PENDING_PAYMENT`]. Binds `:reserved` and `:legacy_pending`
/// ([`open_hold_values`]); `#hold` and `#status` are the caller's.
pub(crate) const OPEN_HOLD: &str = "#hold.#status IN (:reserved, :legacy_pending)";

/// The values [`OPEN_HOLD`] binds.
pub(crate) fn open_hold_values() -> [(&'static str, AttributeValue); 2] {
    [
        (":reserved", s(OrderStatus::Reserved.as_str())),
        (":legacy_pending", s(LEGACY_PENDING_PAYMENT)),
    ]
}
pub(crate) const SHARD: &str = "shard";
pub(crate) const EXPIRES_AT_MS: &str = "expires_at_ms";
/// On a hold: when the release that expired it committed.
pub(crate) const EXPIRED_AT: &str = "expired_at";
/// On a hold: when the pay that settled it committed.
pub(crate) const PAID_AT: &str = "paid_at";
/// On a hold: when the cancel that released it committed.
const CANCELLED_AT: &str = "cancelled_at";
/// On a refunded hold and its order's item: the status it was refunded from
/// (`cancelled` or `expired`), where it goes back to if its refund fails after all.
pub(crate) const REFUNDED_FROM: &str = "refunded_from";
/// A price, on a sale, a hold or an order: its amount in minor units and its ISO 4217
/// code, two plain attributes so that an operator reads them as they are. Both absent
/// on what was written before sales had prices.
const PRICE_AMOUNT: &str = "price_amount";
const PRICE_CURRENCY: &str = "price_currency";

/// A price's attributes: none for no price.
fn price_attributes(price: Option<Price>) -> impl Iterator<Item = (String, AttributeValue)> {
    price.into_iter().flat_map(|price| {
        [
            (PRICE_AMOUNT.to_owned(), n(price.amount())),
            (PRICE_CURRENCY.to_owned(), s(price.currency().code())),
        ]
    })
}

/// On a hold: the order's payment at the provider, once one was opened for it (absent
/// on holds without one, and on every hold written before payments were recorded): its
/// id, recorded once, and its state (a [`PaymentState::name`]) as a settlement last
/// read it. Two plain attributes inside the hold, so that every write about the
/// payment is conditional on the hold in the same item.
pub(crate) const PAYMENT_ID: &str = "payment_id";
pub(crate) const PAYMENT_STATE: &str = "payment_state";

/// The hold's attribute that records when a release for `reason` committed.
pub(crate) fn settled_at_attribute(reason: ReleaseReason) -> &'static str {
    match reason {
        ReleaseReason::Expired => EXPIRED_AT,
        ReleaseReason::Cancelled => CANCELLED_AT,
    }
}

const META_SK: &str = "META";
/// A sale's creation in progress: see `catalog`'s `create_sale`.
const CREATING_SK: &str = "CREATING";
/// On a creation claim: the token of the create call that holds it.
pub(crate) const CLAIM_TOKEN: &str = "token";
/// A claim left by a create that never finished (the process died) is removed this
/// long after it was taken; no create takes a fraction of it.
const CLAIM_RETENTION: Duration = Duration::days(1);
const STOCK_SK: &str = "STOCK";
const HOLDS_SK: &str = "HOLDS";
const ORDER_SK: &str = "ORDER";
const HOLD_PREFIX: &str = "hold#";
const USER_GSI_PREFIX: &str = "USER#";
const BUYER_GSI_PREFIX: &str = "BUYER#";
/// The one `gsi1` partition that indexes every sale by its end.
const SALES_GSI_PK: &str = "SALES";
/// The one partition of the blocklist: admins write it rarely and the grab reads it
/// whole every few seconds per process, far below one partition's limits.
const BLOCKLIST_PK: &str = "BLOCKLIST";
const BLOCKED_USER_PREFIX: &str = "USER#";
/// The one partition of the followed money: an item per order whose money a settlement
/// left unsettled, written only then (never on the way of a sale that goes well) and
/// read whole once per reconciler pass, so a few items, far below one partition's
/// limits.
const FOLLOWED_MONEY_PK: &str = "MONEY";
const FOLLOWED_ORDER_PREFIX: &str = "ORDER#";
/// On a followed order's item: its buyer, and since when its money is unsettled.
pub(crate) const FOLLOWED_BUYER: &str = "user_id";
pub(crate) const FOLLOWED_SINCE: &str = "since";
pub(crate) const FOLLOWED_VERSION: &str = "version";
/// A provider's event a webhook processed: one item each, in a partition of its own,
/// so that recording one is a conditional put on nothing else.
const EVENT_PREFIX: &str = "EVENT#";
const EVENT_SK: &str = "EVENT";
/// On a processed event: when it was recorded.
const PROCESSED_AT: &str = "processed_at";
/// On a processed event: a token of the call that recorded it, so that the call knows
/// its own put when the SDK resends it after a lost answer.
pub(crate) const DELIVERY: &str = "delivery";

/// Cancelled, expired and refunded orders are kept this long after they settle, then
/// DynamoDB's TTL removes them; paid ones are kept. A refund keeps the TTL its order's
/// release set: the refund comes days after it at most.
pub(crate) const SETTLED_RETENTION: Duration = Duration::days(90);

pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

pub(crate) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn time(value: DateTime<Utc>) -> AttributeValue {
    s(value.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

fn key(pk: String, sk: &str) -> Item {
    HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))])
}

pub(crate) fn sale_pk(sale_id: &SaleId) -> String {
    format!("SALE#{sale_id}")
}

pub(crate) fn sale_key(sale_id: &SaleId) -> Item {
    key(sale_pk(sale_id), META_SK)
}

/// The claim on a sale's creation, beside the sale's own item in its partition.
pub(crate) fn claim_key(sale_id: &SaleId) -> Item {
    key(sale_pk(sale_id), CREATING_SK)
}

/// The claim of the create call holding `token`, taken at `now`.
pub(crate) fn claim_item(sale_id: &SaleId, token: &str, now: DateTime<Utc>) -> Item {
    let mut item = claim_key(sale_id);
    item.extend([
        (CLAIM_TOKEN.to_owned(), s(token)),
        (TTL.to_owned(), n((now + CLAIM_RETENTION).timestamp())),
    ]);
    item
}

pub(crate) fn shard_pk(sale_id: &SaleId, shard: u16) -> String {
    format!("SALE#{sale_id}#SHARD#{shard}")
}

/// Each shard under its own partition key: this is what spreads the write heat.
pub(crate) fn shard_key(sale_id: &SaleId, shard: u16) -> Item {
    key(shard_pk(sale_id, shard), STOCK_SK)
}

pub(crate) fn user_key(sale_id: &SaleId, user_id: &UserId) -> Item {
    user_key_of(sale_id, user_id.as_str())
}

fn user_key_of(sale_id: &SaleId, user: &str) -> Item {
    key(format!("SALE#{sale_id}#USER#{user}"), HOLDS_SK)
}

/// The sale and user a user item belongs to, from its key. Sale ids have no `#`, so the
/// first `#USER#` ends the sale's part whatever the user id holds.
pub(crate) fn user_item_owner(item: &Item) -> Result<(SaleId, UserId), ItemError> {
    let pk = Fields::of(item).string(PK)?;
    let (sale, user) = pk
        .strip_prefix("SALE#")
        .and_then(|rest| rest.split_once("#USER#"))
        .ok_or_else(|| ItemError::Form {
            name: PK.to_owned(),
            expected: "SALE#{sale_id}#USER#{user_id}",
        })?;
    let id = |source| ItemError::Id {
        name: PK.to_owned(),
        source,
    };
    Ok((
        SaleId::parse(sale).map_err(id)?,
        UserId::parse(user).map_err(id)?,
    ))
}

pub(crate) fn blocklist_pk() -> AttributeValue {
    s(BLOCKLIST_PK)
}

/// A blocked user's item is only its key: the user id is in `sk`, so reading the list
/// needs nothing but the keys.
pub(crate) fn blocked_user_key(user_id: &UserId) -> Item {
    key(
        BLOCKLIST_PK.to_owned(),
        &format!("{BLOCKED_USER_PREFIX}{user_id}"),
    )
}

/// The user a blocklist item bars, from its `sk`.
pub(crate) fn parse_blocked_user(item: &Item) -> Result<UserId, ItemError> {
    let sk = Fields::of(item).string(SK)?;
    let user = sk
        .strip_prefix(BLOCKED_USER_PREFIX)
        .ok_or_else(|| ItemError::Form {
            name: SK.to_owned(),
            expected: "USER#{user_id}",
        })?;
    UserId::parse(user).map_err(|source| ItemError::Id {
        name: SK.to_owned(),
        source,
    })
}

pub(crate) fn followed_money_pk() -> AttributeValue {
    s(FOLLOWED_MONEY_PK)
}

/// The item that follows `order_id`'s money: the order id in `sk`.
pub(crate) fn followed_money_key(order_id: &OrderId) -> Item {
    key(
        FOLLOWED_MONEY_PK.to_owned(),
        &format!("{FOLLOWED_ORDER_PREFIX}{order_id}"),
    )
}

/// A followed order, from its item.
pub(crate) fn parse_followed_money(item: &Item) -> Result<FollowedMoney, ItemError> {
    let fields = Fields::of(item);
    let sk = fields.string(SK)?;
    let order = sk
        .strip_prefix(FOLLOWED_ORDER_PREFIX)
        .ok_or_else(|| ItemError::Form {
            name: SK.to_owned(),
            expected: "ORDER#{order_id}",
        })?;
    Ok(FollowedMoney {
        order_id: OrderId::parse(order).map_err(|source| ItemError::Id {
            name: SK.to_owned(),
            source,
        })?,
        buyer: fields.id(FOLLOWED_BUYER, |raw| UserId::parse(raw))?,
        since: fields.time(FOLLOWED_SINCE)?,
        version: fields.number(FOLLOWED_VERSION)?,
    })
}

/// The item that records `event_id` processed.
pub(crate) fn event_key(event_id: &str) -> Item {
    key(format!("{EVENT_PREFIX}{event_id}"), EVENT_SK)
}

/// `event_id` recorded processed at `now` by the call holding `delivery`, removed by
/// DynamoDB's TTL once the provider can no longer redeliver it.
pub(crate) fn event_item(event_id: &str, delivery: &str, now: DateTime<Utc>) -> Item {
    let mut item = event_key(event_id);
    item.extend([
        (DELIVERY.to_owned(), s(delivery)),
        (PROCESSED_AT.to_owned(), time(now)),
        (
            TTL.to_owned(),
            n((now + PROCESSED_EVENT_RETENTION).timestamp()),
        ),
    ]);
    item
}

pub(crate) fn order_key(order_id: &OrderId) -> Item {
    key(format!("ORDER#{order_id}"), ORDER_SK)
}

/// Top-level, not nested in a `holds` map: `SET holds.#id = ...` fails when the user
/// item has no `holds` map yet, and a transaction cannot say "create it if missing".
pub(crate) fn hold_attribute(order_id: &OrderId) -> String {
    format!("{HOLD_PREFIX}{order_id}")
}

/// The stats bucket partition: `count` and `open_holds` query buckets `0..sale.shards`.
pub(crate) fn bucket_pk(sale_id: &SaleId, bucket: u16) -> String {
    format!("SALE#{sale_id}#B{bucket}")
}

pub(crate) fn user_gsi_sk(user_id: &UserId) -> String {
    format!("{USER_GSI_PREFIX}{user_id}")
}

/// What every user item's `gsi1sk` begins with, and no order item's.
pub(crate) fn user_gsi_prefix() -> AttributeValue {
    s(USER_GSI_PREFIX)
}

pub(crate) fn sales_gsi_pk() -> AttributeValue {
    s(SALES_GSI_PK)
}

/// A time whose string order is its time order: RFC 3339 in UTC with all nine
/// fractional digits, so every value has the same width. Only years 0 to 9999 have
/// four digits, so times outside them are clamped to the nearest end; a range read on
/// these keys must therefore check the exact time of what it finds.
fn sortable_time(value: DateTime<Utc>) -> String {
    match value.year() {
        ..0 => "0000-01-01T00:00:00.000000000Z".to_owned(),
        10_000.. => "9999-12-31T23:59:59.999999999Z".to_owned(),
        _ => value.to_rfc3339_opts(SecondsFormat::Nanos, true),
    }
}

/// The sale meta item's `gsi1sk`: its end first, so `gsi1sk >= sales_ending_from(t)`
/// finds the sales ending at or after `t` (up to the clamping of [`sortable_time`]).
fn sale_gsi_sk(sale: &Sale) -> String {
    sale_gsi_sk_of(sale.ends_at, &sale.sale_id)
}

fn sale_gsi_sk_of(ends_at: DateTime<Utc>, sale_id: &SaleId) -> String {
    format!("{}#{}", sortable_time(ends_at), sale_id)
}

/// The index key of the sale `cursor` names: where a page of the sales' `gsi1`
/// partition, read newest end first, goes on from (`ExclusiveStartKey`).
pub(crate) fn sale_index_key(cursor: &SaleCursor) -> Item {
    let mut item = sale_key(&cursor.sale_id);
    item.insert(GSI1_PK.to_owned(), sales_gsi_pk());
    item.insert(
        GSI1_SK.to_owned(),
        s(sale_gsi_sk_of(cursor.ends_at, &cursor.sale_id)),
    );
    item
}

/// The index key of `buyer`'s item in `bucket`: where a page of a sale's orders in
/// `gsi1` goes on from, within that bucket. Any text is a place there, a buyer's id or
/// not.
pub(crate) fn buyer_index_key(sale_id: &SaleId, bucket: u16, buyer: &str) -> Item {
    let mut item = user_key_of(sale_id, buyer);
    item.insert(GSI1_PK.to_owned(), s(bucket_pk(sale_id, bucket)));
    item.insert(GSI1_SK.to_owned(), s(format!("{USER_GSI_PREFIX}{buyer}")));
    item
}

/// The user item's `gsi2pk`: its buyer's partition of the buyers' index.
pub(crate) fn buyer_gsi_pk(user_id: &UserId) -> String {
    format!("{BUYER_GSI_PREFIX}{user_id}")
}

/// The user item's `gsi2sk`: when the buyer's first hold in the sale was recorded,
/// then the sale, so the buyer's partition read backwards lists the latest first.
pub(crate) fn buyer_gsi_sk(held_at: DateTime<Utc>, sale_id: &SaleId) -> String {
    format!("{}#{}", sortable_time(held_at), sale_id)
}

/// The index key of the place `cursor` names in `user`'s partition of `gsi2`: where a
/// page of the buyer's orders goes on from (`ExclusiveStartKey`). Any place is one.
pub(crate) fn buyer_orders_index_key(user_id: &UserId, cursor: &BuyerOrdersCursor) -> Item {
    let mut item = user_key(&cursor.sale_id, user_id);
    item.insert(GSI2_PK.to_owned(), s(buyer_gsi_pk(user_id)));
    item.insert(
        GSI2_SK.to_owned(),
        s(buyer_gsi_sk(cursor.held_at, &cursor.sale_id)),
    );
    item
}

/// Where a page of a buyer's orders that ended with `item` goes on from: its place in
/// `gsi2`, read back from its `gsi2sk`.
pub(crate) fn buyer_orders_cursor(item: &Item) -> Result<BuyerOrdersCursor, ItemError> {
    let form = || ItemError::Form {
        name: GSI2_SK.to_owned(),
        expected: "{time}#{sale_id}",
    };
    let (held_at, sale_id) = Fields::of(item)
        .string(GSI2_SK)?
        .split_once('#')
        .ok_or_else(form)?;
    Ok(BuyerOrdersCursor {
        held_at: DateTime::parse_from_rfc3339(held_at)
            .map_err(|_| form())?
            .with_timezone(&Utc),
        sale_id: SaleId::parse(sale_id).map_err(|_| form())?,
    })
}

/// The lowest `gsi1sk` of a sale ending at or after `cutoff`: a bare time sorts before
/// the same time followed by `#` and an id.
pub(crate) fn sales_ending_from(cutoff: DateTime<Utc>) -> AttributeValue {
    s(sortable_time(cutoff))
}

/// An attribute of a corrupt item that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    #[error("attribute `{0}` is missing")]
    Missing(String),
    #[error("attribute `{name}` is not of type {expected}")]
    WrongType {
        name: String,
        expected: &'static str,
    },
    #[error("attribute `{name}` is not a valid number")]
    Number {
        name: String,
        #[source]
        source: ParseIntError,
    },
    #[error("attribute `{name}` is not an RFC 3339 time")]
    Time {
        name: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("attribute `{name}` is not a valid id")]
    Id {
        name: String,
        #[source]
        source: ValidationError,
    },
    #[error("attribute `{name}` is out of its range")]
    Range {
        name: String,
        #[source]
        source: ValidationError,
    },
    #[error("attribute `{name}` is not of the form {expected}")]
    Form {
        name: String,
        expected: &'static str,
    },
    #[error("attribute `{name}` is not an order status")]
    Status {
        name: String,
        #[source]
        source: UnknownStatus,
    },
    #[error("attribute `{name}` is not a payment state")]
    PaymentState { name: String },
}

/// An item that breaks the data model. Retrying cannot fix it, so it is always a
/// `Permanent` store error.
#[derive(Debug, thiserror::Error)]
#[error("item {pk} / {sk} is corrupt")]
pub struct CorruptItem {
    pub pk: String,
    pub sk: String,
    #[source]
    pub source: ItemError,
}

impl CorruptItem {
    pub(crate) fn new(key: &Item, source: ItemError) -> Self {
        let part = |name: &str| {
            key.get(name)
                .and_then(|value| value.as_s().ok())
                .cloned()
                .unwrap_or_default()
        };
        Self {
            pk: part(PK),
            sk: part(SK),
            source,
        }
    }
}

/// Typed reads of one item's (or one nested map's) attributes.
struct Fields<'a> {
    item: &'a Item,
    /// The map's own attribute name, so errors in a hold name the hold.
    parent: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn of(item: &'a Item) -> Self {
        Self { item, parent: None }
    }

    fn nested(item: &'a Item, parent: &'a str) -> Self {
        Self {
            item,
            parent: Some(parent),
        }
    }

    fn name(&self, attribute: &str) -> String {
        match self.parent {
            Some(parent) => format!("{parent}.{attribute}"),
            None => attribute.to_owned(),
        }
    }

    fn has(&self, attribute: &str) -> bool {
        self.item.contains_key(attribute)
    }

    fn get(&self, attribute: &str) -> Result<&'a AttributeValue, ItemError> {
        self.item
            .get(attribute)
            .ok_or_else(|| ItemError::Missing(self.name(attribute)))
    }

    fn string(&self, attribute: &str) -> Result<&'a str, ItemError> {
        self.get(attribute)?
            .as_s()
            .map(String::as_str)
            .map_err(|_| ItemError::WrongType {
                name: self.name(attribute),
                expected: "S",
            })
    }

    fn number<T>(&self, attribute: &str) -> Result<T, ItemError>
    where
        T: std::str::FromStr<Err = ParseIntError>,
    {
        let raw = self
            .get(attribute)?
            .as_n()
            .map_err(|_| ItemError::WrongType {
                name: self.name(attribute),
                expected: "N",
            })?;
        raw.parse().map_err(|source| ItemError::Number {
            name: self.name(attribute),
            source,
        })
    }

    fn time(&self, attribute: &str) -> Result<DateTime<Utc>, ItemError> {
        DateTime::parse_from_rfc3339(self.string(attribute)?)
            .map(|time| time.with_timezone(&Utc))
            .map_err(|source| ItemError::Time {
                name: self.name(attribute),
                source,
            })
    }

    fn id<T>(
        &self,
        attribute: &str,
        parse: fn(&str) -> Result<T, ValidationError>,
    ) -> Result<T, ItemError> {
        parse(self.string(attribute)?).map_err(|source| ItemError::Id {
            name: self.name(attribute),
            source,
        })
    }

    /// The price, if the item (or hold) has one: both attributes or neither, and a
    /// price the API would accept.
    fn price(&self) -> Result<Option<Price>, ItemError> {
        if !self.has(PRICE_AMOUNT) && !self.has(PRICE_CURRENCY) {
            return Ok(None);
        }
        let amount: i64 = self.number(PRICE_AMOUNT)?;
        Price::new(amount, self.string(PRICE_CURRENCY)?)
            .map(Some)
            .map_err(|source| ItemError::Range {
                name: self.name(if source.field == "price.amount" {
                    PRICE_AMOUNT
                } else {
                    PRICE_CURRENCY
                }),
                source,
            })
    }

    /// The hold's payment, if it records one: both attributes or neither.
    fn payment(&self) -> Result<Option<OrderPayment>, ItemError> {
        if !self.has(PAYMENT_ID) && !self.has(PAYMENT_STATE) {
            return Ok(None);
        }
        let id = PaymentId::new(self.string(PAYMENT_ID)?);
        let state = PaymentState::named(self.string(PAYMENT_STATE)?).ok_or_else(|| {
            ItemError::PaymentState {
                name: self.name(PAYMENT_STATE),
            }
        })?;
        Ok(Some(OrderPayment { id, state }))
    }

    /// The status a refunded hold was refunded from, if it records one.
    fn refunded_from(&self) -> Result<Option<OrderStatus>, ItemError> {
        if !self.has(REFUNDED_FROM) {
            return Ok(None);
        }
        let raw = self.string(REFUNDED_FROM)?;
        raw.parse().map(Some).map_err(|source| ItemError::Status {
            name: self.name(REFUNDED_FROM),
            source,
        })
    }

    fn status(&self) -> Result<OrderStatus, ItemError> {
        let raw = self.string(STATUS)?;
        if raw == LEGACY_PENDING_PAYMENT {
            return Ok(OrderStatus::Reserved);
        }
        raw.parse().map_err(|source| ItemError::Status {
            name: self.name(STATUS),
            source,
        })
    }
}

pub(crate) fn sale_item(sale: &Sale) -> Item {
    let mut item = sale_key(&sale.sale_id);
    item.extend([
        ("sale_id".to_owned(), s(sale.sale_id.as_str())),
        ("name".to_owned(), s(sale.name.as_str())),
        ("stock_total".to_owned(), n(sale.stock_total)),
        ("starts_at".to_owned(), time(sale.starts_at)),
        ("ends_at".to_owned(), time(sale.ends_at)),
        ("per_user_limit".to_owned(), n(sale.per_user_limit)),
        (
            "payment_timeout_secs".to_owned(),
            n(sale.payment_timeout_secs),
        ),
        ("shards".to_owned(), n(sale.shards)),
        (GSI1_PK.to_owned(), sales_gsi_pk()),
        (GSI1_SK.to_owned(), s(sale_gsi_sk(sale))),
    ]);
    // Absent when off, as on every sale written before challenges existed.
    if let Some(work) = sale.challenge_work {
        item.insert(CHALLENGE_WORK.to_owned(), n(work.derivations()));
    }
    // Absent when adaptive, as on every sale written before the setting existed.
    if sale.reserve != ReservePath::Adaptive {
        item.insert(RESERVE.to_owned(), s(sale.reserve.name()));
    }
    item.extend(price_attributes(sale.price));
    // Absent when open, as on every sale written before sales could be paused.
    if !sale.control.is_open() {
        item.insert(CONTROL.to_owned(), control_value(sale.control));
    }
    item
}

/// On a sale item: its [`SaleControl`], by name; absent while it has never been paused
/// or ended.
pub(crate) const CONTROL: &str = "control";

pub(crate) fn control_value(control: SaleControl) -> AttributeValue {
    s(control.name())
}

/// The control of a sale item.
pub(crate) fn parse_control(item: &Item) -> Result<SaleControl, ItemError> {
    let fields = Fields::of(item);
    if !fields.has(CONTROL) {
        return Ok(SaleControl::Open);
    }
    let name = fields.string(CONTROL)?;
    SaleControl::named(name).ok_or_else(|| ItemError::Form {
        name: CONTROL.to_owned(),
        expected: "open, paused or ended",
    })
}

/// The partition of a sale's audit trail: its own, so that a function that reads the
/// trail may query these partitions and no other (template.yaml, `LeadingKeys`).
pub(crate) fn audit_pk(sale_id: &SaleId) -> String {
    format!("{AUDIT_PK_PREFIX}{sale_id}")
}

pub(crate) const AUDIT_PK_PREFIX: &str = "AUDIT#";

/// One entry of a sale's audit trail. Its sort key is its time, fixed width so that
/// the trail sorts by it, then a random suffix so that two entries never collide.
pub(crate) fn audit_item(sale_id: &SaleId, entry: &SaleAudit) -> Item {
    let sk = format!(
        "{}#{:016x}",
        entry.at.format("%Y-%m-%dT%H:%M:%S%.9fZ"),
        rand::random::<u64>()
    );
    let mut item = key(audit_pk(sale_id), &sk);
    item.extend([
        ("action".to_owned(), s(entry.action.name())),
        ("by".to_owned(), s(entry.by.as_str())),
        ("at".to_owned(), time(entry.at)),
    ]);
    item
}

pub(crate) fn parse_audit(item: &Item) -> Result<SaleAudit, ItemError> {
    let fields = Fields::of(item);
    Ok(SaleAudit {
        action: SaleAction::named(fields.string("action")?).ok_or_else(|| ItemError::Form {
            name: "action".to_owned(),
            expected: "pause, resume or end",
        })?,
        by: fields.id("by", |raw| UserId::parse(raw))?,
        at: fields.time("at")?,
    })
}

const CHALLENGE_WORK: &str = "challenge_work";
const RESERVE: &str = "reserve";

pub(crate) fn parse_sale(item: &Item) -> Result<Sale, ItemError> {
    let fields = Fields::of(item);
    Ok(Sale {
        sale_id: fields.id("sale_id", |raw| SaleId::parse(raw))?,
        name: fields.string("name")?.to_owned(),
        price: fields.price()?,
        stock_total: fields.number("stock_total")?,
        starts_at: fields.time("starts_at")?,
        ends_at: fields.time("ends_at")?,
        per_user_limit: fields.number("per_user_limit")?,
        payment_timeout_secs: fields.number("payment_timeout_secs")?,
        shards: fields.number("shards")?,
        challenge_work: if fields.has(CHALLENGE_WORK) {
            ChallengeWork::of_setting(CHALLENGE_WORK, fields.number(CHALLENGE_WORK)?).map_err(
                |source| ItemError::Range {
                    name: CHALLENGE_WORK.to_owned(),
                    source,
                },
            )?
        } else {
            None
        },
        reserve: if fields.has(RESERVE) {
            ReservePath::named(RESERVE, fields.string(RESERVE)?).map_err(|source| {
                ItemError::Range {
                    name: RESERVE.to_owned(),
                    source,
                }
            })?
        } else {
            ReservePath::Adaptive
        },
        control: parse_control(item)?,
    })
}

pub(crate) fn shard_item(sale_id: &SaleId, shard: u16, stock: u32) -> Item {
    let mut item = shard_key(sale_id, shard);
    item.extend([
        (AVAILABLE.to_owned(), n(stock)),
        (TOTAL.to_owned(), n(stock)),
        (TAKERS.to_owned(), AttributeValue::M(HashMap::new())),
    ]);
    item
}

/// The name under [`TAKERS`] of `order_id`'s take.
pub(crate) fn taker_name(order_id: &OrderId) -> String {
    order_id.unique_part()
}

/// A take's entry under [`TAKERS`]: the user, to find the hold by key, and when, so the
/// reconciler can tell a reserve between its two writes from one that died there.
pub(crate) fn taker_value(user_id: &UserId, at: DateTime<Utc>) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        (TAKER_USER.to_owned(), s(user_id.as_str())),
        (TAKER_AT_MS.to_owned(), n(at.timestamp_millis())),
    ]))
}

/// The takes a shard item records.
pub(crate) fn parse_takes(
    sale_id: &SaleId,
    shard: u16,
    item: &Item,
) -> Result<Vec<Take>, ItemError> {
    let takers = item
        .get(TAKERS)
        .ok_or_else(|| ItemError::Missing(TAKERS.to_owned()))?
        .as_m()
        .map_err(|_| ItemError::WrongType {
            name: TAKERS.to_owned(),
            expected: "M",
        })?;
    takers
        .iter()
        .map(|(unique, value)| {
            let name = format!("{TAKERS}.{unique}");
            let map = value.as_m().map_err(|_| ItemError::WrongType {
                name: name.clone(),
                expected: "M",
            })?;
            let fields = Fields::nested(map, &name);
            let at_ms: i64 = fields.number(TAKER_AT_MS)?;
            let order_id =
                OrderId::parse(&format!("{sale_id}.{unique}")).map_err(|source| ItemError::Id {
                    name: name.clone(),
                    source,
                })?;
            Ok(Take {
                shard,
                order_id,
                user_id: fields.id(TAKER_USER, |raw| UserId::parse(raw))?,
                taken_at: DateTime::from_timestamp_millis(at_ms).ok_or_else(|| {
                    ItemError::Form {
                        name: format!("{name}.{TAKER_AT_MS}"),
                        expected: "epoch milliseconds",
                    }
                })?,
            })
        })
        .collect()
}

pub(crate) fn parse_available(item: &Item) -> Result<u64, ItemError> {
    Fields::of(item).number(AVAILABLE)
}

/// A hold on the user's item: the reservation minus what its attribute name and its
/// item's key already say (order, sale, user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hold {
    pub shard: u16,
    pub status: OrderStatus,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// When the release that expired it committed; set by that release only.
    pub expired_at: Option<DateTime<Utc>>,
    /// When the pay that settled it committed; set by that pay only.
    pub paid_at: Option<DateTime<Utc>>,
    /// The price the unit is sold at, as the reservation carried it.
    pub price: Option<Price>,
    /// The buyer's payment, once one was attached ([`PAYMENT_ID`]).
    pub payment: Option<OrderPayment>,
    /// Where a refunded hold was refunded from ([`REFUNDED_FROM`]).
    pub refunded_from: Option<OrderStatus>,
}

impl Hold {
    pub(crate) fn reserved(reservation: &Reservation) -> Self {
        Self {
            shard: reservation.shard,
            status: OrderStatus::Reserved,
            created_at: reservation.created_at,
            expires_at: reservation.expires_at,
            expired_at: None,
            paid_at: None,
            price: reservation.price,
            payment: None,
            refunded_from: None,
        }
    }

    pub(crate) fn to_value(&self) -> AttributeValue {
        let mut map = HashMap::from([
            (SHARD.to_owned(), n(self.shard)),
            (STATUS.to_owned(), s(self.status.as_str())),
            ("created_at".to_owned(), time(self.created_at)),
            ("expires_at".to_owned(), time(self.expires_at)),
            // Milliseconds, not seconds: pay compares it with `now` in the condition,
            // and must agree with `now < expires_at` even for a sub-second expiry.
            (
                EXPIRES_AT_MS.to_owned(),
                n(self.expires_at.timestamp_millis()),
            ),
        ]);
        if let Some(expired_at) = self.expired_at {
            map.insert(EXPIRED_AT.to_owned(), time(expired_at));
        }
        if let Some(paid_at) = self.paid_at {
            map.insert(PAID_AT.to_owned(), time(paid_at));
        }
        map.extend(price_attributes(self.price));
        if let Some(payment) = &self.payment {
            map.extend([
                (PAYMENT_ID.to_owned(), s(payment.id.as_str())),
                (PAYMENT_STATE.to_owned(), s(payment.state.name())),
            ]);
        }
        if let Some(from) = self.refunded_from {
            map.insert(REFUNDED_FROM.to_owned(), s(from.as_str()));
        }
        AttributeValue::M(map)
    }

    pub(crate) fn parse(name: &str, value: &AttributeValue) -> Result<Self, ItemError> {
        let map = value.as_m().map_err(|_| ItemError::WrongType {
            name: name.to_owned(),
            expected: "M",
        })?;
        let fields = Fields::nested(map, name);
        Ok(Self {
            shard: fields.number(SHARD)?,
            status: fields.status()?,
            created_at: fields.time("created_at")?,
            expires_at: fields.time("expires_at")?,
            expired_at: fields
                .has(EXPIRED_AT)
                .then(|| fields.time(EXPIRED_AT))
                .transpose()?,
            paid_at: fields
                .has(PAID_AT)
                .then(|| fields.time(PAID_AT))
                .transpose()?,
            price: fields.price()?,
            payment: fields.payment()?,
            refunded_from: fields.refunded_from()?,
        })
    }

    /// The order this hold is, as its owner sees it.
    pub(crate) fn order(&self, order_id: &OrderId, user_id: &UserId) -> (Order, Reservation) {
        let reservation = self.reservation(order_id, user_id);
        let order = Order {
            expired_at: self.expired_at,
            paid_at: self.paid_at,
            payment: self.payment.clone(),
            refunded_from: self.refunded_from,
            ..Order::from_reservation(&reservation, self.status)
        };
        (order, reservation)
    }

    pub(crate) fn reservation(&self, order_id: &OrderId, user_id: &UserId) -> Reservation {
        Reservation {
            order_id: order_id.clone(),
            sale_id: order_id.sale_id().clone(),
            user_id: user_id.clone(),
            shard: self.shard,
            created_at: self.created_at,
            expires_at: self.expires_at,
            price: self.price,
        }
    }
}

/// Every hold on a user item, as the order it is and the reservation it records; other
/// attributes are skipped. The order id comes from the hold's name and the user from
/// the item's key, and a hold of another sale's order is corrupt.
pub(crate) fn parse_holds(item: &Item) -> Result<Vec<(Order, Reservation)>, ItemError> {
    let (sale_id, user_id) = user_item_owner(item)?;
    item.iter()
        .filter_map(|(name, value)| {
            name.strip_prefix(HOLD_PREFIX)
                .map(|order_id| (name, order_id, value))
        })
        .map(|(name, order_id, value)| {
            let order_id = OrderId::parse(order_id).map_err(|source| ItemError::Id {
                name: name.clone(),
                source,
            })?;
            if order_id.sale_id() != &sale_id {
                return Err(ItemError::Form {
                    name: name.clone(),
                    expected: "hold#{order_id} of an order of the item's sale",
                });
            }
            Ok(Hold::parse(name, value)?.order(&order_id, &user_id))
        })
        .collect()
}

/// The order item with `status`. It is not indexed: holds, written in the same
/// transactions with the same status, are what stats and the reconciler read, so
/// indexing orders too would only double the index's writes.
pub(crate) fn order_item(
    reservation: &Reservation,
    status: OrderStatus,
    now: DateTime<Utc>,
) -> Item {
    let mut item = order_key(&reservation.order_id);
    item.extend([
        ("order_id".to_owned(), s(reservation.order_id.to_string())),
        ("sale_id".to_owned(), s(reservation.sale_id.as_str())),
        ("user_id".to_owned(), s(reservation.user_id.as_str())),
        (SHARD.to_owned(), n(reservation.shard)),
        (STATUS.to_owned(), s(status.as_str())),
        ("created_at".to_owned(), time(reservation.created_at)),
        ("expires_at".to_owned(), time(reservation.expires_at)),
        ("updated_at".to_owned(), time(now)),
    ]);
    item.extend(price_attributes(reservation.price));
    if status.gave_the_unit_back() {
        item.insert(TTL.to_owned(), n((now + SETTLED_RETENTION).timestamp()));
    }
    item
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    /// The order item read back, as an operator would: the functions answer from
    /// holds, and the item is only the settled order's record (and its TTL).
    fn parse_order(item: &Item) -> Result<(Reservation, OrderStatus), ItemError> {
        let fields = Fields::of(item);
        let reservation = Reservation {
            order_id: fields.id("order_id", OrderId::parse)?,
            sale_id: fields.id("sale_id", |raw| SaleId::parse(raw))?,
            user_id: fields.id("user_id", |raw| UserId::parse(raw))?,
            shard: fields.number(SHARD)?,
            created_at: fields.time("created_at")?,
            expires_at: fields.time("expires_at")?,
            price: fields.price()?,
        };
        Ok((reservation, fields.status()?))
    }

    fn reservation() -> Reservation {
        let sale_id = SaleId::parse("phone-1").expect("valid");
        Reservation {
            order_id: OrderId::new(sale_id.clone()),
            sale_id,
            user_id: UserId::parse("alice").expect("valid"),
            shard: 3,
            created_at: Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap()
                + Duration::milliseconds(678),
            expires_at: Utc.with_ymd_and_hms(2026, 1, 2, 3, 19, 6).unwrap(),
            price: Some(Price::new(1_299, "JPY").expect("valid")),
        }
    }

    fn sale() -> Sale {
        Sale {
            sale_id: SaleId::parse("phone-1").expect("valid"),
            name: "Phone".to_owned(),
            price: Some(Price::new(129_900, "EUR").expect("valid")),
            stock_total: 100,
            starts_at: Utc.with_ymd_and_hms(2026, 1, 2, 3, 0, 0).unwrap(),
            ends_at: Utc.with_ymd_and_hms(2026, 1, 3, 3, 0, 0).unwrap(),
            per_user_limit: 2,
            payment_timeout_secs: 900,
            shards: 10,
            challenge_work: None,
            reserve: ReservePath::Adaptive,
            control: SaleControl::Open,
        }
    }

    #[test]
    fn a_sale_round_trips() {
        let sale = sale();
        assert_eq!(parse_sale(&sale_item(&sale)).expect("parses"), sale);
        assert!(
            !sale_item(&sale).contains_key(CHALLENGE_WORK),
            "off: as before"
        );
        let challenged = Sale {
            challenge_work: ChallengeWork::of_setting("w", 40_000).unwrap(),
            ..sale
        };
        assert_eq!(
            parse_sale(&sale_item(&challenged)).expect("parses"),
            challenged
        );
        assert!(
            !sale_item(&challenged).contains_key(RESERVE),
            "adaptive: as before"
        );
        for reserve in ReservePath::ALL {
            let set = Sale {
                reserve,
                ..challenged.clone()
            };
            assert_eq!(parse_sale(&sale_item(&set)).expect("parses"), set);
        }
        assert!(
            !sale_item(&challenged).contains_key(CONTROL),
            "open: as before"
        );
        for control in SaleControl::ALL {
            let set = Sale {
                control,
                ..challenged.clone()
            };
            assert_eq!(parse_sale(&sale_item(&set)).expect("parses"), set);
        }
    }

    #[test]
    fn an_audit_entry_round_trips_and_sorts_by_its_time() {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let entry = |action, at| SaleAudit {
            action,
            by: UserId::parse("operator").expect("valid"),
            at,
        };
        let paused = entry(SaleAction::Pause, at);
        let item = audit_item(&sale().sale_id, &paused);
        assert_eq!(parse_audit(&item).expect("parses"), paused);
        let sort_key = |item: &Item| item[SK].as_s().expect("a string").clone();
        let later = audit_item(
            &sale().sale_id,
            &entry(SaleAction::Resume, at + Duration::milliseconds(1)),
        );
        let much_later = audit_item(
            &sale().sale_id,
            &entry(SaleAction::End, at + Duration::days(400)),
        );
        assert!(sort_key(&item) < sort_key(&later));
        assert!(sort_key(&later) < sort_key(&much_later));
    }

    #[test]
    fn a_price_is_two_plain_attributes_and_absent_on_what_came_before_prices() {
        let item = sale_item(&sale());
        assert_eq!(item.get(PRICE_AMOUNT), Some(&n(129_900)));
        assert_eq!(item.get(PRICE_CURRENCY), Some(&s("EUR")));
        let mut before = item.clone();
        before.remove(PRICE_AMOUNT);
        before.remove(PRICE_CURRENCY);
        assert_eq!(parse_sale(&before).expect("parses").price, None);
        let reservation = Reservation {
            price: None,
            ..reservation()
        };
        let AttributeValue::M(hold) = Hold::reserved(&reservation).to_value() else {
            panic!("a hold is a map");
        };
        assert!(!hold.contains_key(PRICE_AMOUNT) && !hold.contains_key(PRICE_CURRENCY));
        let name = hold_attribute(&reservation.order_id);
        let parsed = Hold::parse(&name, &AttributeValue::M(hold)).expect("parses");
        assert_eq!(parsed.price, None);
    }

    #[test]
    fn a_half_or_invalid_price_is_corrupt() {
        let mut item = sale_item(&sale());
        item.remove(PRICE_CURRENCY);
        assert!(
            matches!(parse_sale(&item), Err(ItemError::Missing(name)) if name == PRICE_CURRENCY)
        );
        item.insert(PRICE_CURRENCY.to_owned(), s("XAU"));
        assert!(
            matches!(parse_sale(&item), Err(ItemError::Range { name, .. }) if name == PRICE_CURRENCY)
        );
        item.insert(PRICE_CURRENCY.to_owned(), s("EUR"));
        item.insert(PRICE_AMOUNT.to_owned(), n(0));
        assert!(
            matches!(parse_sale(&item), Err(ItemError::Range { name, .. }) if name == PRICE_AMOUNT)
        );
    }

    #[test]
    fn an_order_round_trips_with_sub_second_times() {
        let reservation = reservation();
        let item = order_item(&reservation, OrderStatus::Paid, reservation.created_at);
        let (parsed, status) = parse_order(&item).expect("parses");
        assert_eq!(parsed, reservation);
        assert_eq!(status, OrderStatus::Paid);
        assert!(!item.contains_key(TTL), "paid orders are kept");
    }

    #[test]
    fn settled_orders_expire_ninety_days_after_they_settle() {
        let reservation = reservation();
        let now = reservation.expires_at;
        let item = order_item(&reservation, OrderStatus::Expired, now);
        let ttl = item.get(TTL).and_then(|v| v.as_n().ok()).expect("ttl set");
        assert_eq!(ttl, &(now + Duration::days(90)).timestamp().to_string());
    }

    #[test]
    fn a_hold_round_trips_and_rebuilds_the_reservation() {
        let reservation = reservation();
        let hold = Hold::reserved(&reservation);
        let name = hold_attribute(&reservation.order_id);
        let parsed = Hold::parse(&name, &hold.to_value()).expect("parses");
        assert_eq!(parsed, hold);
        assert_eq!(
            parsed.reservation(&reservation.order_id, &reservation.user_id),
            reservation
        );
    }

    fn with_payment(state: PaymentState) -> Hold {
        Hold {
            status: OrderStatus::Paid,
            payment: Some(OrderPayment {
                id: PaymentId::new("pi_3Abc"),
                state,
            }),
            ..Hold::reserved(&reservation())
        }
    }

    #[test]
    fn a_holds_payment_round_trips_in_every_state_and_fills_the_order() {
        let reservation = reservation();
        let name = hold_attribute(&reservation.order_id);
        for state in PaymentState::ALL {
            let hold = with_payment(state);
            let AttributeValue::M(map) = hold.to_value() else {
                panic!("a hold is a map");
            };
            assert_eq!(map.get(PAYMENT_ID), Some(&s("pi_3Abc")));
            assert_eq!(map.get(PAYMENT_STATE), Some(&s(state.name())));
            let parsed = Hold::parse(&name, &AttributeValue::M(map)).expect("parses");
            assert_eq!(parsed, hold);
            let (order, _) = parsed.order(&reservation.order_id, &reservation.user_id);
            assert_eq!(order.payment, hold.payment);
            assert_eq!(order.status, OrderStatus::Paid);
        }
    }

    #[test]
    fn a_hold_without_a_payment_has_no_payment_attributes_as_before_payments() {
        let reservation = reservation();
        let AttributeValue::M(map) = Hold::reserved(&reservation).to_value() else {
            panic!("a hold is a map");
        };
        assert!(!map.contains_key(PAYMENT_ID) && !map.contains_key(PAYMENT_STATE));
        let name = hold_attribute(&reservation.order_id);
        let parsed = Hold::parse(&name, &AttributeValue::M(map)).expect("parses");
        assert_eq!(parsed.payment, None);
        assert_eq!(
            parsed
                .order(&reservation.order_id, &reservation.user_id)
                .0
                .payment,
            None
        );
    }

    #[test]
    fn a_half_or_unknown_payment_is_corrupt() {
        let reservation = reservation();
        let name = hold_attribute(&reservation.order_id);
        let AttributeValue::M(mut map) = with_payment(PaymentState::Captured).to_value() else {
            panic!("a hold is a map");
        };
        map.insert(PAYMENT_STATE.to_owned(), s("refunded"));
        let error = Hold::parse(&name, &AttributeValue::M(map.clone())).expect_err("corrupt");
        assert!(
            matches!(&error, ItemError::PaymentState { name: at } if *at == format!("{name}.{PAYMENT_STATE}")),
            "{error:?}"
        );
        map.remove(PAYMENT_STATE);
        let error = Hold::parse(&name, &AttributeValue::M(map.clone())).expect_err("corrupt");
        assert!(
            matches!(&error, ItemError::Missing(at) if *at == format!("{name}.{PAYMENT_STATE}")),
            "{error:?}"
        );
        map.remove(PAYMENT_ID);
        map.insert(PAYMENT_STATE.to_owned(), s("open"));
        let error = Hold::parse(&name, &AttributeValue::M(map)).expect_err("corrupt");
        assert!(
            matches!(&error, ItemError::Missing(at) if *at == format!("{name}.{PAYMENT_ID}")),
            "{error:?}"
        );
    }

    #[test]
    fn holds_on_a_user_item_are_read_as_orders_with_their_payments() {
        let reservation = reservation();
        let mut item = user_item_with(&reservation);
        let hold = with_payment(PaymentState::Authorised);
        item.insert(hold_attribute(&reservation.order_id), hold.to_value());
        let holds = parse_holds(&item).expect("parses");
        assert_eq!(holds.len(), 1);
        let (order, found) = &holds[0];
        assert_eq!(found, &reservation);
        assert_eq!(order.status, OrderStatus::Paid);
        assert_eq!(order.payment, hold.payment);
    }

    #[test]
    fn a_refunded_order_expires_as_the_released_ones_do() {
        let reservation = reservation();
        let now = reservation.expires_at;
        let item = order_item(&reservation, OrderStatus::Refunded, now);
        assert_eq!(
            item.get(TTL),
            Some(&n((now + Duration::days(90)).timestamp()))
        );
        assert_eq!(item.get(STATUS), Some(&s("refunded")));
    }

    #[test]
    fn a_processed_event_is_its_own_item_removed_after_the_retention() {
        let now = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let item = event_item("evt_1Abc", "token", now);
        assert_eq!(item.get(PK), Some(&s("EVENT#evt_1Abc")));
        assert_eq!(item.get(SK), Some(&s("EVENT")));
        assert_eq!(item.get(DELIVERY), Some(&s("token")));
        assert_eq!(
            item.get(TTL),
            Some(&n((now + Duration::days(30)).timestamp()))
        );
        assert!(
            event_key("evt_1Abc")
                .iter()
                .all(|(name, value)| item.get(name) == Some(value)),
            "the item is at its key"
        );
    }

    #[test]
    fn a_corrupt_hold_names_the_attribute_at_fault() {
        let reservation = reservation();
        let name = hold_attribute(&reservation.order_id);
        let AttributeValue::M(mut map) = Hold::reserved(&reservation).to_value() else {
            panic!("a hold is a map");
        };
        map.insert(STATUS.to_owned(), s("shipped"));
        let error = Hold::parse(&name, &AttributeValue::M(map.clone())).expect_err("corrupt");
        assert!(
            matches!(&error, ItemError::Status { name: at, .. } if *at == format!("{name}.status")),
            "{error:?}"
        );
        map.insert(SHARD.to_owned(), s("three"));
        let error = Hold::parse(&name, &AttributeValue::M(map)).expect_err("corrupt");
        assert!(
            matches!(error, ItemError::WrongType { expected: "N", .. }),
            "{error:?}"
        );
    }

    #[test]
    fn a_corrupt_sale_is_reported_with_its_key() {
        let mut item = sale_item(&sale());
        item.remove("ends_at");
        let error = parse_sale(&item).expect_err("corrupt");
        assert!(matches!(&error, ItemError::Missing(name) if name == "ends_at"));
        let corrupt = CorruptItem::new(&item, error);
        assert_eq!(corrupt.pk, "SALE#phone-1");
        assert_eq!(corrupt.sk, "META");
        item.insert("ends_at".to_owned(), s("tomorrow"));
        assert!(matches!(parse_sale(&item), Err(ItemError::Time { .. })));
    }

    fn user_item_with(reservation: &Reservation) -> Item {
        let mut item = user_key(&reservation.sale_id, &reservation.user_id);
        item.insert(ACTIVE.to_owned(), n(1));
        item.insert(GSI1_SK.to_owned(), s(user_gsi_sk(&reservation.user_id)));
        item.insert(
            hold_attribute(&reservation.order_id),
            Hold::reserved(reservation).to_value(),
        );
        item
    }

    #[test]
    fn holds_rebuild_their_reservations_and_skip_other_attributes() {
        let reservation = reservation();
        assert_eq!(
            parse_holds(&user_item_with(&reservation)).expect("parses"),
            vec![(
                Order::from_reservation(&reservation, OrderStatus::Reserved),
                reservation
            )]
        );
    }

    #[test]
    fn a_user_id_containing_the_key_separator_survives_the_key() {
        let reservation = Reservation {
            user_id: UserId::parse("eve#USER#mallory").expect("valid"),
            ..reservation()
        };
        let holds = parse_holds(&user_item_with(&reservation)).expect("parses");
        assert_eq!(holds[0].1.user_id, reservation.user_id);
    }

    #[test]
    fn a_hold_of_another_sales_order_is_corrupt() {
        let reservation = reservation();
        let mut item = user_item_with(&reservation);
        let stray = OrderId::new(SaleId::parse("other-sale").expect("valid"));
        item.insert(
            hold_attribute(&stray),
            Hold::reserved(&reservation).to_value(),
        );
        let error = parse_holds(&item).expect_err("corrupt");
        assert!(
            matches!(&error, ItemError::Form { name, .. } if *name == hold_attribute(&stray)),
            "{error:?}"
        );
        item.insert(
            "hold#not-an-order".to_owned(),
            Hold::reserved(&reservation).to_value(),
        );
        item.remove(&hold_attribute(&stray));
        assert!(matches!(parse_holds(&item), Err(ItemError::Id { .. })));
    }

    #[test]
    fn sortable_times_sort_as_the_times_do() {
        let base = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let times = [
            DateTime::<Utc>::MIN_UTC,
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(999, 12, 31, 23, 59, 59).unwrap(),
            base - Duration::nanoseconds(1),
            base,
            base + Duration::nanoseconds(1),
            base + Duration::milliseconds(100),
            base + Duration::seconds(1),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap(),
            DateTime::<Utc>::MAX_UTC,
        ];
        let keys: Vec<String> = times.iter().copied().map(sortable_time).collect();
        assert!(
            keys.iter().all(|key| key.len() == keys[0].len()),
            "{keys:?}"
        );
        assert!(keys.windows(2).all(|pair| pair[0] <= pair[1]), "{keys:?}");
        assert!(
            keys[3] < keys[4] && keys[4] < keys[5],
            "nanoseconds count: {keys:?}"
        );
    }

    #[test]
    fn a_sale_sorts_after_its_own_end_as_a_cutoff() {
        let sale = sale();
        let AttributeValue::S(from) = sales_ending_from(sale.ends_at) else {
            panic!("a string key");
        };
        assert!(sale_gsi_sk(&sale) > from);
        let AttributeValue::S(later) = sales_ending_from(sale.ends_at + Duration::nanoseconds(1))
        else {
            panic!("a string key");
        };
        assert!(sale_gsi_sk(&sale) < later);
    }
}
