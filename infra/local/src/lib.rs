//! The local stack behind `make run`: `template.yaml`, as AWS's SAM translator expands it
//! ([`template`]) and evaluated as CloudFormation would ([`resolve`], [`model`]),
//! provisioned on real emulators
//! (DynamoDB Local, moto, the SQS emulator) and the functions run in-process behind emulations of the
//! managed triggers AWS would put in front of them:
//!
//! - [`edge`]: the CloudFront web ACL's rate-based rules (AWS WAF), before any route;
//! - [`apigw`]: the HTTP API with its JWT authorizer ([`auth`]), payload format 2.0;
//! - [`esm`]: the SQS event source mapping, with `ReportBatchItemFailures`;
//! - [`scheduler`]: EventBridge Scheduler delivery of one-time schedules, invoking
//!   Lambda asynchronously ([`lambda`]) with Lambda's retries;
//! - [`rules`]: EventBridge `rate(...)` rules;
//! - [`metrics`]: the functions' metrics, served at `GET /local/metrics`.
//!
//! [`LocalStack::start`] runs all of it in-process for tests; the `flashsale-local`
//! binary runs it for `make run`.

pub mod apigw;
pub mod auth;
pub mod dispatch;
pub mod edge;
pub mod esm;
pub mod lambda;
pub mod local_stripe;
pub mod metrics;
pub mod model;
pub mod provision;
pub mod resolve;
pub mod rules;
pub mod scheduler;
pub mod stack;
pub mod static_files;
pub mod template;

pub use lambda::{FunctionError, InvokeContext, LambdaFunction, function_fn};
pub use stack::{EmulatorSource, LocalStack, StackError, StackOptions};
