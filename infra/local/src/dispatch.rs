//! The real functions, run in-process: a template function's `CodeUri` names its crate,
//! its `Config` is read from the template-resolved environment (so a variable missing
//! from the template fails the local stack as it would fail the deployed function),
//! and its handler is called with the event decoded the way its Lambda runtime
//! adapter (lambda_http / lambda_runtime) would decode it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use lambda_http::RequestExt;
use lambda_http::aws_lambda_events::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_http::request::LambdaRequest;
use serde_json::Value;

use crate::lambda::{FunctionError, InvokeContext, LambdaFunction};
use crate::model::FunctionSpec;

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("function {function}: CodeUri {code_uri} names no function crate of this workspace")]
    UnknownCode { function: String, code_uri: String },
    #[error("function {function}: its configuration is invalid or unreadable")]
    Config {
        function: String,
        #[source]
        source: FunctionError,
    },
}

/// The in-process implementation of `spec`, with its dependencies built once, as a
/// Lambda execution environment builds them at cold start (the grab reads its key from
/// Secrets Manager here).
pub async fn builtin(
    spec: &FunctionSpec,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<dyn LambdaFunction>, DispatchError> {
    let env = spec.environment.clone();
    let lookup = move |name: &str| env.get(name).cloned();
    let config_error = |source: FunctionError| DispatchError::Config {
        function: spec.logical_id.clone(),
        source,
    };
    let code = spec.code_uri.trim_end_matches('/');
    Ok(match code {
        "functions/grab" => {
            let config = flashsale_grab::Config::from_lookup(lookup)
                .map_err(|e| config_error(Box::new(e)))?;
            let deps = flashsale_grab::Deps::init(&config, sdk)
                .await
                .map_err(|e| config_error(Box::new(e)))?;
            Arc::new(GrabFunction(deps))
        }
        "functions/api" => {
            let config = flashsale_api::Config::from_lookup(lookup)
                .map_err(|e| config_error(Box::new(e)))?;
            Arc::new(ApiFunction(flashsale_api::Deps::new(&config, sdk)))
        }
        "functions/order-consumer" => {
            let config = flashsale_order_consumer::Config::from_lookup(lookup)
                .map_err(|e| config_error(Box::new(e)))?;
            Arc::new(OrderConsumerFunction(flashsale_order_consumer::Deps::new(
                &config, sdk,
            )))
        }
        "functions/reconciler" => {
            let config = flashsale_reconciler::Config::from_lookup(lookup)
                .map_err(|e| config_error(Box::new(e)))?;
            Arc::new(ReconcilerFunction(flashsale_reconciler::Deps::new(
                &config, sdk,
            )))
        }
        "functions/release" => {
            let config = flashsale_release::Config::from_lookup(lookup)
                .map_err(|e| config_error(Box::new(e)))?;
            Arc::new(ReleaseFunction(flashsale_release::Deps::new(&config, sdk)))
        }
        _ => {
            return Err(DispatchError::UnknownCode {
                function: spec.logical_id.clone(),
                code_uri: spec.code_uri.clone(),
            });
        }
    })
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

struct GrabFunction(flashsale_grab::Deps);
struct ApiFunction(flashsale_api::Deps);
struct OrderConsumerFunction(flashsale_order_consumer::Deps);
struct ReleaseFunction(flashsale_release::Deps);
struct ReconcilerFunction(flashsale_reconciler::Deps);

#[async_trait]
impl LambdaFunction for ReconcilerFunction {
    async fn invoke(&self, event: Value, _context: InvokeContext) -> Result<Value, FunctionError> {
        Ok(flashsale_reconciler::handler(&self.0, event).await?)
    }
}

#[async_trait]
impl LambdaFunction for GrabFunction {
    async fn invoke(&self, event: Value, context: InvokeContext) -> Result<Value, FunctionError> {
        let request = http_request(event, &context)?;
        http_response(flashsale_grab::handler(&self.0, request).await?)
    }
}

#[async_trait]
impl LambdaFunction for ApiFunction {
    async fn invoke(&self, event: Value, context: InvokeContext) -> Result<Value, FunctionError> {
        let request = http_request(event, &context)?;
        http_response(flashsale_api::handler(&self.0, request).await?)
    }
}

#[async_trait]
impl LambdaFunction for OrderConsumerFunction {
    async fn invoke(&self, event: Value, _context: InvokeContext) -> Result<Value, FunctionError> {
        let event = serde_json::from_value(event)?;
        let response = flashsale_order_consumer::handler(&self.0, event).await?;
        Ok(serde_json::to_value(response)?)
    }
}

#[async_trait]
impl LambdaFunction for ReleaseFunction {
    async fn invoke(&self, event: Value, _context: InvokeContext) -> Result<Value, FunctionError> {
        Ok(flashsale_release::handler(&self.0, event).await?)
    }
}
