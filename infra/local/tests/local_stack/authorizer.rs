use flashsale_local::auth::LocalJwt;
use flashsale_local::function_fn;
use lambda_http::RequestExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{Recorder, options, start};

/// Posts `body`, sent again on a 503 as a client does ("try again shortly"): a loaded
/// machine (CI's, with surges beside it on one DynamoDB Local) can keep the function's
/// store call past its budget. Each body here makes a new sale, so a resend is safe.
async fn post(url: &str, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let mut tries = 0;
    loop {
        tries += 1;
        let mut request = client.post(url).json(&body);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        if status != StatusCode::SERVICE_UNAVAILABLE || tries == 20 {
            return (status, response.json().await.unwrap_or(Value::Null));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn sale() -> Value {
    json!({"name": "x", "price": {"amount": 100, "currency": "EUR"}, "stock": 1, "starts_at": "2020-01-01T00:00:00Z", "ends_at": "2099-01-01T00:00:00Z"})
}

#[tokio::test]
async fn missing_malformed_wrongly_signed_and_expired_tokens_are_refused_before_the_function_runs()
{
    let recorder = Recorder::default();
    let api = {
        let recorder = recorder.clone();
        function_fn(move |event: Value| {
            let recorder = recorder.clone();
            async move {
                recorder.record(&event);
                Ok(json!({"statusCode": 200, "body": "{}"}))
            }
        })
    };
    let stack = start(options("auth-refused").function("ApiFunction", api)).await;
    let url = format!("{}/admin/sales", stack.api_url);

    let forger = LocalJwt::new(
        b"not-the-stack-secret-not-the-stack-secret".to_vec(),
        stack.jwt().authorizer.clone(),
        "cognito:groups",
        "admin",
    );
    let forged = forger.issue("mallory", true).expect("forged");
    let mut claims = stack.jwt().claims("bob", true).expect("claims");
    claims.insert("exp".to_owned(), json!(chrono::Utc::now().timestamp() - 5));
    let expired = stack.jwt().sign(&claims).expect("signed");
    let mut claims = stack.jwt().claims("bob", true).expect("claims");
    claims.insert("aud".to_owned(), json!("another-app"));
    let foreign = stack.jwt().sign(&claims).expect("signed");

    for (case, token) in [
        ("no token", None),
        ("malformed", Some("abc.def")),
        ("bad signature", Some(forged.as_str())),
        ("expired", Some(expired.as_str())),
        ("wrong audience", Some(foreign.as_str())),
    ] {
        let (status, body) = post(&url, token, sale()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}");
        // API Gateway's own answer: it cannot be shaped like the functions' errors.
        assert_eq!(body, json!({"message": "Unauthorized"}), "{case}");
    }
    assert_eq!(
        recorder.count(),
        0,
        "no refused request reached the function"
    );

    let (status, _) = post(
        &url,
        Some(&stack.token("bob", false).expect("token")),
        sale(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_user_token_on_an_admin_route_is_refused_by_the_api_function() {
    let stack = start(options("auth-admin")).await;
    let url = format!("{}/admin/sales", stack.api_url);
    let user = stack.token("bob", false).expect("token");
    let (status, body) = post(&url, Some(&user), sale()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "forbidden");

    // A token from the LOCAL ONLY route works the same way, and an admin's is let in.
    let (status, body) = post(
        &format!("{}/local/token", stack.api_url),
        None,
        json!({"user_id": "root", "admin": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let admin = body["token"].as_str().expect("token").to_owned();
    let (status, body) = post(&url, Some(&admin), sale()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    stack.shutdown().await;
}

#[tokio::test]
async fn the_function_receives_the_payload_format_2_event_api_gateway_sends() {
    let recorder = Recorder::default();
    let grab = {
        let recorder = recorder.clone();
        function_fn(move |event: Value| {
            let recorder = recorder.clone();
            async move {
                recorder.record(&event);
                Ok(
                    json!({"statusCode": 202, "headers": {"content-type": "application/json"}, "body": "{\"ok\":true}"}),
                )
            }
        })
    };
    let stack = start(options("auth-event").function("GrabFunction", grab)).await;
    let token = stack.token("alice", true).expect("token");
    let response = reqwest::Client::new()
        .post(format!(
            "{}/sales/s%201/grab/tok-1?a=1&a=2&b=x",
            stack.api_url
        ))
        .header("authorization", format!("Bearer {token}"))
        .header("X-Custom", "Yes")
        .header("content-type", "application/json")
        .body("{\"k\":1}")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(
        response.json::<Value>().await.expect("json"),
        json!({"ok": true})
    );

    let event = recorder.snapshot()[0].1.clone();
    assert_eq!(event["version"], "2.0");
    assert_eq!(event["routeKey"], "POST /sales/{sale_id}/grab/{token}");
    assert_eq!(event["rawPath"], "/sales/s%201/grab/tok-1");
    assert_eq!(event["rawQueryString"], "a=1&a=2&b=x");
    assert_eq!(
        event["queryStringParameters"],
        json!({"a": "1,2", "b": "x"})
    );
    assert_eq!(
        event["pathParameters"],
        json!({"sale_id": "s 1", "token": "tok-1"})
    );
    assert_eq!(event["headers"]["x-custom"], "Yes");
    assert_eq!(event["body"], "{\"k\":1}");
    assert_eq!(event["isBase64Encoded"], false);
    let context = &event["requestContext"];
    assert_eq!(context["accountId"], "123456789012");
    assert_eq!(context["http"]["method"], "POST");
    assert_eq!(context["http"]["sourceIp"], "127.0.0.1");
    assert_eq!(context["routeKey"], event["routeKey"]);
    assert_eq!(context["stage"], "dev");
    let claims = &context["authorizer"]["jwt"]["claims"];
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["cognito:groups"], "[admin]");

    // The same event is what the real handlers get, through lambda_http's conversion.
    let invoke = flashsale_local::InvokeContext {
        request_id: "r".to_owned(),
        function_arn: "arn".to_owned(),
        deadline: std::time::SystemTime::now(),
    };
    let request =
        flashsale_local::dispatch::http_request(event, &invoke).expect("lambda_http request");
    assert_eq!(request.path_parameters().first("sale_id"), Some("s 1"));
    assert_eq!(request.method(), "POST");
    stack.shutdown().await;
}
