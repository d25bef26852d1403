//! The release Lambda: wiring only. The behaviour lives in the library.

use flashsale_release::{Config, Deps, handler};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = flashsale_lambda::telemetry::init()?;
    let config = Config::from_env().map_err(flashsale_lambda::failure::startup_failure)?;
    let sdk = flashsale_adapters::load_sdk_config().await;
    let deps = Deps::new(&config, &sdk);
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        telemetry.flushed(handler(&deps, event.payload))
    }))
    .await
}
