//! Injected `TransactionConflict`s.
//!
//! DynamoDB Local runs every transaction under table locks (its `TransactWriteItems`
//! wraps the work in a `MultiTableLock` in WRITE mode), so, unlike DynamoDB, it never
//! cancels a transaction with `TransactionConflict`, however many run at once. To
//! exercise the adapter's conflict retry against the real emulator, this HTTP client
//! answers some `TransactWriteItems` calls itself with the exact response DynamoDB
//! sends for a conflict, *without forwarding them* (so, as in DynamoDB, a conflicted
//! transaction wrote nothing), and forwards everything else to DynamoDB Local.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;

/// The body DynamoDB returns when a transaction loses a conflict.
const CONFLICT_BODY: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict, None]","CancellationReasons":[{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"},{"Code":"None"}]}"#;

/// Which `TransactWriteItems` calls conflict, by their 0-based sequence number.
#[derive(Debug, Clone, Copy)]
pub enum Pattern {
    /// Every call: contention that never ends.
    Always,
    /// The first `n` calls.
    First(u64),
    /// Every call whose number is not a multiple of `n` (so `n - 1` in every `n`).
    AllButEvery(u64),
    /// Every call from number `n` on: a writer cut off part way through its work.
    FromCall(u64),
}

#[derive(Debug)]
struct State {
    pattern: Pattern,
    seen: AtomicU64,
    injected: AtomicU64,
}

/// Counts what it did, so a test can prove that the retries really happened.
#[derive(Debug, Clone)]
pub struct ConflictInjector {
    inner: SharedHttpClient,
    state: Arc<State>,
}

impl ConflictInjector {
    pub fn new(inner: SharedHttpClient, pattern: Pattern) -> Self {
        Self {
            inner,
            state: Arc::new(State {
                pattern,
                seen: AtomicU64::new(0),
                injected: AtomicU64::new(0),
            }),
        }
    }

    /// `TransactWriteItems` calls answered with a conflict.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// `TransactWriteItems` calls seen, injected or forwarded.
    pub fn seen(&self) -> u64 {
        self.state.seen.load(Ordering::SeqCst)
    }
}

impl HttpClient for ConflictInjector {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(Connector {
            inner: self.inner.http_connector(settings, components),
            state: self.state.clone(),
        })
    }
}

#[derive(Debug)]
struct Connector {
    inner: SharedHttpConnector,
    state: Arc<State>,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let transaction = request
            .headers()
            .get("x-amz-target")
            .is_some_and(|target| target.ends_with(".TransactWriteItems"));
        if transaction {
            let number = self.state.seen.fetch_add(1, Ordering::SeqCst);
            let conflict = match self.state.pattern {
                Pattern::Always => true,
                Pattern::First(n) => number < n,
                Pattern::AllButEvery(n) => !number.is_multiple_of(n),
                Pattern::FromCall(n) => number >= n,
            };
            if conflict {
                self.state.injected.fetch_add(1, Ordering::SeqCst);
                let mut response = HttpResponse::new(
                    StatusCode::try_from(400).expect("a valid status"),
                    SdkBody::from(CONFLICT_BODY),
                );
                response
                    .headers_mut()
                    .insert("content-type", "application/x-amz-json-1.0");
                return HttpConnectorFuture::ready(Ok(response));
            }
        }
        self.inner.call(request)
    }
}
