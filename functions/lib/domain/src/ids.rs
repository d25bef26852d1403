//! Identifiers. They are opaque to clients, but an [`OrderId`] carries its sale so that
//! an order can be found from its id alone before the order item exists.

use std::fmt;

use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::error::ValidationError;

const MAX_SALE_ID_LEN: usize = 64;
const MAX_USER_ID_LEN: usize = 128;

/// A sale id: 1 to 64 characters of `[A-Za-z0-9_-]`, so it is safe in keys, paths and
/// schedule names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SaleId(String);

impl SaleId {
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        let well_formed = !raw.is_empty()
            && raw.len() <= MAX_SALE_ID_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if well_formed {
            Ok(Self(raw))
        } else {
            Err(ValidationError::new(
                "sale_id",
                format!("must be 1 to {MAX_SALE_ID_LEN} characters of A-Z, a-z, 0-9, '-' or '_'"),
            ))
        }
    }

    pub fn generate() -> Self {
        Self::from_ulid(Ulid::new())
    }

    /// The id of a new sale drawn as `ulid` ([`crate::ports::IdSource`]).
    pub fn from_ulid(ulid: Ulid) -> Self {
        Self(format!("sale-{}", ulid.to_string().to_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SaleId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<SaleId> for String {
    fn from(value: SaleId) -> Self {
        value.0
    }
}

impl fmt::Display for SaleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The buyer, as the JWT `sub` names them: 1 to 128 characters (Unicode scalar values,
/// as openapi.yaml's `maxLength` counts them, not bytes), none of them a control
/// character.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UserId(String);

impl UserId {
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        if raw.is_empty()
            || raw.chars().count() > MAX_USER_ID_LEN
            || raw.chars().any(char::is_control)
        {
            return Err(ValidationError::new(
                "user_id",
                format!("must be 1 to {MAX_USER_ID_LEN} printable characters"),
            ));
        }
        Ok(Self(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A hash that is stable across processes and releases, so a user keeps landing on
    /// the same stock shard and the same stats bucket wherever the grab runs.
    pub fn stable_hash(&self) -> u64 {
        fnv1a(self.0.as_bytes())
    }
}

impl TryFrom<String> for UserId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<UserId> for String {
    fn from(value: UserId) -> Self {
        value.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

/// `{sale_id}.{ulid}`: unique, time-ordered, and it names its sale, so the owner's hold
/// can be read by key before the consumer has created the order item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderId {
    sale_id: SaleId,
    unique: Ulid,
}

impl OrderId {
    pub fn new(sale_id: SaleId) -> Self {
        Self {
            sale_id,
            unique: Ulid::new(),
        }
    }

    /// The order a grab path names (see [`crate::token`]).
    pub fn from_parts(sale_id: SaleId, unique: Ulid) -> Self {
        Self { sale_id, unique }
    }

    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let invalid = || ValidationError::new("order_id", "is not an order id");
        let (sale, unique) = raw.rsplit_once('.').ok_or_else(invalid)?;
        Ok(Self {
            sale_id: SaleId::parse(sale).map_err(|_| invalid())?,
            unique: Ulid::from_string(unique).map_err(|_| invalid())?,
        })
    }

    pub fn sale_id(&self) -> &SaleId {
        &self.sale_id
    }

    /// The part that is unique on its own (a ULID, 26 characters of `[0-9A-Z]`), for
    /// names with tight length limits such as schedule names.
    pub fn unique_part(&self) -> String {
        self.unique.to_string()
    }

    /// The random bits of the id: different for every order, so whatever is drawn from
    /// them (a grab's backoff, say) spreads buyers apart without a random source.
    pub fn random_bits(&self) -> u64 {
        // The low 64 of the ULID's 80 random bits; truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        let bits = self.unique.random() as u64;
        bits
    }
}

impl TryFrom<String> for OrderId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<OrderId> for String {
    fn from(value: OrderId) -> Self {
        value.to_string()
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.sale_id, self.unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_id_round_trips_and_names_its_sale() {
        let sale = SaleId::parse("phone-2026_a").unwrap();
        let id = OrderId::new(sale.clone());
        let parsed = OrderId::parse(&id.to_string()).unwrap();
        assert_eq!(parsed, id);
        assert_eq!(parsed.sale_id(), &sale);
    }

    #[test]
    fn malformed_ids_are_rejected() {
        for bad in ["", "a b", "x#y", &"s".repeat(65)] {
            assert!(SaleId::parse(bad).is_err(), "{bad:?}");
        }
        for bad in [
            "",
            "nodot",
            "sale.notaulid",
            "bad id.01ARZ3NDEKTSV4RRFFQ69G5FAV",
        ] {
            assert!(OrderId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(UserId::parse("").is_err());
        for control in ["a\nb", "nul\0", "esc\u{1b}[31m", "c1\u{85}"] {
            assert!(UserId::parse(control).is_err(), "{control:?}");
        }
    }

    #[test]
    fn a_user_id_is_measured_in_characters_as_the_contract_counts_them() {
        // 128 two-byte characters: 256 bytes, still 128 characters.
        assert!(UserId::parse("é".repeat(128)).is_ok());
        assert!(UserId::parse("é".repeat(129)).is_err());
        assert!(UserId::parse("a".repeat(128)).is_ok());
        assert!(UserId::parse("a".repeat(129)).is_err());
    }

    #[test]
    fn user_hash_is_stable() {
        // Pinned: shard choice must not move between releases.
        // FNV-1a 64 of "alice", computed independently.
        assert_eq!(
            UserId::parse("alice").unwrap().stable_hash(),
            0x508b_2abb_65a0_3907
        );
    }
}
