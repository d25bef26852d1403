//! Races the design must settle with DynamoDB conditions alone: a card payment against
//! the timeout and Stripe's webhook, a release delivered twice, a queue message delivered
//! twice.

use std::time::Duration;

use flashsale_e2e::{GOOD_CARD, Harness, LocalStripe, eventually};
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Invokes the release function as Lambda's asynchronous retries would: an error (a
/// busy table under the test's load) is tried again, for as long as a loaded machine
/// may need. Lambda spaces those retries by minutes; here the pause grows from 100 ms
/// to 2 s, with full jitter. Retrying every 100 ms in step, 100 releases once kept
/// DynamoDB Local's queue past the release's 1 s attempt timeout for two minutes: every
/// attempt timed out, and still executed, while the next one was already queued behind.
async fn release(harness: &Harness, timer: &Value) -> Value {
    use rand::Rng as _;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut ceiling = Duration::from_millis(100);
    loop {
        match harness
            .stack
            .lambda()
            .invoke("ReleaseFunction", timer.clone())
            .await
        {
            Ok(answer) => return answer,
            Err(error) if tokio::time::Instant::now() < deadline => {
                eprintln!("release failed, retrying: {error}");
                let pause = rand::rng().random_range(Duration::ZERO..=ceiling);
                tokio::time::sleep(pause).await;
                ceiling = (ceiling * 2).min(Duration::from_secs(2));
            }
            Err(error) => panic!("the release still fails after 120 s: {error:?}"),
        }
    }
}

/// An order awaiting payment, with what its owner and its timer need.
struct OpenOrder {
    /// The owner's token.
    user: String,
    order_id: String,
    expires_at: chrono::DateTime<chrono::Utc>,
    /// The event the order's timer delivers to the release function.
    timer: Value,
}

/// Grabs one unit per buyer and waits until the consumer has set a timer for every
/// order (a short window's timer may have fired already, and its order expired).
async fn open_orders(harness: &Harness, sale_id: &str, buyers: usize) -> Vec<OpenOrder> {
    let grabs = (0..buyers).map(|n| async move {
        let user_id = format!("{sale_id}-buyer-{n}");
        let user = harness.user(&user_id);
        let (order_id, expires_at) = harness.grab_ok(&user, sale_id).await;
        let timer = harness.release_event(&user_id, &order_id).await;
        OpenOrder {
            user,
            order_id,
            expires_at,
            timer,
        }
    });
    let orders = join_all(grabs).await;
    harness
        .wait_for_orders_opened(sale_id, u64::try_from(buyers).expect("a few buyers"))
        .await;
    orders
}

/// Card payments against the timeout, through the local Stripe: around each order's
/// deadline its owner's card is confirmed at Stripe and the page asks for the
/// settlement, while the timer's event is delivered right at the deadline and Stripe's
/// webhook settles too. Whoever wins, money and unit agree: paid and captured, or expired
/// with the authorisation released (or the money refunded, were it captured).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_card_payment_against_the_timeout_and_the_webhook_ends_right_every_time() {
    const ORDERS: usize = 40;
    let harness = Harness::start("card-race").await;
    harness.active_sale("card-race", ORDERS as u32, 4, 15).await;
    let orders = open_orders(&harness, "card-race", ORDERS).await;
    let stripe = LocalStripe::of(&harness);
    let payments = join_all(orders.iter().map(|order| async {
        let opened = harness
            .api
            .open_payment(&order.user, &order.order_id)
            .await
            .expect("open answers");
        assert_eq!(opened.status, StatusCode::OK, "{}", opened.body);
        opened.body
    }))
    .await;

    let races = orders
        .iter()
        .zip(&payments)
        .enumerate()
        .map(|(n, (order, payment))| {
            let (harness, stripe) = (&harness, &stripe);
            async move {
                // The card's confirmation at Stripe and the settlement each take a
                // round trip before the pay write, and Stripe (localstripe: one Python
                // process) takes the 40 confirmations of the second one after another:
                // starting from a second before the deadline to the deadline puts the
                // writes on both sides of it.
                let offset =
                    chrono::Duration::milliseconds(i64::try_from(n % 21).unwrap() * 50 - 1000);
                let until = |at: chrono::DateTime<chrono::Utc>| {
                    (at - chrono::Utc::now()).to_std().unwrap_or_default()
                };
                let pay = async {
                    tokio::time::sleep(until(order.expires_at + offset)).await;
                    let (status, confirmed) = stripe.page_confirm(payment, GOOD_CARD).await;
                    assert_eq!(status, StatusCode::OK, "{confirmed:#}");
                    harness
                        .api
                        .confirm_payment(&order.user, &order.order_id)
                        .await
                        .expect("confirm answers")
                };
                let fire = async {
                    tokio::time::sleep(until(order.expires_at)).await;
                    release(harness, &order.timer).await
                };
                let (settled, _) = tokio::join!(pay, fire);
                assert_eq!(settled.status, StatusCode::OK, "{}", settled.body);
            }
        });
    join_all(races).await;

    // The webhook may still be settling: each order ends in one of the agreed pairs.
    let mut ends = std::collections::BTreeMap::<(String, String), usize>::new();
    for (order, payment) in orders.iter().zip(&payments) {
        let end = eventually(Duration::from_secs(60), || async {
            let status = harness.order_status(&order.user, &order.order_id).await;
            let intent = stripe.status_of(payment).await;
            let agreed = matches!(
                (status.as_str(), intent.as_str()),
                ("paid", "succeeded") | ("expired", "canceled") | ("refunded", "succeeded")
            );
            agreed
                .then(|| (status.clone(), intent.clone()))
                .ok_or((status, intent))
        })
        .await;
        *ends.entry(end).or_default() += 1;
    }
    eprintln!("card payment vs timeout and webhook, {ORDERS} races: {ends:?}");
    let count = |status: &str| -> usize {
        ends.iter()
            .filter(|((end, _), _)| end == status)
            .map(|(_, n)| n)
            .sum()
    };
    let stats = harness.stats("card-race").await;
    assert_eq!(stats["paid"], count("paid"), "{stats}");
    let ended = (count("expired") + count("refunded")) as u64;
    assert_eq!(
        stats["expired"].as_u64().unwrap() + stats["refunded"].as_u64().unwrap(),
        ended,
        "{stats}"
    );
    assert_eq!(
        stats["available"], ended,
        "each unit of an ended order came back once: {stats}"
    );
    assert_eq!(stats["consistent"], true, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_delivered_twice_returns_the_unit_once() {
    let harness = Harness::start("release-twice").await;
    harness.active_sale("release-twice", 2, 1, 2).await;
    let orders = open_orders(&harness, "release-twice", 1).await;
    let OpenOrder {
        user,
        order_id,
        timer,
        ..
    } = &orders[0];

    // Delivered twice at once, whenever (a release delivered early waits for the
    // deadline): the Scheduler emulation may deliver it a third time meanwhile.
    let (first, second) = tokio::join!(release(&harness, timer), release(&harness, timer));
    let outcomes: Vec<Value> = [first, second]
        .into_iter()
        .map(|outcome| outcome["outcome"].clone())
        .collect();
    // At most one of them released (the Scheduler emulation may have beaten both).
    let released = outcomes
        .iter()
        .filter(|outcome| **outcome == "released")
        .count();
    assert!(released <= 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|outcome| *outcome == "released" || *outcome == "already_settled"),
        "{outcomes:?}"
    );
    assert_eq!(harness.order_status(user, order_id).await, "expired");
    assert_eq!(harness.shard_availability("release-twice", 1).await, [2]);
    let stats = harness.stats("release-twice").await;
    assert_eq!(
        (stats["expired"].as_u64(), stats["available"].as_u64()),
        (Some(1), Some(2)),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_handed_the_same_record_twice_sets_one_timer_and_writes_nothing() {
    let harness = Harness::start("consume-twice").await;
    harness.active_sale("consume-twice", 5, 1, 900).await;
    let orders = open_orders(&harness, "consume-twice", 1).await;
    let OpenOrder {
        user,
        order_id,
        timer: reservation,
        ..
    } = &orders[0];
    // A 900 s window: the timer's minute is far ahead, so it is there to be counted.
    harness.wait_for_release_timer(order_id).await;
    let items_before = harness.item_count().await;

    let event = flashsale_e2e::orders_queue_event(order_id, reservation, &["m-1", "m-2"]);
    let answer = harness
        .stack
        .lambda()
        .invoke("OrderConsumerFunction", event)
        .await
        .expect("the consumer answers");
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");

    assert_eq!(harness.order_status(user, order_id).await, "reserved");
    assert_eq!(
        harness.item_count().await,
        items_before,
        "the consumer writes nothing to the table"
    );
    assert_eq!(
        harness.timers_in_group().await,
        1,
        "one timer for the one order"
    );
}
