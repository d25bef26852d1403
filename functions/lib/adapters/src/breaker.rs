//! A circuit breaker per dependency (DynamoDB, SQS), as an interceptor on its SDK client.
//!
//! A sick dependency costs a call each time it is asked: the SDK's tries and its
//! back-off, a second of the function's budget, and one more request the dependency
//! must refuse. After [`BreakerPolicy::failures`] failed tries in a row within
//! [`BreakerPolicy::window`] the breaker *opens*: for [`BreakerPolicy::cool_off`] every
//! call is refused before it is sent, which the adapters classify as
//! [`StoreError::Unavailable`](flashsale_domain::StoreError) (503 `unavailable` with
//! `Retry-After`). Then one try goes through (*half-open*): its success closes the
//! breaker, its failure opens it again. The breaker is per process, as the SDK client
//! is: each Lambda environment learns on its own.
//!
//! A failed try is one with no answer (a timeout, a reset connection) or a 5xx answer.
//! A 4xx is an answer from a healthy service, throttling included: a throttle on one hot
//! key says nothing about the rest of the table, and the SDK already backs off from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef, InterceptorContext,
};
use aws_smithy_runtime_api::client::retries::classifiers::{ClassifyRetry, RetryAction};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

/// Counted when a breaker opens (from closed or from a failed probe), by dependency.
pub const BREAKER_OPENED: &str = "circuit_breaker_opened";
/// Counted when a probe's success closes a breaker, by dependency.
pub const BREAKER_CLOSED: &str = "circuit_breaker_closed";
/// Calls a breaker refused without sending them, by dependency.
pub const BREAKER_REFUSED: &str = "circuit_breaker_refused";
/// The label naming the dependency.
pub const DEPENDENCY: &str = "dependency";

/// When a breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Failed tries in a row that open the breaker.
    pub failures: u32,
    /// A run of failures older than this starts over: a failure now and then over
    /// minutes is not an outage.
    pub window: Duration,
    /// How long an open breaker refuses every call before it lets one probe through.
    pub cool_off: Duration,
}

impl BreakerPolicy {
    /// Five failed tries in a row: the SDK makes up to three per call, but a call's
    /// operation budget (1 s for a grab) usually cuts it after one or two, so that is two
    /// to five failing calls in a row, which a healthy DynamoDB or SQS (a 5xx rate far
    /// below 1 %) all but never produces. Ten seconds: a grab's whole budget is
    /// 2.5 s, so five failures spread wider are not one outage. Two seconds of cool-off:
    /// the page retries after `Retry-After`, and one probe per environment every two
    /// seconds is what a sick dependency then sees; once it recovers, an environment
    /// serves again within a cool-off and one round trip.
    pub const DEFAULT: Self = Self {
        failures: 5,
        window: Duration::from_secs(10),
        cool_off: Duration::from_secs(2),
    };
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A try refused by an open breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the circuit breaker of {dependency} is open; not calling it for {retry_after:?}")]
pub struct BreakerOpen {
    pub dependency: &'static str,
    /// Until the breaker lets a probe through.
    pub retry_after: Duration,
    /// An earlier try of the same call was sent (the SDK was retrying it), so the call
    /// may have done something: only a call refused at its first try did nothing.
    pub after_a_sent_try: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
        since: Option<Instant>,
    },
    Open {
        until: Instant,
    },
    /// One probe, `probe`, is out since `since`. A probe whose outcome never arrives
    /// (its call dropped mid-flight) is given up after a cool-off, and another goes.
    HalfOpen {
        since: Instant,
        probe: ProbeTicket,
    },
}

/// Which probe a try was: only the probe out now decides a half-open breaker, not the
/// late answer of a try let through earlier (closed, or a probe given up on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTicket(u64);

/// How a try was let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// The breaker is closed.
    Freely,
    /// As the one probe of a breaker that was open.
    AsProbe(ProbeTicket),
}

/// What a try's outcome was, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryOutcome {
    /// The dependency answered, whatever it said (a 4xx included).
    Answered,
    /// No answer, or a 5xx.
    Failed,
}

/// One dependency's breaker, shared by every call of its client in this process.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    dependency: &'static str,
    policy: BreakerPolicy,
    state: Arc<Mutex<State>>,
    /// The next probe's ticket.
    probes: Arc<AtomicU64>,
}

impl CircuitBreaker {
    pub fn new(dependency: &'static str, policy: BreakerPolicy) -> Self {
        Self {
            dependency,
            policy,
            state: Arc::new(Mutex::new(State::Closed {
                failures: 0,
                since: None,
            })),
            probes: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn dependency(&self) -> &'static str {
        self.dependency
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is a few plain fields, each update complete: a panic elsewhere
        // cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a try may be sent at `now`, and as what; refused while open, and while a
    /// probe is out.
    pub fn admit(&self, now: Instant) -> Result<Admitted, BreakerOpen> {
        let mut state = self.state();
        let refused = |until: Instant| BreakerOpen {
            dependency: self.dependency,
            retry_after: until.saturating_duration_since(now),
            after_a_sent_try: false,
        };
        match *state {
            State::Closed { .. } => Ok(Admitted::Freely),
            State::Open { until } if now < until => Err(refused(until)),
            State::HalfOpen { since, .. } if now < since + self.policy.cool_off => {
                Err(refused(since + self.policy.cool_off))
            }
            // The cool-off is over (or the last probe was lost): this try is the probe.
            State::Open { .. } | State::HalfOpen { .. } => {
                let probe = ProbeTicket(self.probes.fetch_add(1, Ordering::Relaxed));
                *state = State::HalfOpen { since: now, probe };
                Ok(Admitted::AsProbe(probe))
            }
        }
    }

    fn is_closed(&self) -> bool {
        matches!(*self.state(), State::Closed { .. })
    }

    /// Takes in the outcome of a try that [`CircuitBreaker::admit`] let through as
    /// `admitted`.
    pub fn record(&self, admitted: Admitted, outcome: TryOutcome, now: Instant) {
        let mut state = self.state();
        let next = match (*state, outcome) {
            // Not the probe out now: a try from before, answering late.
            (half_open @ State::HalfOpen { probe, .. }, _)
                if admitted != Admitted::AsProbe(probe) =>
            {
                half_open
            }
            (State::HalfOpen { .. }, TryOutcome::Answered) => {
                metrics::counter!(BREAKER_CLOSED, DEPENDENCY => self.dependency).increment(1);
                tracing::info!(dependency = self.dependency, "circuit breaker closed");
                State::Closed {
                    failures: 0,
                    since: None,
                }
            }
            (State::HalfOpen { .. }, TryOutcome::Failed) => self.open(now),
            (State::Closed { .. }, TryOutcome::Answered) => State::Closed {
                failures: 0,
                since: None,
            },
            (State::Closed { failures, since }, TryOutcome::Failed) => {
                let (failures, since) = match since {
                    Some(since) if now.saturating_duration_since(since) < self.policy.window => {
                        (failures + 1, since)
                    }
                    _ => (1, now),
                };
                if failures >= self.policy.failures {
                    self.open(now)
                } else {
                    State::Closed {
                        failures,
                        since: Some(since),
                    }
                }
            }
            // A try sent before the breaker opened, answering late: the probe decides.
            (open @ State::Open { .. }, _) => open,
        };
        *state = next;
    }

    fn open(&self, now: Instant) -> State {
        metrics::counter!(BREAKER_OPENED, DEPENDENCY => self.dependency).increment(1);
        tracing::warn!(
            dependency = self.dependency,
            cool_off = ?self.policy.cool_off,
            "circuit breaker opened: calls are refused without being sent"
        );
        State::Open {
            until: now + self.policy.cool_off,
        }
    }

    /// The interceptor that puts this breaker in front of an SDK client.
    pub fn interceptor(&self) -> BreakerInterceptor {
        BreakerInterceptor(self.clone())
    }

    /// The retry classifier that goes with [`CircuitBreaker::interceptor`].
    pub fn retry_classifier(&self) -> NoRetryWhileOpen {
        NoRetryWhileOpen(self.clone())
    }
}

/// What this breaker made of an operation's last try, kept in the operation's config
/// bag: a refused try is not counted by the after-try hook (which runs for every try),
/// and a refusal after a sent try says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastTry {
    Refused,
    Sent(Admitted),
}

impl Storable for LastTry {
    type Storer = StoreReplace<Self>;
}

/// [`CircuitBreaker`] as an SDK interceptor: it refuses a try before it is sent, and
/// reads each try's outcome after it.
#[derive(Debug, Clone)]
pub struct BreakerInterceptor(CircuitBreaker);

impl Intercept for BreakerInterceptor {
    fn name(&self) -> &'static str {
        "CircuitBreaker"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let sent_before = matches!(cfg.load::<LastTry>(), Some(LastTry::Sent(_)));
        let admitted = self.0.admit(Instant::now()).map_err(|open| BreakerOpen {
            after_a_sent_try: sent_before,
            ..open
        });
        let last = match admitted {
            Ok(how) => LastTry::Sent(how),
            Err(_) => LastTry::Refused,
        };
        cfg.interceptor_state().store_put(last);
        match admitted {
            Ok(_) => Ok(()),
            Err(open) => {
                metrics::counter!(BREAKER_REFUSED, DEPENDENCY => self.0.dependency).increment(1);
                Err(open.into())
            }
        }
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(&LastTry::Sent(admitted)) = cfg.load::<LastTry>() else {
            return Ok(());
        };
        let outcome = match context.response() {
            Some(response) if response.status().is_server_error() => TryOutcome::Failed,
            Some(_) => TryOutcome::Answered,
            None => TryOutcome::Failed,
        };
        self.0.record(admitted, outcome, Instant::now());
        Ok(())
    }
}

/// Keeps the SDK from retrying while the breaker is not closed: after its back-off the
/// retry would be refused too (or take the probe meant for later), and a failed probe's
/// answer is the breaker's, not a reason to ask again. The caller hears at once.
#[derive(Debug, Clone)]
pub struct NoRetryWhileOpen(CircuitBreaker);

impl ClassifyRetry for NoRetryWhileOpen {
    fn classify_retry(&self, context: &InterceptorContext) -> RetryAction {
        let failed = matches!(context.output_or_error(), Some(Err(_)));
        if failed && !self.0.is_closed() {
            RetryAction::RetryForbidden
        } else {
            RetryAction::NoActionIndicated
        }
    }

    fn name(&self) -> &'static str {
        "NoRetryWhileTheCircuitBreakerIsOpen"
    }
}

/// The breaker that refused `error`'s call, if one did: a call refused before it was
/// sent. Looked for along the error's sources, where the SDK wraps it.
pub fn refused_by_breaker(error: &(dyn std::error::Error + 'static)) -> Option<BreakerOpen> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(open) = error.downcast_ref::<BreakerOpen>() {
            return Some(*open);
        }
        current = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BreakerPolicy = BreakerPolicy {
        failures: 3,
        window: Duration::from_secs(10),
        cool_off: Duration::from_secs(2),
    };

    fn failing(breaker: &CircuitBreaker, times: u32, at: Instant) {
        for _ in 0..times {
            let admitted = breaker.admit(at).expect("closed");
            breaker.record(admitted, TryOutcome::Failed, at);
        }
    }

    #[test]
    fn failures_in_a_row_open_it_and_it_refuses_until_the_cool_off_ends() {
        let breaker = CircuitBreaker::new("dynamodb", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 2, t0);
        let third = breaker
            .admit(t0)
            .expect("two failures of three: still closed");
        breaker.record(third, TryOutcome::Failed, t0);
        let refused = breaker.admit(t0 + Duration::from_millis(500)).unwrap_err();
        assert_eq!(refused.dependency, "dynamodb");
        assert_eq!(refused.retry_after, Duration::from_millis(1500));
    }

    #[test]
    fn an_answer_between_failures_starts_the_count_over() {
        let breaker = CircuitBreaker::new("sqs", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 2, t0);
        let answered = breaker.admit(t0).unwrap();
        breaker.record(answered, TryOutcome::Answered, t0);
        failing(&breaker, 2, t0);
        assert!(breaker.admit(t0).is_ok());
    }

    #[test]
    fn failures_spread_wider_than_the_window_do_not_open_it() {
        let breaker = CircuitBreaker::new("sqs", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 2, t0);
        failing(&breaker, 2, t0 + Duration::from_secs(11));
        assert!(breaker.admit(t0 + Duration::from_secs(11)).is_ok());
    }

    #[test]
    fn after_the_cool_off_one_probe_goes_and_its_answer_closes_it() {
        let breaker = CircuitBreaker::new("dynamodb", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 3, t0);
        let later = t0 + POLICY.cool_off;
        let probe = breaker.admit(later).expect("the probe");
        assert!(matches!(probe, Admitted::AsProbe(_)), "{probe:?}");
        assert!(
            breaker.admit(later).is_err(),
            "no second try while the probe is out"
        );
        breaker.record(probe, TryOutcome::Answered, later);
        assert_eq!(
            breaker.admit(later),
            Ok(Admitted::Freely),
            "closed: every try goes"
        );
    }

    #[test]
    fn a_failed_probe_opens_it_for_another_cool_off() {
        let breaker = CircuitBreaker::new("dynamodb", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 3, t0);
        let probe = t0 + POLICY.cool_off;
        let admitted = breaker.admit(probe).unwrap();
        breaker.record(admitted, TryOutcome::Failed, probe);
        let refused = breaker.admit(probe + Duration::from_secs(1)).unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        assert!(breaker.admit(probe + POLICY.cool_off).is_ok());
    }

    #[test]
    fn a_probe_whose_answer_never_comes_is_replaced_after_a_cool_off() {
        let breaker = CircuitBreaker::new("dynamodb", POLICY);
        let t0 = Instant::now();
        failing(&breaker, 3, t0);
        let probe = t0 + POLICY.cool_off;
        let lost = breaker.admit(probe).unwrap();
        assert!(breaker.admit(probe + Duration::from_secs(1)).is_err());
        let replacement = breaker.admit(probe + POLICY.cool_off).unwrap();
        assert_ne!(lost, replacement);
        // The lost probe answering at last decides nothing: the replacement does.
        breaker.record(lost, TryOutcome::Answered, probe + POLICY.cool_off);
        assert!(
            breaker.admit(probe + POLICY.cool_off).is_err(),
            "still half-open"
        );
        breaker.record(replacement, TryOutcome::Failed, probe + POLICY.cool_off);
        assert!(
            breaker.admit(probe + POLICY.cool_off).is_err(),
            "open again"
        );
    }

    #[test]
    fn a_late_answer_of_a_try_from_before_does_not_decide_a_half_open_breaker() {
        let breaker = CircuitBreaker::new("dynamodb", POLICY);
        let t0 = Instant::now();
        // A slow try let through while closed, still out when the breaker opens.
        let slow = breaker.admit(t0).unwrap();
        failing(&breaker, 3, t0);
        let later = t0 + POLICY.cool_off;
        let probe = breaker.admit(later).unwrap();
        breaker.record(slow, TryOutcome::Answered, later);
        assert!(
            breaker.admit(later).is_err(),
            "the probe decides, not the slow try"
        );
        breaker.record(probe, TryOutcome::Answered, later);
        assert_eq!(breaker.admit(later), Ok(Admitted::Freely));
    }

    #[test]
    fn a_refusal_is_found_along_the_error_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapper(#[source] BreakerOpen);
        let open = BreakerOpen {
            dependency: "sqs",
            retry_after: Duration::from_secs(1),
            after_a_sent_try: false,
        };
        assert_eq!(refused_by_breaker(&Wrapper(open)), Some(open));
        assert_eq!(refused_by_breaker(&std::fmt::Error), None);
    }
}
