//! What the emulators' tests share: an upstream on loopback for the proxy, and a
//! DynamoDB client through a proxy that sends each call once.

#![allow(dead_code)] // Each test binary uses its own part.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use flashsale_emulators::proxy::Proxy;
use flashsale_emulators::{Emulators, LocalEndpoints, sdk_config_for};

/// A server on loopback for the proxy to forward to, with how many requests reached it.
pub struct Upstream {
    pub url: String,
    pub hits: Arc<AtomicU64>,
    _server: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Serves the router `app` makes on a free port; `app` counts in the hits it is
    /// given whichever requests it means to count.
    pub async fn serve(app: impl FnOnce(Arc<AtomicU64>) -> axum::Router) -> Self {
        let hits = Arc::new(AtomicU64::new(0));
        let app = app(Arc::clone(&hits));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("upstream serves");
        });
        Self {
            url,
            hits,
            _server: server,
        }
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A DynamoDB client whose calls go through `proxy` and are each sent once: the SDK's
/// retries would hide the answer the proxy played.
pub async fn dynamodb_through(proxy: &Proxy, emulators: &Emulators) -> aws_sdk_dynamodb::Client {
    let proxied = sdk_config_for(LocalEndpoints {
        dynamodb: proxy.url(),
        ..emulators.endpoints()
    })
    .await;
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&proxied)
            .retry_config(RetryConfig::disabled())
            .build(),
    )
}
