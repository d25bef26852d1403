//! The AWS adapters of the flash-sale ports: DynamoDB for sales, stock and orders, SQS
//! for the orders queue, EventBridge Scheduler for release timers; ALTCHA's proof of
//! work for the grab path's challenge; and Stripe for payments.
//!
//! Every failure is a [`flashsale_domain::StoreError`] whose source is the SDK error
//! (or one of this crate's typed errors wrapping it), classified in one place
//! (`classify`) as `Transient` (throttling, timeouts, network, 5xx, contention that
//! outlasted the retries) or `Permanent` (everything else).

pub mod breaker;
mod classify;
pub mod correlation;
mod dynamo;
mod pause;
pub mod proof_of_work;
mod retry;
mod scheduler;
mod sdk;
mod sqs;
pub mod stripe;

pub use dynamo::{
    ContentionExhausted, CorruptItem, DynamoStore, Inconsistency, InvalidRequest, ItemError,
    ReserveMode, UnexpectedRefusal, UnprocessedKeys,
};
pub use pause::TokioPause;
pub use scheduler::{
    EventBridgeScheduler, FIRING_SLACK, MAX_EARLY_FIRING, NoReleaseTarget, ReleaseTarget,
};
pub use sdk::{dynamodb_behind, https_client, load_sdk_config, sqs_behind};
pub use sqs::SqsOrderQueue;
