//! The proof-of-work challenge that comes before the grab path: the seeds' behaviour
//! captcha. Its two jobs are to make scripted buyers pay (CPU for every grab path) and
//! to spread the pulse: every buyer's solve takes a different, random time, so the
//! clicks of one instant reach the token route over seconds instead of together, and
//! in an order the network's fastest do not decide.
//!
//! A sale asks for it with [`ChallengeWork`]. The challenge is stateless: it is signed,
//! bound to (sale, buyer, expiry), and checked with CPU only, so neither issuing it nor
//! refusing a wrong solution touches the database. A solved challenge buys one grab
//! path, and always the same one: the path's order is derived from the challenge, so a
//! replay of a solution finds the order it already made (see [`SolvedChallenge`]).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::error::ValidationError;

/// How long a buyer has to solve a challenge and exchange it for a grab path. The
/// solve takes seconds; the margin covers a slow device.
pub const CHALLENGE_LIFETIME: Duration = Duration::minutes(5);

/// The fewest key derivations a challenge may ask for when it is on. Below this the
/// solve takes milliseconds: no spread, and no cost to a bot.
pub const MIN_CHALLENGE_WORK: u32 = 1_000;
/// The most, so that no sale can ask buyers for minutes of CPU.
pub const MAX_CHALLENGE_WORK: u32 = 10_000_000;

/// How much work a sale's challenge asks: the issuer hides its answer at a counter
/// drawn uniformly below this bound, and the solver derives a key per counter from 0
/// until it finds it. So a solve costs `work / 2` derivations on average, and the solve
/// times of a crowd spread evenly from nothing to `work` derivations: that spread is
/// what shuffles their arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChallengeWork(u32);

impl ChallengeWork {
    /// The sale's setting: 0 is off, anything else is the work, within
    /// [`MIN_CHALLENGE_WORK`]`..=`[`MAX_CHALLENGE_WORK`].
    pub fn of_setting(field: &'static str, value: i64) -> Result<Option<Self>, ValidationError> {
        if value == 0 {
            return Ok(None);
        }
        let range = i64::from(MIN_CHALLENGE_WORK)..=i64::from(MAX_CHALLENGE_WORK);
        if !range.contains(&value) {
            return Err(ValidationError::new(
                field,
                format!(
                    "must be 0 (no challenge) or between {MIN_CHALLENGE_WORK} and {MAX_CHALLENGE_WORK}"
                ),
            ));
        }
        Ok(u32::try_from(value).ok().map(Self))
    }

    pub fn derivations(self) -> u32 {
        self.0
    }
}

/// A challenge as the buyer receives it: the protocol's own JSON, passed on as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct IssuedChallenge(pub serde_json::Value);

/// What a genuine solution proves: this buyer solved this challenge, issued then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SolvedChallenge {
    /// Unique to the challenge and the same on every verification of it.
    pub challenge_id: [u8; 16],
    pub issued_at: DateTime<Utc>,
}

impl SolvedChallenge {
    /// The order the challenge's grab path names: the same for every replay of the
    /// solution, so a replay finds the order the first use made, never a second. A
    /// ULID like any other order's, timed at the challenge's issue.
    pub fn order(&self) -> Ulid {
        let millis = u64::try_from(self.issued_at.timestamp_millis()).unwrap_or(0);
        let mut random = [0u8; 16];
        random[6..].copy_from_slice(&self.challenge_id[..10]);
        Ulid::from_parts(millis, u128::from_be_bytes(random))
    }
}

/// Why a solution was refused. Each is the buyer's problem (or a forger's), never the
/// service's: the route answers 403 and writes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChallengeRefusal {
    #[error("the challenge solution is not in the protocol's shape")]
    Malformed,
    #[error("the challenge was not issued by this service, or was altered")]
    Forged,
    #[error("the challenge has expired")]
    Expired,
    #[error("the challenge was issued for another buyer or sale")]
    NotYours,
    #[error("the challenge is not solved")]
    Unsolved,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_is_off_or_within_its_bounds() {
        assert_eq!(ChallengeWork::of_setting("w", 0), Ok(None));
        assert_eq!(
            ChallengeWork::of_setting("w", 50_000).map(|work| work.map(ChallengeWork::derivations)),
            Ok(Some(50_000))
        );
        for wrong in [-1, 1, 999, 10_000_001, i64::MAX] {
            let error = ChallengeWork::of_setting("w", wrong).unwrap_err();
            assert_eq!(error.field, "w");
            assert!(error.problem.contains("must be 0"), "{error}");
        }
    }

    #[test]
    fn a_solved_challenge_names_one_order_of_its_own() {
        let issued_at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let solved = SolvedChallenge {
            challenge_id: [7; 16],
            issued_at,
        };
        assert_eq!(
            solved.order(),
            solved.order(),
            "a replay names the same order"
        );
        assert_eq!(
            solved.order().timestamp_ms(),
            u64::try_from(issued_at.timestamp_millis()).unwrap()
        );
        let other = SolvedChallenge {
            challenge_id: [8; 16],
            ..solved
        };
        assert_ne!(solved.order(), other.order());
    }
}
