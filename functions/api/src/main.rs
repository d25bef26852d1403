//! The api Lambda: wiring only. The behaviour lives in the library.

use flashsale_api::{Config, Deps, handler};
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = flashsale_lambda::telemetry::init()?;
    let config = Config::from_env().map_err(flashsale_lambda::failure::startup_failure)?;
    let sdk = flashsale_adapters::load_sdk_config().await;
    let deps = Deps::new(&config, &sdk);
    lambda_http::run(service_fn(|req| telemetry.flushed(handler(&deps, req)))).await
}
