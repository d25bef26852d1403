//! Stripe's side of the tests: Stripe's adapter on the shared localstripe, and the
//! buyer's steps that Stripe.js takes on the page.

use std::time::Duration;

use flashsale_adapters::stripe::{StripeConfig, StripePayments};
use flashsale_domain::payment::Payment;

pub const SECRET_KEY: &str = "sk_test_flashsale";

pub async fn endpoint() -> String {
    flashsale_emulators::shared().await.stripe_endpoint.clone()
}

pub fn payments(api_base: String, secret_key: &str) -> StripePayments {
    StripePayments::new(StripeConfig {
        api_base,
        secret_key: secret_key.to_owned(),
        timeout: Duration::from_secs(5),
    })
    .expect("the TLS roots load")
}

pub async fn stripe() -> StripePayments {
    payments(endpoint().await, SECRET_KEY)
}

/// The buyer's side: a test card attached and the payment confirmed, as Stripe.js does
/// on the page. Manual capture leaves it authorised.
pub async fn authorise(payment: &Payment) {
    authorise_with(payment, "4242424242424242").await;
}

/// [`authorise`] with one of Stripe's test cards (`4000000000007726`: a refund of it
/// begins pending; `4000000000005126`: one succeeds, then fails).
pub async fn authorise_with(payment: &Payment, card: &str) {
    let http = reqwest::Client::new();
    let base = endpoint().await;
    let method: serde_json::Value = http
        .post(format!("{base}/v1/payment_methods"))
        .bearer_auth(SECRET_KEY)
        .form(&[
            ("type", "card"),
            ("card[number]", card),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ])
        .send()
        .await
        .expect("localstripe answers")
        .error_for_status()
        .expect("a card")
        .json()
        .await
        .expect("JSON");
    let method = method["id"].as_str().expect("an id");
    for (path, form) in [
        (String::new(), vec![("payment_method", method)]),
        ("/confirm".to_owned(), vec![]),
    ] {
        http.post(format!("{base}/v1/payment_intents/{}{path}", payment.id))
            .bearer_auth(SECRET_KEY)
            .form(&form)
            .send()
            .await
            .expect("localstripe answers")
            .error_for_status()
            .expect("the buyer's step is taken");
    }
}

/// A restricted key (`rk_test_...`) with just `permissions` (Stripe's names:
/// `rak_payment_intent_write`, ...), registered with the local Stripe as the dashboard
/// makes one.
pub async fn restricted_key(permissions: &[&str]) -> String {
    let key = format!("rk_test_{}", flashsale_emulators::unique_suffix());
    let form: Vec<(&str, &str)> = permissions
        .iter()
        .map(|permission| ("permissions[]", *permission))
        .collect();
    reqwest::Client::new()
        .post(format!(
            "{}/_config/restricted_keys/{key}",
            endpoint().await
        ))
        .form(&form)
        .send()
        .await
        .expect("localstripe answers")
        .error_for_status()
        .expect("the key is registered");
    key
}
