//! Bad input gets its 4xx with `{"error", "message"}`, never a 5xx, and writes nothing.
//! Requests API Gateway refuses itself (no valid token) never reach a function; they
//! get the gateway's own `{"message"}`.

use flashsale_e2e::{Harness, RefusedBy, assert_refused};
use flashsale_load::client::ApiResponse;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn assert_refused_without_writing(
    harness: &Harness,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
    status: StatusCode,
    by: impl Into<RefusedBy>,
) {
    let before = harness.item_count().await;
    let response = harness
        .api
        .send_raw(method.clone(), path, token, body)
        .await
        .expect("an answer");
    assert_refused(&response, status, by);
    assert_eq!(
        harness.item_count().await,
        before,
        "{method} {path} wrote something"
    );
}

fn sale_body(overrides: serde_json::Value) -> Vec<u8> {
    let mut body = json!({
        "sale_id": "bad-input-sale",
        "name": "Phone",
        "price": {"amount": 129_900, "currency": "EUR"},
        "stock": 10,
        "starts_at": "2026-01-01T00:00:00Z",
        "ends_at": "2099-01-01T00:00:00Z",
    });
    for (key, value) in overrides.as_object().expect("an object") {
        if value.is_null() {
            body.as_object_mut().unwrap().remove(key);
        } else {
            body[key] = value.clone();
        }
    }
    serde_json::to_vec(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_sales_are_refused_with_400_and_write_nothing() {
    let harness = Harness::start("bad-sale").await;
    let admin = harness.admin.clone();
    let post = |body: Vec<u8>, code: &'static str| {
        let harness = &harness;
        let admin = admin.clone();
        async move {
            assert_refused_without_writing(
                harness,
                Method::POST,
                "/admin/sales",
                Some(&admin),
                Some(body),
                StatusCode::BAD_REQUEST,
                code,
            )
            .await;
        }
    };
    post(b"{\"name\": \"Phone\", ".to_vec(), "invalid_json").await;
    post(b"not json at all".to_vec(), "invalid_json").await;
    // Well-formed JSON of the wrong shape is invalid input, naming the field.
    post(sale_body(json!({ "name": null })), "invalid_input").await;
    post(sale_body(json!({ "stock": "ten" })), "invalid_input").await;
    post(
        sale_body(json!({ "starts_at": "yesterday" })),
        "invalid_input",
    )
    .await;
    post(sale_body(json!({ "colour": "red" })), "invalid_input").await;
    post(sale_body(json!({ "stock": 0 })), "invalid_input").await;
    post(sale_body(json!({ "stock": -3 })), "invalid_input").await;
    post(sale_body(json!({ "stock": 1_000_001 })), "invalid_input").await;
    post(
        sale_body(json!({ "ends_at": "2026-01-01T00:00:00Z" })),
        "invalid_input",
    )
    .await;
    post(
        sale_body(json!({ "payment_timeout_secs": 0 })),
        "invalid_input",
    )
    .await;
    post(
        sale_body(json!({ "sale_id": "has spaces" })),
        "invalid_input",
    )
    .await;
    post(sale_body(json!({ "shards": 11 })), "invalid_input").await;
    for reserve in [json!("fast"), json!("Adaptive"), json!(""), json!(1)] {
        post(sale_body(json!({ "reserve": reserve })), "invalid_input").await;
    }
    // A price is required, in whole minor units of a current ISO 4217 currency, as
    // Stripe takes it (its currency codes are lower case; the API's are ISO's).
    for price in [
        Value::Null,
        json!(1299),
        json!("12.99 EUR"),
        json!({ "amount": 1299 }),
        json!({ "currency": "EUR" }),
        json!({ "amount": 12.99, "currency": "EUR" }),
        json!({ "amount": "1299", "currency": "EUR" }),
        json!({ "amount": 0, "currency": "EUR" }),
        json!({ "amount": -1, "currency": "EUR" }),
        json!({ "amount": 100_000_000, "currency": "EUR" }),
        json!({ "amount": 1299, "currency": "eur" }),
        json!({ "amount": 1299, "currency": "EURO" }),
        json!({ "amount": 1299, "currency": "XAU" }),
        json!({ "amount": 1299, "currency": "HRK" }),
        json!({ "amount": 1299, "currency": "EUR", "decimals": 2 }),
        // Issue 47: prices Stripe never charges, refused before a buyer meets them at
        // the payment: money it does not take, under its minimum, over its eight digits
        // in its own unit (ISK's hundredths), or between its steps (a fils of BHD, a
        // hundredth of an ariary: whole ariary at Stripe).
        json!({ "amount": 1299, "currency": "IRR" }),
        json!({ "amount": 49, "currency": "USD" }),
        json!({ "amount": 1_000_000, "currency": "ISK" }),
        json!({ "amount": 1299, "currency": "BHD" }),
        json!({ "amount": 129_950, "currency": "MGA" }),
    ] {
        post(sale_body(json!({ "price": price })), "invalid_input").await;
    }
    // Valid RFC 3339 that lands in year 10000 in UTC: it could be stored but never read.
    post(
        sale_body(json!({ "ends_at": "9999-12-31T23:59:59-05:00" })),
        "invalid_input",
    )
    .await;
    // The optional fields may be left out, never null (sale_body drops a null override,
    // so these bodies are spelled out).
    for field in [
        "sale_id",
        "per_user_limit",
        "payment_timeout_secs",
        "shards",
        "reserve",
    ] {
        let mut body: Value = serde_json::from_slice(&sale_body(json!({}))).unwrap();
        body[field] = Value::Null;
        post(serde_json::to_vec(&body).unwrap(), "invalid_input").await;
    }
    // Names are shown on the public page as sent: no control or bidi formatting
    // characters, not blank, and 200 characters counting any blanks.
    for name in [
        "Phone\u{0}".to_owned(),
        "\u{1b}[2JPhone".to_owned(),
        "Phone \u{202e}gpj.exe".to_owned(),
        "   ".to_owned(),
        format!("     {}     ", "x".repeat(200)),
    ] {
        post(sale_body(json!({ "name": name })), "invalid_input").await;
    }
}

/// Sends `body` to `POST /admin/sales` as `content_type` (none when `None`).
async fn create_sale_as(
    harness: &Harness,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> ApiResponse {
    let mut request = reqwest::Client::new()
        .post(format!("{}/admin/sales", harness.api.base_url()))
        .bearer_auth(&harness.admin)
        .body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status();
    let cache_control = response
        .headers()
        .get("cache-control")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body = response.json().await.expect("a JSON answer");
    ApiResponse {
        status,
        body,
        cache_control,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_not_sent_as_json_is_415_and_writes_nothing() {
    let harness = Harness::start("media-type").await;
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let before = harness.item_count().await;
        let response = create_sale_as(&harness, content_type, sale_body(json!({}))).await;
        assert_refused(
            &response,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
        assert_eq!(harness.item_count().await, before, "{content_type:?} wrote");
    }
    let json_with_charset = create_sale_as(
        &harness,
        Some("application/json; charset=utf-8"),
        sale_body(json!({})),
    )
    .await;
    assert_eq!(
        json_with_charset.status,
        StatusCode::CREATED,
        "{}",
        json_with_charset.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_ids_are_measured_in_characters_and_refuse_control_characters() {
    let harness = Harness::start("user-ids").await;
    let admin = harness.admin.clone();
    // 129 two-byte characters, percent-encoded in the path.
    let too_long = "%C3%A9".repeat(129);
    for user_id in [too_long.as_str(), "esc%1Bx", "nul%00x"] {
        assert_refused_without_writing(
            &harness,
            Method::PUT,
            &format!("/admin/blocklist/{user_id}"),
            Some(&admin),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_input",
        )
        .await;
    }
    // 128 of them is the longest user id, as the contract's maxLength counts.
    let longest = "%C3%A9".repeat(128);
    let response = harness
        .api
        .send_raw(
            Method::PUT,
            &format!("/admin/blocklist/{longest}"),
            Some(&admin),
            None,
        )
        .await
        .expect("an answer");
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(response.body["user_id"], "é".repeat(128));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversize_body_is_413_on_every_route_and_writes_nothing() {
    let harness = Harness::start("oversize").await;
    harness.active_sale("oversize", 5, 1, 900).await;
    let admin = harness.admin.clone();
    let alice = harness.user("alice");
    let huge = sale_body(json!({ "name": "x".repeat(1 << 20) }));
    for (method, path, token) in [
        (Method::POST, "/admin/sales", Some(admin.as_str())),
        (Method::POST, "/sales/oversize/token", Some(alice.as_str())),
        (
            Method::PUT,
            "/admin/blocklist/mallory",
            Some(admin.as_str()),
        ),
        (Method::GET, "/sales/oversize", None),
    ] {
        assert_refused_without_writing(
            &harness,
            method,
            path,
            token,
            Some(huge.clone()),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_sales_are_404_on_every_route() {
    let harness = Harness::start("unknown-sale").await;
    let alice = harness.user("alice");
    assert_refused_without_writing(
        &harness,
        Method::GET,
        "/sales/no-such-sale",
        None,
        None,
        StatusCode::NOT_FOUND,
        "sale_not_found",
    )
    .await;
    assert_refused_without_writing(
        &harness,
        Method::POST,
        "/sales/no-such-sale/token",
        Some(&alice),
        None,
        StatusCode::NOT_FOUND,
        "sale_not_found",
    )
    .await;
    // A grab path is only ever issued for a sale that exists: one on an unknown sale is
    // forged, refused on its signature before any lookup.
    assert_refused_without_writing(
        &harness,
        Method::POST,
        "/sales/no-such-sale/grab/123.abc",
        Some(&alice),
        None,
        StatusCode::FORBIDDEN,
        "invalid_token",
    )
    .await;
    let admin = harness.admin.clone();
    assert_refused_without_writing(
        &harness,
        Method::GET,
        "/admin/sales/no-such-sale/stats",
        Some(&admin),
        None,
        StatusCode::NOT_FOUND,
        "sale_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_or_borrowed_grab_tokens_are_403_and_write_nothing() {
    let harness = Harness::start("forged").await;
    harness.active_sale("forged", 5, 1, 900).await;
    let alice = harness.user("alice");
    let mallory = harness.user("mallory");
    let pass = harness.api.grab_pass(&alice, "forged").await.unwrap();
    let alices_path = pass.str_field("grab_path").unwrap().to_owned();
    let forged_path = format!(
        "/sales/forged/grab/{}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        chrono::Utc::now().timestamp() + 60
    );
    for path in [
        alices_path.as_str(),
        forged_path.as_str(),
        "/sales/forged/grab/garbage",
    ] {
        assert_refused_without_writing(
            &harness,
            Method::POST,
            path,
            Some(&mallory),
            None,
            StatusCode::FORBIDDEN,
            "invalid_token",
        )
        .await;
    }
    assert_eq!(harness.shard_availability("forged", 1).await, [5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_users_order_is_404_whatever_is_asked() {
    let harness = Harness::start("not-yours").await;
    harness.active_sale("not-yours", 5, 1, 900).await;
    let alice = harness.user("alice");
    let mallory = harness.user("mallory");
    let (order_id, _) = harness.grab_ok(&alice, "not-yours").await;
    // The order as its buyer pays it: held, its timer set.
    harness.wait_for_orders_opened("not-yours", 1).await;
    for (method, path) in [
        (Method::GET, format!("/orders/{order_id}")),
        (Method::POST, format!("/orders/{order_id}/payment")),
        (Method::POST, format!("/orders/{order_id}/payment/confirm")),
        (Method::POST, format!("/orders/{order_id}/cancel")),
    ] {
        assert_refused_without_writing(
            &harness,
            method,
            &path,
            Some(&mallory),
            None,
            StatusCode::NOT_FOUND,
            "order_not_found",
        )
        .await;
    }
    assert_refused_without_writing(
        &harness,
        Method::GET,
        "/orders/not-an-order-id",
        Some(&alice),
        None,
        StatusCode::NOT_FOUND,
        "order_not_found",
    )
    .await;
    assert_eq!(harness.order_status(&alice, &order_id).await, "reserved");
}

/// Every order in a buyer's list (`GET /orders`), page after page of `limit` sales.
async fn my_orders(harness: &Harness, user: &str, limit: Option<u32>) -> Vec<Value> {
    let (mut orders, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..10 {
        let page = harness
            .api
            .my_orders(user, limit, cursor.as_deref())
            .await
            .expect("GET /orders answers");
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        orders.extend(
            page.body["orders"]
                .as_array()
                .expect("orders")
                .iter()
                .cloned(),
        );
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return orders,
        }
    }
    panic!("more pages than sales: {orders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buyer_lists_their_own_orders_in_every_sale_and_never_anothers() {
    let harness = Harness::start("mine").await;
    for sale in ["mine-a", "mine-b"] {
        harness.active_sale(sale, 5, 1, 900).await;
    }
    let alice = harness.user("alice");
    let bob = harness.user("bob");
    let mallory = harness.user("mallory");
    let (alices_first, _) = harness.grab_ok(&alice, "mine-a").await;
    let (bobs, _) = harness.grab_ok(&bob, "mine-a").await;
    let (alices_latest, _) = harness.grab_ok(&alice, "mine-b").await;

    // Newest first, each order as the buyer reads it alone: a reload finds them all.
    for limit in [None, Some(1)] {
        let listed = my_orders(&harness, &alice, limit).await;
        let mut expected = Vec::new();
        for order_id in [&alices_latest, &alices_first] {
            let read = harness.api.order(&alice, order_id).await.expect("order");
            expected.push(read.body);
        }
        assert_eq!(listed, expected, "limit {limit:?}");
    }
    let bobs_list = my_orders(&harness, &bob, None).await;
    let ids: Vec<&str> = bobs_list
        .iter()
        .filter_map(|o| o["order_id"].as_str())
        .collect();
    assert_eq!(ids, [bobs.as_str()], "only bob's own");
    assert_eq!(
        my_orders(&harness, &mallory, Some(50)).await,
        Vec::<Value>::new()
    );

    assert_refused_without_writing(
        &harness,
        Method::GET,
        "/orders",
        None,
        None,
        StatusCode::UNAUTHORIZED,
        RefusedBy::Gateway("Unauthorized"),
    )
    .await;
    for query in [
        "limit=0",
        "limit=51",
        "cursor=1.2.not%20a%20sale",
        "cursor=garbage",
    ] {
        assert_refused_without_writing(
            &harness,
            Method::GET,
            &format!("/orders?{query}"),
            Some(&mallory),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_input",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_valid_token_protected_routes_are_401_and_users_are_not_admins() {
    let harness = Harness::start("auth").await;
    let alice = harness.user("alice");
    let body = Some(sale_body(json!({})));
    assert_refused_without_writing(
        &harness,
        Method::POST,
        "/admin/sales",
        None,
        body.clone(),
        StatusCode::UNAUTHORIZED,
        RefusedBy::Gateway("Unauthorized"),
    )
    .await;
    assert_refused_without_writing(
        &harness,
        Method::POST,
        "/admin/sales",
        Some("not.a.jwt"),
        body.clone(),
        StatusCode::UNAUTHORIZED,
        RefusedBy::Gateway("Unauthorized"),
    )
    .await;
    assert_refused_without_writing(
        &harness,
        Method::POST,
        "/admin/sales",
        Some(&alice),
        body,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
}
