use chrono::{Duration, Utc};
use flashsale_local::metrics::Summary;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{options, start};

#[tokio::test]
async fn grabs_move_the_local_metrics_counters_by_exactly_their_outcomes() {
    let stack = start(options("metrics")).await;
    let client = reqwest::Client::new();
    let sale_id = format!("m-{}", flashsale_emulators::unique_suffix());
    let admin = stack.token("ops", true).expect("admin token");
    let now = Utc::now();
    let created = client
        .post(format!("{}/admin/sales", stack.api_url))
        .bearer_auth(&admin)
        .json(&json!({
            "sale_id": sale_id,
            "name": "metrics",
            "price": {"amount": 100, "currency": "EUR"},
            "stock": 2,
            "shards": 1,
            "starts_at": (now - Duration::seconds(5)).to_rfc3339(),
            "ends_at": (now + Duration::hours(1)).to_rfc3339(),
            "payment_timeout_secs": 600,
        }))
        .send()
        .await
        .expect("create the sale");
    assert_eq!(created.status(), StatusCode::CREATED);

    // Two units, four buyers: two reserve, two hear sold out.
    let mut statuses = Vec::new();
    for buyer in ["ann", "bob", "cid", "dee"] {
        let token = stack.token(buyer, false).expect("buyer token");
        let pass: Value = client
            .post(format!("{}/sales/{sale_id}/token", stack.api_url))
            .bearer_auth(&token)
            .send()
            .await
            .expect("token request")
            .json()
            .await
            .expect("a grab pass");
        let path = pass["grab_path"].as_str().expect("a grab path");
        // A buyer retries the same path on 503 (a loaded machine can miss the
        // grab's deadline); the path names its order, so the retry resumes it.
        let mut status = StatusCode::SERVICE_UNAVAILABLE;
        for _ in 0..20 {
            status = client
                .post(format!("{}{path}", stack.api_url))
                .bearer_auth(&token)
                .send()
                .await
                .expect("grab")
                .status();
            if status != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
        }
        statuses.push(status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::ACCEPTED,
            StatusCode::ACCEPTED,
            StatusCode::CONFLICT,
            StatusCode::CONFLICT
        ]
    );

    // Recorded before each answer went out, so no waiting is needed.
    let summary: Summary = client
        .get(format!("{}/local/metrics", stack.api_url))
        .send()
        .await
        .expect("GET /local/metrics")
        .json()
        .await
        .expect("a JSON summary");
    let sale = ("sale_id", sale_id.as_str());
    let grabs = |reason| summary.counter("grab_outcome", &[sale, ("reason", reason)]);
    // Each 202 is one reserved or resumed grab. (A 503 is counted under
    // `sale_id=unknown`: it does not prove the sale exists.)
    assert_eq!(grabs("reserved") + grabs("resumed"), 2.0);
    assert!(grabs("reserved") >= 1.0, "{summary:#?}");
    // The first sold-out grab tries the empty shard; the next is refused in memory
    // unless the gate's one-second mark went stale in between (a slow machine).
    let sold_out_in_db = grabs("sold_out_database");
    assert_eq!(sold_out_in_db + grabs("sold_out_gate"), 2.0);
    assert!(sold_out_in_db >= 1.0, "{summary:#?}");
    assert!(summary.counter("grab_reached_database", &[sale]) >= 2.0 + sold_out_in_db);
    assert_eq!(summary.counter("tokens_issued", &[sale]), 4.0);
    stack.shutdown().await;
}
