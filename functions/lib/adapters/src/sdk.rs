//! The SDK configuration every Lambda loads on a cold start.
//!
//! The HTTPS client is built here, with rustls on ring, rather than taken from the SDK's
//! `default-https-client` feature, which always links aws-lc: ring is the smaller crypto
//! library, and a Lambda talks TLS only to AWS endpoints, which ring's suites cover.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

use crate::breaker::CircuitBreaker;

/// An HTTPS (and plain HTTP) client for the AWS SDK: rustls with ring's crypto and the
/// system's root certificates, loaded on the first connection rather than at start-up.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// The environment's SDK configuration (region and credentials from Lambda's variables),
/// on [`https_client`].
pub async fn load_sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .load()
        .await
}

/// A DynamoDB client on `sdk` whose every try goes through `breaker` first.
pub fn dynamodb_behind(sdk: &SdkConfig, breaker: &CircuitBreaker) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::config::Builder::from(sdk)
        .interceptor(breaker.interceptor())
        .retry_classifier(breaker.retry_classifier())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// An SQS client on `sdk` whose every try goes through `breaker` first.
pub fn sqs_behind(sdk: &SdkConfig, breaker: &CircuitBreaker) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::config::Builder::from(sdk)
        .interceptor(breaker.interceptor())
        .retry_classifier(breaker.retry_classifier())
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}
