//! The fulfilment export through the local stack: the paid orders of a sale, read
//! through the holds' index on DynamoDB Local a page at a time, as JSON and as CSV, and
//! counted against the stats.

use std::time::Duration;

use flashsale_e2e::{Harness, eventually};
use reqwest::StatusCode;
use serde_json::Value;

/// How long the index may take to show the last writes: generous for a loaded
/// machine (it only bounds a failure).
const INDEX_LAG: Duration = Duration::from_secs(60);

/// One page of the export: its status, its `x-next-cursor` header and its body.
async fn page(
    harness: &Harness,
    route: &str,
    query: &[(&str, &str)],
) -> (StatusCode, Option<String>, String) {
    let answer = reqwest::Client::new()
        .get(format!(
            "{}/admin/sales/export/{route}",
            harness.api.base_url()
        ))
        .query(query)
        .bearer_auth(&harness.admin)
        .send()
        .await
        .expect("the export answers");
    let next = answer
        .headers()
        .get("x-next-cursor")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let status = answer.status();
    (status, next, answer.text().await.expect("a body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paid_orders_export_through_the_index_and_agree_with_the_stats() {
    let harness = Harness::start("fulfilment").await;
    harness.active_sale("export", 6, 2, 900).await;
    let mut paid = Vec::new();
    for (n, buyer) in ["e2e-ann", "e2e-bob", "e2e-cy"].into_iter().enumerate() {
        let token = harness.user(buyer);
        let (order_id, _) = harness.grab_ok(&token, "export").await;
        if n != 1 {
            let settled = harness.pay_by_card(&token, &order_id).await;
            assert_eq!(settled.status, StatusCode::OK, "{}", settled.body);
            paid.push(order_id);
        }
    }
    paid.sort();
    let stats = harness.stats("export").await;
    assert_eq!(stats["paid"], 2, "{stats}");

    // One buyer a page: the cursor carries the export from bucket to bucket.
    let listed = eventually(INDEX_LAG, || async {
        let (mut listed, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let mut query = vec![("status", "paid"), ("limit", "1")];
            if let Some(cursor) = &cursor {
                query.push(("cursor", cursor.as_str()));
            }
            let (status, _, body) = page(&harness, "orders", &query).await;
            if status != StatusCode::OK {
                return Err(body);
            }
            let body: Value = serde_json::from_str(&body).expect("JSON");
            for line in body["orders"].as_array().expect("orders") {
                listed.push(line["order_id"].as_str().expect("order_id").to_owned());
            }
            match body["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        listed.sort();
        if listed == paid {
            Ok(listed)
        } else {
            Err(format!("{listed:?}"))
        }
    })
    .await;
    assert_eq!(listed, paid);

    // CSV, one buyer a page too, joined: one header row, a row per paid order.
    let (mut text, mut cursor) = (String::new(), None::<String>);
    loop {
        let mut query = vec![("status", "paid"), ("limit", "1")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.as_str()));
        }
        let (status, next, body) = page(&harness, "orders.csv", &query).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        text.push_str(&body);
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(
        rows[0],
        "order_id,buyer,status,payment,amount,currency,price,paid_at"
    );
    assert_eq!(rows.len(), 3, "{text}");
    for order_id in &paid {
        assert!(
            rows.iter()
                .any(|row| row.starts_with(&format!("{order_id},e2e-"))),
            "{text}"
        );
    }
}
