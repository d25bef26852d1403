//! An order's life through the local stack: the grab's hold is the order, `reserved`
//! until it settles; the consumer (run by the SQS event source emulation) sets its
//! timer and writes nothing; then a card payment, cancel or the timer (fired by the
//! Scheduler emulation) ends it.

use flashsale_e2e::{CONSUMER_LAG, Harness, assert_error};
use flashsale_load::client::sale_price;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_order_is_settled_and_its_timer_changes_nothing() {
    let harness = Harness::start("pay").await;
    // A window long enough that the timer's minute is still ahead when it is looked
    // at: it cannot have fired yet, so its presence and its deletion are both real.
    harness.active_sale("pay", 5, 1, 900).await;
    let alice = harness.user("alice");
    let (order_id, _) = harness.grab_ok(&alice, "pay").await;

    let timer = harness.wait_for_release_timer(&order_id).await;
    assert_eq!(timer["order_id"], order_id.as_str());
    // Setting the timer wrote nothing: the order stays as the grab left it.
    harness.wait_for_orders_opened("pay", 1).await;
    assert_eq!(harness.order_status(&alice, &order_id).await, "reserved");
    // The grab copied the sale's price onto the hold, which is the order.
    let order = harness.api.order(&alice, &order_id).await.unwrap();
    let mut price = sale_price();
    price["decimals"] = 2.into();
    assert_eq!(order.body["price"], price, "{}", order.body);

    let paid = harness.pay_by_card(&alice, &order_id).await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.body);
    assert_eq!(paid.str_field("status"), Some("paid"));
    assert_eq!(paid.str_field("settlement"), Some("paid"), "captured");
    assert_eq!(paid.body["price"], price, "paid at that price");
    assert!(paid.body.get("expired_at").is_none(), "{}", paid.body);
    let again = harness
        .api
        .confirm_payment(&alice, &order_id)
        .await
        .unwrap();
    assert_eq!(
        (again.status, again.str_field("status")),
        (StatusCode::OK, Some("paid"))
    );
    // A settlement leaves the timer be: it finds the order paid and does nothing.
    assert!(harness.release_timer_input(&order_id).await.is_some());

    // The timer fires early (the Scheduler may, within its minute), long before its
    // minute here: the release refuses to act before the deadline, with an error
    // Lambda retries later.
    let early = harness
        .stack
        .lambda()
        .invoke("ReleaseFunction", timer)
        .await;
    assert!(early.is_err(), "{early:?}");
    assert_eq!(harness.order_status(&alice, &order_id).await, "paid");
    let cancel = harness.api.cancel(&alice, &order_id).await.unwrap();
    assert_error(&cancel, StatusCode::CONFLICT, "order_paid");

    let stats = harness.stats("pay").await;
    assert_eq!(
        (stats["paid"].as_u64(), stats["available"].as_u64()),
        (Some(1), Some(4)),
        "{stats}"
    );
    assert_eq!(stats["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpaid_order_expires_on_time_and_its_unit_can_be_grabbed_again() {
    const WINDOW_SECS: u64 = 2;
    let harness = Harness::start("expire").await;
    harness
        .active_sale("expire", 1, 1, WINDOW_SECS as u32)
        .await;
    let alice = harness.user("alice");
    let bob = harness.user("bob");
    let (order_id, expires_at) = harness.grab_ok(&alice, "expire").await;
    let sold_out = harness.api.grab(&bob, "expire").await.unwrap();
    assert_error(&sold_out, StatusCode::CONFLICT, "sold_out");

    harness.wait_for_orders_opened("expire", 1).await;
    // The Scheduler emulation fires the timer at a random second of its minute, as AWS
    // may; fired early, the release waits for the deadline. A 2 s window's timer is in
    // the minute it was set in, so the order expires within a minute of that.
    harness
        .wait_for_status(
            &alice,
            &order_id,
            "expired",
            flashsale_e2e::expiry_lag(WINDOW_SECS),
        )
        .await;
    let (deadline, expired_at) = harness.expiry_times(&alice, &order_id).await;
    assert_eq!(deadline, expires_at);
    let expired_at = expired_at.expect("an expired order says when it expired");
    assert!(
        expired_at >= expires_at,
        "released before the deadline: {expired_at} < {expires_at}"
    );
    eprintln!(
        "released {} ms after the deadline",
        (expired_at - expires_at).num_milliseconds()
    );
    // Delivered timers delete themselves (ActionAfterCompletion: DELETE).
    flashsale_e2e::eventually(CONSUMER_LAG, || async {
        match harness.release_timer_input(&order_id).await {
            None => Ok(()),
            Some(_) => Err("the fired timer is still there"),
        }
    })
    .await;

    let late_pay = harness.pay_by_card(&alice, &order_id).await;
    assert_error(&late_pay, StatusCode::CONFLICT, "order_expired");
    let stats = harness.stats("expire").await;
    assert_eq!(
        (stats["expired"].as_u64(), stats["available"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    assert_eq!(stats["consistent"], true);

    // The unit is on sale again: the same buyer may grab it (the limit counts only
    // held and bought units), once the grab's sold-out gate rechecks.
    flashsale_e2e::eventually(CONSUMER_LAG, || async {
        let again = harness.api.grab(&alice, "expire").await.unwrap();
        (again.status == StatusCode::ACCEPTED)
            .then_some(())
            .ok_or(again.body)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_returns_the_unit_at_once() {
    let harness = Harness::start("cancel").await;
    harness.active_sale("cancel", 1, 1, 900).await;
    let alice = harness.user("alice");
    let (order_id, _) = harness.grab_ok(&alice, "cancel").await;

    let cancelled = harness.api.cancel(&alice, &order_id).await.unwrap();
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    assert_eq!(cancelled.str_field("status"), Some("cancelled"));
    let page = harness.api.sale("cancel").await.unwrap();
    assert_eq!(page.body["stock_available"], 1, "{}", page.body);
    assert_eq!(harness.shard_availability("cancel", 1).await, [1]);

    let again = harness.api.cancel(&alice, &order_id).await.unwrap();
    assert_eq!(
        (again.status, again.str_field("status")),
        (StatusCode::OK, Some("cancelled"))
    );
    let pay = harness.pay_by_card(&alice, &order_id).await;
    assert_error(&pay, StatusCode::CONFLICT, "order_cancelled");

    // The consumer may get the message after the cancel: it must not revive the order.
    // Handed it now (whether or not the queue's own delivery came first), it does not.
    let reservation = harness.release_event("alice", &order_id).await;
    let answer = harness
        .stack
        .lambda()
        .invoke(
            "OrderConsumerFunction",
            flashsale_e2e::orders_queue_event(&order_id, &reservation, &["late"]),
        )
        .await
        .expect("the consumer answers");
    assert_eq!(
        answer["batchItemFailures"],
        serde_json::json!([]),
        "{answer}"
    );
    assert_eq!(harness.order_status(&alice, &order_id).await, "cancelled");
    assert!(
        harness.release_timer_input(&order_id).await.is_none(),
        "no timer for a cancelled order"
    );
    let stats = harness.stats("cancel").await;
    assert_eq!(
        (stats["cancelled"].as_u64(), stats["available"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    assert_eq!(stats["consistent"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sale_page_is_public_cacheable_and_carries_server_time() {
    let harness = Harness::start("page").await;
    harness.active_sale("page", 3, 1, 900).await;
    let page = harness.api.sale("page").await.unwrap();
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(page.str_field("status"), Some("active"));
    assert_eq!(page.body["stock_total"], 3);
    assert_eq!(page.body["price"]["currency"], "EUR", "{}", page.body);
    assert_eq!(
        page.body["price"]["decimals"], 2,
        "for the page to format it"
    );
    assert!(page.str_field("server_time").is_some());
    let cache = page.cache_control.expect("a Cache-Control header");
    assert!(cache.contains("max-age"), "{cache}");
}
