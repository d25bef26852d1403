//! `make bench` and the pass-through it counts with.
//!
//! - the counting, fault-injecting HTTP pass-through in front of an emulator ([`proxy`],
//!   which lives with the emulators, so the e2e fault drills use the same one);
//! - the emulators, a proxy in front of each, and the local stack pointed at the proxies
//!   ([`stack`]);
//! - the measurements ([`scenarios`], [`external`]), the grab under the proxy's
//!   transaction-conflict mode ([`contention`]), bootstrap sizes and init times ([`init`]);
//! - the operator's pause under a surge ([`pause`]), the fulfilment export at size
//!   ([`fulfilment`]);
//! - `docs/benchmarks.md` ([`report`]).

pub mod contention;
pub mod external;
pub mod fulfilment;
pub mod init;
pub mod pause;
pub use flashsale_emulators::proxy;
pub mod quiet;
pub mod report;
pub mod scenarios;
pub mod stack;
pub mod stats;
