//! Card payments end to end, over HTTP: the local stack with its local Stripe
//! (localstripe, made faithful by our launcher). The buyer's order is paid with Stripe's
//! test cards as the page's Stripe.js confirms them (the publishable key and the client
//! secret, no secret key), settled by the page's confirm call or by the webhook the local
//! Stripe sends, and money that comes after the deadline moves nothing.

use std::time::Duration;

use flashsale_e2e::{GOOD_CARD, Harness, LocalStripe, StripeWebhook, eventually};
use reqwest::StatusCode;
use serde_json::Value;

const DECLINED_CARD: &str = "4000000000000002";

/// The page's confirm call: the order after its settlement (200).
async fn settled_by_the_page(harness: &Harness, buyer: &str, order_id: &str) -> Value {
    let settled = harness
        .api
        .confirm_payment(buyer, order_id)
        .await
        .expect("confirm answers");
    assert_eq!(settled.status, StatusCode::OK, "{}", settled.body);
    settled.body
}

/// A buyer holding one unit of a fresh sale, and the payment the API opened for it.
async fn a_held_order_with_its_payment(
    harness: &Harness,
    sale_id: &str,
    window_secs: u32,
) -> (String, String, Value) {
    harness.active_sale(sale_id, 5, 1, window_secs).await;
    let buyer = harness.user(&format!("{sale_id}-buyer"));
    let (order_id, _) = harness.grab_ok(&buyer, sale_id).await;
    let opened = harness
        .api
        .open_payment(&buyer, &order_id)
        .await
        .expect("open answers");
    assert_eq!(opened.status, StatusCode::OK, "{}", opened.body);
    assert_eq!(opened.body["amount"], 129_900);
    assert_eq!(opened.body["currency"], "eur");
    (buyer, order_id, opened.body)
}

/// The PaymentIntent has one charge, captured whole (129,900), nothing given back.
async fn captured_once_whole(stripe: &LocalStripe, payment: &Value) {
    let intent = stripe.intent(payment).await;
    let charges = &intent["charges"];
    assert_eq!(charges["total_count"], 1, "{intent:#}");
    let charge = &charges["data"][0];
    assert_eq!(
        (
            &charge["captured"],
            &charge["amount"],
            &charge["amount_refunded"]
        ),
        (&Value::Bool(true), &Value::from(129_900), &Value::from(0)),
        "{intent:#}"
    );
}

#[tokio::test]
async fn a_buyer_pays_with_a_good_card_and_the_money_is_captured_once_the_order_is_paid() {
    let harness = Harness::start("card-paid").await;
    let (buyer, order_id, payment) =
        a_held_order_with_its_payment(&harness, "card-paid", 600).await;
    let stripe = LocalStripe::of(&harness);

    let (status, confirmed) = stripe.page_confirm(&payment, GOOD_CARD).await;
    assert_eq!(status, StatusCode::OK, "{confirmed:#}");
    assert_eq!(
        confirmed["status"], "requires_capture",
        "authorised, not yet taken"
    );

    let settled = settled_by_the_page(&harness, &buyer, &order_id).await;
    assert_eq!(settled["status"], "paid");
    // The page's call and the webhook race to settle; each says what it found, and
    // the money moved once.
    assert_eq!(stripe.status_of(&payment).await, "succeeded", "captured");
    captured_once_whole(&stripe, &payment).await;
    let stats = harness.stats("card-paid").await;
    assert_eq!(stats["paid"], 1, "{stats}");
    assert_eq!(stats["consistent"], true, "{stats}");
}

#[tokio::test]
async fn the_webhook_alone_settles_a_payment_the_page_never_reported() {
    let harness = Harness::start("card-webhook").await;
    let (buyer, order_id, payment) =
        a_held_order_with_its_payment(&harness, "card-webhook", 600).await;
    let stripe = LocalStripe::of(&harness);
    let (status, confirmed) = stripe.page_confirm(&payment, GOOD_CARD).await;
    assert_eq!(status, StatusCode::OK, "{confirmed:#}");
    // The tab closed before the page's confirm call: Stripe's event settles it.
    harness
        .wait_for_status(&buyer, &order_id, "paid", Duration::from_secs(30))
        .await;
    eventually(Duration::from_secs(30), || async {
        let now = stripe.status_of(&payment).await;
        (now == "succeeded").then_some(()).ok_or(now)
    })
    .await;
}

#[tokio::test]
async fn a_declined_card_leaves_the_order_awaiting_payment() {
    let harness = Harness::start("card-declined").await;
    let (buyer, order_id, payment) =
        a_held_order_with_its_payment(&harness, "card-declined", 600).await;
    let stripe = LocalStripe::of(&harness);
    let (status, declined) = stripe.page_confirm(&payment, DECLINED_CARD).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{declined:#}");
    assert_eq!(declined["error"]["code"], "card_declined");

    let settled = settled_by_the_page(&harness, &buyer, &order_id).await;
    assert_eq!(settled["settlement"], "awaiting_buyer");
    assert_eq!(settled["status"], "reserved");
    // The buyer tries again with a good card, within the window.
    let (status, _) = stripe.page_confirm(&payment, GOOD_CARD).await;
    assert_eq!(status, StatusCode::OK);
    let paid = settled_by_the_page(&harness, &buyer, &order_id).await;
    assert_eq!(paid["status"], "paid", "{paid}");
}

#[tokio::test]
async fn a_card_confirmed_after_the_deadline_moves_no_money() {
    let harness = Harness::start("card-late").await;
    let (buyer, order_id, payment) = a_held_order_with_its_payment(&harness, "card-late", 2).await;
    // Past the deadline; the release timer may or may not have fired yet: the
    // settlement decides against the deadline either way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stripe = LocalStripe::of(&harness);
    let (status, confirmed) = stripe.page_confirm(&payment, GOOD_CARD).await;
    assert_eq!(status, StatusCode::OK, "{confirmed:#}");

    let settled = settled_by_the_page(&harness, &buyer, &order_id).await;
    assert_eq!(settled["status"], "expired");
    eventually(Duration::from_secs(30), || async {
        let now = stripe.status_of(&payment).await;
        (now == "canceled").then_some(()).ok_or(now)
    })
    .await;
    let stats = harness.stats("card-late").await;
    assert_eq!(stats["paid"], 0, "{stats}");
    assert_eq!(stats["consistent"], true, "{stats}");
}

#[tokio::test]
async fn the_webhook_route_needs_no_token_but_a_stripe_signature() {
    let harness = Harness::start("card-forged").await;
    let event = serde_json::json!({
        "id": "evt_forged",
        "type": "payment_intent.amount_capturable_updated",
        "data": {"object": {"id": "pi_forged", "object": "payment_intent"}},
    });
    for signature in [None, Some("t=1,v1=00"), Some("nonsense")] {
        let mut request = reqwest::Client::new()
            .post(format!("{}/payments/stripe/webhook", harness.stack.api_url))
            .json(&event);
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        let response = request.send().await.expect("the API answers");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{signature:?}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"], "invalid_signature", "{signature:?}: {body}");
    }
}

/// Stripe's events through the stack's webhook route, signed as Stripe signs them: each
/// settles at most once whatever order they come in, and a payment that names the order
/// but is not its own (another amount, another currency) is refused and counted, with
/// nothing written and no money moved.
#[tokio::test]
async fn the_webhook_settles_once_in_any_order_and_refuses_a_payment_not_the_orders() {
    let harness = Harness::start("card-hook").await;
    let (buyer, order_id, payment) =
        a_held_order_with_its_payment(&harness, "card-hook", 600).await;
    let stripe = LocalStripe::of(&harness);
    let webhook = StripeWebhook::of(&harness);

    // Out of order: `succeeded` comes before the card is even confirmed. The
    // settlement reads the payment from Stripe, which still awaits the buyer.
    let unconfirmed = stripe.intent(&payment).await;
    let (status, early) = webhook
        .deliver("evt_hook_early", "payment_intent.succeeded", &unconfirmed)
        .await;
    assert_eq!(status, StatusCode::OK, "{early}");
    assert_eq!(early["outcome"], "awaiting_buyer", "{early}");
    assert_eq!(harness.order_status(&buyer, &order_id).await, "reserved");

    let (status, confirmed) = stripe.page_confirm(&payment, GOOD_CARD).await;
    assert_eq!(status, StatusCode::OK, "{confirmed:#}");
    let authorised = stripe.intent(&payment).await;
    let (status, settled) = webhook
        .deliver(
            "evt_hook_authorised",
            "payment_intent.amount_capturable_updated",
            &authorised,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{settled}");
    assert_eq!(settled["outcome"], "paid", "{settled}");
    // Delivered again, and the early one again: each was settled already.
    for (event_id, kind, intent) in [
        (
            "evt_hook_authorised",
            "payment_intent.amount_capturable_updated",
            &authorised,
        ),
        ("evt_hook_early", "payment_intent.succeeded", &unconfirmed),
    ] {
        let (status, again) = webhook.deliver(event_id, kind, intent).await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again["outcome"], "duplicate", "{event_id}: {again}");
    }
    assert_eq!(harness.order_status(&buyer, &order_id).await, "paid");
    captured_once_whole(&stripe, &payment).await;
    // The local Stripe's own deliveries of these events came too: the sale still
    // counts the order paid once, by whichever settlement's write sold it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counted = harness.local_metrics().await;
    assert_eq!(
        counted.counter("orders_paid", &[("sale_id", "card-hook")]),
        1.0,
        "{counted:?}"
    );

    let refused_before = harness
        .local_metrics()
        .await
        .counter("payment_events_refused", &[]);
    // The order's own metadata, as our API wrote it on the order's payment.
    let buyer_id = authorised["metadata"]["user_id"]
        .as_str()
        .expect("the buyer");
    let metadata = [("order_id", order_id.as_str()), ("user_id", buyer_id)];
    for (event_id, amount, currency) in [
        ("evt_hook_short", 129_800, "eur"),
        ("evt_hook_dollars", 129_900, "usd"),
    ] {
        let other = stripe.create_intent(amount, currency, &metadata).await;
        let (status, refused) = webhook
            .deliver(event_id, "payment_intent.amount_capturable_updated", &other)
            .await;
        assert_eq!(status, StatusCode::OK, "{refused}");
        assert_eq!(refused["outcome"], "refused", "{event_id}: {refused}");
        // Read as the API names a payment.
        let untouched = stripe
            .status_of(&serde_json::json!({ "payment_id": other["id"] }))
            .await;
        assert_eq!(
            untouched, "requires_payment_method",
            "{event_id}: no money moved"
        );
    }
    let refused = harness
        .local_metrics()
        .await
        .counter("payment_events_refused", &[]);
    assert!(
        refused >= refused_before + 2.0,
        "{refused_before} then {refused}"
    );
    assert_eq!(harness.order_status(&buyer, &order_id).await, "paid");
    let stats = harness.stats("card-hook").await;
    assert_eq!(
        (&stats["paid"], &stats["consistent"]),
        (&Value::from(1), &Value::Bool(true)),
        "{stats}"
    );
}

/// Issue 47: a Pay clicked at the deadline (or in a second tab) opens a PaymentIntent
/// the order does not take, and the API cancels it. Stripe's `payment_intent.canceled`
/// about it was refused and counted as a forged payment, firing
/// PaymentEventsRefusedAlarm. It is a withdrawn payment; one that still could hold
/// money stays refused.
#[tokio::test]
async fn the_cancel_of_a_payment_the_order_did_not_take_is_withdrawn_not_refused() {
    let harness = Harness::start("card-withdrawn").await;
    let (buyer, order_id, payment) =
        a_held_order_with_its_payment(&harness, "card-withdrawn", 600).await;
    let stripe = LocalStripe::of(&harness);
    let webhook = StripeWebhook::of(&harness);
    let own = stripe.intent(&payment).await;
    let buyer_id = own["metadata"]["user_id"].as_str().expect("the buyer");
    let metadata = [("order_id", order_id.as_str()), ("user_id", buyer_id)];

    // As the API opens and withdraws one: the order's price, its metadata, cancelled.
    let second = stripe.create_intent(129_900, "eur", &metadata).await;
    let withdrawn = stripe.cancel(&second).await;
    let (status, answer) = webhook
        .deliver("evt_withdrawn", "payment_intent.canceled", &withdrawn)
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], "withdrawn", "{answer}");

    // Not cancelled: it could still take the buyer's money, so it is refused.
    let stray = stripe.create_intent(129_900, "eur", &metadata).await;
    let (status, answer) = webhook
        .deliver("evt_stray", "payment_intent.created", &stray)
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], "refused", "{answer}");
    assert_eq!(harness.order_status(&buyer, &order_id).await, "reserved");
}
