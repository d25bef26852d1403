//! The smallest real `lambda_runtime` function, for the emulator's own tests: it echoes
//! the event with the request id and function name it was given, fails when the event
//! says `"fail": true`, and exits the process when it says `"exit": <code>`.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
#[error("asked to fail: {0}")]
struct AskedToFail(String);

async fn echo(event: LambdaEvent<Value>) -> Result<Value, Error> {
    let (payload, context) = event.into_parts();
    if payload["fail"] == json!(true) {
        return Err(Box::new(AskedToFail(
            payload["why"].as_str().unwrap_or("no reason").to_owned(),
        )));
    }
    if let Some(code) = payload["exit"].as_i64() {
        eprintln!("exiting with {code} as asked");
        std::process::exit(i32::try_from(code).unwrap_or(1));
    }
    Ok(json!({
        "echo": payload,
        "request_id": context.request_id,
        "function_arn": context.invoked_function_arn,
        "deadline_in_future": context.deadline > 0,
    }))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    println!("echo lambda starting");
    lambda_runtime::run(service_fn(echo)).await
}
