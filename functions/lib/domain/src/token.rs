//! The dynamic grab path. The grab URL is only handed out once the sale is active, and
//! its token is an HMAC over (sale, user, order, expiry), so it cannot be guessed before
//! the start, nor used by another user.
//!
//! Each path also names the order it will create. That makes a grab idempotent: a
//! client that retries after a timeout (whose transaction may well have committed)
//! reaches the same order instead of a second one or a false "limit reached". One path
//! buys at most one unit; a buyer allowed more asks for another path.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use ulid::Ulid;

use crate::ids::{OrderId, SaleId, UserId};

type HmacSha256 = Hmac<Sha256>;

/// At least this many bytes of secret: shorter keys make the MAC guessable.
pub const MIN_SECRET_LEN: usize = 32;

#[derive(Clone)]
pub struct GrabTokenSigner {
    /// The MAC with the key already absorbed (HMAC hashes a padded key first); each
    /// token starts from a clone of it, so the hot path never redoes that work.
    keyed: HmacSha256,
}

impl std::fmt::Debug for GrabTokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrabTokenSigner(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the grab-token secret must be at least {MIN_SECRET_LEN} bytes")]
pub struct WeakSecret;

impl GrabTokenSigner {
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, WeakSecret> {
        let key = secret.into();
        if key.len() < MIN_SECRET_LEN {
            return Err(WeakSecret);
        }
        let keyed = HmacSha256::new_from_slice(&key).expect("HMAC accepts any key length");
        Ok(Self { keyed })
    }

    fn mac(&self, sale: &SaleId, user: &UserId, order: Ulid, expires_unix: i64) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        // Lengths first, so no two (sale, user) pairs can produce the same message.
        for part in [sale.as_str().as_bytes(), user.as_str().as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(&order.to_bytes());
        mac.update(&expires_unix.to_be_bytes());
        mac
    }

    /// A token for this user, sale and a fresh order, valid until `expires_at` (second
    /// precision): `{expiry}.{order ulid}.{tag}`.
    pub fn issue(&self, sale: &SaleId, user: &UserId, expires_at: DateTime<Utc>) -> String {
        self.issue_for_order(sale, user, Ulid::new(), expires_at)
    }

    /// A token as [`Self::issue`]'s, naming `order`: a path that must always buy the
    /// same order (one from a solved challenge) gets it from here.
    pub fn issue_for_order(
        &self,
        sale: &SaleId,
        user: &UserId,
        order: Ulid,
        expires_at: DateTime<Utc>,
    ) -> String {
        let expires_unix = expires_at.timestamp();
        let tag = self
            .mac(sale, user, order, expires_unix)
            .finalize()
            .into_bytes();
        format!("{expires_unix}.{order}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// A key for another use of this secret, named by `purpose` (HMAC of it under the
    /// secret): the grab path and, say, the challenge then share one secret to rotate
    /// without sharing a key.
    pub fn subkey(&self, purpose: &str) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        mac.update(b"flashsale subkey\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The order a token grabs, if `token` was issued by this signer to this user for
    /// this sale and has not expired. The tag is compared in constant time.
    pub fn verify(
        &self,
        token: &str,
        sale: &SaleId,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Option<OrderId> {
        self.check(token, sale, user, now).ok()
    }

    /// As [`GrabTokenSigner::verify`], saying why a token is refused: only a genuine
    /// one that expired is worth a look at its sale (to tell its buyer the sale ended);
    /// anything else costs nothing but this check.
    pub fn check(
        &self,
        token: &str,
        sale: &SaleId,
        user: &UserId,
        now: DateTime<Utc>,
    ) -> Result<OrderId, PathRefusal> {
        let mut parts = token.splitn(3, '.');
        let (Some(expiry), Some(order), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(PathRefusal::Forged);
        };
        let expires_unix = expiry.parse::<i64>().map_err(|_| PathRefusal::Forged)?;
        let order = Ulid::from_string(order).map_err(|_| PathRefusal::Forged)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| PathRefusal::Forged)?;
        self.mac(sale, user, order, expires_unix)
            .verify_slice(&tag)
            .map_err(|_| PathRefusal::Forged)?;
        if expires_unix <= now.timestamp() {
            return Err(PathRefusal::Expired);
        }
        Ok(OrderId::from_parts(sale.clone(), order))
    }
}

/// Why [`GrabTokenSigner::check`] refused a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRefusal {
    /// Not issued by this signer to this user for this sale: forged, or junk.
    Forged,
    /// Issued as it says, and past its expiry.
    Expired,
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn signer() -> GrabTokenSigner {
        GrabTokenSigner::new(vec![7u8; 32]).unwrap()
    }

    #[test]
    fn a_token_is_valid_only_for_its_user_sale_and_lifetime() {
        let now = Utc::now();
        let sale = SaleId::parse("s1").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let bob = UserId::parse("bob").unwrap();
        let token = signer().issue(&sale, &alice, now + Duration::seconds(60));

        let order = signer().verify(&token, &sale, &alice, now).expect("valid");
        assert_eq!(order.sale_id(), &sale);
        assert_eq!(
            signer().verify(&token, &sale, &alice, now),
            Some(order),
            "stable"
        );
        assert!(signer().verify(&token, &sale, &bob, now).is_none());
        assert!(
            signer()
                .verify(&token, &SaleId::parse("s2").unwrap(), &alice, now)
                .is_none()
        );
        assert!(
            signer()
                .verify(&token, &sale, &alice, now + Duration::seconds(61))
                .is_none()
        );
        let other_key = GrabTokenSigner::new(vec![8u8; 32]).unwrap();
        assert!(other_key.verify(&token, &sale, &alice, now).is_none());
    }

    #[test]
    fn forged_and_garbled_tokens_are_rejected() {
        let now = Utc::now();
        let sale = SaleId::parse("s1").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let token = signer().issue(&sale, &alice, now + Duration::seconds(60));
        let later = (now + Duration::seconds(3600)).timestamp();
        let extended = format!("{later}.{}", token.split_once('.').unwrap().1);
        let (head, tag) = token.rsplit_once('.').unwrap();
        let (expiry, _) = head.split_once('.').unwrap();
        let other_order = format!("{expiry}.{}.{tag}", Ulid::new());
        for forged in ["", "abc", "123.", "x.y", "1.2.3", &extended, &other_order] {
            assert!(
                signer().verify(forged, &sale, &alice, now).is_none(),
                "{forged:?}"
            );
        }
    }

    #[test]
    fn every_token_names_a_fresh_order() {
        let now = Utc::now();
        let sale = SaleId::parse("s1").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let expires = now + Duration::seconds(60);
        let first = signer().issue(&sale, &alice, expires);
        let second = signer().issue(&sale, &alice, expires);
        assert_ne!(
            signer().verify(&first, &sale, &alice, now),
            signer().verify(&second, &sale, &alice, now)
        );
    }

    #[test]
    fn subkeys_differ_by_purpose_and_from_the_tokens_key() {
        let (challenge, other) = (signer().subkey("challenge"), signer().subkey("other"));
        assert_ne!(challenge, other);
        assert_eq!(challenge, signer().subkey("challenge"));
        assert_ne!(challenge, [7u8; 32]);
    }

    #[test]
    fn a_token_for_a_given_order_names_that_order() {
        let now = Utc::now();
        let sale = SaleId::parse("s1").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let order = Ulid::new();
        let token = signer().issue_for_order(&sale, &alice, order, now + Duration::seconds(60));
        assert_eq!(
            signer().verify(&token, &sale, &alice, now),
            Some(OrderId::from_parts(sale.clone(), order))
        );
    }

    #[test]
    fn short_secrets_are_refused() {
        assert_eq!(GrabTokenSigner::new(vec![1u8; 31]).unwrap_err(), WeakSecret);
    }
}
