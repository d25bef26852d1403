//! Injected `TransactionConflict`s, on transactions or on plain writes.
//!
//! DynamoDB Local runs every transaction under table locks (its `TransactWriteItems`
//! wraps the work in a `MultiTableLock` in WRITE mode), so, unlike DynamoDB, it never
//! cancels a transaction with `TransactionConflict`, however many run at once. To
//! exercise the adapter's conflict retry against the real emulator, this HTTP client
//! answers some `TransactWriteItems` calls itself with the exact response DynamoDB
//! sends for a conflict, *without forwarding them* (so, as in DynamoDB, a conflicted
//! transaction wrote nothing), and forwards everything else to DynamoDB Local. Aimed
//! at plain `UpdateItem`s instead, it answers them `TransactionConflictException`: what
//! DynamoDB answers a plain write to an item a transaction holds.

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

/// The body DynamoDB returns to a plain write on an item a transaction holds.
const PLAIN_CONFLICT_BODY: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}"#;

/// DynamoDB's answer when it failed internally.
const SERVER_ERROR_BODY: &str =
    r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}"#;

/// Which calls the pattern numbers and answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `TransactWriteItems`, answered `TransactionCanceledException`.
    Transactions,
    /// `UpdateItem`, answered `TransactionConflictException`.
    PlainWrites,
    /// `UpdateItem`, answered `InternalServerError` (which the SDK retries, to no
    /// avail): with `FromCall`, a writer that dies part way, after the calls before.
    FailingPlainWrites,
    /// `UpdateItem`, sent on to DynamoDB, which applies it, and its answer replaced by
    /// `InternalServerError`: an answer lost in transit, which the SDK resends.
    LostPlainWrites,
}

impl Target {
    fn operation(self) -> &'static str {
        match self {
            Self::Transactions => ".TransactWriteItems",
            Self::PlainWrites | Self::FailingPlainWrites | Self::LostPlainWrites => ".UpdateItem",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Self::Transactions => CONFLICT_BODY,
            Self::PlainWrites => PLAIN_CONFLICT_BODY,
            Self::FailingPlainWrites | Self::LostPlainWrites => SERVER_ERROR_BODY,
        }
    }

    fn status(self) -> u16 {
        match self {
            Self::Transactions | Self::PlainWrites => 400,
            Self::FailingPlainWrites | Self::LostPlainWrites => 500,
        }
    }
}

/// Which targeted calls conflict, by their 0-based sequence number.
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
    /// Call number `n` alone.
    Only(u64),
}

#[derive(Debug)]
struct State {
    target: Target,
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
    pub fn new(inner: SharedHttpClient, target: Target, pattern: Pattern) -> Self {
        Self {
            inner,
            state: Arc::new(State {
                target,
                pattern,
                seen: AtomicU64::new(0),
                injected: AtomicU64::new(0),
            }),
        }
    }

    /// Targeted calls answered with a conflict.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// Targeted calls seen, injected or forwarded.
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
        let targeted = request
            .headers()
            .get("x-amz-target")
            .is_some_and(|target| target.ends_with(self.state.target.operation()));
        if targeted {
            let number = self.state.seen.fetch_add(1, Ordering::SeqCst);
            let conflict = match self.state.pattern {
                Pattern::Always => true,
                Pattern::First(n) => number < n,
                Pattern::AllButEvery(n) => !number.is_multiple_of(n),
                Pattern::FromCall(n) => number >= n,
                Pattern::Only(n) => number == n,
            };
            if conflict {
                self.state.injected.fetch_add(1, Ordering::SeqCst);
                let target = self.state.target;
                let answer = move || {
                    let mut response = HttpResponse::new(
                        StatusCode::try_from(target.status()).expect("a valid status"),
                        SdkBody::from(target.body()),
                    );
                    response
                        .headers_mut()
                        .insert("content-type", "application/x-amz-json-1.0");
                    response
                };
                if let Target::LostPlainWrites = target {
                    let applied = self.inner.call(request);
                    return HttpConnectorFuture::new(async move {
                        applied.await?;
                        Ok(answer())
                    });
                }
                return HttpConnectorFuture::ready(Ok(answer()));
            }
        }
        self.inner.call(request)
    }
}
