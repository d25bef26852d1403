//! Card payments on the local stack. With a local Stripe among the emulators (the
//! patched localstripe `flashsale-emulators` starts), the stack runs the template with
//! `CardPayments=stripe` and `StripeApiBase` and `StripeJsOrigin` pointed at it, puts test keys into the
//! template's Stripe keys secret before any function starts, and registers its webhook
//! endpoint with the local Stripe once the API listens: what an operator does by hand
//! on AWS (docs/deploy.md), done at every start because localstripe keeps webhooks in
//! memory.

use std::collections::BTreeMap;

use crate::model::StackModel;
use crate::resolve::ParamValue;

/// The template's parameters this module sets, unless the caller set them.
pub const CARD_PAYMENTS: &str = "CardPayments";
pub const STRIPE_API_BASE: &str = "StripeApiBase";
pub const STRIPE_JS_ORIGIN: &str = "StripeJsOrigin";
/// The template's secret of the keys.
pub const KEYS_SECRET: &str = "StripeKeysSecret";
/// Test keys: localstripe takes any key of the right kind.
pub const SECRET_KEY: &str = "sk_test_flashsale_local";
pub const PUBLISHABLE_KEY: &str = "pk_test_flashsale_local";
/// Stripe.js, as the local Stripe serves it: the pages' `config.json` names it.
pub fn stripe_js(endpoint: &str) -> String {
    format!("{endpoint}/js.stripe.com/v3/")
}

/// Where Stripe delivers events, under the API.
pub const WEBHOOK_PATH: &str = "/payments/stripe/webhook";

/// Why the local Stripe could not be wired.
#[derive(Debug, thiserror::Error)]
pub enum LocalStripeError {
    #[error("could not put the local Stripe keys into {secret}")]
    PutKeys {
        secret: String,
        #[source]
        source: Box<aws_sdk_secretsmanager::Error>,
    },
    #[error("could not register the webhook {url} with the local Stripe at {stripe}")]
    Register {
        stripe: String,
        url: String,
        #[source]
        source: reqwest::Error,
    },
}

/// `overrides` with card payments through the local Stripe at `endpoint`, where the
/// template has the parameters and the caller did not set them.
pub fn with_card_payments(
    overrides: &BTreeMap<String, String>,
    declared: impl Fn(&str) -> bool,
    endpoint: &str,
) -> BTreeMap<String, String> {
    let mut overrides = overrides.clone();
    for (name, value) in [
        (CARD_PAYMENTS, "stripe"),
        (STRIPE_API_BASE, endpoint),
        (STRIPE_JS_ORIGIN, endpoint),
    ] {
        if declared(name) {
            overrides
                .entry(name.to_owned())
                .or_insert_with(|| value.to_owned());
        }
    }
    overrides
}

/// The webhook's signing secret for one run: random, as Stripe's per endpoint.
pub fn new_webhook_secret() -> String {
    use rand::Rng;
    let random: String = rand::rng()
        .sample_iter(&rand::distr::Alphanumeric)
        .take(32)
        .map(char::from)
        .collect();
    format!("whsec_{random}")
}

/// Whether the stack as built takes card payments and has the keys' secret.
pub fn takes_card_payments(model: &StackModel) -> bool {
    model.parameters.get(CARD_PAYMENTS) == Some(&ParamValue::String("stripe".to_owned()))
        && model.secret(KEYS_SECRET).is_some()
}

/// Puts the local keys into the stack's keys secret, before any function reads it.
pub async fn put_keys(
    client: &aws_sdk_secretsmanager::Client,
    model: &StackModel,
    webhook_secret: &str,
) -> Result<(), LocalStripeError> {
    let Some(secret) = model.secret(KEYS_SECRET) else {
        return Ok(());
    };
    let keys = serde_json::json!({
        "secret_key": SECRET_KEY,
        "publishable_key": PUBLISHABLE_KEY,
        "webhook_secret": webhook_secret,
    });
    client
        .put_secret_value()
        .secret_id(&secret.name)
        .secret_string(keys.to_string())
        .send()
        .await
        .map_err(|error| LocalStripeError::PutKeys {
            secret: secret.name.clone(),
            source: Box::new(error.into()),
        })?;
    Ok(())
}

/// Removes the stack `id`'s webhook from the local Stripe at `stripe` (our launcher's
/// `DELETE /_config/webhooks/{id}`), so that a local Stripe shared by many stacks posts
/// only to stacks that are up. From any context, a `Drop` included: on a thread of its
/// own, for at most two seconds; a local Stripe already gone is fine.
pub fn unregister_webhook(stripe: &str, id: &str) {
    let url = format!("{stripe}/_config/webhooks/{id}");
    let removed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            reqwest::Client::new()
                .delete(&url)
                .timeout(std::time::Duration::from_secs(2))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map(drop)
                .map_err(std::io::Error::other)
        })
    })
    .join();
    if let Ok(Err(error)) = removed {
        tracing::debug!(%error, "the webhook was not removed from the local Stripe");
    }
}

/// Registers `api_url`'s webhook path with the local Stripe at `stripe`, under the
/// stack's own id: stacks sharing one local Stripe each get every event, and ignore
/// (refuse) the payments that are not theirs.
pub async fn register_webhook(
    stripe: &str,
    id: &str,
    api_url: &str,
    webhook_secret: &str,
) -> Result<(), LocalStripeError> {
    let url = format!("{api_url}{WEBHOOK_PATH}");
    let failed = |source| LocalStripeError::Register {
        stripe: stripe.to_owned(),
        url: url.clone(),
        source,
    };
    reqwest::Client::new()
        .post(format!("{stripe}/_config/webhooks/{id}"))
        .form(&[("url", url.as_str()), ("secret", webhook_secret)])
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(failed)?;
    tracing::info!(%url, stripe, "webhook registered with the local Stripe");
    Ok(())
}
