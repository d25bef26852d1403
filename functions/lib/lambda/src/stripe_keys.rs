//! The Stripe keys a function that settles payments reads once per cold start (see
//! [`SecretsManagerSecret`]): the api's, and the reconciler's.

use std::time::Duration;

use flashsale_adapters::stripe::{StripeConfig, StripeError, StripePayments};
use serde::Deserialize;

use crate::{Clients, SecretError, SecretsManagerSecret};

/// How long one call to Stripe may take. A confirmation makes two (read the
/// PaymentIntent, capture it) besides the table's few, inside the function's 10 s.
pub const STRIPE_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// The Stripe keys: one Secrets Manager secret, a JSON object of the three (see
/// docs/deploy.md), read once per cold start.
#[derive(Clone, Deserialize)]
pub struct StripeKeys {
    /// `sk_live_...`/`sk_test_...`: the API calls.
    pub secret_key: String,
    /// `pk_live_...`/`pk_test_...`: handed to the page with the client secret.
    pub publishable_key: String,
    /// `whsec_...`: the webhook endpoint's signing secret.
    pub webhook_secret: String,
}

impl std::fmt::Debug for StripeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the public key may reach a log line.
        f.debug_struct("StripeKeys")
            .field("publishable_key", &self.publishable_key)
            .finish_non_exhaustive()
    }
}

/// Why the payments could not be set up. A secret that cannot be read, or a Stripe
/// client that cannot be built, fails the cold start (Lambda starts it again on the next
/// request: a throttled or timed-out read heals that way). A secret read whole that holds
/// no usable keys is [`CardPayments::Misconfigured`] instead: contained to the payments.
#[derive(Debug, thiserror::Error)]
pub enum PaymentsInitError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// Only where the JSON went wrong: serde's own message can quote the value, which
    /// may be a key.
    #[error(
        "the Stripe secret {arn} is not a JSON object of secret_key, publishable_key and webhook_secret ({category:?} error at line {line}, column {column})"
    )]
    Keys {
        arn: String,
        category: serde_json::error::Category,
        line: usize,
        column: usize,
    },
    /// A key is empty or not of its kind (a publishable key where the secret key goes,
    /// say): the secret still holds the template's shape, or was filled in wrong.
    #[error("the Stripe secret {arn}'s {key} is not set to a {prefix}... key")]
    KeyUnset {
        arn: String,
        key: &'static str,
        prefix: &'static str,
    },
    #[error("the Stripe client could not be built")]
    Stripe(#[from] StripeError),
}

impl StripeKeys {
    /// The keys `secret` holds.
    pub async fn read(secret: &SecretsManagerSecret) -> Result<Self, PaymentsInitError> {
        let arn = secret.arn();
        let keys: Self = serde_json::from_slice(&secret.value().await?).map_err(|error| {
            PaymentsInitError::Keys {
                arn: arn.to_owned(),
                category: error.classify(),
                line: error.line(),
                column: error.column(),
            }
        })?;
        keys.checked()
            .map_err(|(key, prefix)| PaymentsInitError::KeyUnset {
                arn: arn.to_owned(),
                key,
                prefix,
            })
    }

    /// The keys, if each has its kind's prefix: the key's name and prefix otherwise.
    fn checked(self) -> Result<Self, (&'static str, &'static str)> {
        // A restricted key (`rk_`) may stand for the secret key: the least it needs is
        // PaymentIntents write.
        let kinds: [(&str, &String, &[&str]); 3] = [
            ("secret_key", &self.secret_key, &["sk_", "rk_"]),
            ("publishable_key", &self.publishable_key, &["pk_"]),
            ("webhook_secret", &self.webhook_secret, &["whsec_"]),
        ];
        for (key, value, prefixes) in kinds {
            let of_its_kind = prefixes
                .iter()
                .any(|prefix| value.len() > prefix.len() && value.starts_with(prefix));
            if !of_its_kind {
                return Err((key, prefixes[0]));
            }
        }
        Ok(self)
    }

    /// Stripe at `api_base`, as the [`PaymentProvider`].
    pub fn provider(&self, api_base: &str) -> Result<StripePayments, StripeError> {
        StripePayments::new(StripeConfig {
            api_base: api_base.to_owned(),
            secret_key: self.secret_key.clone(),
            timeout: STRIPE_CALL_TIMEOUT,
        })
    }
}

/// What a cold start found for card payments.
#[derive(Debug)]
pub enum CardPayments {
    /// No Stripe secret configured: the deployment takes no card payments.
    Off,
    On(StripeKeys),
    /// The secret was read, but holds no usable keys: still the template's shape, or
    /// filled in wrong. Contained: the payment routes answer 503 and the reconciler
    /// settles no payments, counted in `payments_misconfigured` (alarmed) on each, while
    /// grabs, orders and cancels, and the reconciler's repairs of holds, go on.
    /// Fixing the secret takes effect as containers start.
    Misconfigured(PaymentsInitError),
}

/// What the secret `arn` names holds, if the deployment takes card payments (`arn`
/// given). Fails only when the secret cannot be read at all.
pub async fn read_if_on(
    arn: Option<&str>,
    clients: &Clients,
) -> Result<CardPayments, PaymentsInitError> {
    let Some(arn) = arn else {
        return Ok(CardPayments::Off);
    };
    let secret = SecretsManagerSecret::new(clients.sdk_config(), arn);
    match StripeKeys::read(&secret).await {
        Ok(keys) => Ok(CardPayments::On(keys)),
        Err(unreadable @ PaymentsInitError::Secret(_)) => Err(unreadable),
        Err(misconfigured) => {
            tracing::error!(
                error = %misconfigured,
                "card payments are unavailable until the Stripe secret is fixed; everything else runs"
            );
            Ok(CardPayments::Misconfigured(misconfigured))
        }
    }
}
