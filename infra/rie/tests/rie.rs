//! The driver against AWS's RIE and the real `lambda_runtime` crate: the echo function
//! is a `lambda_runtime::run` binary, started exactly as the smoke test starts a
//! bootstrap.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flashsale_rie::{InvokeError, Lambda, LambdaSpec, Outcome, StartError, bundled_rie};
use serde_json::json;

/// The RIE `make tools` installed with aws-sam-cli (or `FLASHSALE_RIE`).
fn rie() -> PathBuf {
    if let Some(path) = std::env::var_os("FLASHSALE_RIE") {
        return PathBuf::from(path);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/venv");
    bundled_rie(&venv).unwrap_or_else(|| {
        panic!(
            "no aws-lambda-rie under {}: run `make tools` (it installs aws-sam-cli)",
            venv.display()
        )
    })
}

fn echo_spec() -> LambdaSpec {
    LambdaSpec {
        rie: rie(),
        name: "echo".to_owned(),
        bootstrap: PathBuf::from(env!("CARGO_BIN_EXE_flashsale-echo-lambda")),
        runner: Vec::new(),
        env: vec![
            ("RUST_LOG".to_owned(), "info".to_owned()),
            ("AWS_REGION".to_owned(), "us-east-1".to_owned()),
        ],
        memory_mb: 128,
        timeout: Duration::from_secs(20),
    }
}

#[tokio::test]
async fn a_lambda_runtime_function_receives_the_event_and_its_answer_comes_back() {
    let mut lambda = Lambda::start(&echo_spec()).await.expect("start");
    let first = lambda
        .invoke(&json!({"n": 1}))
        .await
        .expect("first")
        .json()
        .expect("json");
    assert_eq!(first["echo"], json!({"n": 1}));
    let arn = first["function_arn"].as_str().unwrap_or_default();
    assert!(arn.ends_with(":function:echo"), "{first}");
    assert_eq!(first["deadline_in_future"], true);

    // The same process serves the next invocation, with a new request id.
    let second = lambda
        .invoke(&json!({"n": 2}))
        .await
        .expect("second")
        .json()
        .expect("json");
    assert_eq!(second["echo"], json!({"n": 2}));
    assert_ne!(first["request_id"], second["request_id"]);
    assert!(
        lambda.logs().contains("echo lambda starting"),
        "{}",
        lambda.logs()
    );
}

#[tokio::test]
async fn a_handler_error_is_reported_as_a_function_error_and_the_function_keeps_serving() {
    let mut lambda = Lambda::start(&echo_spec()).await.expect("start");
    let outcome = lambda
        .invoke(&json!({"fail": true, "why": "bad input"}))
        .await
        .expect("an answer");
    let Outcome::FunctionError(error) = outcome else {
        panic!("expected a function error, got {outcome:?}");
    };
    assert!(error.error_message.contains("bad input"), "{error}");
    let after = lambda
        .invoke(&json!({"n": 3}))
        .await
        .expect("still serving");
    assert_eq!(after.json().expect("json")["echo"], json!({"n": 3}));
}

#[tokio::test]
async fn a_process_that_dies_fails_the_invocation_with_its_output_and_lambda_starts_another() {
    let mut lambda = Lambda::start(&echo_spec()).await.expect("start");
    let error = lambda
        .invoke(&json!({"exit": 3}))
        .await
        .expect_err("the process exits");
    let InvokeError::Failed { logs, .. } = &error else {
        panic!("expected the RIE's failure, got {error}");
    };
    assert!(logs.contains("exiting with 3"), "{logs}");
    assert!(logs.contains("Runtime.ExitError"), "{logs}");
    // As Lambda does, the next invocation gets a fresh process.
    let after = lambda
        .invoke(&json!({"n": 4}))
        .await
        .expect("a new process");
    assert_eq!(after.json().expect("json")["echo"], json!({"n": 4}));
}

#[tokio::test]
async fn a_function_that_cannot_start_fails_the_invocation_instead_of_hanging() {
    let mut spec = echo_spec();
    spec.bootstrap = PathBuf::from("/nonexistent/bootstrap");
    assert!(
        matches!(Lambda::start(&spec).await, Err(StartError::Missing { .. })),
        "a missing binary is a start error"
    );

    // A binary that starts but never speaks the Runtime API: the invocation times out.
    let silent = LambdaSpec {
        runner: vec!["/bin/sh".to_owned(), "-c".to_owned(), "sleep 30".to_owned()],
        timeout: Duration::from_secs(1),
        ..echo_spec()
    };
    let mut lambda = Lambda::start(&silent).await.expect("start");
    let error = lambda.invoke(&json!({})).await.expect_err("no answer");
    assert!(matches!(error, InvokeError::TimedOut { .. }), "{error:?}");
}

#[tokio::test]
async fn init_time_comes_from_the_ries_init_report_and_the_function_still_serves() {
    let mut lambda = Lambda::start(&echo_spec()).await.expect("start");
    let init = lambda
        .init_duration(&json!({"probe": true}))
        .await
        .expect("the function initialised");
    // No bound on the time itself (a loaded machine is slow); it is a real span.
    assert!(init > Duration::ZERO, "{init:?}");
    assert_eq!(
        lambda.init_duration(&json!({})).await.expect("again"),
        init,
        "the first init's report, not a new one"
    );
    let answer = lambda
        .invoke(&json!({"n": 3}))
        .await
        .expect("answer")
        .json()
        .expect("json");
    assert_eq!(answer["echo"], json!({"n": 3}));
}

#[tokio::test]
async fn a_function_that_dies_during_init_is_reported_as_an_init_failure() {
    let dying = LambdaSpec {
        runner: vec!["/bin/sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()],
        ..echo_spec()
    };
    let mut lambda = Lambda::start(&dying).await.expect("start");
    let error = lambda
        .init_duration(&json!({}))
        .await
        .expect_err("the runtime never asked for an event");
    assert!(matches!(error, InvokeError::InitFailed { .. }), "{error}");
}
