//! The real functions, run in-process: the bin a template function's build makes
//! (`BuildProperties.Binary`) names its crate in [`FUNCTIONS`], its `Config` is read from the template-resolved environment (so a
//! variable missing from the template fails the local stack as it would fail the
//! deployed function), it starts as the deployed one does, and it is called with the
//! event decoded the way its Lambda runtime adapter (lambda_http / lambda_runtime)
//! would decode it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use flashsale_lambda::{FromEnv, Function, cold_start};
use lambda_http::RequestExt;
use lambda_http::aws_lambda_events::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_http::request::LambdaRequest;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::lambda::{FunctionError, InvokeContext, LambdaFunction};
use crate::model::FunctionSpec;

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("function {function}: bin {binary} is no function crate's of this workspace")]
    UnknownCode { function: String, binary: String },
    #[error("function {function}: its configuration is invalid or unreadable")]
    Config {
        function: String,
        #[source]
        source: FunctionError,
    },
}

/// How the local stack starts one kind of function: its cold start on the template's
/// environment, wrapped for the event translation its runtime adapter does.
type Start = for<'a> fn(
    &'a FunctionSpec,
    &'a aws_config::SdkConfig,
) -> Pin<
    Box<dyn Future<Output = Result<Arc<dyn LambdaFunction>, FunctionError>> + Send + 'a>,
>;

/// Every function crate of the workspace, by the bin its bootstrap is built from, and
/// the runtime adapter it is called through.
const FUNCTIONS: [(&str, Start); 5] = [
    ("grab", |spec, sdk| {
        Box::pin(start(spec, sdk, http::<flashsale_grab::Deps>))
    }),
    ("api", |spec, sdk| {
        Box::pin(start(spec, sdk, http::<flashsale_api::Deps>))
    }),
    ("order-consumer", |spec, sdk| {
        Box::pin(start(spec, sdk, events::<flashsale_order_consumer::Deps>))
    }),
    ("reconciler", |spec, sdk| {
        Box::pin(start(spec, sdk, events::<flashsale_reconciler::Deps>))
    }),
    ("release", |spec, sdk| {
        Box::pin(start(spec, sdk, events::<flashsale_release::Deps>))
    }),
];

/// The in-process implementation of `spec`, with its dependencies built once, as a
/// Lambda execution environment builds them at cold start (the grab reads its key from
/// Secrets Manager here).
pub async fn builtin(
    spec: &FunctionSpec,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<dyn LambdaFunction>, DispatchError> {
    let Some((_, start)) = FUNCTIONS.iter().find(|(binary, _)| *binary == spec.binary) else {
        return Err(DispatchError::UnknownCode {
            function: spec.logical_id.clone(),
            binary: spec.binary.clone(),
        });
    };
    start(spec, sdk)
        .await
        .map_err(|source| DispatchError::Config {
            function: spec.logical_id.clone(),
            source,
        })
}

/// `F` read from the template-resolved environment, started as the deployed one starts
/// ([`flashsale_lambda::cold_start`]), and wrapped for its runtime adapter.
async fn start<F: Function>(
    spec: &FunctionSpec,
    sdk: &aws_config::SdkConfig,
    wrap: fn(F) -> Arc<dyn LambdaFunction>,
) -> Result<Arc<dyn LambdaFunction>, FunctionError> {
    let config = F::Config::from_lookup(|name| spec.environment.get(name).cloned())?;
    Ok(wrap(cold_start::<F>(&config, sdk).await?))
}

/// A function behind API Gateway, called as lambda_http's adapter calls it.
struct HttpFunction<F>(F);

fn http<F: Function>(function: F) -> Arc<dyn LambdaFunction>
where
    HttpFunction<F>: LambdaFunction,
{
    Arc::new(HttpFunction(function))
}

#[async_trait]
impl<F> LambdaFunction for HttpFunction<F>
where
    F: Function<Event = lambda_http::Request, Output = lambda_http::Response<lambda_http::Body>>,
    F::Error: Into<FunctionError>,
{
    async fn invoke(&self, event: Value, context: InvokeContext) -> Result<Value, FunctionError> {
        let request = http_request(event, &context)?;
        http_response(self.0.handle(request).await.map_err(Into::into)?)
    }
}

/// A function of JSON events, called as lambda_runtime calls it.
struct EventFunction<F>(F);

fn events<F: Function>(function: F) -> Arc<dyn LambdaFunction>
where
    EventFunction<F>: LambdaFunction,
{
    Arc::new(EventFunction(function))
}

#[async_trait]
impl<F> LambdaFunction for EventFunction<F>
where
    F: Function,
    F::Event: DeserializeOwned,
    F::Output: Serialize,
    F::Error: Into<FunctionError>,
{
    async fn invoke(&self, event: Value, _context: InvokeContext) -> Result<Value, FunctionError> {
        let event = serde_json::from_value(event)?;
        let output = self.0.handle(event).await.map_err(Into::into)?;
        Ok(serde_json::to_value(output)?)
    }
}

/// The request lambda_http's runtime adapter hands an HTTP handler.
pub fn http_request(
    event: Value,
    context: &InvokeContext,
) -> Result<lambda_http::Request, FunctionError> {
    let event: ApiGatewayV2httpRequest = serde_json::from_value(event)?;
    let request: lambda_http::Request = LambdaRequest::ApiGatewayV2(event).into();
    Ok(request.with_lambda_context(lambda_context(context)))
}

/// The payload-format-2.0 response lambda_http's runtime adapter makes of a handler's
/// response: headers (repeats comma-joined), `Set-Cookie` moved to `cookies`, binary
/// bodies base64-encoded.
pub fn http_response(
    response: lambda_http::Response<lambda_http::Body>,
) -> Result<Value, FunctionError> {
    let (parts, body) = response.into_parts();
    let mut out = ApiGatewayV2httpResponse::default();
    out.status_code = i64::from(parts.status.as_u16());
    let mut headers = parts.headers;
    out.cookies = headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    headers.remove(http::header::SET_COOKIE);
    out.headers = headers;
    match body {
        lambda_http::Body::Empty => {}
        lambda_http::Body::Text(text) => out.body = Some(lambda_http::Body::Text(text)),
        lambda_http::Body::Binary(bytes) => {
            out.is_base64_encoded = true;
            out.body = Some(lambda_http::Body::Binary(bytes));
        }
        other => out.body = Some(other),
    }
    Ok(serde_json::to_value(out)?)
}

fn lambda_context(context: &InvokeContext) -> lambda_runtime::Context {
    let mut lambda = lambda_runtime::Context::default();
    lambda.request_id = context.request_id.clone();
    lambda.invoked_function_arn = context.function_arn.clone();
    lambda.deadline = context
        .deadline
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_else(|_| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        });
    lambda
}
