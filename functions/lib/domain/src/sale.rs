//! A sale: its price, its stock, its window, its per-user limit and how its stock is
//! sharded.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::challenge::ChallengeWork;
use crate::control::SaleControl;
use crate::error::ValidationError;
use crate::ids::{SaleId, UserId};
use crate::order::OrderStatus;
use crate::payment::{OrderPayment, PaymentState};
use crate::price::Price;

pub const MAX_STOCK: u32 = 1_000_000;
/// Each shard is its own partition key. A transactional reserve would get about one
/// reservation a shard per transaction latency (on AWS a key admits one transaction at
/// a time and cancels, and bills, the others): 37 a second at a 15 ms commit and 24 at
/// 30 ms, so 50,000 a second would need 2,100 to 4,000 shards (docs/capacity.md's
/// model). The reserve takes with a plain write instead, which only the key's WCU
/// limits, so 4,000 is room to spare; what grows with K stays bounded there: creating
/// the sale takes 41 transactions, a read of its stock 40 `BatchGetItem` calls.
pub const MAX_SHARDS: u16 = 4_000;
/// A shard's item names every order holding one of its units (the takers that make its
/// plain-write take exactly-once), 60 to 80 bytes each with a typical user id and up
/// to about 550 with a 128-character one. So its units are bounded: at 250 the item
/// stays under 140 KB even then, well inside DynamoDB's 400 KB, and about 20 KB (20
/// write units a take at the end of the sale) with typical ids. `MAX_STOCK` on
/// `MAX_SHARDS` is exactly this.
pub const MAX_UNITS_PER_SHARD: u32 = 250;
pub const MAX_PER_USER_LIMIT: u32 = 100;
pub const MAX_PAYMENT_TIMEOUT_SECS: u32 = 86_400;
pub const DEFAULT_PAYMENT_TIMEOUT_SECS: u32 = 900;
const MAX_NAME_LEN: usize = 200;
/// Reservations of one sale a buyer may let lapse or cancel before further grabs of it
/// are refused as `LimitReached`. Every settled hold stays on the buyer's item (that
/// is what makes a grab path single-use), so without a bound a grab-and-cancel loop
/// would grow the item, and the cost of every write to it, towards DynamoDB's 400 KB
/// item limit; and one buyer could keep a unit out of everyone else's reach by
/// cycling it.
pub const MAX_ABANDONED_HOLDS: u32 = 20;
/// A grab token may be fetched this long before the start, so clients whose clocks
/// are slightly off can still be first at the start instant, but never earlier.
pub const TOKEN_LEAD: Duration = Duration::seconds(1);

/// Sale times must fall in this range. Past year 9999 a time no longer fits RFC 3339's
/// four-digit year, so it could be written but not read back (an offset can push a
/// valid-looking `9999-12-31T23:59:59-05:00` there), and an order's deadline lies up to
/// a day past the sale's end.
/// Unix seconds: 1970-01-01T00:00:00Z up to 9999-01-01T00:00:00Z.
const SALE_CALENDAR_SECS: std::ops::Range<i64> = 0..253_370_764_800;

/// A sale as an administrator asks for it, before validation. An optional field is
/// either left out (its default applies) or given a value: `null` is refused, as the
/// contract's non-nullable schema says. Every field is read by [`draft_field`], so a
/// wrong type is described in the API's words ("must be an integer").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaleDraft {
    #[serde(default, deserialize_with = "draft_field::some_string")]
    pub sale_id: Option<String>,
    #[serde(deserialize_with = "draft_field::string")]
    pub name: String,
    /// Required: a sale an operator runs sells at a price.
    #[serde(deserialize_with = "draft_field::price")]
    pub price: PriceDraft,
    #[serde(deserialize_with = "draft_field::integer")]
    pub stock: i64,
    #[serde(deserialize_with = "draft_field::date_time")]
    pub starts_at: DateTime<Utc>,
    #[serde(deserialize_with = "draft_field::date_time")]
    pub ends_at: DateTime<Utc>,
    #[serde(default, deserialize_with = "draft_field::some_integer")]
    pub per_user_limit: Option<i64>,
    #[serde(default, deserialize_with = "draft_field::some_integer")]
    pub payment_timeout_secs: Option<i64>,
    #[serde(default, deserialize_with = "draft_field::some_integer")]
    pub shards: Option<i64>,
    /// The proof-of-work challenge before the grab path: 0 (the default) is none.
    #[serde(default, deserialize_with = "draft_field::some_integer")]
    pub challenge_work: Option<i64>,
    /// How a grab reserves its unit (a [`ReservePath`] by name); `adaptive` if left out.
    #[serde(default, deserialize_with = "draft_field::some_string")]
    pub reserve: Option<String>,
}

/// A draft's price as sent, before validation:
/// `{"amount": 129900, "currency": "EUR"}`, the amount in the currency's minor unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceDraft {
    #[serde(deserialize_with = "draft_field::integer")]
    pub amount: i64,
    #[serde(deserialize_with = "draft_field::string")]
    pub currency: String,
}

/// Readers of the draft's JSON fields whose errors speak JSON, not Rust: serde's own
/// would say "expected i64" or "expected a formatted date and time string".
mod draft_field {
    use std::fmt;

    use chrono::{DateTime, Utc};
    use serde::de::{Error as _, MapAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    use super::PriceDraft;

    const PRICE: &str = r#"an object such as {"amount": 129900, "currency": "EUR"}"#;

    /// The price object, its own fields read by the readers here. A visitor rather than
    /// a `Value` first, so that an error inside it keeps its path (`price.amount`).
    pub fn price<'de, D: Deserializer<'de>>(input: D) -> Result<PriceDraft, D::Error> {
        struct PriceObject;

        impl<'de> Visitor<'de> for PriceObject {
            type Value = PriceDraft;

            fn expecting(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
                out.write_str(PRICE)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PriceDraft, A::Error> {
                PriceDraft::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not null")))
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not a boolean")))
            }

            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not a number")))
            }

            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not a number")))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not a number")))
            }

            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<PriceDraft, E> {
                Err(E::custom(format!("must be {PRICE}, not a string")))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<PriceDraft, A::Error> {
                Err(A::Error::custom(format!("must be {PRICE}, not an array")))
            }
        }

        input.deserialize_any(PriceObject)
    }

    pub fn integer<'de, D: Deserializer<'de>>(input: D) -> Result<i64, D::Error> {
        let value = Value::deserialize(input)?;
        integer_of(&value).ok_or_else(|| D::Error::custom(wrong_kind("an integer", &value)))
    }

    pub fn some_integer<'de, D: Deserializer<'de>>(input: D) -> Result<Option<i64>, D::Error> {
        integer(input).map(Some)
    }

    pub fn string<'de, D: Deserializer<'de>>(input: D) -> Result<String, D::Error> {
        match Value::deserialize(input)? {
            Value::String(text) => Ok(text),
            other => Err(D::Error::custom(wrong_kind("a string", &other))),
        }
    }

    pub fn some_string<'de, D: Deserializer<'de>>(input: D) -> Result<Option<String>, D::Error> {
        string(input).map(Some)
    }

    pub fn date_time<'de, D: Deserializer<'de>>(input: D) -> Result<DateTime<Utc>, D::Error> {
        const EXPECTED: &str = "an RFC 3339 date-time such as 2026-01-01T00:00:00Z";
        match Value::deserialize(input)? {
            Value::String(text) => DateTime::parse_from_rfc3339(&text)
                .map(|time| time.with_timezone(&Utc))
                .map_err(|_| D::Error::custom(format!("must be {EXPECTED}"))),
            other => Err(D::Error::custom(wrong_kind(EXPECTED, &other))),
        }
    }

    /// JSON has one number type: `3`, `3.0` and `3e0` are the same integer (as JSON
    /// Schema's `integer` counts them). One too large for i64 is kept as the largest,
    /// which every range check then refuses with its bounds.
    fn integer_of(value: &Value) -> Option<i64> {
        let number = value.as_number()?;
        if let Some(integer) = number.as_i64() {
            return Some(integer);
        }
        if number.is_u64() {
            return Some(i64::MAX);
        }
        let float = number.as_f64()?;
        // `as` saturates, which is what the range checks want for huge values.
        #[allow(clippy::cast_possible_truncation)]
        (float.is_finite() && float.fract() == 0.0).then_some(float as i64)
    }

    fn wrong_kind(expected: &str, found: &Value) -> String {
        let found = match found {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        format!("must be {expected}, not {found}")
    }
}

/// A validated sale. Immutable once created but for its [`SaleControl`], which is what
/// lets every grab cache it (and reread it once per interval, for the control).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sale {
    pub sale_id: SaleId,
    pub name: String,
    /// What one unit costs. Every sale created since sales had prices has one; `None`
    /// only for a sale stored before, which is read as it was and sells unpriced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    pub stock_total: u32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub per_user_limit: u32,
    pub payment_timeout_secs: u32,
    pub shards: u16,
    /// The work of the challenge a buyer solves before each grab path, if any; 0 in
    /// JSON when there is none, as the administrator sets it.
    #[serde(default, with = "challenge_setting")]
    pub challenge_work: Option<ChallengeWork>,
    /// How a grab reserves its unit. A sale stored before it could be set is adaptive.
    #[serde(default)]
    pub reserve: ReservePath,
    /// Open, or paused or ended by an operator.
    #[serde(default, skip_serializing_if = "SaleControl::is_open")]
    pub control: SaleControl,
}

/// How a grab reserves its unit: the take from a stock shard and the hold on the buyer's
/// item. Every path sells exactly the stock, and they mix safely on one shard; they
/// differ in speed and writes when many grabs meet on a shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservePath {
    /// The brief's one transaction (take and hold, both or neither) until a reserve of
    /// this process meets another transaction on its shard; then take then hold in the
    /// sale for a short while. The default: a quiet sale gets the transaction, a hot
    /// one learns it is hot at the cost of one cancelled transaction per process.
    #[default]
    Adaptive,
    /// Always the one transaction. On a hot shard transactions cancel each other, so
    /// this suits a sale with few buyers at a time.
    Transaction,
    /// Always the take, then the hold: two plain conditional writes that queue on a hot
    /// shard instead of cancelling. For a sale whose surge is expected: on Lambda every
    /// new container would otherwise learn it with a cancelled transaction of its own.
    TakeThenHold,
}

impl ReservePath {
    pub const ALL: [Self; 3] = [Self::Adaptive, Self::Transaction, Self::TakeThenHold];

    /// The name the API and the store use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Adaptive => "adaptive",
            Self::Transaction => "transaction",
            Self::TakeThenHold => "take_then_hold",
        }
    }

    /// The path named `name`, or why not, for `field`.
    pub fn named(field: &'static str, name: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|path| path.name() == name)
            .ok_or_else(|| {
                let names: Vec<String> = Self::ALL
                    .iter()
                    .map(|path| format!("{:?}", path.name()))
                    .collect();
                ValidationError::new(field, format!("must be one of {}", names.join(", ")))
            })
    }
}

/// A sale's challenge as its JSON says it: the work, or 0 for none.
mod challenge_setting {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::challenge::ChallengeWork;

    pub fn serialize<S: Serializer>(
        work: &Option<ChallengeWork>,
        out: S,
    ) -> Result<S::Ok, S::Error> {
        work.map_or(0, ChallengeWork::derivations).serialize(out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        input: D,
    ) -> Result<Option<ChallengeWork>, D::Error> {
        let setting = u32::deserialize(input)?;
        ChallengeWork::of_setting("challenge_work", i64::from(setting))
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SalePhase {
    Upcoming,
    Active,
    /// Paused by an operator, before or during its window.
    Paused,
    /// Past its window, or ended early by an operator.
    Ended,
}

/// Shards chosen when the administrator does not say: about ten items a shard, so a
/// sale of 100 spreads its write heat over ten partitions, capped at 16 so the stats
/// and the sold-out probe stay cheap, but never fewer than [`MAX_UNITS_PER_SHARD`]
/// allows.
pub fn default_shards(stock: u32) -> u16 {
    let wanted = stock.div_ceil(10).clamp(1, 16).max(min_shards(stock));
    u16::try_from(wanted).unwrap_or(MAX_SHARDS)
}

/// The fewest shards that hold `stock` within [`MAX_UNITS_PER_SHARD`] each.
fn min_shards(stock: u32) -> u32 {
    stock.div_ceil(MAX_UNITS_PER_SHARD).max(1)
}

/// Characters a sale name may not hold, because the public page shows it as sent:
/// control characters (NUL, ESC, ...) and the bidirectional overrides and isolates that
/// make text display in a different order than it reads ("Trojan Source").
/// openapi.yaml states the same set as the name's `pattern`.
fn is_unsafe_in_text(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn in_range(field: &'static str, value: i64, min: i64, max: i64) -> Result<u32, ValidationError> {
    if (min..=max).contains(&value) {
        u32::try_from(value).map_err(|_| ValidationError::new(field, "is out of range"))
    } else {
        Err(ValidationError::new(
            field,
            format!("must be between {min} and {max}"),
        ))
    }
}

fn within_sale_calendar(field: &'static str, value: DateTime<Utc>) -> Result<(), ValidationError> {
    if SALE_CALENDAR_SECS.contains(&value.timestamp()) {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            "must be between 1970-01-01T00:00:00Z and 9999-01-01T00:00:00Z",
        ))
    }
}

impl Sale {
    pub fn from_draft(draft: SaleDraft) -> Result<Self, ValidationError> {
        Self::from_draft_or(draft, SaleId::generate)
    }

    /// [`Sale::from_draft`], a draft that names no id taking `new_id()`'s.
    pub fn from_draft_or(
        draft: SaleDraft,
        new_id: impl FnOnce() -> SaleId,
    ) -> Result<Self, ValidationError> {
        let sale_id = match draft.sale_id {
            Some(raw) => SaleId::parse(raw)?,
            None => new_id(),
        };
        let name = draft.name;
        if name.chars().count() > MAX_NAME_LEN || !name.chars().any(|c| !c.is_whitespace()) {
            return Err(ValidationError::new(
                "name",
                format!("must be 1 to {MAX_NAME_LEN} characters, not all blank"),
            ));
        }
        if let Some(unsafe_char) = name.chars().find(|&c| is_unsafe_in_text(c)) {
            return Err(ValidationError::new(
                "name",
                format!(
                    "must not contain control or bidirectional formatting characters (found U+{:04X})",
                    u32::from(unsafe_char)
                ),
            ));
        }
        let price = Price::new(draft.price.amount, &draft.price.currency)?;
        let stock_total = in_range("stock", draft.stock, 1, i64::from(MAX_STOCK))?;
        within_sale_calendar("starts_at", draft.starts_at)?;
        within_sale_calendar("ends_at", draft.ends_at)?;
        if draft.ends_at <= draft.starts_at {
            return Err(ValidationError::new("ends_at", "must be after starts_at"));
        }
        let per_user_limit = in_range(
            "per_user_limit",
            draft.per_user_limit.unwrap_or(1),
            1,
            i64::from(MAX_PER_USER_LIMIT),
        )?;
        let payment_timeout_secs = in_range(
            "payment_timeout_secs",
            draft
                .payment_timeout_secs
                .unwrap_or(i64::from(DEFAULT_PAYMENT_TIMEOUT_SECS)),
            1,
            i64::from(MAX_PAYMENT_TIMEOUT_SECS),
        )?;
        let shards = match draft.shards {
            None => default_shards(stock_total),
            Some(requested) => {
                let max = i64::from(MAX_SHARDS).min(i64::from(stock_total));
                let min = i64::from(min_shards(stock_total));
                let shards = in_range("shards", requested, min, max)?;
                u16::try_from(shards).map_err(|_| ValidationError::new("shards", "is too large"))?
            }
        };
        let challenge_work =
            ChallengeWork::of_setting("challenge_work", draft.challenge_work.unwrap_or(0))?;
        let reserve = match draft.reserve {
            None => ReservePath::default(),
            Some(name) => ReservePath::named("reserve", &name)?,
        };
        Ok(Self {
            sale_id,
            name,
            price: Some(price),
            stock_total,
            starts_at: draft.starts_at,
            ends_at: draft.ends_at,
            per_user_limit,
            payment_timeout_secs,
            shards,
            challenge_work,
            reserve,
            control: SaleControl::Open,
        })
    }

    pub fn phase(&self, now: DateTime<Utc>) -> SalePhase {
        if now >= self.ends_at || self.control == SaleControl::Ended {
            SalePhase::Ended
        } else if self.control == SaleControl::Paused {
            SalePhase::Paused
        } else if now < self.starts_at {
            SalePhase::Upcoming
        } else {
            SalePhase::Active
        }
    }

    /// The stock of each shard: the total spread as evenly as it divides.
    pub fn shard_stock(&self, shard: u16) -> u32 {
        let shards = u32::from(self.shards);
        let base = self.stock_total / shards;
        base + u32::from(u32::from(shard) < self.stock_total % shards)
    }

    /// The order in which a user tries the shards: their own first, so load spreads,
    /// then every other one, so no stock is stranded while buyers remain. The others
    /// come at a stride of the user's own (coprime with the shard count, so every shard
    /// comes once): buyers who leave the same empty or contended shard scatter over the
    /// rest instead of all moving on to its neighbour.
    pub fn shard_order(&self, user: &UserId) -> impl Iterator<Item = u16> + use<> {
        let shards = u32::from(self.shards.max(1));
        let first = u32::from(self.bucket_of(user));
        let stride = coprime_stride(user.stable_hash() >> 32, shards);
        (0..shards).map(move |step| {
            // Below `shards`, which is a u16.
            u16::try_from((first + step * stride) % shards).unwrap_or(0)
        })
    }

    /// The user's home shard, also the stats bucket their items are indexed under.
    pub fn bucket_of(&self, user: &UserId) -> u16 {
        u16::try_from(user.stable_hash() % u64::from(self.shards)).unwrap_or(0)
    }

    /// When a reservation made now must be paid by: whole seconds, because Scheduler's
    /// `at()` expressions have second precision and must not fire before the expiry.
    pub fn payment_deadline(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let deadline = now + Duration::seconds(i64::from(self.payment_timeout_secs));
        let whole = deadline.timestamp();
        let round_up = i64::from(deadline.timestamp_subsec_nanos() > 0);
        DateTime::from_timestamp(whole + round_up, 0).unwrap_or(deadline)
    }
}

/// A step in `1..shards` drawn from `seed` that is coprime with `shards`, so that
/// stepping by it from any shard visits every shard once (1 when there is one shard).
fn coprime_stride(seed: u64, shards: u32) -> u32 {
    if shards <= 2 {
        return 1;
    }
    let mut stride = 1 + u32::try_from(seed % u64::from(shards - 1)).unwrap_or(0);
    while gcd(stride, shards) != 1 {
        stride = stride % (shards - 1) + 1;
    }
    stride
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Counts of a sale's stock by where it is. Sold stock is `paid`; held stock is
/// `reserved`; `cancelled`, `expired`, `refunded` and `payment_failed` are orders whose
/// stock came back and are counted for reporting only. Two counts say where money and units disagree:
/// `capture_pending`, of the `paid` orders, those whose money is not seen captured
/// (authorised and awaiting its capture, which a settlement retries, or, rarely, no
/// longer capturable, which an operator must look at); `refund_pending`, of the
/// cancelled and expired orders, those whose money was captured and not yet given back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockCounts {
    pub available: u64,
    pub reserved: u64,
    pub paid: u64,
    pub cancelled: u64,
    pub expired: u64,
    #[serde(default)]
    pub refunded: u64,
    #[serde(default)]
    pub payment_failed: u64,
    #[serde(default)]
    pub capture_pending: u64,
    #[serde(default)]
    pub refund_pending: u64,
}

impl StockCounts {
    /// Counts one order of the sale, in `status` with `payment` (if one was opened).
    pub fn add(&mut self, status: OrderStatus, payment: Option<&OrderPayment>) {
        let counter = match status {
            OrderStatus::Reserved => &mut self.reserved,
            OrderStatus::Paid => &mut self.paid,
            OrderStatus::Cancelled => &mut self.cancelled,
            OrderStatus::Expired => &mut self.expired,
            OrderStatus::Refunded => &mut self.refunded,
            OrderStatus::PaymentFailed => &mut self.payment_failed,
        };
        *counter += 1;
        let Some(payment) = payment else {
            return;
        };
        match status {
            OrderStatus::Paid if payment.state != PaymentState::Captured => {
                self.capture_pending += 1;
            }
            OrderStatus::Cancelled | OrderStatus::Expired
                if payment.state == PaymentState::Captured =>
            {
                self.refund_pending += 1;
            }
            _ => {}
        }
    }
}

/// The reconciliation the admin sees: every unit is available, held or sold, and no
/// money is taken for a unit not sold nor left uncaptured for one sold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleStats {
    pub stock_total: u64,
    #[serde(flatten)]
    pub counts: StockCounts,
    pub consistent: bool,
}

impl SaleStats {
    pub fn reconcile(stock_total: u32, counts: StockCounts) -> Self {
        let accounted = counts.available + counts.reserved + counts.paid;
        Self {
            stock_total: u64::from(stock_total),
            counts,
            consistent: accounted == u64::from(stock_total)
                && counts.capture_pending == 0
                && counts.refund_pending == 0,
        }
    }
}

/// What the public sale page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaleView {
    pub sale_id: SaleId,
    pub name: String,
    /// What one unit costs, with its currency's decimals for display; absent only for a
    /// sale created before sales had prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    pub status: &'static str,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub server_time: DateTime<Utc>,
    pub stock_total: u32,
    pub stock_available: u64,
    /// Units one buyer may hold or have bought in this sale: a rule of the sale, shown so
    /// that a page can say a buyer is at it instead of offering a grab that can only be
    /// refused with `limit_reached`.
    pub per_user_limit: u32,
    /// The work of the challenge before each grab path (0: none), so that the page
    /// knows to solve one and can say how long it may take.
    pub challenge_work: u32,
}

impl SaleView {
    pub fn new(sale: &Sale, stock_available: u64, now: DateTime<Utc>) -> Self {
        let status = match sale.phase(now) {
            SalePhase::Ended => "ended",
            SalePhase::Paused => "paused",
            _ if stock_available == 0 => "sold_out",
            SalePhase::Upcoming => "upcoming",
            SalePhase::Active => "active",
        };
        Self {
            sale_id: sale.sale_id.clone(),
            name: sale.name.clone(),
            price: sale.price,
            status,
            starts_at: sale.starts_at,
            ends_at: sale.ends_at,
            server_time: now,
            stock_total: sale.stock_total,
            stock_available,
            per_user_limit: sale.per_user_limit,
            challenge_work: sale.challenge_work.map_or(0, ChallengeWork::derivations),
        }
    }
}

/// Where a listing of sales goes on from: the last sale of the page before, by its
/// place in the order latest-ending first, then by id. Opaque to clients, written
/// `{seconds}.{nanoseconds}.{sale_id}` of that sale's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleCursor {
    pub ends_at: DateTime<Utc>,
    pub sale_id: SaleId,
}

impl SaleCursor {
    /// The cursor that goes on after `sale`.
    pub fn after(sale: &Sale) -> Self {
        Self {
            ends_at: sale.ends_at,
            sale_id: sale.sale_id.clone(),
        }
    }

    /// A cursor a client sent back, as [`SaleCursor::encode`] wrote it.
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let (ends_at, sale_id) = parse_place(raw)?;
        Ok(Self { ends_at, sale_id })
    }

    pub fn encode(&self) -> String {
        encode_place(self.ends_at, &self.sale_id)
    }
}

/// A place in an index sorted by a time, then a sale id, as a cursor writes it:
/// `{seconds}.{nanoseconds}.{sale_id}`, plain ASCII, so that it survives a query string.
pub(crate) fn encode_place(at: DateTime<Utc>, sale_id: &SaleId) -> String {
    format!(
        "{}.{}.{}",
        at.timestamp(),
        at.timestamp_subsec_nanos(),
        sale_id
    )
}

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The place [`encode_place`] wrote; anything else is an invalid `cursor`.
pub(crate) fn parse_place(raw: &str) -> Result<(DateTime<Utc>, SaleId), ValidationError> {
    let invalid = || ValidationError::new("cursor", "is not a cursor this API answered");
    let mut parts = raw.splitn(3, '.');
    let (Some(seconds), Some(nanos), Some(sale_id)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid());
    };
    let seconds: i64 = seconds.parse().map_err(|_| invalid())?;
    let nanos: u64 = nanos.parse().map_err(|_| invalid())?;
    // A second of 10 digits of nanoseconds is a leap second (as chrono writes one);
    // anywhere else, the instant they add up to: any place in the index is one.
    let whole = i64::try_from(nanos / NANOS_PER_SECOND).map_err(|_| invalid())?;
    let part = u32::try_from(nanos % NANOS_PER_SECOND).map_err(|_| invalid())?;
    let at = u32::try_from(nanos)
        .ok()
        .and_then(|nanos| DateTime::from_timestamp(seconds, nanos))
        .or_else(|| DateTime::from_timestamp(seconds.checked_add(whole)?, part))
        .ok_or_else(invalid)?;
    let sale_id = SaleId::parse(sale_id).map_err(|_| invalid())?;
    Ok((at, sale_id))
}

/// One page of sales, the latest-ending first, and where the next one starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SalePage {
    pub sales: Vec<Sale>,
    /// `None` on the last page.
    pub next: Option<SaleCursor>,
}

/// A page of the admin console's list of sales: each as its page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaleList {
    pub sales: Vec<SaleView>,
    /// Asks for the next page (`?cursor=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn every_user_tries_every_shard_once_starting_at_their_own() {
        for shards in [1_u16, 2, 3, 4, 10, 12, 16, 128, 1000, MAX_SHARDS] {
            let sale = Sale {
                shards,
                ..Sale::from_draft(serde_json::from_value(draft_json()).unwrap()).unwrap()
            };
            let mut second_steps = std::collections::BTreeSet::new();
            for name in ["alice", "bob", "carol", "dave", "erin", "frank", "grace"] {
                let user = UserId::parse(name).unwrap();
                let order: Vec<u16> = sale.shard_order(&user).collect();
                assert_eq!(order[0], sale.bucket_of(&user));
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..shards).collect::<Vec<_>>(),
                    "{shards} shards, {name}"
                );
                if shards > 1 {
                    second_steps.insert((order[1] + shards - order[0]) % shards);
                }
            }
            if shards > 4 {
                assert!(
                    second_steps.len() > 1,
                    "users of {shards} shards step alike"
                );
            }
        }
    }

    fn draft_json() -> Value {
        json!({
            "name": "Phone",
            "price": {"amount": 129_900, "currency": "EUR"},
            "stock": 10,
            "starts_at": "2026-01-01T00:00:00Z",
            "ends_at": "2026-01-01T01:00:00Z",
        })
    }

    fn read(overrides: Value) -> Result<SaleDraft, String> {
        let mut body = draft_json();
        for (key, value) in overrides.as_object().unwrap() {
            body[key] = value.clone();
        }
        serde_json::from_value(body).map_err(|err| err.to_string())
    }

    fn create(overrides: Value) -> Result<Sale, ValidationError> {
        Sale::from_draft(read(overrides).expect("a readable draft"))
    }

    #[test]
    fn null_is_refused_for_every_optional_field_and_absence_takes_the_default() {
        for field in [
            "sale_id",
            "per_user_limit",
            "payment_timeout_secs",
            "shards",
            "challenge_work",
            "reserve",
        ] {
            let err = read(json!({ field: null })).unwrap_err();
            assert!(err.contains("not null"), "{field}: {err}");
        }
        let sale = create(json!({})).unwrap();
        assert_eq!(sale.per_user_limit, 1);
        assert_eq!(sale.payment_timeout_secs, DEFAULT_PAYMENT_TIMEOUT_SECS);
        assert_eq!(sale.shards, default_shards(10));
    }

    #[test]
    fn a_wrong_type_is_described_in_json_terms_not_rust_ones() {
        let cases = [
            (json!({"stock": "ten"}), "must be an integer, not a string"),
            (json!({"stock": 1.5}), "must be an integer, not a number"),
            (json!({"shards": true}), "must be an integer, not a boolean"),
            (json!({"name": 5}), "must be a string, not a number"),
            (json!({"sale_id": []}), "must be a string, not an array"),
            (
                json!({"starts_at": "tomorrow"}),
                "must be an RFC 3339 date-time",
            ),
            (
                json!({"ends_at": {}}),
                "must be an RFC 3339 date-time such as 2026-01-01T00:00:00Z, not an object",
            ),
            (
                json!({"price": 1299}),
                r#"must be an object such as {"amount": 129900, "currency": "EUR"}, not a number"#,
            ),
            (json!({"price": null}), "must be an object such as"),
            (json!({"price": "12.99 EUR"}), "must be an object such as"),
            (
                json!({"price": {"amount": "12.99", "currency": "EUR"}}),
                "must be an integer, not a string",
            ),
            (
                json!({"price": {"amount": 1299, "currency": 978}}),
                "must be a string, not a number",
            ),
        ];
        for (overrides, expected) in cases {
            let err = read(overrides.clone()).unwrap_err();
            assert!(err.starts_with(expected), "{overrides}: {err}");
            assert!(!err.contains("i64") && !err.contains("struct"), "{err}");
        }
    }

    #[test]
    fn a_price_is_required_whole_and_nothing_else() {
        let mut body = draft_json();
        body.as_object_mut().unwrap().remove("price");
        let err = serde_json::from_value::<SaleDraft>(body)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `price`"), "{err}");
        let err = read(json!({"price": {"amount": 1}})).unwrap_err();
        assert!(err.contains("missing field `currency`"), "{err}");
        let err =
            read(json!({"price": {"amount": 1, "currency": "EUR", "decimals": 2}})).unwrap_err();
        assert!(err.contains("unknown field `decimals`"), "{err}");
    }

    #[test]
    fn a_sale_sells_at_the_validated_price_of_its_draft() {
        let sale = create(json!({})).unwrap();
        let price = sale.price.expect("a created sale has a price");
        assert_eq!(price.amount(), 129_900);
        assert_eq!(price.currency().code(), "EUR");
        let yen = create(json!({"price": {"amount": 1_299, "currency": "JPY"}})).unwrap();
        assert_eq!(yen.price.map(|price| price.currency().decimals()), Some(0));
        for (price, field) in [
            (json!({"amount": 0, "currency": "EUR"}), "price.amount"),
            (json!({"amount": -5, "currency": "EUR"}), "price.amount"),
            (
                json!({"amount": 100_000_000, "currency": "EUR"}),
                "price.amount",
            ),
            (json!({"amount": 1.5, "currency": "EUR"}), "unreadable"),
            (json!({"amount": 100, "currency": "eur"}), "price.currency"),
            (json!({"amount": 100, "currency": "ZZZ"}), "price.currency"),
            (json!({"amount": 100, "currency": "XAU"}), "price.currency"),
        ] {
            match read(json!({ "price": price.clone() })) {
                Ok(draft) => assert_eq!(Sale::from_draft(draft).unwrap_err().field, field),
                Err(err) => assert_eq!(field, "unreadable", "{price}: {err}"),
            }
        }
    }

    #[test]
    fn the_page_shows_the_price_with_its_currencys_decimals() {
        let sale = create(json!({"price": {"amount": 1_299, "currency": "JPY"}})).unwrap();
        let view = serde_json::to_value(SaleView::new(&sale, 10, sale.starts_at)).unwrap();
        assert_eq!(
            view["price"],
            json!({"amount": 1_299, "currency": "JPY", "decimals": 0})
        );
        let unpriced = Sale {
            price: None,
            ..sale
        };
        let view = serde_json::to_value(SaleView::new(&unpriced, 10, unpriced.starts_at)).unwrap();
        assert!(view.get("price").is_none(), "a sale stored before prices");
    }

    #[test]
    fn integral_numbers_in_any_json_spelling_are_integers() {
        assert_eq!(read(json!({"stock": 10.0})).unwrap().stock, 10);
        let huge = read(json!({"stock": u64::MAX})).unwrap();
        assert_eq!(huge.stock, i64::MAX);
        assert!(Sale::from_draft(huge).is_err());
    }

    #[test]
    fn a_name_is_stored_as_sent_and_must_not_be_blank_or_too_long() {
        let padded = format!("  {}  ", "x".repeat(196));
        assert_eq!(create(json!({ "name": padded })).unwrap().name, padded);
        for bad in ["", "   ", "\u{3000}\u{a0}"] {
            assert!(create(json!({ "name": bad })).is_err(), "{bad:?}");
        }
        let too_long = format!("  {}  ", "x".repeat(206));
        assert!(create(json!({ "name": too_long })).is_err());
        assert!(create(json!({ "name": "é".repeat(200) })).is_ok());
    }

    #[test]
    fn a_name_with_control_or_bidi_formatting_characters_is_refused() {
        for bad in [
            "nul\0",
            "esc\u{1b}[2J",
            "c1\u{9b}",
            "abc\u{202e}fdp",
            "iso\u{2066}x\u{2069}",
        ] {
            let err = create(json!({ "name": bad })).unwrap_err();
            assert_eq!(err.field, "name", "{bad:?}");
        }
        // Other formatting characters are ordinary text: a zero-width joiner in an emoji.
        assert!(create(json!({ "name": "Family \u{1F468}\u{200D}\u{1F469}" })).is_ok());
    }

    #[test]
    fn a_sale_asks_for_no_challenge_unless_told_and_then_within_bounds() {
        assert_eq!(create(json!({})).unwrap().challenge_work, None);
        assert_eq!(
            create(json!({ "challenge_work": 0 }))
                .unwrap()
                .challenge_work,
            None
        );
        let sale = create(json!({ "challenge_work": 40_000 })).unwrap();
        assert_eq!(
            sale.challenge_work.map(ChallengeWork::derivations),
            Some(40_000)
        );
        // In JSON, as the administrator set it; 0 for none.
        assert_eq!(
            serde_json::to_value(&sale).unwrap()["challenge_work"],
            40_000
        );
        let plain = create(json!({})).unwrap();
        assert_eq!(serde_json::to_value(&plain).unwrap()["challenge_work"], 0);
        for wrong in [1, 999, 10_000_001] {
            let error = create(json!({ "challenge_work": wrong })).unwrap_err();
            assert_eq!(error.field, "challenge_work");
        }
    }

    #[test]
    fn a_sale_reserves_adaptively_unless_told_one_of_the_paths_by_name() {
        assert_eq!(create(json!({})).unwrap().reserve, ReservePath::Adaptive);
        for path in ReservePath::ALL {
            let sale = create(json!({ "reserve": path.name() })).unwrap();
            assert_eq!(sale.reserve, path);
            assert_eq!(serde_json::to_value(&sale).unwrap()["reserve"], path.name());
        }
        for wrong in ["", "Adaptive", "plain", "take-then-hold"] {
            let error = create(json!({ "reserve": wrong })).unwrap_err();
            assert_eq!(error.field, "reserve", "{wrong:?}");
        }
        assert!(read(json!({ "reserve": 1 })).is_err());
        // A sale stored before the setting existed reads as adaptive.
        let mut stored = serde_json::to_value(create(json!({})).unwrap()).unwrap();
        stored.as_object_mut().unwrap().remove("reserve");
        let sale: Sale = serde_json::from_value(stored).unwrap();
        assert_eq!(sale.reserve, ReservePath::Adaptive);
    }

    fn draft(stock: i64, shards: Option<i64>) -> SaleDraft {
        crate::testing::sale(stock, 1)
            .with(|draft| {
                draft.shards = shards;
                draft.payment_timeout_secs = None;
            })
            .draft()
    }

    #[test]
    fn a_large_sale_may_have_up_to_the_shard_cap() {
        let sale = Sale::from_draft(draft(1_000_000, Some(i64::from(MAX_SHARDS)))).unwrap();
        assert_eq!(sale.shards, MAX_SHARDS);
        let error = Sale::from_draft(draft(1_000_000, Some(i64::from(MAX_SHARDS) + 1)));
        assert!(error.is_err());
    }

    #[test]
    fn the_default_stays_about_ten_units_a_shard_up_to_sixteen_then_the_unit_cap_decides() {
        assert_eq!(default_shards(100), 10);
        assert_eq!(default_shards(5), 1);
        assert_eq!(default_shards(4_000), 16);
        assert_eq!(default_shards(10_000), 40);
        assert_eq!(default_shards(1_000_000), MAX_SHARDS);
    }

    #[test]
    fn no_shard_holds_more_than_the_unit_cap() {
        let error = Sale::from_draft(draft(1_000, Some(3))).unwrap_err();
        assert_eq!(error.field, "shards");
        assert!(error.problem.contains("between 4 and"), "{}", error.problem);
        assert_eq!(Sale::from_draft(draft(1_000, Some(4))).unwrap().shards, 4);
        for stock in [1, 250, 251, 9_999, 1_000_000] {
            let sale = Sale::from_draft(draft(stock, None)).unwrap();
            let most = (0..sale.shards).map(|shard| sale.shard_stock(shard)).max();
            assert!(most <= Some(MAX_UNITS_PER_SHARD), "{stock}: {most:?}");
        }
    }

    #[test]
    fn a_sale_cursor_reads_back_what_it_wrote_and_nothing_else() {
        let sale = crate::testing::sale(1, 1).id("phone").build();
        let cursor = SaleCursor::after(&sale);
        assert_eq!(SaleCursor::parse(&cursor.encode()), Ok(cursor));
        for bad in [
            "",
            "1767225600",
            "1767225600.0",
            "x.0.phone",
            "1767225600.x.phone",
            "1767225600.0.not a sale id",
            "1767225600.99999999999999999999.phone",
            "99999999999999999.0.phone",
        ] {
            let error = SaleCursor::parse(bad).expect_err(bad);
            assert_eq!(error.field, "cursor", "{bad}");
        }
    }

    #[test]
    fn a_sale_ending_on_a_leap_second_pages_on_and_any_ten_digits_are_a_place() {
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .and_then(|day| day.and_hms_nano_opt(23, 59, 59, 1_500_000_000))
            .expect("a leap second")
            .and_utc();
        let cursor = SaleCursor {
            ends_at: leap,
            sale_id: SaleId::parse("phone").unwrap(),
        };
        assert_eq!(cursor.encode(), "1483228799.1500000000.phone");
        assert_eq!(SaleCursor::parse(&cursor.encode()), Ok(cursor));
        // Not a leap second: the instant the digits add up to.
        let place = SaleCursor::parse("1767225600.2500000000.phone").expect("a place");
        assert_eq!(
            place.ends_at,
            DateTime::from_timestamp(1_767_225_602, 500_000_000).unwrap()
        );
    }
}
