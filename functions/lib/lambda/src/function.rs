//! The one shape of a deployable function, and the one way each is served.
//!
//! A function is its configuration (read from the environment once), what it builds
//! once per execution environment from that configuration and its SDK clients (the
//! cold start), and how it answers one event. [`serve`] and [`serve_http`] are the
//! whole of a `main.rs`: logs and metrics, the configuration, the SDK clients within
//! the function's [`CallBudget`], the cold start, then the runtime's loop. The local
//! stack starts the same functions in-process through [`cold_start`], so both build
//! them the same way.

use std::fmt::Debug;
use std::future::Future;

use aws_types::SdkConfig;
use lambda_http::lambda_runtime::{self, Diagnostic, LambdaEvent};
use lambda_http::{Body, Request, Response, service_fn};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::FromEnv;
use crate::failure::startup_failure;
use crate::sdk::{CallBudget, Clients};
use crate::telemetry::{self, Telemetry};

/// One deployable function: a template `AWS::Serverless::Function` and its crate.
pub trait Function: Sized + Send + Sync + 'static {
    /// What it reads from its environment variables.
    type Config: FromEnv;
    /// The event its runtime hands it: an HTTP [`Request`], or a JSON event.
    type Event: Send + 'static;
    /// Its answer.
    type Output: Send;
    /// Why an invocation failed; the runtime reports it as a [`Diagnostic`].
    type Error: Send + Sync + 'static;
    /// Why the cold start failed; the function then serves nothing.
    type InitError: std::error::Error + Send + Sync + 'static;

    /// How long one SDK call may take: see [`crate::sdk`].
    const SDK_BUDGET: CallBudget;

    /// The cold start: everything an invocation needs, built once per process.
    fn init(
        config: &Self::Config,
        clients: &Clients,
    ) -> impl Future<Output = Result<Self, Self::InitError>> + Send;

    /// One invocation.
    fn handle(
        &self,
        event: Self::Event,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send;
}

/// The cold start of `F` on `sdk`, with its clients within [`Function::SDK_BUDGET`].
pub async fn cold_start<F: Function>(
    config: &F::Config,
    sdk: &SdkConfig,
) -> Result<F, F::InitError> {
    F::init(config, &Clients::within(F::SDK_BUDGET, sdk)).await
}

/// Why a function could not start: each is logged as one JSON line before `main`
/// returns it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    #[error("the cold start failed")]
    Init(#[source] Box<dyn std::error::Error + Send + Sync>),
}

async fn start<F: Function>() -> Result<(Telemetry, F), StartError> {
    let telemetry = telemetry::init()?;
    let config = F::Config::from_env().map_err(startup_failure)?;
    let sdk = flashsale_adapters::load_sdk_config().await;
    let function = cold_start::<F>(&config, &sdk)
        .await
        .map_err(startup_failure)
        .map_err(|err| StartError::Init(Box::new(err)))?;
    Ok((telemetry, function))
}

/// Serves `F` to the Lambda runtime, for a function of JSON events.
pub async fn serve<F>() -> Result<(), lambda_runtime::Error>
where
    F: Function,
    F::Event: DeserializeOwned,
    F::Output: Serialize,
    F::Error: Into<Diagnostic> + Debug,
{
    let (telemetry, function) = start::<F>().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<F::Event>| {
        telemetry.flushed(function.handle(event.payload))
    }))
    .await
}

/// Serves `F` to the Lambda runtime, for a function behind API Gateway.
pub async fn serve_http<F>() -> Result<(), lambda_http::Error>
where
    F: Function<Event = Request, Output = Response<Body>>,
    F::Error: Into<Diagnostic> + Debug,
{
    let (telemetry, function) = start::<F>().await?;
    lambda_http::run(service_fn(|request| {
        telemetry.flushed(function.handle(request))
    }))
    .await
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use super::*;
    use crate::config::Env;

    /// A function that keeps the budget its cold start's clients were built with.
    struct Probe {
        budget: Option<CallBudget>,
    }

    struct NoConfig;

    impl FromEnv for NoConfig {
        fn read(_env: &Env<'_>) -> Self {
            Self
        }
    }

    impl Function for Probe {
        type Config = NoConfig;
        type Event = ();
        type Output = ();
        type Error = Infallible;
        type InitError = Infallible;
        const SDK_BUDGET: CallBudget = CallBudget {
            attempt: Duration::from_millis(300),
            operation: Duration::from_millis(900),
        };

        async fn init(_config: &NoConfig, clients: &Clients) -> Result<Self, Infallible> {
            let dynamodb = clients.dynamodb();
            Ok(Self {
                budget: dynamodb.config().timeout_config().and_then(CallBudget::of),
            })
        }

        async fn handle(&self, _event: ()) -> Result<(), Infallible> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_cold_start_builds_every_client_within_the_functions_budget() {
        let sdk = SdkConfig::builder().build();
        let Ok(probe) = cold_start::<Probe>(&NoConfig, &sdk).await;
        assert_eq!(probe.budget, Some(Probe::SDK_BUDGET));
    }
}
