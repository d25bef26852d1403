//! The order-consumer Lambda: wiring only. The behaviour lives in the library.

use aws_lambda_events::event::sqs::SqsEvent;
use flashsale_order_consumer::{Config, Deps, handler};
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = flashsale_lambda::telemetry::init()?;
    let config = Config::from_env().map_err(flashsale_lambda::failure::startup_failure)?;
    let sdk = flashsale_adapters::load_sdk_config().await;
    let deps = Deps::new(&config, &sdk);
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        telemetry.flushed(handler(&deps, event.payload))
    }))
    .await
}
