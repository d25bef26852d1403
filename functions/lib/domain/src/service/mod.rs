//! The use cases. Each service holds only the ports it needs, so each function builds
//! only the clients it uses.
//!
//! - `sales`: sale administration and the public page;
//! - `blocklist`: the admins' blocklist;
//! - `orders`: the consumer's timer, the owner's read and cancel, the timeout;
//! - `payments`: the buyer's payment of an order, opened once and settled;
//! - `reconciler`: the safety net under the happy path;
//! - `caches`: the per-process caches the grab reads instead of the store.
//!
//! The hot path, the grab, has a module of its own ([`crate::grab`]).

mod blocklist;
mod caches;
mod orders;
mod payments;
mod reconciler;
mod sales;

pub use blocklist::BlocklistService;
pub use caches::{CachedBlocklist, CachedCatalog, DEFAULT_SALE_REFRESH};
pub(crate) use orders::settled_error;
pub use orders::{ExpiryService, OrderService, TimerSet};
pub use payments::{
    EventHandled, MoneyMoves, PaymentService, PaymentWebhook, SettleOutcome, Settled,
};
pub use reconciler::{DEFAULT_TAKE_GRACE, ReconcileReport, Reconciler};
pub use sales::SaleService;

// The hot path's names stay reachable from here.
pub use crate::grab::{
    Attempt, ContentionPolicy, GRAB_PATH_LIFETIME, GrabOutcome, GrabPass, GrabReport, GrabService,
    SoldOutBy,
};
