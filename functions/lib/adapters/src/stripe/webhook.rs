//! Stripe's webhooks: the `Stripe-Signature` check and the event's envelope.
//!
//! Stripe signs `"{t}.{payload}"` with HMAC-SHA256 under the endpoint's signing secret
//! and sends `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]` (several `v1`
//! while a secret is being rolled). An event is taken only if one `v1` matches, compared
//! in constant time, and `t` is within the tolerance of now: an old request replayed is
//! refused even with a valid signature.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use flashsale_domain::payment::PaymentId;

/// Stripe's own libraries' default: five minutes either way.
pub const SIGNATURE_TOLERANCE: chrono::Duration = chrono::Duration::minutes(5);

/// Why a webhook request is refused. Each is a 400, and nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Stripe-Signature header is missing or has no t= and v1= parts")]
    Malformed,
    #[error("the signature's timestamp is more than {0} seconds from now")]
    Stale(i64),
    #[error("no v1 signature matches the payload")]
    Mismatch,
}

/// Checks `header` (the `Stripe-Signature` value) over `payload` (the request body as
/// received, byte for byte) under `secret` (`whsec_...`), at `now`.
pub fn verify(
    payload: &[u8],
    header: &str,
    secret: &str,
    now: DateTime<Utc>,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => signatures.extend(hex::decode(value).ok()),
            _ => {}
        }
    }
    let (Some(timestamp), false) = (timestamp, signatures.is_empty()) else {
        return Err(SignatureError::Malformed);
    };
    if (now.timestamp() - timestamp).abs() > SIGNATURE_TOLERANCE.num_seconds() {
        return Err(SignatureError::Stale(SIGNATURE_TOLERANCE.num_seconds()));
    }
    let signed = |signature: &[u8]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(payload);
        // `verify_slice` compares in constant time.
        mac.verify_slice(signature).is_ok()
    };
    if signatures.iter().any(|signature| signed(signature)) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The value of a `Stripe-Signature` header for `payload` at `timestamp`: what Stripe
/// sends, for tests and local tools that play Stripe.
pub fn sign(payload: &[u8], secret: &str, timestamp: i64) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// What of an event the settlement needs: which event (to take each once), and which
/// payment it is about. Its `data.object` is the payment as it was when the event was
/// made; events come late and out of order, so the settlement reads the payment anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEvent {
    pub id: String,
    /// `payment_intent.amount_capturable_updated`, `payment_intent.succeeded`...
    pub kind: String,
    /// The PaymentIntent the event is about, if it is about one.
    pub payment: Option<PaymentId>,
}

/// Reads a verified payload; `None` if it is not a Stripe event.
pub fn event(payload: &[u8]) -> Option<WebhookEvent> {
    #[derive(Deserialize)]
    struct Envelope {
        id: String,
        #[serde(rename = "type")]
        kind: String,
        data: Data,
    }
    #[derive(Deserialize)]
    struct Data {
        object: Object,
    }
    #[derive(Deserialize)]
    struct Object {
        id: String,
        object: String,
        #[serde(default)]
        payment_intent: Option<String>,
    }
    let envelope: Envelope = serde_json::from_slice(payload).ok()?;
    let object = envelope.data.object;
    let payment = match object.object.as_str() {
        "payment_intent" => Some(PaymentId::new(object.id)),
        // A charge or a refund names its PaymentIntent.
        _ => object.payment_intent.map(PaymentId::new),
    };
    Some(WebhookEvent {
        id: envelope.id,
        kind: envelope.kind,
        payment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret";

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).expect("in range")
    }

    #[test]
    fn a_signature_stripe_made_verifies_and_any_change_does_not() {
        let payload = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;
        let header = sign(payload, SECRET, 1_700_000_000);
        assert_eq!(verify(payload, &header, SECRET, at(1_700_000_100)), Ok(()));

        let mut altered = payload.to_vec();
        altered[8] = b'2';
        assert_eq!(
            verify(&altered, &header, SECRET, at(1_700_000_100)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(payload, &header, "whsec_other", at(1_700_000_100)),
            Err(SignatureError::Mismatch)
        );
        let moved = header.replace("t=1700000000", "t=1700000001");
        assert_eq!(
            verify(payload, &moved, SECRET, at(1_700_000_100)),
            Err(SignatureError::Mismatch),
            "the timestamp is signed too"
        );
    }

    #[test]
    fn a_signature_outside_five_minutes_is_stale() {
        let payload = b"{}";
        let header = sign(payload, SECRET, 1_700_000_000);
        assert!(verify(payload, &header, SECRET, at(1_700_000_300)).is_ok());
        assert_eq!(
            verify(payload, &header, SECRET, at(1_700_000_301)),
            Err(SignatureError::Stale(300))
        );
        assert_eq!(
            verify(payload, &header, SECRET, at(1_699_999_699)),
            Err(SignatureError::Stale(300))
        );
    }

    #[test]
    fn any_of_several_v1_signatures_may_match_and_a_header_without_one_is_malformed() {
        let payload = b"{}";
        let good = sign(payload, SECRET, 1_700_000_000);
        let v1 = good.split_once(",v1=").expect("v1").1;
        let rolled = format!("t=1700000000,v1={},v0=ignored,v1={v1}", "00".repeat(32));
        assert_eq!(verify(payload, &rolled, SECRET, at(1_700_000_000)), Ok(()));
        for header in ["", "t=1700000000", "v1=abcd", "t=x,v1=zz", "garbage"] {
            assert_eq!(
                verify(payload, header, SECRET, at(1_700_000_000)),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
    }

    #[test]
    fn an_event_names_its_payment_whether_about_the_intent_or_its_charge() {
        let intent = br#"{"id":"evt_1","type":"payment_intent.amount_capturable_updated","data":{"object":{"id":"pi_1","object":"payment_intent"}}}"#;
        assert_eq!(
            event(intent),
            Some(WebhookEvent {
                id: "evt_1".into(),
                kind: "payment_intent.amount_capturable_updated".into(),
                payment: Some(PaymentId::new("pi_1")),
            })
        );
        let charge = br#"{"id":"evt_2","type":"charge.refunded","data":{"object":{"id":"ch_1","object":"charge","payment_intent":"pi_1"}}}"#;
        assert_eq!(
            event(charge).and_then(|e| e.payment),
            Some(PaymentId::new("pi_1"))
        );
        assert_eq!(event(b"not json"), None);
    }
}
