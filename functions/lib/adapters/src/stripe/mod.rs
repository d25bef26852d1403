//! Stripe as the [`PaymentProvider`]: PaymentIntents through Stripe's HTTP API, and the
//! signature of the webhooks it sends.
//!
//! Plain HTTPS on the hyper and rustls builds the AWS SDK already links (the same
//! crates and features as `aws-smithy-http-client`), so the api bootstrap gains no TLS
//! stack of its own; the few calls are form-encoded requests with JSON answers. None
//! carries an `Idempotency-Key`: Stripe replays a stored failure (a 500) to every retry
//! with the same key for 24 hours, so each call is made safe to retry otherwise. An
//! opening by the order's conditional attach (one payment recorded per order), a refund
//! by Stripe's refusal to refund more than is left, a capture and a cancel by the
//! payment's state (see `act_on`).
//!
//! Why not async-stripe: measured side by side on the api bootstrap (x86_64, the
//! release profile, these five calls linked in), async-stripe 1.0.0-rc.10 made it
//! 13.66 MB against 7.99 MB here (7.73 MB without Stripe), and its generated crates
//! took 67 s of compile against 0.3 s for what this adapter adds. It also could not
//! read localstripe's PaymentIntents, which the tests run against.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use flashsale_domain::ids::{OrderId, UserId};
use flashsale_domain::payment::{
    CancelOutcome, CaptureOutcome, Payment, PaymentId, PaymentState, Refund, RefundProgress,
    RefundStatus,
};
use flashsale_domain::ports::PaymentProvider;
use flashsale_domain::{Price, StoreError};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub mod webhook;

/// Where Stripe is and who we are to it.
#[derive(Clone)]
pub struct StripeConfig {
    /// `https://api.stripe.com`, or a local fake's address.
    pub api_base: String,
    /// The secret API key (`sk_live_...`/`sk_test_...`).
    pub secret_key: String,
    /// How long one call may take before it counts as a transient failure.
    pub timeout: Duration,
}

impl std::fmt::Debug for StripeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of every log line.
        f.debug_struct("StripeConfig")
            .field("api_base", &self.api_base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why a call to Stripe failed: the source of the [`StoreError`] a port call returns.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    #[error("Stripe did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Stripe could not be reached")]
    Connect(#[source] hyper_util::client::legacy::Error),
    #[error("Stripe's answer could not be read")]
    Body(#[source] flashsale_domain::error::BoxError),
    #[error("Stripe answered {status}: {code} {message}")]
    Refused {
        status: StatusCode,
        /// Stripe's error `code` (or `type` when it gives no code).
        code: String,
        message: String,
    },
    /// A restricted key without a permission the call needs (403): a deployment's key
    /// made with fewer permissions than docs/deploy.md lists. Stripe's message names the
    /// permission missing.
    #[error(
        "the Stripe key lacks a permission this call needs (docs/deploy.md lists the key's permissions): {message}"
    )]
    KeyLacksPermission { message: String },
    #[error("Stripe's answer to {what} is not what its API documents")]
    Unexpected {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the TLS roots of this system could not be loaded")]
    Roots(#[source] std::io::Error),
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Stripe's PaymentIntents API.
#[derive(Clone)]
pub struct StripePayments {
    http: HttpsClient,
    config: Arc<StripeConfig>,
}

impl StripePayments {
    pub fn new(config: StripeConfig) -> Result<Self, StripeError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(StripeError::Roots)?
            // A local fake speaks plain HTTP on loopback; Stripe itself is HTTPS only.
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            http: Client::builder(TokioExecutor::new()).build(https),
            config: Arc::new(config),
        })
    }

    /// One call: `form` as the body of a POST (none for a GET), the answer as `T`, or
    /// the refusal Stripe gave.
    async fn call<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> Result<T, StoreError> {
        let body = serde_urlencoded::to_string(form).expect("string pairs always encode");
        let request = Request::builder()
            .method(method)
            .uri(format!(
                "{}{path}",
                self.config.api_base.trim_end_matches('/')
            ))
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.config.secret_key),
            )
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            );
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| StoreError::permanent(operation, e))?;
        let timeout = self.config.timeout;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(StripeError::Connect)?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| StripeError::Body(Box::new(e)))?
                .to_bytes();
            Ok::<_, StripeError>((status, bytes))
        };
        let (status, bytes) = match tokio::time::timeout(timeout, exchange).await {
            Err(_) => {
                return Err(StoreError::transient(
                    operation,
                    StripeError::Timeout(timeout),
                ));
            }
            Ok(Err(e)) => return Err(StoreError::transient(operation, e)),
            Ok(Ok(answer)) => answer,
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|source| {
                StoreError::permanent(
                    operation,
                    StripeError::Unexpected {
                        what: operation,
                        source,
                    },
                )
            });
        }
        let refusal = refusal(status, &bytes);
        // Stripe's advice: 429, 5xx and 409 (a conflicting request in flight) may be
        // retried.
        let retryable = status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::CONFLICT
            || status.is_server_error();
        Err(if retryable {
            StoreError::transient(operation, refusal)
        } else {
            StoreError::permanent(operation, refusal)
        })
    }
}

/// The refusal in a non-2xx answer: Stripe's `{"error": {"code", "type", "message"}}`,
/// a 403 being a restricted key's missing permission.
fn refusal(status: StatusCode, body: &[u8]) -> StripeError {
    #[derive(Deserialize, Default)]
    struct Envelope {
        #[serde(default)]
        error: Detail,
    }
    #[derive(Deserialize, Default)]
    struct Detail {
        code: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
        message: Option<String>,
    }
    let detail = serde_json::from_slice::<Envelope>(body)
        .unwrap_or_default()
        .error;
    if status == StatusCode::FORBIDDEN {
        return StripeError::KeyLacksPermission {
            message: detail.message.unwrap_or_default(),
        };
    }
    StripeError::Refused {
        status,
        code: detail.code.or(detail.kind).unwrap_or_default(),
        message: detail.message.unwrap_or_default(),
    }
}

/// Whether `error` is Stripe refusing the request with `status`: 400 for a request it
/// holds invalid, 404 for an object it does not have.
fn refused_with(error: &StoreError, wanted: StatusCode) -> bool {
    let StoreError::Permanent { source, .. } = error else {
        return false;
    };
    matches!(
        source.downcast_ref::<StripeError>(),
        Some(StripeError::Refused { status, .. }) if *status == wanted
    )
}

/// A PaymentIntent, as much of it as the domain's [`Payment`] holds.
#[derive(Deserialize)]
struct Intent {
    id: String,
    amount: u64,
    currency: String,
    status: String,
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, String>,
}

impl From<Intent> for Payment {
    fn from(intent: Intent) -> Self {
        let state = match intent.status.as_str() {
            "requires_capture" => PaymentState::Authorised,
            "succeeded" => PaymentState::Captured,
            "canceled" => PaymentState::Cancelled,
            // requires_payment_method, requires_confirmation, requires_action, processing
            _ => PaymentState::Open,
        };
        Payment {
            id: PaymentId::new(intent.id),
            order_id: intent
                .metadata
                .get(ORDER_METADATA)
                .and_then(|id| OrderId::parse(id).ok()),
            buyer: intent
                .metadata
                .get(BUYER_METADATA)
                .and_then(|id| UserId::parse(id).ok()),
            amount: intent.amount,
            currency: intent.currency,
            state,
            client_secret: intent.client_secret.unwrap_or_default(),
        }
    }
}

/// A refund, as much of it as the domain's [`Refund`] holds.
#[derive(Deserialize)]
struct StripeRefund {
    id: String,
    amount: u64,
    /// `pending`, `requires_action`, `succeeded`, `failed` or `canceled`.
    status: String,
}

impl StripeRefund {
    fn of(self, payment: &PaymentId) -> Refund {
        let status = match self.status.as_str() {
            "succeeded" => RefundStatus::Succeeded,
            "failed" | "canceled" => RefundStatus::Failed,
            // `pending`, `requires_action`, and any status Stripe adds: not back yet.
            _ => RefundStatus::Pending,
        };
        Refund {
            id: self.id,
            payment: payment.clone(),
            amount: self.amount,
            status,
        }
    }
}

/// The metadata key that names a payment's order.
pub const ORDER_METADATA: &str = "order_id";
/// The metadata key that names a payment's buyer: with the order, the key of the
/// order's hold, so an event about the payment finds the order in one read.
pub const BUYER_METADATA: &str = "user_id";

#[async_trait]
impl PaymentProvider for StripePayments {
    async fn open(
        &self,
        order: &OrderId,
        buyer: &UserId,
        price: Price,
    ) -> Result<Payment, StoreError> {
        let amount = price.stripe_amount().to_string();
        let currency = price.currency().stripe_code();
        let order_id = order.to_string();
        let order_key = format!("metadata[{ORDER_METADATA}]");
        let buyer_key = format!("metadata[{BUYER_METADATA}]");
        // No idempotency key: the order's conditional attach records one payment per
        // order, and one opened by a call that lost it, or whose answer was lost, is
        // withdrawn or never confirmed. A key of the order's made Stripe replay a failure
        // (a 500) to every retry for 24 hours, so one provider error at the open cost the
        // buyer their unit.
        self.call::<Intent>(
            "payment_intents.create",
            Method::POST,
            "/v1/payment_intents",
            &[
                ("amount", &amount),
                ("currency", &currency),
                ("capture_method", "manual"),
                ("payment_method_types[]", "card"),
                (&order_key, &order_id),
                (&buyer_key, buyer.as_str()),
            ],
        )
        .await
        .map(Payment::from)
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        match self
            .call::<Intent>(
                "payment_intents.retrieve",
                Method::GET,
                &format!("/v1/payment_intents/{}", path_segment(id)),
                &[],
            )
            .await
        {
            Ok(intent) => Ok(Some(intent.into())),
            Err(e) if refused_with(&e, StatusCode::NOT_FOUND) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn capture(&self, id: &PaymentId) -> Result<CaptureOutcome, StoreError> {
        let (payment, refusal) = self
            .act_on("payment_intents.capture", "capture", id)
            .await?;
        match (payment.state, refusal) {
            (PaymentState::Captured, None) => Ok(CaptureOutcome::Captured(payment)),
            // Refused because it was captured before.
            (PaymentState::Captured, Some(_)) => Ok(CaptureOutcome::AlreadyCaptured(payment)),
            // Still authorised, the refusal was about the request itself.
            (PaymentState::Authorised, Some(refusal)) => Err(refusal),
            _ => Ok(CaptureOutcome::NotCapturable(payment)),
        }
    }

    async fn cancel(&self, id: &PaymentId) -> Result<CancelOutcome, StoreError> {
        let (payment, refusal) = self.act_on("payment_intents.cancel", "cancel", id).await?;
        match (payment.state, refusal) {
            (PaymentState::Captured, _) => Ok(CancelOutcome::AlreadyCaptured(payment)),
            (_, None) => Ok(CancelOutcome::Cancelled(payment)),
            // Refused because it was cancelled before.
            (PaymentState::Cancelled, Some(_)) => Ok(CancelOutcome::AlreadyCancelled(payment)),
            (_, Some(refusal)) => Err(refusal),
        }
    }

    async fn refund(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        let mut refunds = self.refund_list(&payment.id).await?;
        let before = RefundProgress::of(payment.amount, &refunds, false);
        let Some(uncovered) = before.to_refund() else {
            return Ok(before);
        };
        // No idempotency key: Stripe never refunds more than is left of the charge
        // (what no refund that succeeded or is pending covers), so a retry whose first
        // try went through, or a second settlement racing this one, is refused (400) and
        // reads the refunds instead. A key would make Stripe replay a failure (a 500) to
        // every retry for 24 hours, and late money would stay with us for a day.
        let amount = uncovered.to_string();
        let made = self
            .call::<StripeRefund>(
                "refunds.create",
                Method::POST,
                "/v1/refunds",
                &[("payment_intent", payment.id.as_str()), ("amount", &amount)],
            )
            .await;
        match made {
            Ok(refund) => {
                refunds.push(refund.of(&payment.id));
                Ok(RefundProgress::of(payment.amount, &refunds, true))
            }
            Err(refusal) if refused_with(&refusal, StatusCode::BAD_REQUEST) => {
                self.refunds(payment).await
            }
            Err(e) => Err(e),
        }
    }

    async fn refunds(&self, payment: &Payment) -> Result<RefundProgress, StoreError> {
        let refunds = self.refund_list(&payment.id).await?;
        Ok(RefundProgress::of(payment.amount, &refunds, false))
    }
}

impl StripePayments {
    /// The refunds of payment `id`, whatever their status.
    async fn refund_list(&self, id: &PaymentId) -> Result<Vec<Refund>, StoreError> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<StripeRefund>,
        }
        // A payment has a refund, a few if some failed: one page of Stripe's largest.
        let list: List = self
            .call(
                "refunds.list",
                Method::GET,
                &format!("/v1/refunds?payment_intent={}&limit=100", path_segment(id)),
                &[],
            )
            .await?;
        Ok(list.data.into_iter().map(|refund| refund.of(id)).collect())
    }

    /// POSTs `action` (`capture`, `cancel`) on payment `id`. A refusal as invalid (400:
    /// captured before, cancelled, never authorised, or a wrong request) answers the
    /// payment as it is now, with the refusal: only its state tells which, as Stripe's
    /// error codes for it differ between its versions. No idempotency key: the payment's
    /// state already makes a second capture or cancel a refusal that reads back the
    /// first's result, while a key would make Stripe replay a 500 to every retry for 24
    /// hours, so a capture that failed could not be retried until the next day.
    async fn act_on(
        &self,
        operation: &'static str,
        action: &str,
        id: &PaymentId,
    ) -> Result<(Payment, Option<StoreError>), StoreError> {
        let acted = self
            .call::<Intent>(
                operation,
                Method::POST,
                &format!("/v1/payment_intents/{}/{action}", path_segment(id)),
                &[],
            )
            .await;
        match acted {
            Ok(intent) => Ok((intent.into(), None)),
            Err(refusal) if refused_with(&refusal, StatusCode::BAD_REQUEST) => {
                match self.payment(id).await? {
                    Some(payment) => Ok((payment, Some(refusal))),
                    None => Err(refusal),
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// A payment id as one path segment: Stripe's ids are `[A-Za-z0-9_]`, anything else
/// is percent-encoded rather than allowed to change the path or the query.
fn path_segment(id: &PaymentId) -> String {
    const ID: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'_');
    percent_encoding::utf8_percent_encode(id.as_str(), ID).to_string()
}
