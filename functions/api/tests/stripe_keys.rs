//! The api's cold start with card payments on: the Stripe keys are read from Secrets
//! Manager (moto) once, and a secret that is missing, not JSON, or still the template's
//! empty shape fails the start, naming the secret and the key.

use std::collections::HashMap;

use flashsale_api::{Config, Deps};
use flashsale_lambda::{FromEnv as _, PaymentsInitError, SecretError, cold_start};

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

#[tokio::test]
async fn the_keys_are_read_at_the_cold_start_and_a_bad_secret_fails_it_naming_what() {
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
    let unset = start(&shape)
        .await
        .err()
        .expect("the template's shape is no keys");
    assert!(
        matches!(&unset, PaymentsInitError::KeyUnset { arn, key: "secret_key", .. } if *arn == shape),
        "{unset:?}"
    );
    let swapped = secret_holding(
        r#"{"secret_key": "sk_test_1", "publishable_key": "sk_test_1", "webhook_secret": "whsec_1"}"#,
    )
    .await;
    let error = start(&swapped)
        .await
        .err()
        .expect("a secret key where the public one goes");
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
    let error = start(&not_json).await.err().expect("not JSON");
    let quoted = secret_holding(r#""sk_test_quoted""#).await;
    let string = start(&quoted)
        .await
        .err()
        .expect("a JSON string, not an object");
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
}
