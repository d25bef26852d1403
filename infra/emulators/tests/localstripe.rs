//! The local Stripe (localstripe, started through `infra/stripe/flashsale_localstripe.py`)
//! against Stripe's documented behaviour, over its HTTP API: the events of a
//! manual-capture payment arrive signed; what Stripe refuses is refused, in Stripe's error
//! shape; an `Idempotency-Key` answers its first answer again; Stripe's test cards behave
//! as Stripe documents them when the page confirms them with the publishable key and the
//! client secret, directly and through the fake Stripe.js; a refund of Stripe's refund test
//! cards moves on to its later status, with its events; each webhook endpoint gets its
//! events on its own, and one can be removed; a restricted key makes only the calls its
//! permissions allow; and the launcher registers its webhook at start.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use flashsale_adapters::stripe::webhook::verify;
use flashsale_emulators::{EmulatorOptions, LocalStripe, StripeWebhook, unique_suffix};
use reqwest::StatusCode;
use serde_json::Value;

const SECRET_KEY: &str = "sk_test_flashsale";
const PUBLISHABLE_KEY: &str = "pk_test_flashsale";
const WEBHOOK_SECRET: &str = "whsec_flashsale_test";
const GOOD_CARD: &str = "4242424242424242";
const DECLINED_CARD: &str = "4000000000000002";
const THREE_D_SECURE_CARD: &str = "4000002500003155";
/// Stripe's refund test card whose refund begins pending and succeeds later.
const REFUND_PENDING_CARD: &str = "4000000000007726";
/// Stripe's refund test card whose refund begins succeeded and fails later.
const REFUND_FAILING_CARD: &str = "4000000000005126";

/// One answer: its status, whether Stripe replayed it for an idempotency key, its JSON.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

impl Answer {
    fn ok(self) -> Value {
        assert_eq!(self.status, StatusCode::OK, "{:#}", self.body);
        self.body
    }

    /// A refusal in Stripe's shape, `{"error": {"type", "code", "message"}}`: its error.
    fn refused(self, status: StatusCode, kind: &str, code: Option<&str>) -> Value {
        assert_eq!(self.status, status, "{:#}", self.body);
        let error = &self.body["error"];
        assert_eq!(error["type"], kind, "{error:#}");
        assert_eq!(error["code"].as_str(), code, "{error:#}");
        assert!(
            !error["message"].as_str().unwrap_or_default().is_empty(),
            "{error:#}"
        );
        error.clone()
    }

    /// Refused as invalid (400, `invalid_request_error`), with `code`.
    fn invalid(self, code: Option<&str>) -> Value {
        self.refused(StatusCode::BAD_REQUEST, "invalid_request_error", code)
    }
}

const UNEXPECTED_STATE: Option<&str> = Some("payment_intent_unexpected_state");

struct Stripe {
    base: String,
    http: reqwest::Client,
}

impl Stripe {
    async fn shared() -> Self {
        Self::at(flashsale_emulators::shared().await.stripe_endpoint.clone())
    }

    fn at(base: String) -> Self {
        Self {
            base,
            http: reqwest::Client::new(),
        }
    }

    async fn send(request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.expect("localstripe answers");
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let body = response.json().await.expect("a JSON answer");
        Answer {
            status,
            replayed,
            body,
        }
    }

    /// A POST with the secret key, as the API does.
    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.keyed(path, None, form).await
    }

    async fn keyed(&self, path: &str, key: Option<&str>, form: &[(&str, &str)]) -> Answer {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(SECRET_KEY)
            .form(form);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        Self::send(request).await
    }

    async fn get(&self, path: &str) -> Answer {
        Self::send(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(SECRET_KEY),
        )
        .await
    }

    /// A POST as the page makes it: no secret key, the publishable one in the form.
    async fn page_post(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        Self::send(self.http.post(format!("{}{path}", self.base)).form(form)).await
    }

    /// A manual-capture PaymentIntent, as the API opens one.
    async fn intent(&self) -> Value {
        self.post(
            "/v1/payment_intents",
            &[
                ("amount", "2500"),
                ("currency", "eur"),
                ("capture_method", "manual"),
                ("payment_method_types[]", "card"),
            ],
        )
        .await
        .ok()
    }

    /// The page confirms `intent` with `card` typed in, as Stripe.js does.
    async fn page_confirm(&self, intent: &Value, card: &str) -> Answer {
        self.page_post(
            &format!("/v1/payment_intents/{}/confirm", id(intent)),
            &[
                ("key", PUBLISHABLE_KEY),
                ("client_secret", secret(intent)),
                ("payment_method_data[type]", "card"),
                ("payment_method_data[card][number]", card),
                ("payment_method_data[card][exp_month]", "12"),
                ("payment_method_data[card][exp_year]", "2034"),
                ("payment_method_data[card][cvc]", "123"),
            ],
        )
        .await
    }

    /// The page reads `intent` back, as `stripe.retrievePaymentIntent` does.
    async fn page_read(&self, intent: &Value) -> Answer {
        Self::send(
            self.http
                .get(format!("{}/v1/payment_intents/{}", self.base, id(intent)))
                .query(&[("key", PUBLISHABLE_KEY), ("client_secret", secret(intent))]),
        )
        .await
    }

    /// A PaymentIntent the buyer authorised with the good card.
    async fn authorised(&self) -> Value {
        let intent = self.intent().await;
        let confirmed = self.page_confirm(&intent, GOOD_CARD).await.ok();
        assert_eq!(confirmed["status"], "requires_capture");
        confirmed
    }

    /// A PaymentIntent paid with `card`: authorised from the page, then captured.
    async fn paid_with(&self, card: &str) -> Value {
        let intent = self.intent().await;
        let confirmed = self.page_confirm(&intent, card).await.ok();
        assert_eq!(confirmed["status"], "requires_capture", "{card}");
        let captured = self.act(&intent, "capture", &[]).await.ok();
        assert_eq!(captured["status"], "succeeded", "{card}");
        captured
    }

    async fn act(&self, intent: &Value, action: &str, form: &[(&str, &str)]) -> Answer {
        self.post(
            &format!("/v1/payment_intents/{}/{action}", id(intent)),
            form,
        )
        .await
    }

    async fn cancel(&self, intent: &Value, reason: &str) -> Answer {
        self.act(intent, "cancel", &[("cancellation_reason", reason)])
            .await
    }

    async fn refund(&self, intent: &Value, form: &[(&str, &str)]) -> Answer {
        let mut form = form.to_vec();
        form.push(("payment_intent", id(intent)));
        self.post("/v1/refunds", &form).await
    }

    /// `refund` as the list of the refunds of `intent` shows it, as the product reads it.
    async fn listed(&self, intent: &Value, refund: &Value) -> Value {
        let list = self
            .get(&format!(
                "/v1/refunds?payment_intent={}&limit=100",
                id(intent)
            ))
            .await
            .ok();
        list["data"]
            .as_array()
            .and_then(|refunds| refunds.iter().find(|listed| listed["id"] == refund["id"]))
            .cloned()
            .unwrap_or_else(|| panic!("{} is listed: {list:#}", id(refund)))
    }

    /// `refund` once the list shows it `status`, waited for up to 10 s.
    async fn listed_once(&self, intent: &Value, refund: &Value, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listed = self.listed(intent, refund).await;
            if listed["status"] == status {
                return listed;
            }
            assert!(
                Instant::now() < deadline,
                "{} still {} after 10 s, not {status}",
                id(refund),
                listed["status"]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn id(object: &Value) -> &str {
    object["id"].as_str().expect("an id")
}

fn secret(intent: &Value) -> &str {
    intent["client_secret"].as_str().expect("a client secret")
}

/// Registers the webhook `id` at `url` on `stripe`, as the launcher and a local stack do.
async fn register(stripe: &Stripe, id: &str, url: &str) {
    let registered = stripe
        .http
        .post(format!("{}/_config/webhooks/{id}", stripe.base))
        .form(&[("url", url), ("secret", WEBHOOK_SECRET)])
        .send()
        .await
        .expect("localstripe answers");
    assert_eq!(registered.status(), StatusCode::OK);
}

/// What a never-answering endpoint was sent on each connection, and whether Stripe's
/// side has closed it since.
type StuckConnections = Arc<Mutex<Vec<(Vec<u8>, bool)>>>;

/// A webhook endpoint on loopback that reads what it is sent and never answers: a stack
/// stuck, or gone with its port taken.
async fn never_answering() -> (String, StuckConnections) {
    use tokio::io::AsyncReadExt as _;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("http://{}/webhook", listener.local_addr().expect("bound"));
    let connections: StuckConnections = Arc::default();
    let kept = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let kept = Arc::clone(&kept);
            let at = {
                let mut all = kept.lock().expect("not poisoned");
                all.push((Vec::new(), false));
                all.len() - 1
            };
            tokio::spawn(async move {
                let mut buffer = [0_u8; 4096];
                while let Ok(n @ 1..) = connection.read(&mut buffer).await {
                    kept.lock().expect("not poisoned")[at]
                        .0
                        .extend_from_slice(&buffer[..n]);
                }
                kept.lock().expect("not poisoned")[at].1 = true;
            });
        }
    });
    (url, connections)
}

/// A webhook endpoint on loopback that keeps every request it gets.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

impl Receiver {
    async fn start() -> Self {
        let got = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&got);
        let app = axum::Router::new().route(
            "/webhook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                kept.lock().expect("not poisoned").push((headers, body));
                async { "" }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!(
            "http://{}/webhook",
            listener.local_addr().expect("bound address")
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, got }
    }

    /// Registered on `stripe`, as the launcher does at start.
    async fn registered(stripe: &Stripe) -> Self {
        let receiver = Self::start().await;
        register(stripe, &format!("test-{}", unique_suffix()), &receiver.url).await;
        receiver
    }

    /// Whether any event about payment `intent` came.
    fn got_any_about(&self, intent: &str) -> bool {
        self.got
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|(_, body)| String::from_utf8_lossy(body).contains(intent))
    }

    /// The event `kind` about payment `intent`, once it has come: its signature verified
    /// under `secret` (the check the API's webhook makes), its payload parsed.
    async fn event(&self, kind: &str, intent: &str, secret: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let found =
                self.got
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .find_map(|(headers, body)| {
                        let event: Value = serde_json::from_slice(body).ok()?;
                        let object = &event["data"]["object"];
                        let about = object["object"] == "payment_intent" && object["id"] == intent
                            || object["payment_intent"] == intent;
                        (event["type"] == kind && about)
                            .then(|| (headers.clone(), body.clone(), event))
                    });
            if let Some((headers, body, event)) = found {
                let signature = headers
                    .get("stripe-signature")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_else(|| panic!("{kind} comes signed"));
                assert_eq!(
                    verify(&body, signature, secret, chrono::Utc::now()),
                    Ok(()),
                    "{kind}: {signature}"
                );
                return event;
            }
            assert!(
                Instant::now() < deadline,
                "no {kind} for {intent} within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn each_step_of_a_manual_capture_payment_sends_its_event_signed() {
    let stripe = Stripe::shared().await;
    let receiver = Receiver::registered(&stripe).await;

    let paid = stripe.authorised().await;
    assert_eq!(paid["amount_capturable"], 2500);
    assert_eq!(
        stripe.act(&paid, "capture", &[]).await.ok()["status"],
        "succeeded"
    );
    stripe.refund(&paid, &[]).await.ok();
    let cancelled = stripe.authorised().await;
    let cancel = stripe
        .cancel(&cancelled, "requested_by_customer")
        .await
        .ok();
    assert_eq!(cancel["status"], "canceled");
    let declined = stripe.intent().await;
    assert_eq!(
        stripe.page_confirm(&declined, DECLINED_CARD).await.status,
        StatusCode::PAYMENT_REQUIRED
    );

    // What each event is about, as it was when sent.
    let object = |kind: &'static str, intent: &Value| {
        let intent = id(intent).to_owned();
        let receiver = &receiver;
        async move { receiver.event(kind, &intent, WEBHOOK_SECRET).await["data"]["object"].clone() }
    };
    let authorised = object("payment_intent.amount_capturable_updated", &paid).await;
    assert_eq!(authorised["status"], "requires_capture");
    assert_eq!(authorised["amount_capturable"], 2500);
    let captured = object("payment_intent.succeeded", &paid).await;
    assert_eq!(captured["status"], "succeeded");
    let charge = object("charge.refunded", &paid).await;
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["refunded"], true);
    assert_eq!(charge["amount_refunded"], 2500);
    let cancel = object("payment_intent.canceled", &cancelled).await;
    assert_eq!(cancel["cancellation_reason"], "requested_by_customer");
    let intent = object("payment_intent.payment_failed", &declined).await;
    assert_eq!(intent["status"], "requires_payment_method");
    assert_eq!(intent["last_payment_error"]["code"], "card_declined");
}

#[tokio::test]
async fn an_endpoint_that_never_answers_holds_up_no_other_endpoints_events() {
    let stripe = Stripe::shared().await;
    let (stuck, connections) = never_answering().await;
    let stuck_id = format!("stuck-{}", unique_suffix());
    register(&stripe, &stuck_id, &stuck).await;
    let receiver = Receiver::registered(&stripe).await;

    let paid = stripe.authorised().await;
    receiver
        .event(
            "payment_intent.amount_capturable_updated",
            id(&paid),
            WEBHOOK_SECRET,
        )
        .await;
    // Delivered while the stuck endpoint's post of the same event still waits for its
    // answer: not after that post gave up, as localstripe alone delivers. (Other tests'
    // events reach the stuck endpoint too, and are given up on in their own time.)
    let this_event = |data: &[u8]| {
        let text = String::from_utf8_lossy(data);
        text.contains(id(&paid)) && text.contains("payment_intent.amount_capturable_updated")
    };
    let given_up: Vec<bool> = connections
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|(data, _)| this_event(data))
        .map(|(_, closed)| *closed)
        .collect();
    assert!(!given_up.contains(&true), "{given_up:?}");
    stripe
        .http
        .delete(format!("{}/_config/webhooks/{stuck_id}", stripe.base))
        .send()
        .await
        .expect("localstripe answers");
}

#[tokio::test]
async fn a_removed_webhook_gets_no_more_events() {
    let stripe = Stripe::shared().await;
    let removed = Receiver::start().await;
    let removed_id = format!("removed-{}", unique_suffix());
    register(&stripe, &removed_id, &removed.url).await;
    let kept = Receiver::registered(&stripe).await;
    let remove = || async {
        let answer = stripe
            .http
            .delete(format!("{}/_config/webhooks/{removed_id}", stripe.base))
            .send()
            .await
            .expect("localstripe answers");
        assert_eq!(answer.status(), StatusCode::OK);
        answer.json::<Value>().await.expect("JSON")
    };
    assert_eq!(remove().await["deleted"], true);
    assert_eq!(remove().await["deleted"], false, "removed already");

    let paid = stripe.authorised().await;
    kept.event(
        "payment_intent.amount_capturable_updated",
        id(&paid),
        WEBHOOK_SECRET,
    )
    .await;
    // Every endpoint's post starts at once: had the removed one been sent the event, it
    // would have it by now too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!removed.got_any_about(id(&paid)));
}

#[tokio::test]
async fn only_an_authorised_payment_is_captured_and_only_an_open_one_cancelled() {
    let stripe = Stripe::shared().await;
    let unexpected = |answer: Answer| answer.invalid(UNEXPECTED_STATE);

    let never_confirmed = stripe.intent().await;
    let error = unexpected(stripe.act(&never_confirmed, "capture", &[]).await);
    assert_eq!(
        error["payment_intent"]["status"], "requires_payment_method",
        "the error carries the PaymentIntent"
    );

    let cancelled = stripe.authorised().await;
    let bad_reason = stripe.cancel(&cancelled, "bored").await.invalid(None);
    assert_eq!(bad_reason["param"], "cancellation_reason");
    stripe.cancel(&cancelled, "abandoned").await.ok();
    unexpected(stripe.act(&cancelled, "capture", &[]).await);
    unexpected(stripe.act(&cancelled, "cancel", &[]).await);
    let read = stripe
        .get(&format!("/v1/payment_intents/{}", id(&cancelled)))
        .await
        .ok();
    assert_eq!(read["status"], "canceled");
    assert_eq!(
        read["latest_charge"]["captured"], false,
        "no money moved for the cancelled payment"
    );

    let captured = stripe.authorised().await;
    stripe.act(&captured, "capture", &[]).await.ok();
    unexpected(stripe.act(&captured, "capture", &[]).await);
    unexpected(stripe.act(&captured, "cancel", &[]).await);
}

#[tokio::test]
async fn only_captured_money_is_refunded_and_never_twice() {
    let stripe = Stripe::shared().await;
    let nothing_captured = |answer: Answer| {
        let error = answer.invalid(None);
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("does not have a successful charge to refund")),
            "{error:#}"
        );
    };
    let already_refunded = |answer: Answer| answer.invalid(Some("charge_already_refunded"));

    let never_confirmed = stripe.intent().await;
    nothing_captured(stripe.refund(&never_confirmed, &[]).await);
    let refunds = stripe
        .get(&format!(
            "/v1/refunds?payment_intent={}",
            id(&never_confirmed)
        ))
        .await
        .ok();
    assert_eq!(refunds["data"], Value::Array(vec![]), "none, and no 500");

    let authorised = stripe.authorised().await;
    nothing_captured(stripe.refund(&authorised, &[]).await);
    let charge = authorised["latest_charge"]["id"]
        .as_str()
        .expect("a charge");
    nothing_captured(stripe.post("/v1/refunds", &[("charge", charge)]).await);
    stripe.act(&authorised, "cancel", &[]).await.ok();
    nothing_captured(stripe.refund(&authorised, &[]).await);

    let captured = stripe.authorised().await;
    stripe.act(&captured, "capture", &[]).await.ok();
    let part = stripe.refund(&captured, &[("amount", "1000")]).await.ok();
    assert_eq!(
        (&part["amount"], &part["payment_intent"]),
        (&1000.into(), &captured["id"])
    );
    assert_eq!(
        part["status"], "succeeded",
        "an ordinary refund is made at once"
    );
    let too_much = stripe
        .refund(&captured, &[("amount", "1501")])
        .await
        .invalid(None);
    assert_eq!(too_much["param"], "amount");
    let rest = stripe.refund(&captured, &[]).await.ok();
    assert_eq!(rest["amount"], 1500, "what was left");
    already_refunded(stripe.refund(&captured, &[]).await);
    let charge = captured["latest_charge"]["id"].as_str().expect("a charge");
    already_refunded(stripe.post("/v1/refunds", &[("charge", charge)]).await);
    let refunds = stripe
        .get(&format!("/v1/refunds?payment_intent={}", id(&captured)))
        .await
        .ok();
    assert_eq!(refunds["data"].as_array().map(Vec::len), Some(2));
    for listed in refunds["data"].as_array().into_iter().flatten() {
        assert_eq!(listed["status"], "succeeded", "{listed:#}");
    }
}

/// The refund event `kind` about payment `intent`, delivered to `receiver` signed: its refund.
async fn refund_event(receiver: &Receiver, kind: &str, intent: &Value) -> Value {
    let event = receiver.event(kind, id(intent), WEBHOOK_SECRET).await;
    let refund = event["data"]["object"].clone();
    assert_eq!(refund["object"], "refund", "{kind}: {refund:#}");
    assert_eq!(
        refund["charge"], intent["latest_charge"]["id"],
        "{kind}: {refund:#}"
    );
    refund
}

#[tokio::test]
async fn a_refund_of_stripes_refund_test_cards_moves_on_later_with_its_event() {
    let stripe = Stripe::shared().await;
    let receiver = Receiver::registered(&stripe).await;

    // Pending at first, succeeded some time later.
    let paid = stripe.paid_with(REFUND_PENDING_CARD).await;
    let refund = stripe.refund(&paid, &[]).await.ok();
    assert_eq!(
        (&refund["status"], &refund["amount"]),
        (&"pending".into(), &2500.into())
    );
    assert_eq!(stripe.listed(&paid, &refund).await["status"], "pending");
    // What is pending is on its way: nothing is left to refund.
    stripe
        .refund(&paid, &[])
        .await
        .invalid(Some("charge_already_refunded"));
    stripe.listed_once(&paid, &refund, "succeeded").await;
    let updated = refund_event(&receiver, "charge.refund.updated", &paid).await;
    assert_eq!(
        (&updated["id"], &updated["status"]),
        (&refund["id"], &"succeeded".into())
    );

    // Succeeded at first, failed some time later: its money is left to refund again.
    let paid = stripe.paid_with(REFUND_FAILING_CARD).await;
    let refund = stripe.refund(&paid, &[]).await.ok();
    assert_eq!(
        (&refund["status"], &refund["amount"]),
        (&"succeeded".into(), &2500.into())
    );
    assert_eq!(stripe.listed(&paid, &refund).await["status"], "succeeded");
    stripe.listed_once(&paid, &refund, "failed").await;
    for kind in ["charge.refund.updated", "refund.failed"] {
        let failed = refund_event(&receiver, kind, &paid).await;
        assert_eq!(
            (&failed["id"], &failed["status"]),
            (&refund["id"], &"failed".into()),
            "{kind}"
        );
    }
    let charge = stripe
        .get(&format!("/v1/payment_intents/{}", id(&paid)))
        .await
        .ok()["latest_charge"]
        .clone();
    assert_eq!(
        (&charge["amount_refunded"], &charge["refunded"]),
        (&0.into(), &false.into()),
        "{charge:#}"
    );
    // (It begins succeeded, and will fail too.)
    let again = stripe.refund(&paid, &[]).await.ok();
    assert_eq!(again["amount"], 2500, "{again:#}");
}

#[tokio::test]
async fn a_payment_intent_is_refused_in_an_amount_or_currency_stripe_cannot_charge() {
    let stripe = Stripe::shared().await;
    let open = |amount: &'static str, currency: &'static str| {
        let stripe = &stripe;
        async move {
            stripe
                .post(
                    "/v1/payment_intents",
                    &[("amount", amount), ("currency", currency)],
                )
                .await
        }
    };
    // Refused with `code` (none for a malformed amount or currency), on `param`.
    let refused = |answer: Answer, code: Option<&str>, param: &str| {
        let error = answer.invalid(code);
        assert_eq!(error["param"], param, "{error:#}");
        error
    };

    for currency in ["xts", "irr"] {
        let error = refused(open("1000", currency).await, None, "currency");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("Invalid currency: {currency}.")),
            "{message}"
        );
    }
    let too_small = Some("amount_too_small");
    let error = refused(open("49", "usd").await, too_small, "amount");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("0.50"),
        "the minimum in dollars: {error:#}"
    );
    assert_eq!(open("50", "usd").await.ok()["amount"], 50);
    // ISK is given with two decimals, always 00; three-decimal amounts end in 0.
    refused(open("1299", "isk").await, None, "amount");
    assert_eq!(open("130000", "isk").await.ok()["amount"], 130_000);
    refused(open("1255", "kwd").await, None, "amount");
    assert_eq!(open("1250", "kwd").await.ok()["amount"], 1250);
    assert_eq!(
        open("1299", "mga").await.ok()["amount"],
        1299,
        "zero-decimal"
    );
    let too_large = Some("amount_too_large");
    refused(open("100000000", "eur").await, too_large, "amount");
    let largest = open("99999999", "eur").await.ok();
    assert_eq!(largest["amount"], 99_999_999);

    // An update is held to the same.
    let update = format!("/v1/payment_intents/{}", id(&largest));
    let update = |form: &'static [(&'static str, &'static str)]| stripe.post(&update, form);
    refused(update(&[("amount", "49")]).await, too_small, "amount");
    refused(update(&[("currency", "xts")]).await, None, "currency");
    let updated = update(&[("amount", "1250"), ("currency", "kwd")])
        .await
        .ok();
    assert_eq!(
        (&updated["amount"], &updated["currency"]),
        (&1250.into(), &"kwd".into())
    );
}

#[tokio::test]
async fn an_idempotency_key_answers_its_first_answer_again() {
    let stripe = Stripe::shared().await;
    let key = format!("test-{}", unique_suffix());
    let open = [
        ("amount", "2500"),
        ("currency", "eur"),
        ("capture_method", "manual"),
    ];

    let first = stripe.keyed("/v1/payment_intents", Some(&key), &open).await;
    assert!(!first.replayed);
    let first = first.ok();
    let again = stripe.keyed("/v1/payment_intents", Some(&key), &open).await;
    assert!(again.replayed, "Idempotent-Replayed: true");
    assert_eq!(again.ok(), first, "the first answer, not a second intent");

    let other = [("amount", "2600"), ("currency", "eur")];
    stripe
        .keyed("/v1/payment_intents", Some(&key), &other)
        .await
        .refused(StatusCode::BAD_REQUEST, "idempotency_error", None);
    stripe
        .keyed("/v1/refunds", Some(&key), &[("payment_intent", id(&first))])
        .await
        .refused(StatusCode::BAD_REQUEST, "idempotency_error", None);

    // A refusal made once the endpoint ran is saved and replayed too: a capture key used
    // before the buyer authorised answers that refusal for 24 hours.
    let capture = format!("/v1/payment_intents/{}/capture", id(&first));
    let capture_key = format!("capture-{key}");
    stripe
        .keyed(&capture, Some(&capture_key), &[])
        .await
        .invalid(UNEXPECTED_STATE);
    stripe.page_confirm(&first, GOOD_CARD).await.ok();
    let replayed = stripe.keyed(&capture, Some(&capture_key), &[]).await;
    assert!(replayed.replayed);
    assert_eq!(replayed.status, StatusCode::BAD_REQUEST);
    let captured = stripe
        .keyed(&capture, Some(&format!("capture-again-{key}")), &[])
        .await;
    assert_eq!(captured.ok()["status"], "succeeded");

    // Parameters that fail validation save nothing: the key is free for the right ones.
    let invalid_key = format!("invalid-{key}");
    let invalid = stripe
        .keyed(
            "/v1/payment_intents",
            Some(&invalid_key),
            &[("amount", "-1"), ("currency", "eur")],
        )
        .await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    let valid = stripe
        .keyed("/v1/payment_intents", Some(&invalid_key), &open)
        .await;
    assert!(!valid.replayed);
    valid.ok();
}

#[tokio::test]
async fn the_good_card_confirmed_from_the_page_authorises_the_payment() {
    let stripe = Stripe::shared().await;
    let intent = stripe.intent().await;
    let confirmed = stripe.page_confirm(&intent, GOOD_CARD).await.ok();
    assert_eq!(confirmed["status"], "requires_capture");
    assert_eq!(
        confirmed["latest_charge"]["captured"], false,
        "manual capture"
    );
    let read = stripe.page_read(&intent).await.ok();
    assert_eq!(read["status"], "requires_capture");
    assert_eq!(read["amount_capturable"], 2500);
}

#[tokio::test]
async fn the_declined_card_leaves_the_payment_open_for_another_card() {
    let stripe = Stripe::shared().await;
    let intent = stripe.intent().await;
    let error = stripe.page_confirm(&intent, DECLINED_CARD).await.refused(
        StatusCode::PAYMENT_REQUIRED,
        "card_error",
        Some("card_declined"),
    );
    assert_eq!(error["decline_code"], "generic_decline");
    assert_eq!(error["payment_intent"]["status"], "requires_payment_method");

    let read = stripe.page_read(&intent).await.ok();
    assert_eq!(read["status"], "requires_payment_method");
    assert_eq!(read["last_payment_error"]["code"], "card_declined");
    assert_eq!(read["last_payment_error"]["type"], "card_error");

    let retried = stripe.page_confirm(&intent, GOOD_CARD).await.ok();
    assert_eq!(retried["status"], "requires_capture");
    assert_eq!(retried["last_payment_error"], Value::Null);
}

#[tokio::test]
async fn the_3d_secure_card_asks_for_authentication_first() {
    let stripe = Stripe::shared().await;
    for (success, then) in [
        ("true", "requires_capture"),
        ("false", "requires_payment_method"),
    ] {
        let intent = stripe.intent().await;
        let confirmed = stripe.page_confirm(&intent, THREE_D_SECURE_CARD).await.ok();
        assert_eq!(confirmed["status"], "requires_action");
        assert_eq!(confirmed["next_action"]["type"], "use_stripe_sdk");
        let authenticated = stripe
            .page_post(
                &format!(
                    "/v1/payment_intents/{}/_authenticate?success={success}",
                    id(&intent)
                ),
                &[("key", PUBLISHABLE_KEY), ("client_secret", secret(&intent))],
            )
            .await
            .ok();
        assert_eq!(authenticated["status"], then, "authenticated: {success}");
        if success == "false" {
            assert_eq!(
                authenticated["last_payment_error"]["code"],
                "payment_intent_authentication_failure"
            );
        }
    }
}

#[tokio::test]
async fn the_publishable_key_reaches_only_the_intent_its_client_secret_names() {
    let stripe = Stripe::shared().await;
    let intent = stripe.intent().await;
    let other = stripe.intent().await;
    let confirm = format!("/v1/payment_intents/{}/confirm", id(&intent));
    for form in [
        vec![("key", PUBLISHABLE_KEY)],
        vec![("key", PUBLISHABLE_KEY), ("client_secret", secret(&other))],
        vec![
            ("key", "sk_test_flashsale"),
            ("client_secret", secret(&intent)),
        ],
    ] {
        let answer = stripe.page_post(&confirm, &form).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{form:?}");
    }
    for path in [
        "/v1/payment_intents".to_owned(),
        format!("/v1/payment_intents/{}/capture", id(&intent)),
        format!("/v1/payment_intents/{}", id(&intent)),
    ] {
        let answer = stripe
            .page_post(
                &path,
                &[("key", PUBLISHABLE_KEY), ("client_secret", secret(&intent))],
            )
            .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let mut read = stripe.page_read(&intent).await;
    assert_eq!(read.status, StatusCode::OK);
    read = Stripe::send(
        stripe
            .http
            .get(format!(
                "{}/v1/payment_intents/{}",
                stripe.base,
                id(&intent)
            ))
            .query(&[("key", PUBLISHABLE_KEY), ("client_secret", secret(&other))]),
    )
    .await;
    assert_eq!(read.status, StatusCode::UNAUTHORIZED);
}

/// Stripe's restricted keys: a key has only the permissions made for it (Write granting
/// Read), a call it lacks one for is refused with 403 naming the permission, and a key
/// Stripe does not know is refused with 401.
#[tokio::test]
async fn a_restricted_key_makes_only_the_calls_its_permissions_allow() {
    let stripe = Stripe::shared().await;
    let register = |permissions: &'static [&'static str]| {
        let stripe = &stripe;
        async move {
            let key = format!("rk_test_{}", unique_suffix());
            let form: Vec<_> = permissions.iter().map(|p| ("permissions[]", *p)).collect();
            let answer = Stripe::send(
                stripe
                    .http
                    .post(format!("{}/_config/restricted_keys/{key}", stripe.base))
                    .form(&form),
            )
            .await;
            answer.ok();
            key
        }
    };
    let with = |key: &str, request: reqwest::RequestBuilder| request.bearer_auth(key.to_owned());
    let intents_only = register(&["rak_payment_intent_write"]).await;
    let opened = Stripe::send(with(
        &intents_only,
        stripe
            .http
            .post(format!("{}/v1/payment_intents", stripe.base))
            .form(&[
                ("amount", "2500"),
                ("currency", "eur"),
                ("capture_method", "manual"),
            ]),
    ))
    .await
    .ok();
    let read = format!("{}/v1/payment_intents/{}", stripe.base, id(&opened));
    Stripe::send(with(&intents_only, stripe.http.get(&read)))
        .await
        .ok();
    let refunds = format!("{}/v1/refunds", stripe.base);
    let listed = Stripe::send(with(
        &intents_only,
        stripe
            .http
            .get(&refunds)
            .query(&[("payment_intent", id(&opened))]),
    ))
    .await
    .refused(StatusCode::FORBIDDEN, "invalid_request_error", None);
    assert!(
        listed["message"]
            .as_str()
            .unwrap()
            .contains("'rak_refund_read'"),
        "{listed:#}"
    );
    let refunds_read_only = register(&["rak_refund_read"]).await;
    for key in [&intents_only, &refunds_read_only] {
        let made = Stripe::send(with(
            key,
            stripe
                .http
                .post(&refunds)
                .form(&[("payment_intent", id(&opened))]),
        ))
        .await
        .refused(StatusCode::FORBIDDEN, "invalid_request_error", None);
        assert!(
            made["message"]
                .as_str()
                .unwrap()
                .contains("'rak_refund_write'"),
            "{made:#}"
        );
    }
    let unknown = format!("rk_test_{}", unique_suffix());
    let answer = Stripe::send(with(&unknown, stripe.http.get(&read))).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{:#}", answer.body);
}

#[tokio::test]
async fn a_server_side_confirm_takes_a_payment_method() {
    let stripe = Stripe::shared().await;
    let intent = stripe.intent().await;
    let confirmed = stripe
        .act(&intent, "confirm", &[("payment_method", "pm_card_visa")])
        .await
        .ok();
    assert_eq!(confirmed["status"], "requires_capture");
    let payment_method = confirmed["payment_method"].as_str().expect("a method");
    assert!(payment_method.starts_with("pm_"), "{payment_method}");
    stripe
        .act(&intent, "confirm", &[("payment_method", "pm_card_visa")])
        .await
        .invalid(UNEXPECTED_STATE);
}

/// What the page runs: the fake Stripe.js, loaded from the local Stripe into node with the
/// little of a page it touches, then `confirmCardPayment` for each case on stdin (a client
/// secret, the card typed into the Element, and the buyer's answer to 3-D Secure's dialog).
const PAGE: &str = r#"
const vm = require('vm');
const [base, key] = process.argv.slice(1);
// stdout is for the results; the scripts' own logging goes to stderr.
console.log = console.error;
globalThis.window = {Element: class {}};
globalThis.document = {currentScript: {src: `${base}/js.stripe.com/v3/`},
                       getElementsByTagName: () => []};
(async () => {
  const script = await (await fetch(`${base}/js.stripe.com/v3/`)).text();
  vm.runInThisContext(script);
  const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const results = [];
  for (const {secret, card, authenticate} of cases) {
    globalThis.openModal = async () => authenticate;
    const stripe = Stripe(key);
    const element = stripe.elements().create('card');
    element.value = {card: {number: card, exp_month: '12', exp_year: '2034', cvc: '123'},
                     postal_code: '75001'};
    const result = await stripe.confirmCardPayment(secret, {payment_method: {card: element}});
    const read = await stripe.retrievePaymentIntent(secret);
    results.push({result, read});
  }
  process.stdout.write(JSON.stringify(results));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

#[tokio::test]
async fn the_fake_stripe_js_confirms_the_card_typed_in() {
    use tokio::io::AsyncWriteExt as _;

    let stripe = Stripe::shared().await;
    let script = stripe
        .http
        .get(format!("{}/js.stripe.com/v3/", stripe.base))
        .send()
        .await
        .expect("localstripe answers");
    assert_eq!(
        script
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok()),
        Some("application/javascript; charset=utf-8")
    );
    let script = script.text().await.expect("text");
    for offered in [
        "confirmCardPayment",
        "retrievePaymentIntent",
        "payment_method_data",
    ] {
        assert!(script.contains(offered), "the fake Stripe.js has {offered}");
    }

    let cases = [
        (GOOD_CARD, true, "requires_capture"),
        ("4242 4242 4242 4242", true, "requires_capture"),
        (DECLINED_CARD, true, "requires_payment_method"),
        (THREE_D_SECURE_CARD, true, "requires_capture"),
        (THREE_D_SECURE_CARD, false, "requires_payment_method"),
    ];
    let mut intents = Vec::new();
    for _ in cases {
        intents.push(stripe.intent().await);
    }
    let input: Vec<Value> = cases
        .iter()
        .zip(&intents)
        .map(|((card, authenticate, _), intent)| {
            let secret = secret(intent);
            serde_json::json!({"secret": secret, "card": card, "authenticate": authenticate})
        })
        .collect();
    let mut node = tokio::process::Command::new("node")
        .args(["-e", PAGE, &stripe.base, PUBLISHABLE_KEY])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("node runs (the project assumes Node 20)");
    let mut stdin = node.stdin.take().expect("stdin");
    stdin
        .write_all(&serde_json::to_vec(&input).expect("JSON"))
        .await
        .expect("written");
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(30), node.wait_with_output())
        .await
        .expect("node is done within 30 s")
        .expect("node ran");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&output.stdout).expect("JSON results");

    for (((card, authenticate, status), intent), outcome) in
        cases.iter().zip(&intents).zip(&results)
    {
        let case = format!("{card}, authenticated: {authenticate}");
        let result = &outcome["result"];
        assert_eq!(
            outcome["read"]["paymentIntent"]["status"], *status,
            "{case}"
        );
        if *status == "requires_capture" {
            assert_eq!(result["paymentIntent"]["id"], intent["id"], "{case}");
            assert_eq!(result["paymentIntent"]["status"], *status, "{case}");
            assert_eq!(result["error"], Value::Null, "{case}");
        } else {
            assert_eq!(result["paymentIntent"], Value::Null, "{case}");
            assert_eq!(
                result["error"]["payment_intent"]["id"], intent["id"],
                "{case}"
            );
            let code = if *card == DECLINED_CARD {
                "card_declined"
            } else {
                "payment_intent_authentication_failure"
            };
            assert_eq!(result["error"]["code"], code, "{case}");
        }
    }
    let read = stripe.page_read(&intents[0]).await.ok();
    let card = &read["latest_charge"]["payment_method"];
    let method = stripe
        .get(&format!(
            "/v1/payment_methods/{}",
            card.as_str().expect("an id")
        ))
        .await
        .ok();
    assert_eq!(
        method["card"]["last4"], "4242",
        "the card typed in was used"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_launcher_registers_its_webhook_at_start() {
    let receiver = Receiver::start().await;
    let secret = format!("whsec_{}", unique_suffix());
    let options = EmulatorOptions {
        stripe_webhook: Some(StripeWebhook {
            url: receiver.url.clone(),
            secret: secret.clone(),
        }),
        ..EmulatorOptions::default()
    };
    let local = tokio::task::spawn_blocking(move || LocalStripe::start(&options))
        .await
        .expect("start task")
        .expect("the launcher starts");
    let stripe = Stripe::at(local.endpoint.clone());
    let paid = stripe.authorised().await;
    let event = receiver
        .event(
            "payment_intent.amount_capturable_updated",
            id(&paid),
            &secret,
        )
        .await;
    assert_eq!(event["data"]["object"]["status"], "requires_capture");
}
