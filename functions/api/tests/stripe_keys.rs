//! The api's cold start with card payments on: the Stripe keys are read from Secrets
//! Manager (moto) once. A secret that cannot be read fails the start, naming it; one read
//! whole that holds no usable keys (not JSON, or still the template's empty shape) is
//! contained: found misconfigured, naming the secret and the key, and the api starts with
//! its payment routes answering 503 while everything else serves.

use std::collections::HashMap;

use flashsale_api::{Config, Deps, handler};
use flashsale_lambda::testing::{ApiEvent, assert_refused};
use flashsale_lambda::{
    CardPayments, Clients, FromEnv as _, PaymentsInitError, SecretError, cold_start,
};

async fn secret_holding(value: &str) -> String {
    flashsale_emulators::shared()
        .await
        .secret_holding(value)
        .await
}

fn config(secret_arn: &str) -> Config {
    let vars: HashMap<&str, &str> = [
        ("TABLE_NAME", "unused"),
        ("SCHEDULE_GROUP_NAME", "unused"),
        ("STRIPE_API_BASE", "http://127.0.0.1:9"),
        ("STRIPE_SECRET_ARN", secret_arn),
    ]
    .into_iter()
    .collect();
    Config::from_lookup(|var| vars.get(var).map(|v| (*v).to_owned())).unwrap()
}

async fn start(secret_arn: &str) -> Result<Deps, PaymentsInitError> {
    let sdk = flashsale_emulators::shared().await.sdk_config().await;
    cold_start::<Deps>(&config(secret_arn), &sdk).await
}

/// What the cold start finds in the secret `secret_arn`.
async fn found(secret_arn: &str) -> Result<CardPayments, PaymentsInitError> {
    let sdk = flashsale_emulators::shared().await.sdk_config().await;
    let clients = Clients::within(flashsale_api::SDK_BUDGET, &sdk);
    flashsale_lambda::stripe_keys::read_if_on(Some(secret_arn), &clients).await
}

/// Why the secret's keys are unusable.
async fn misconfigured(secret_arn: &str) -> PaymentsInitError {
    match found(secret_arn).await {
        Ok(CardPayments::Misconfigured(error)) => error,
        other => panic!("{secret_arn}: not found misconfigured: {other:?}"),
    }
}

#[tokio::test]
async fn the_keys_are_read_at_the_cold_start_and_a_bad_secret_is_named_and_contained() {
    let good = secret_holding(
        r#"{"secret_key": "sk_test_1", "publishable_key": "pk_test_1", "webhook_secret": "whsec_1"}"#,
    )
    .await;
    assert!(start(&good).await.is_ok());

    let restricted = secret_holding(
        r#"{"secret_key": "rk_test_1", "publishable_key": "pk_test_1", "webhook_secret": "whsec_1"}"#,
    )
    .await;
    assert!(start(&restricted).await.is_ok(), "a restricted key will do");

    let shape =
        secret_holding(r#"{"secret_key": "", "publishable_key": "", "webhook_secret": ""}"#).await;
    let unset = misconfigured(&shape).await;
    assert!(
        matches!(&unset, PaymentsInitError::KeyUnset { arn, key: "secret_key", .. } if *arn == shape),
        "{unset:?}"
    );
    let swapped = secret_holding(
        r#"{"secret_key": "sk_test_1", "publishable_key": "sk_test_1", "webhook_secret": "whsec_1"}"#,
    )
    .await;
    let error = misconfigured(&swapped).await;
    assert!(
        matches!(
            &error,
            PaymentsInitError::KeyUnset {
                key: "publishable_key",
                ..
            }
        ),
        "{error:?}"
    );
    // The secret key never reaches the error's text.
    assert!(!flashsale_lambda::failure::error_chain(&error).contains("sk_test_1"));

    let not_json = secret_holding("sk_test_1").await;
    let error = misconfigured(&not_json).await;
    let quoted = secret_holding(r#""sk_test_quoted""#).await;
    let string = misconfigured(&quoted).await;
    assert!(
        !flashsale_lambda::failure::error_chain(&string).contains("sk_test_quoted"),
        "the value stays out of the error: {string:?}"
    );
    assert!(
        matches!(&error, PaymentsInitError::Keys { arn, .. } if *arn == not_json),
        "{error:?}"
    );

    let gone = format!("{good}-never-created");
    let error = start(&gone).await.err().expect("no such secret");
    assert!(
        matches!(&error, PaymentsInitError::Secret(SecretError::Unreadable { arn, .. }) if *arn == gone),
        "{error:?}"
    );

    // The api starts all the same: only its payment routes refuse, 503, not a 5xx of a
    // failed start on every route.
    let deps = start(&shape)
        .await
        .expect("a misconfigured secret is contained");
    let response = handler(
        &deps,
        ApiEvent::fixture("api-open-payment.json").into_request(),
    )
    .await
    .unwrap();
    assert_refused(&response, 503, "payment_unavailable");
}
