//! The operator's stop: pausing, resuming and ending a sale, each recorded in the
//! sale's audit trail.
//!
//! A sale's definition is otherwise immutable, which is what lets every grab process
//! cache it. Its control is the one part that changes, so the caches reread each sale
//! they hold at most once per interval (`SALE_REFRESH_MS`): a pause reaches every warm
//! process within that interval, at one read per process and interval, never one per
//! grab.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{SaleId, UserId};

/// What the operator has made of a sale. Absent from a stored sale: open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaleControl {
    /// Sells in its window, as created.
    #[default]
    Open,
    /// Hands out no grab path and takes no grab until resumed. Holds already taken stay
    /// valid and payable.
    Paused,
    /// Ended early, for good. Holds already taken stay valid and payable.
    Ended,
}

impl SaleControl {
    pub const ALL: [Self; 3] = [Self::Open, Self::Paused, Self::Ended];

    pub fn name(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Paused => "paused",
            Self::Ended => "ended",
        }
    }

    /// The control stored under `name`, if it is one.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|control| control.name() == name)
    }

    pub fn is_open(&self) -> bool {
        *self == Self::Open
    }
}

/// What an operator does to a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaleAction {
    Pause,
    Resume,
    End,
}

impl SaleAction {
    pub const ALL: [Self; 3] = [Self::Pause, Self::Resume, Self::End];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::End => "end",
        }
    }

    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.name() == name)
    }

    /// The control the action leaves the sale in.
    pub fn target(self) -> SaleControl {
        match self {
            Self::Pause => SaleControl::Paused,
            Self::Resume => SaleControl::Open,
            Self::End => SaleControl::Ended,
        }
    }

    /// The controls this action changes. From its own target it changes nothing (a
    /// repeat), and an ended sale is never reopened.
    pub fn applies_to(self) -> &'static [SaleControl] {
        match self {
            Self::Pause => &[SaleControl::Open],
            Self::Resume => &[SaleControl::Paused],
            Self::End => &[SaleControl::Open, SaleControl::Paused],
        }
    }
}

/// One line of a sale's audit trail: who did what, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleAudit {
    pub action: SaleAction,
    pub by: UserId,
    pub at: DateTime<Utc>,
}

/// What a store did with a change of control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlWrite {
    /// The control changed, and the change is in the audit trail.
    Changed,
    /// The sale's control was none the action applies to, so nothing was written.
    Refused { current: SaleControl },
    /// There is no such sale; nothing was written.
    NoSale,
}

/// What an operator's action did, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Controlled {
    pub sale_id: SaleId,
    /// The sale's control now.
    pub control: SaleControl,
    /// False for a repeat (pausing a paused sale, ...): nothing was written.
    pub changed: bool,
}

/// A sale's audit trail, newest first, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditTrail {
    pub entries: Vec<SaleAudit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for control in SaleControl::ALL {
            assert_eq!(SaleControl::named(control.name()), Some(control));
        }
        for action in SaleAction::ALL {
            assert_eq!(SaleAction::named(action.name()), Some(action));
        }
        assert_eq!(SaleAction::named("Pause"), None);
    }

    #[test]
    fn no_action_reopens_an_ended_sale_or_applies_to_its_own_target() {
        for action in SaleAction::ALL {
            assert!(!action.applies_to().contains(&SaleControl::Ended));
            assert!(!action.applies_to().contains(&action.target()));
        }
    }
}
