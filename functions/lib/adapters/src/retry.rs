//! Bounded retry with full jitter, for the contention the SDK does not retry itself
//! (DynamoDB `TransactionConflict`, `UnprocessedKeys`).
//!
//! Full jitter (sleep a uniform random time in `[0, min(cap, base * 2^attempt)]`) is
//! what spreads hundreds of buyers who collided on one shard: with a fixed or merely
//! exponential delay they would collide again, in step.

use std::time::Duration;

use rand::Rng;

/// How many times, and how patiently, to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Attempts in total, the first one included. At least 1.
    pub(crate) max_attempts: u32,
    /// The ceiling of the first retry's delay; it doubles with each retry.
    pub(crate) base: Duration,
    /// No delay exceeds this.
    pub(crate) cap: Duration,
}

impl RetryPolicy {
    /// What the brief asks of the grab: a contended shard gets about ten tries within
    /// roughly a second in the worst case, well inside the function's timeout.
    pub(crate) const CONTENTION: Self = Self {
        max_attempts: 10,
        base: Duration::from_millis(5),
        cap: Duration::from_millis(200),
    };

    /// The ceiling of the delay before retry number `retry` (0 for the first retry).
    pub(crate) fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1_u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A uniformly random delay in `[0, ceiling(retry)]`.
    pub(crate) fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(0..=micros))
    }

    /// Whether another attempt is allowed after `attempts_made`.
    pub(crate) fn allows_another(&self, attempts_made: u32) -> bool {
        attempts_made < self.max_attempts.max(1)
    }
}

/// What one attempt came to: finished (however it ended), or contended and worth
/// waiting out.
pub(crate) enum Attempt<T, C> {
    Finished(T),
    Contended(C),
}

/// Contention that outlasted every attempt: how many were made, and the last one's.
pub(crate) struct Outlasted<C> {
    pub(crate) attempts: u32,
    pub(crate) last: C,
}

impl RetryPolicy {
    /// Runs `attempt` until it finishes, after each contended one waiting a full-jitter
    /// delay, for at most `max_attempts` in all.
    pub(crate) async fn until_uncontended<T, C, E, Fut>(
        &self,
        operation: &'static str,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<Result<T, Outlasted<C>>, E>
    where
        Fut: std::future::Future<Output = Result<Attempt<T, C>, E>>,
    {
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            let last = match attempt().await? {
                Attempt::Finished(done) => return Ok(Ok(done)),
                Attempt::Contended(contention) => contention,
            };
            if !self.allows_another(attempts) {
                return Ok(Err(Outlasted { attempts, last }));
            }
            let delay = self.delay(attempts - 1);
            tracing::debug!(operation, attempts, ?delay, "contended; retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::CONTENTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_until_the_cap() {
        let policy = RetryPolicy::CONTENTION;
        assert_eq!(policy.ceiling(0), Duration::from_millis(5));
        assert_eq!(policy.ceiling(1), Duration::from_millis(10));
        assert_eq!(policy.ceiling(5), Duration::from_millis(160));
        assert_eq!(policy.ceiling(6), Duration::from_millis(200));
        assert_eq!(policy.ceiling(40), Duration::from_millis(200));
    }

    #[test]
    fn delays_stay_within_the_ceiling_and_vary() {
        let policy = RetryPolicy::CONTENTION;
        let delays: Vec<Duration> = (0..200).map(|_| policy.delay(6)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(200)));
        let first = delays[0];
        assert!(
            delays.iter().any(|d| *d != first),
            "full jitter must not sleep in step"
        );
    }

    #[test]
    fn attempts_are_bounded() {
        let policy = RetryPolicy::CONTENTION;
        assert!(policy.allows_another(9));
        assert!(!policy.allows_another(10));
        let once = RetryPolicy {
            max_attempts: 0,
            ..policy
        };
        assert!(!once.allows_another(1));
    }
}
