//! The flash-sale domain: sales, grabs, orders and releases, with no knowledge of AWS.
//!
//! The rules live here; storage, queues and schedules are reached only through the
//! small traits in [`ports`], so every rule can be tested with the in-memory fakes in
//! `testing` and served in production by the DynamoDB/SQS/Scheduler adapters.

pub mod buyer_orders;
pub mod challenge;
pub mod control;
pub mod currency;
pub mod error;
pub mod fulfilment;
pub mod gate;
pub mod grab;
pub mod ids;
pub mod order;
pub mod payment;
pub mod ports;
pub mod price;
pub mod sale;
pub mod service;
/// The in-memory fakes, behind the `testing` feature: the crates whose tests use them
/// enable it as a dev-dependency, so no production binary compiles them.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod token;

pub use control::{SaleAction, SaleAudit, SaleControl};
pub use currency::Currency;
pub use error::{AppError, StoreError, ValidationError, WriteOutcome};
pub use ids::{OrderId, SaleId, UserId};
pub use order::{Order, OrderMessage, OrderStatus, ReleaseReason, Reservation};
pub use price::Price;
pub use sale::{
    ReservePath, Sale, SaleCursor, SaleDraft, SaleList, SalePage, SalePhase, SaleStats, SaleView,
};
