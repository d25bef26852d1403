//! The dynamic grab path. The grab URL is only handed out once the sale is active, and
//! its token is an HMAC over (sale, user, expiry), so it cannot be guessed before the
//! start, nor reused by another user.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ids::{SaleId, UserId};

type HmacSha256 = Hmac<Sha256>;

/// At least this many bytes of secret: shorter keys make the MAC guessable.
pub const MIN_SECRET_LEN: usize = 32;

#[derive(Clone)]
pub struct GrabTokenSigner {
    key: Vec<u8>,
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
        Ok(Self { key })
    }

    fn mac(&self, sale: &SaleId, user: &UserId, expires_unix: i64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC accepts any key length");
        // Lengths first, so no two (sale, user) pairs can produce the same message.
        for part in [sale.as_str().as_bytes(), user.as_str().as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(&expires_unix.to_be_bytes());
        mac
    }

    /// A token for this user and sale, valid until `expires_at` (second precision).
    pub fn issue(&self, sale: &SaleId, user: &UserId, expires_at: DateTime<Utc>) -> String {
        let expires_unix = expires_at.timestamp();
        let tag = self.mac(sale, user, expires_unix).finalize().into_bytes();
        format!("{expires_unix}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// Whether `token` was issued by this signer to this user for this sale and has not
    /// expired. The tag is compared in constant time.
    pub fn verify(&self, token: &str, sale: &SaleId, user: &UserId, now: DateTime<Utc>) -> bool {
        let Some((expiry, tag)) = token.split_once('.') else {
            return false;
        };
        let Ok(expires_unix) = expiry.parse::<i64>() else {
            return false;
        };
        let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else {
            return false;
        };
        expires_unix > now.timestamp()
            && self
                .mac(sale, user, expires_unix)
                .verify_slice(&tag)
                .is_ok()
    }
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

        assert!(signer().verify(&token, &sale, &alice, now));
        assert!(!signer().verify(&token, &sale, &bob, now));
        assert!(!signer().verify(&token, &SaleId::parse("s2").unwrap(), &alice, now));
        assert!(!signer().verify(&token, &sale, &alice, now + Duration::seconds(61)));
        let other_key = GrabTokenSigner::new(vec![8u8; 32]).unwrap();
        assert!(!other_key.verify(&token, &sale, &alice, now));
    }

    #[test]
    fn forged_and_garbled_tokens_are_rejected() {
        let now = Utc::now();
        let sale = SaleId::parse("s1").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let token = signer().issue(&sale, &alice, now + Duration::seconds(60));
        let later = (now + Duration::seconds(3600)).timestamp();
        let extended = format!("{later}.{}", token.split_once('.').unwrap().1);
        for forged in ["", "abc", "123.", "x.y", extended.as_str()] {
            assert!(!signer().verify(forged, &sale, &alice, now), "{forged:?}");
        }
    }

    #[test]
    fn short_secrets_are_refused() {
        assert_eq!(GrabTokenSigner::new(vec![1u8; 31]).unwrap_err(), WeakSecret);
    }
}
