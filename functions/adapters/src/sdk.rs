//! The SDK configuration every Lambda loads on a cold start.
//!
//! The HTTPS client is built here, with rustls on ring, rather than taken from the SDK's
//! `default-https-client` feature, which always links aws-lc: ring is the smaller crypto
//! library, and a Lambda talks TLS only to AWS endpoints, which ring's suites cover.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

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
