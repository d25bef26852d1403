//! The operator's stop through the local stack: an admin pauses a live sale, resumes
//! it and ends it. Within the sale refresh of the pause no grab path and no grab gets
//! through and nothing is written; holds taken before stay payable; the resumed sale
//! sells on; the stock reconciles throughout; the audit trail says who did what.

use std::time::Duration;

use flashsale_e2e::{Harness, assert_error, eventually};
use flashsale_load::ApiResponse;
use reqwest::{Method, StatusCode};
use serde_json::json;

/// `SaleRefreshMs` in the template: every process's copy of a sale is at most this old
/// when it answers.
const SALE_REFRESH: Duration = Duration::from_secs(2);

/// How long a resume may take to show, polling: generous for a loaded machine (it only
/// bounds a failure).
const REFRESH_LAG: Duration = Duration::from_secs(60);

async fn control(harness: &Harness, action: &str, token: &str) -> ApiResponse {
    harness
        .api
        .send(
            Method::POST,
            &format!("/admin/sales/control/{action}"),
            Some(token),
            None,
        )
        .await
        .expect("the control route answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_pauses_resumes_and_ends_a_live_sale_and_the_stock_stays_exact() {
    let harness = Harness::start("sale-control").await;
    harness.active_sale("control", 4, 1, 900).await;
    let admin = harness.admin.clone();
    let early = harness.user("e2e-early");
    let (held, _) = harness.grab_ok(&early, "control").await;
    let waiting = harness.user("e2e-waiting");
    let pass = harness
        .api
        .grab_pass(&waiting, "control")
        .await
        .expect("token answers");
    assert_eq!(pass.status, StatusCode::OK, "{}", pass.body);
    let path_before_pause = pass.str_field("grab_path").expect("a grab path").to_owned();

    // Only an admin pauses: a buyer's attempt is forbidden and writes nothing.
    let before = harness.item_count().await;
    assert_error(
        &control(&harness, "pause", &early).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    assert_eq!(harness.item_count().await, before);

    let paused = control(&harness, "pause", &admin).await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.body);
    assert_eq!(
        paused.body,
        json!({"sale_id": "control", "control": "paused", "changed": true})
    );
    // The contract: one refresh interval after the pause's answer, no process admits a
    // grab, whichever answers. Polling instead could let a stale copy through.
    tokio::time::sleep(SALE_REFRESH + Duration::from_millis(500)).await;
    let late = harness.user("e2e-late");
    harness
        .assert_grabs_refused_without_writing(
            "control",
            (&late, &waiting, &path_before_pause),
            StatusCode::CONFLICT,
            "sale_paused",
        )
        .await;
    assert_eq!(harness.shard_availability("control", 1).await, [3]);
    let page = harness
        .api
        .send(Method::GET, "/sales/control", None, None)
        .await
        .expect("the page answers");
    assert_eq!(page.body["status"], "paused", "{}", page.body);

    // A hold taken before the pause is still paid.
    let paid = harness.pay_by_card(&early, &held).await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.body);

    let resumed = control(&harness, "resume", &admin).await;
    assert_eq!(resumed.body["control"], "open", "{}", resumed.body);
    let order_id = eventually(REFRESH_LAG, || async {
        let grabbed = harness
            .api
            .send(Method::POST, &path_before_pause, Some(&waiting), None)
            .await
            .expect("grab answers");
        if grabbed.status == StatusCode::ACCEPTED {
            Ok(grabbed.str_field("order_id").expect("order_id").to_owned())
        } else {
            Err(grabbed.body)
        }
    })
    .await;
    assert!(order_id.starts_with("control."), "{order_id}");

    let ended = control(&harness, "end", &admin).await;
    assert_eq!(ended.body["control"], "ended", "{}", ended.body);
    tokio::time::sleep(SALE_REFRESH + Duration::from_millis(500)).await;
    let refused = harness.api.grab(&late, "control").await.expect("answers");
    assert_error(&refused, StatusCode::GONE, "ended");
    assert_error(
        &control(&harness, "resume", &admin).await,
        StatusCode::GONE,
        "ended",
    );

    let stats = harness.stats("control").await;
    assert_eq!(
        (&stats["available"], &stats["reserved"], &stats["paid"]),
        (&json!(2), &json!(1), &json!(1)),
        "{stats}"
    );
    assert_eq!(stats["consistent"], true, "{stats}");

    let trail = harness
        .api
        .send(
            Method::GET,
            "/admin/sales/control/audit",
            Some(&admin),
            None,
        )
        .await
        .expect("the trail answers");
    assert_eq!(trail.status, StatusCode::OK, "{}", trail.body);
    let entries = trail.body["entries"].as_array().expect("entries");
    let actions: Vec<_> = entries.iter().map(|entry| &entry["action"]).collect();
    assert_eq!(actions, ["end", "resume", "pause"], "{}", trail.body);
    assert!(
        entries
            .iter()
            .all(|entry| entry["by"] == entries[0]["by"] && entry["at"].is_string()),
        "{}",
        trail.body
    );
}
