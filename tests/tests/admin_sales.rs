//! The admin's list of sales through the local stack: pages over the index on
//! DynamoDB Local, the latest-ending first, for admins only.

use flashsale_e2e::{Harness, assert_error};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// One page, asked again while the API answers busy (a loaded DynamoDB Local): a read
/// is safe to repeat.
async fn page(harness: &Harness, token: &str, query: &str) -> flashsale_load::ApiResponse {
    let path = format!("/admin/sales?{query}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let answer = harness
            .api
            .send_raw(Method::GET, &path, Some(token), None)
            .await
            .expect("the API answers");
        let busy = matches!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        );
        if !busy || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

fn ids(page: &Value) -> Vec<&str> {
    page["sales"]
        .as_array()
        .expect("sales")
        .iter()
        .map(|sale| sale["sale_id"].as_str().expect("sale_id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_pages_through_the_sales_latest_ending_first() {
    let harness = Harness::start("admin-list").await;
    // Each ends an hour after it is made: the later made, the later it ends.
    for sale_id in ["list-a", "list-b", "list-c"] {
        harness.active_sale(sale_id, 4, 2, 600).await;
    }
    let admin = harness.admin.clone();

    let first = page(&harness, &admin, "limit=2").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(ids(&first.body), ["list-c", "list-b"], "{}", first.body);
    let sale = &first.body["sales"][0];
    assert_eq!(
        (
            &sale["status"],
            &sale["stock_available"],
            &sale["stock_total"]
        ),
        (&Value::from("active"), &Value::from(4), &Value::from(4)),
        "{sale}"
    );
    let cursor = first.body["next_cursor"].as_str().expect("a next page");
    let last = page(&harness, &admin, &format!("limit=2&cursor={cursor}")).await;
    assert_eq!(last.status, StatusCode::OK, "{}", last.body);
    assert_eq!(ids(&last.body), ["list-a"], "{}", last.body);
    assert!(last.body.get("next_cursor").is_none(), "{}", last.body);

    let refused = page(&harness, &admin, "cursor=not-ours").await;
    assert_error(&refused, StatusCode::BAD_REQUEST, "invalid_input");
    let buyer = harness.user("list-buyer");
    let refused = page(&harness, &buyer, "limit=2").await;
    assert_error(&refused, StatusCode::FORBIDDEN, "forbidden");
}
