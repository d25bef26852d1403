//! The grab Lambda: wiring only. The behaviour lives in the library.

use flashsale_grab::{Config, Deps, handler};
use flashsale_lambda::failure::startup_failure;
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = flashsale_lambda::telemetry::init()?;
    let config = Config::from_env().map_err(startup_failure)?;
    let sdk = flashsale_adapters::load_sdk_config().await;
    // The grab-token key is read here, once per cold start; a missing, unreadable or
    // weak one fails the start with its reason logged.
    let deps = Deps::init(&config, &sdk).await.map_err(startup_failure)?;
    lambda_http::run(service_fn(|req| telemetry.flushed(handler(&deps, req)))).await
}
