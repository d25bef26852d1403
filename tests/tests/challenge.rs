//! The proof-of-work challenge before the grab path (issue 16 §1), through HTTP: a sale
//! that asks for one hands out a grab path only for a solved challenge of this buyer, a
//! wrong solution costs DynamoDB nothing (counted at the HTTP level), and a replayed
//! solution buys the same order, never a second unit.

use chrono::Utc;
use flashsale_domain::challenge::IssuedChallenge;
use flashsale_e2e::{Harness, assert_error};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const WORK: u32 = 2_000;

async fn create_sale(harness: &Harness, sale_id: &str, challenge_work: u32) {
    let now = Utc::now();
    let sale = json!({
        "sale_id": sale_id,
        "name": format!("e2e {sale_id}"),
        "price": flashsale_load::client::sale_price(),
        "stock": 3,
        "shards": 1,
        "per_user_limit": 3,
        "starts_at": now - chrono::Duration::seconds(1),
        "ends_at": now + chrono::Duration::hours(1),
        "challenge_work": challenge_work,
    });
    let created = harness
        .api
        .create_sale(&harness.admin, &sale)
        .await
        .expect("create answers");
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["challenge_work"], challenge_work);
}

async fn challenge(harness: &Harness, user: &str, sale_id: &str) -> Value {
    let answer = harness
        .api
        .send(
            Method::GET,
            &format!("/sales/{sale_id}/challenge"),
            Some(user),
            None,
        )
        .await
        .expect("the challenge route answers");
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(
        answer.cache_control.as_deref(),
        Some("no-store"),
        "per buyer"
    );
    answer.body
}

fn solved(challenge: &Value) -> Value {
    let (payload, derivations) =
        flashsale_adapters::proof_of_work::solve(&IssuedChallenge(challenge.clone()))
            .expect("the challenge solves");
    assert!(derivations <= WORK, "{derivations}");
    payload
}

async fn token(
    harness: &Harness,
    user: &str,
    sale_id: &str,
    body: Option<&Value>,
) -> flashsale_load::ApiResponse {
    harness
        .api
        .send(
            Method::POST,
            &format!("/sales/{sale_id}/token"),
            Some(user),
            body,
        )
        .await
        .expect("the token route answers")
}

async fn grab(harness: &Harness, user: &str, path: &str) -> flashsale_load::ApiResponse {
    harness
        .api
        .send(Method::POST, path, Some(user), None)
        .await
        .expect("the grab route answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grab_path_costs_a_solved_challenge_and_a_replay_buys_nothing_more() {
    let harness = Harness::start_counted("challenge", &[]).await;
    create_sale(&harness, "pow", WORK).await;
    let sale = harness.api.sale("pow").await.expect("the sale answers");
    assert_eq!(
        sale.body["challenge_work"], WORK,
        "the page learns it from the status"
    );
    let alice = harness.user("e2e-pow-alice");
    let bob = harness.user("e2e-pow-bob");

    assert_error(
        &token(&harness, &alice, "pow", None).await,
        StatusCode::FORBIDDEN,
        "challenge_required",
    );
    let issued = challenge(&harness, &alice, "pow").await;
    assert_eq!(issued["parameters"]["algorithm"], "PBKDF2/SHA-256");
    assert_eq!(issued["parameters"]["data"]["work"], WORK);
    let solution = solved(&issued);

    // Wrong solutions, each refused in memory: not one DynamoDB request between them.
    let mut guessed = solution.clone();
    guessed["solution"]["derivedKey"] = json!("00".repeat(32));
    let mut rebound = solution.clone();
    rebound["challenge"]["parameters"]["data"]["user"] = json!("e2e-pow-bob");
    let before = harness.dynamodb_requests();
    for (who, wrong) in [
        (&alice, &guessed),
        (&bob, &rebound),
        (&bob, &solution),
        (&alice, &json!({"challenge": {}, "solution": {}})),
    ] {
        assert_error(
            &token(&harness, who, "pow", Some(wrong)).await,
            StatusCode::FORBIDDEN,
            "challenge_failed",
        );
    }
    let garbled = harness
        .api
        .send_raw(
            Method::POST,
            "/sales/pow/token",
            Some(&alice),
            Some(b"{not json".to_vec()),
        )
        .await
        .expect("answers");
    assert_error(&garbled, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(
        harness.dynamodb_requests(),
        before,
        "a refused solution reaches no DynamoDB"
    );

    // The solution buys a path, and the path a unit.
    let pass = token(&harness, &alice, "pow", Some(&solution)).await;
    assert_eq!(pass.status, StatusCode::OK, "{}", pass.body);
    let first = grab(&harness, &alice, pass.str_field("grab_path").unwrap()).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let order = first.str_field("order_id").unwrap().to_owned();

    // The same solution again: a path to the same order, answered with it, no second unit.
    for _ in 0..2 {
        let replay = token(&harness, &alice, "pow", Some(&solution)).await;
        assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
        let again = grab(&harness, &alice, replay.str_field("grab_path").unwrap()).await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
        assert_eq!(again.str_field("order_id"), Some(order.as_str()));
    }
    let stats = harness.stats("pow").await;
    assert_eq!(stats["available"].as_u64(), Some(2), "{stats}");

    // A sale that asks none has no challenge to give.
    create_sale(&harness, "plain", 0).await;
    let none = harness
        .api
        .send(Method::GET, "/sales/plain/challenge", Some(&alice), None)
        .await
        .expect("answers");
    assert_error(&none, StatusCode::NOT_FOUND, "no_challenge");
}
