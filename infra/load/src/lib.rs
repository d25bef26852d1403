//! The load tool and the capacity model: a client of the flashsale HTTP API, the surge
//! that the end-to-end tests and the tool share (the invariant test asserts on the very
//! report the tool prints), the tool's runs, reports, plots and audit, and the model
//! of a sale's capacity at every layer (`flashsale-load model`). `flashsale-pipeline`
//! measures the local grab path against the database work it costs.

pub mod audit;
pub mod client;
pub mod model;
pub mod plot;
pub mod report;
pub mod surge;
pub mod tokens;

mod run;

pub use client::{ApiClient, ApiResponse};
pub use run::{LoadError, LoadRun, Outputs, run};
pub use surge::{SurgePlan, SurgeReport};
