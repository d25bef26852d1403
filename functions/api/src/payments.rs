//! The buyer's card payment through Stripe: the order's PaymentIntent for the page,
//! the settlement after the page's confirmation, and Stripe's signed webhook. Every
//! trigger settles through the domain's one [`PaymentService`]; none takes the
//! caller's word for the payment.

use std::sync::Arc;

use flashsale_adapters::stripe::webhook::{self, SignatureError};
use flashsale_domain::ports::{Clock, OrderPayments, PaymentProvider, ProviderEvents};
use flashsale_domain::service::{EventHandled, PaymentService, PaymentWebhook, Settled};
use flashsale_domain::{Order, OrderId};
use flashsale_lambda::metrics::{self, PaymentMoves};
use flashsale_lambda::{ApiError, CachePolicy, json, order_id_param, user_of};
use lambda_http::http::{Response, StatusCode};
use lambda_http::{Body, Request};
use serde::Serialize;

use crate::Deps;

/// The payment ports, where a provider is wired.
pub struct PaymentPorts {
    pub payments: Arc<dyn OrderPayments>,
    pub events: Arc<dyn ProviderEvents>,
    pub provider: Arc<dyn PaymentProvider>,
    pub publishable_key: String,
    pub webhook_secret: String,
}

/// The payment routes, as the cold start wired them.
pub(crate) enum PaymentRoutes {
    Off,
    On(Payments),
    Misconfigured,
}

/// The payment routes' use cases.
pub struct Payments {
    pub(crate) service: Arc<PaymentService>,
    pub(crate) webhook: PaymentWebhook,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) publishable_key: String,
    pub(crate) webhook_secret: String,
}

/// The order's payment, for the page to confirm with the provider's script.
#[derive(Debug, Serialize)]
struct PaymentOpened<'a> {
    order_id: &'a OrderId,
    provider: &'static str,
    payment_id: &'a str,
    /// Secret to this buyer: the page hands it to Stripe.js, nothing logs it.
    client_secret: &'a str,
    publishable_key: &'a str,
    amount: u64,
    currency: &'a str,
    state: &'static str,
}

/// The order after a settlement, and what the settlement found.
#[derive(Debug, Serialize)]
struct Confirmed {
    #[serde(flatten)]
    order: Order,
    settlement: &'static str,
}

/// A webhook event taken.
#[derive(Debug, Serialize)]
struct Received<'a> {
    received: bool,
    event_id: &'a str,
    outcome: &'static str,
}

/// `result`, a failed settlement counted as one (`payment_settle_failures`): the page's
/// next call, Stripe's redelivery or the reconciler tries again.
fn counted<T>(result: Result<T, flashsale_domain::AppError>) -> Result<T, ApiError> {
    result.map_err(|error| {
        if matches!(
            error,
            flashsale_domain::AppError::Store(_) | flashsale_domain::AppError::Provider(_)
        ) {
            metrics::payments(PaymentMoves {
                failures: 1,
                ..PaymentMoves::default()
            });
        }
        ApiError::from(error)
    })
}

/// What a settlement moved, and the order it sold if it did.
fn count_moves(settled: &Settled) {
    metrics::payments(PaymentMoves::of_one(&settled.moves));
    if settled.moves.paid {
        metrics::order_step(metrics::ORDERS_PAID, settled.order_id.sale_id());
    }
}

fn payments(deps: &Deps) -> Result<&Payments, ApiError> {
    match &deps.payments {
        PaymentRoutes::On(payments) => Ok(payments),
        PaymentRoutes::Off => Err(ApiError::PaymentsOff),
        PaymentRoutes::Misconfigured => {
            metrics::payments_misconfigured();
            Err(ApiError::PaymentsMisconfigured)
        }
    }
}

/// `POST /orders/{order_id}/payment`: the buyer's open order's PaymentIntent, opened the
/// first time and the same one after.
pub(crate) async fn open_payment(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let payments = payments(deps)?;
    let user = user_of(req)?;
    let order_id = order_id_param(req)?;
    let payment = payments.service.open(&order_id, &user).await?;
    json(
        StatusCode::OK,
        &PaymentOpened {
            order_id: &order_id,
            provider: "stripe",
            payment_id: payment.id.as_str(),
            client_secret: &payment.client_secret,
            publishable_key: &payments.publishable_key,
            amount: payment.amount,
            currency: &payment.currency,
            state: payment.state.name(),
        },
        CachePolicy::NoStore,
    )
}

/// `POST /orders/{order_id}/payment/confirm`: settles the order from its payment as
/// the provider has it, after the page's confirmation.
pub(crate) async fn confirm_payment(
    deps: &Deps,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let payments = payments(deps)?;
    let user = user_of(req)?;
    let order_id = order_id_param(req)?;
    let settled = counted(payments.service.settle(&order_id, &user).await)?;
    count_moves(&settled);
    tracing::info!(%order_id, outcome = settled.outcome.name(), "payment settled");
    let order = deps.orders.get(&order_id, &user).await?;
    json(
        StatusCode::OK,
        &Confirmed {
            order,
            settlement: settled.outcome.name(),
        },
        CachePolicy::NoStore,
    )
}

/// `POST /payments/stripe/webhook`, unauthenticated: an event counts only with a
/// `Stripe-Signature` that verifies over the body as received, and is settled at most
/// once. A failure answers 503, so Stripe delivers it again.
pub(crate) async fn stripe_webhook(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let signature = req
        .headers()
        .get("stripe-signature")
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.trim().is_empty())
        .ok_or(ApiError::WebhookSignature(SignatureError::Malformed))?;
    let payments = payments(deps)?;
    let payload: &[u8] = req.body().as_ref();
    webhook::verify(
        payload,
        signature,
        &payments.webhook_secret,
        payments.clock.now(),
    )
    .map_err(ApiError::WebhookSignature)?;
    let event = webhook::event(payload).ok_or(ApiError::NotAnEvent)?;
    let handled = counted(
        payments
            .webhook
            .handle(&event.id, event.payment.as_ref())
            .await,
    )?;
    let outcome = match &handled {
        EventHandled::Settled(settled) => {
            count_moves(settled);
            settled.outcome.name()
        }
        EventHandled::Duplicate => "duplicate",
        EventHandled::Ignored => "ignored",
        EventHandled::Withdrawn => "withdrawn",
        EventHandled::Refused => {
            metrics::payment_event_refused();
            "refused"
        }
    };
    tracing::info!(event_id = %event.id, kind = %event.kind, outcome, "webhook event");
    json(
        StatusCode::OK,
        &Received {
            received: true,
            event_id: &event.id,
            outcome,
        },
        CachePolicy::NoStore,
    )
}
