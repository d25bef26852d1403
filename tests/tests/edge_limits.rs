//! The edge's limits per buyer and per IP (the template's WAF rate-based rules, which the
//! local gateway plays): past its limit, a buyer or an address gets 429 with
//! `Retry-After` on the token and grab paths, no function runs for it, and everybody
//! else, and every other route, is unaffected.
//!
//! One test in a binary of its own: the function invocations it counts are the test
//! process's, which another stack's grabs would add to.

use std::net::IpAddr;

use flashsale_e2e::{Harness, assert_error};
use flashsale_load::{ApiClient, ApiResponse};
use reqwest::{Method, StatusCode};

const PER_USER: u32 = 10;
const PER_IP: u32 = 25;
const WINDOW_SECS: &str = "60";

async fn token_request(api: &ApiClient, user: &str) -> (ApiResponse, Option<String>) {
    api.send_for_retry_after(Method::POST, "/sales/edge/token", Some(user))
        .await
        .expect("the token route answers")
}

async fn grab_invocations(harness: &Harness) -> f64 {
    harness
        .local_metrics()
        .await
        .counter("lambda_invocations", &[("function", "GrabFunction")])
}

fn assert_limited(answer: &(ApiResponse, Option<String>)) {
    assert_error(&answer.0, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert_eq!(
        answer.1.as_deref(),
        Some(WINDOW_SECS),
        "Retry-After: the window, which the page waits out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buyer_or_an_address_over_its_limit_is_refused_at_the_edge_and_nobody_else_is() {
    let harness = Harness::start_with(
        "edge",
        &[
            ("EnableWaf", "true"),
            ("WafGrabRateLimitPerUser", &PER_USER.to_string()),
            ("WafGrabRateLimitPerIp", &PER_IP.to_string()),
            ("WafPaymentRateLimitPerUser", &PER_USER.to_string()),
            ("WafRateWindowSecs", WINDOW_SECS),
            // The route throttle is another row of the funnel; out of the way here.
            ("TokenThrottleRateLimit", "1000"),
            ("TokenThrottleBurstLimit", "1000"),
            // No webhook at the local Stripe: it posts every stack's events to every
            // endpoint registered, as Stripe does an account's, and the payment tests
            // running beside this one invoked this stack's api 4 times in the count.
            // The payment routes still run the api (answering that payments are off).
            ("CardPayments", "off"),
        ],
    )
    .await;
    harness.active_sale("edge", 5, 1, 900).await;
    let address = |last: u8| -> ApiClient {
        ApiClient::from_address(&harness.stack.api_url, IpAddr::from([127, 0, 0, last]))
    };

    // Per buyer: one buyer's eleventh token request in a minute is refused, from any
    // address, and costs the grab function nothing.
    let hasty = harness.user("e2e-edge-hasty");
    let home = address(11);
    for n in 1..=PER_USER {
        let (answer, _) = token_request(&home, &hasty).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "request {n}: {}",
            answer.body
        );
    }
    let before = grab_invocations(&harness).await;
    assert_limited(&token_request(&home, &hasty).await);
    assert_limited(&token_request(&address(12), &hasty).await);
    let grab_path = format!("/sales/edge/grab/{}", "x".repeat(40));
    let grab = home
        .send_for_retry_after(Method::POST, &grab_path, Some(&hasty))
        .await
        .expect("the grab route answers");
    assert_limited(&grab);
    assert_eq!(
        grab_invocations(&harness).await,
        before,
        "no refused request reached the grab function"
    );
    let blocked = harness.local_metrics().await;
    assert_eq!(
        blocked.counter("waf_blocked_requests", &[("rule", "grab-per-user")]),
        3.0
    );
    // Only the token and grab paths are limited: the buyer still reads the sale.
    let sale = home
        .send(Method::GET, "/sales/edge", Some(&hasty), None)
        .await
        .expect("the sale answers");
    assert_eq!(sale.status, StatusCode::OK, "{}", sale.body);
    // Another buyer of the same address is not affected.
    let neighbour = harness.user("e2e-edge-neighbour");
    let (answer, _) = token_request(&home, &neighbour).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    // Per address: many buyers behind one address (a NAT) share its limit; the
    // twenty-sixth is refused, a buyer elsewhere is not.
    let shared = address(21);
    for n in 1..=PER_IP {
        let buyer = harness.user(&format!("e2e-edge-nat-{n}"));
        let (answer, _) = token_request(&shared, &buyer).await;
        assert_eq!(answer.status, StatusCode::OK, "buyer {n}: {}", answer.body);
    }
    let before = grab_invocations(&harness).await;
    let late = harness.user("e2e-edge-nat-late");
    assert_limited(&token_request(&shared, &late).await);
    assert_eq!(
        grab_invocations(&harness).await,
        before,
        "the refused request reached no function"
    );
    let (answer, _) = token_request(&address(22), &late).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "the same buyer from another address: {}",
        answer.body
    );
    let blocked = harness.local_metrics().await;
    assert_eq!(
        blocked.counter("waf_blocked_requests", &[("rule", "grab-per-ip")]),
        1.0
    );
    // Per buyer on the payment routes (issue 47): each calls Stripe, whose rate limit
    // the whole account shares. A buyer's eleventh payment request in a minute is
    // refused at the edge; the token route, limited apart, still answers.
    let payer = harness.user("e2e-edge-payer");
    let payment_path = "/orders/edge.01ARZ3NDEKTSV4RRFFQ69G5FAV/payment";
    let api_before = api_invocations(&harness).await;
    for (n, path) in (1..=PER_USER).zip(
        [payment_path.to_owned(), format!("{payment_path}/confirm")]
            .into_iter()
            .cycle(),
    ) {
        let (answer, _) = address(31)
            .send_for_retry_after(Method::POST, &path, Some(&payer))
            .await
            .expect("the payment route answers");
        assert_ne!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "request {n}: {}",
            answer.body
        );
    }
    assert_eq!(
        api_invocations(&harness).await,
        api_before + f64::from(PER_USER)
    );
    for path in [payment_path.to_owned(), format!("{payment_path}/confirm")] {
        let refused = address(32)
            .send_for_retry_after(Method::POST, &path, Some(&payer))
            .await
            .expect("the payment route answers");
        assert_limited(&refused);
        assert!(
            refused.0.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("payment requests")),
            "{}",
            refused.0.body
        );
    }
    assert_eq!(
        api_invocations(&harness).await,
        api_before + f64::from(PER_USER),
        "no refused payment request reached the api function"
    );
    let (answer, _) = token_request(&address(31), &payer).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let blocked = harness.local_metrics().await;
    assert_eq!(
        blocked.counter("waf_blocked_requests", &[("rule", "payment-per-user")]),
        2.0
    );
}

async fn api_invocations(harness: &Harness) -> f64 {
    harness
        .local_metrics()
        .await
        .counter("lambda_invocations", &[("function", "ApiFunction")])
}
