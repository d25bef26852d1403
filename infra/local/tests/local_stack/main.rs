//! The local stack against the real emulators (DynamoDB Local + moto + the SQS emulator, shared by this
//! test process, or the running pair FLASHSALE_*_ENDPOINT names). Every test starts its
//! own stack under a unique stack name, so no test sees another's resources.

mod authorizer;
mod event_source;
mod gateway;
mod metrics;
mod provisioning;
mod scheduler;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashsale_local::{LocalStack, StackOptions};
use serde_json::Value;

/// Options for a fresh stack named `{prefix}-{unique}`.
pub fn options(prefix: &str) -> StackOptions {
    StackOptions::new(format!("{prefix}-{}", flashsale_emulators::unique_suffix()))
}

pub async fn start(options: StackOptions) -> LocalStack {
    match LocalStack::start(options).await {
        Ok(stack) => stack,
        Err(e) => panic!(
            "the local stack did not start: {}",
            flashsale_local::lambda::error_chain(&e)
        ),
    }
}

/// Waits until `check` holds, polling every 100 ms; panics with `what` after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Events a test function received, with when.
#[derive(Clone, Default)]
pub struct Recorder {
    pub events: Arc<Mutex<Vec<(Instant, Value)>>>,
}

impl Recorder {
    /// Keeps `event`, unless it is Stripe's webhook: stacks take card payments through
    /// one shared local Stripe, which sends every stack the other tests' payment events.
    pub fn record(&self, event: &Value) {
        if event["routeKey"] == "POST /payments/stripe/webhook" {
            return;
        }
        self.events
            .lock()
            .expect("recorder lock")
            .push((Instant::now(), event.clone()));
    }

    pub fn snapshot(&self) -> Vec<(Instant, Value)> {
        self.events.lock().expect("recorder lock").clone()
    }

    pub fn count(&self) -> usize {
        self.events.lock().expect("recorder lock").len()
    }
}
