//! The blocklist through the local stack: an admin blocks a user, whose token requests
//! and grabs (even through a path handed out before the block) are refused with 403
//! `blocked` and write nothing; once unblocked they buy like anyone else.

use std::time::Duration;

use flashsale_e2e::{Harness, assert_error, eventually};
use flashsale_load::ApiResponse;
use reqwest::{Method, StatusCode};
use serde_json::json;

/// `BLOCKLIST_REFRESH_MS` in the template: every grab instance's snapshot of the
/// blocklist is at most this old.
const BLOCKLIST_REFRESH: Duration = Duration::from_secs(5);

/// How long an unblock may take to show, polling: the refresh plus the stack's latency,
/// generous for a loaded machine (it only bounds a failure).
const REFRESH_LAG: Duration = Duration::from_secs(60);

async fn blocklist_call(harness: &Harness, method: Method, path: &str, token: &str) -> ApiResponse {
    harness
        .api
        .send(method, path, Some(token), None)
        .await
        .expect("the blocklist route answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_user_is_refused_without_a_write_and_can_buy_once_unblocked() {
    let harness = Harness::start("blocklist").await;
    harness.active_sale("blocklist", 5, 1, 900).await;
    let scalper = harness.user("e2e-scalper");
    let path = "/admin/blocklist/e2e-scalper";

    // A grab path handed out before the block, which the block must also stop.
    let pass = harness
        .api
        .grab_pass(&scalper, "blocklist")
        .await
        .expect("token answers");
    assert_eq!(pass.status, StatusCode::OK, "{}", pass.body);
    let early_grab_path = pass.str_field("grab_path").expect("a grab path").to_owned();

    // Only an admin may block: a buyer's attempt is forbidden and writes nothing.
    let before = harness.item_count().await;
    let refused = blocklist_call(&harness, Method::PUT, path, &scalper).await;
    assert_error(&refused, StatusCode::FORBIDDEN, "forbidden");
    assert_eq!(harness.item_count().await, before);

    let blocked = blocklist_call(&harness, Method::PUT, path, &harness.admin).await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    assert_eq!(
        blocked.body,
        json!({"user_id": "e2e-scalper", "blocked": true})
    );
    let listed = blocklist_call(&harness, Method::GET, "/admin/blocklist", &harness.admin).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body, json!({"users": ["e2e-scalper"]}));

    // The contract: one refresh interval after the block, no grab instance serves the
    // user, whichever instance answers. Polling instead could let a stale instance
    // reserve through the early path, which is exactly what must not happen.
    tokio::time::sleep(BLOCKLIST_REFRESH + Duration::from_millis(500)).await;
    harness
        .assert_grabs_refused_without_writing(
            "blocklist",
            (&scalper, &scalper, &early_grab_path),
            StatusCode::FORBIDDEN,
            "blocked",
        )
        .await;
    assert_eq!(harness.shard_availability("blocklist", 1).await, [5]);

    let unblocked = blocklist_call(&harness, Method::DELETE, path, &harness.admin).await;
    assert_eq!(unblocked.status, StatusCode::OK, "{}", unblocked.body);
    assert_eq!(
        unblocked.body,
        json!({"user_id": "e2e-scalper", "blocked": false})
    );
    let listed = blocklist_call(&harness, Method::GET, "/admin/blocklist", &harness.admin).await;
    assert_eq!(listed.body, json!({"users": []}));

    let order_id = eventually(REFRESH_LAG, || async {
        let grabbed = harness
            .api
            .grab(&scalper, "blocklist")
            .await
            .expect("grab answers");
        if grabbed.status == StatusCode::ACCEPTED {
            Ok(grabbed.str_field("order_id").expect("order_id").to_owned())
        } else {
            Err(grabbed.body)
        }
    })
    .await;
    assert_eq!(harness.shard_availability("blocklist", 1).await, [4]);
    assert!(order_id.starts_with("blocklist."), "{order_id}");
}
