//! What every flashsale function shares besides the domain: the one mapping from
//! errors to HTTP answers, the caller taken from the API Gateway JWT authorizer, JSON
//! bodies with a size limit, typed configuration from the environment, time limits on
//! AWS SDK calls, and JSON logs.
//!
//! Every function has the one shape of [`Function`], and its `main.rs` is one call of
//! [`serve`] or [`serve_http`].
//!
//! The HTTP functions call [`respond`] once per request, so every error any route can
//! produce is turned into a status and `{"error", "message"}` in exactly one place.

pub mod body;
pub mod caller;
pub mod config;
pub mod correlation;
pub mod error;
pub mod failure;
pub mod function;
pub mod metrics;
pub mod response;
pub mod route;
pub mod sdk;
pub mod secret;
pub mod stripe_keys;
pub mod telemetry;
/// Fixture-built events for tests, behind the `testing` feature (see the domain's).
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use body::{MAX_BODY_BYTES, ensure_within_limit, json_body};
pub use caller::{AdminRule, Caller, user_of};
pub use config::{ConfigError, Env, FromEnv};
pub use error::ApiError;
pub use function::{Function, cold_start, serve, serve_http};
pub use response::{CachePolicy, json, respond};
pub use route::{order_id_param, path_param, route_key, sale_id_param};
pub use sdk::{CallBudget, Clients};
pub use secret::{SECRET_BUDGET, SecretError, SecretsManagerSecret};
pub use stripe_keys::{CardPayments, PaymentsInitError, StripeKeys};
