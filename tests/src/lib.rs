//! A client of the flashsale HTTP API and the surge that the end-to-end tests and the
//! load tool share: the invariant test asserts on the very report the tool prints.

pub mod client;
pub mod load;
pub mod surge;

pub use client::{ApiClient, ApiResponse};
pub use surge::{SurgePlan, SurgeReport};
