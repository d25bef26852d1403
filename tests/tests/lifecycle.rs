//! An order's life through the local stack: the consumer (run by the SQS event source
//! emulation) opens it and sets its timer, then pay, cancel or the timer (fired by the
//! Scheduler emulation) ends it.

mod common;

use std::time::Duration;

use common::{Harness, assert_error};
use reqwest::StatusCode;

const CONSUMER_LAG: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_order_is_settled_and_its_timer_is_gone() {
    let harness = Harness::start("pay").await;
    harness.active_sale("pay", 5, 1, 3).await;
    let alice = harness.user("alice");
    let (order_id, expires_at) = harness.grab_ok(&alice, "pay").await;

    harness
        .wait_for_status(&alice, &order_id, "pending_payment", CONSUMER_LAG)
        .await;
    let timer = harness
        .release_timer_input(&order_id)
        .await
        .expect("the consumer set a release timer");
    assert_eq!(timer["order_id"], order_id.as_str());

    let paid = harness.api.pay(&alice, &order_id).await.unwrap();
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.body);
    assert_eq!(paid.str_field("status"), Some("paid"));
    let again = harness.api.pay(&alice, &order_id).await.unwrap();
    assert_eq!(
        (again.status, again.str_field("status")),
        (StatusCode::OK, Some("paid"))
    );
    assert!(
        harness.release_timer_input(&order_id).await.is_none(),
        "paying deletes the timer"
    );

    // Firing the timer anyway at its time (a delete that lost a race) changes nothing.
    let until_due = (expires_at - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until_due + Duration::from_millis(100)).await;
    let fired = harness
        .stack
        .lambda()
        .invoke("ReleaseFunction", timer)
        .await
        .expect("a due release of a paid order succeeds");
    assert_eq!(fired["outcome"], "already_settled", "{fired}");
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
    let harness = Harness::start("expire").await;
    harness.active_sale("expire", 1, 1, 2).await;
    let alice = harness.user("alice");
    let bob = harness.user("bob");
    let (order_id, expires_at) = harness.grab_ok(&alice, "expire").await;
    let sold_out = harness.api.grab(&bob, "expire").await.unwrap();
    assert_error(&sold_out, StatusCode::CONFLICT, "sold_out");

    harness
        .wait_for_status(&alice, &order_id, "pending_payment", CONSUMER_LAG)
        .await;
    // The Scheduler emulation fires the timer at its at(), the deadline rounded up to
    // the next whole minute: expired within a minute of the deadline, never before it.
    harness
        .wait_for_status(&alice, &order_id, "expired", Duration::from_secs(80))
        .await;
    assert!(chrono::Utc::now() >= expires_at);
    common::eventually(Duration::from_secs(10), || async {
        match harness.release_timer_input(&order_id).await {
            None => Ok(()),
            Some(_) => Err("the fired timer is still there"),
        }
    })
    .await;

    let late_pay = harness.api.pay(&alice, &order_id).await.unwrap();
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
    common::eventually(Duration::from_secs(5), || async {
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
    let pay = harness.api.pay(&alice, &order_id).await.unwrap();
    assert_error(&pay, StatusCode::CONFLICT, "order_cancelled");

    // The consumer may get the message after the cancel: it must not revive the order.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(harness.order_status(&alice, &order_id).await, "cancelled");
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
    assert!(page.str_field("server_time").is_some());
    let cache = page.cache_control.expect("a Cache-Control header");
    assert!(cache.contains("max-age"), "{cache}");
}
