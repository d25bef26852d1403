//! EventBridge Scheduler delivery. moto stores schedules but never fires them; this
//! loop does what the service does for one-time `at(...)` schedules.
//!
//! AWS semantics emulated:
//! - a schedule fires with 60-second precision, as AWS documents ("if you set your
//!   schedule to run at 1:00, it will invoke the target API between 1:00:00 and
//!   1:00:59"): at a uniformly random instant of the minute of its `at` time (in
//!   `ScheduleExpressionTimezone`), never before that minute nor before the schedule was
//!   created, never after the minute's end (a schedule created after its minute has
//!   ended fires at once). The instant is drawn from [`SchedulerSettings::seed`], random
//!   unless a seed is given, so code is exercised against every second AWS may pick;
//! - a Lambda target is invoked *asynchronously*: delivery succeeds once Lambda has
//!   queued the event, and a failing function is retried by Lambda's asynchronous
//!   retries (see [`crate::lambda::LambdaService::invoke_async`]), not by the schedule;
//! - a failed *delivery* (the target ARN names no function, the Input is not JSON) is
//!   retried with exponential backoff, bounded by the target's `RetryPolicy`
//!   (`MaximumRetryAttempts`, `MaximumEventAgeInSeconds`), the schedule kept meanwhile;
//!   when retries run out the event goes to the target's `DeadLetterConfig` queue, if any;
//! - `ActionAfterCompletion: DELETE` deletes the schedule once it has completed.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_scheduler::types::{ActionAfterCompletion, ScheduleState};
use aws_sdk_sqs::types::MessageAttributeValue;
use chrono::{DateTime, DurationRound, NaiveDateTime, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::sync::watch;

use crate::lambda::{LambdaService, error_chain};

/// Timezone names that are UTC. Other IANA zones are refused rather than guessed.
const UTC_ZONES: [&str; 6] = ["UTC", "Etc/UTC", "GMT", "Etc/GMT", "Universal", "Zulu"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpressionError {
    #[error("{0:?} is not a one-time at(...) expression; rate() and cron() are not emulated")]
    NotOneTime(String),
    #[error("{0:?} is not at(yyyy-mm-ddThh:mm:ss)")]
    Malformed(String),
    #[error("timezone {0:?} is not emulated (only UTC)")]
    UnsupportedTimezone(String),
}

/// The instant an `at(yyyy-mm-ddThh:mm:ss)` expression names in `timezone`.
pub fn due_time(
    expression: &str,
    timezone: Option<&str>,
) -> Result<DateTime<Utc>, ExpressionError> {
    let inner = expression
        .trim()
        .strip_prefix("at(")
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| ExpressionError::NotOneTime(expression.to_owned()))?;
    let local = NaiveDateTime::parse_from_str(inner, "%Y-%m-%dT%H:%M:%S")
        .map_err(|_| ExpressionError::Malformed(expression.to_owned()))?;
    match timezone {
        None => Ok(local.and_utc()),
        Some(zone) if UTC_ZONES.contains(&zone) => Ok(local.and_utc()),
        Some(zone) => Err(ExpressionError::UnsupportedTimezone(zone.to_owned())),
    }
}

/// The environment variable that seeds the firing instants of `make run` and the e2e
/// stacks, to replay a run; unset, they are random.
pub const SEED_VAR: &str = "LOCAL_SCHEDULER_SEED";

/// When, within the minute of its `at()`, a schedule created at `created` fires:
/// `draw` (in `[0, 1)`) of the way through what is left of the minute after the
/// creation. A minute that ended before the creation fires at the creation.
pub fn firing_instant(due: DateTime<Utc>, created: DateTime<Utc>, draw: f64) -> DateTime<Utc> {
    let minute = TimeDelta::minutes(1);
    let start = due.duration_trunc(minute).unwrap_or(due);
    let end = start + minute;
    let from = start.max(created);
    if from >= end {
        return created;
    }
    let span_ms = (end - from).num_milliseconds();
    // Whole milliseconds below the span: never at the next minute's first instant.
    let offset_ms = ((span_ms as f64 * draw.clamp(0.0, 1.0)) as i64).min(span_ms - 1);
    from + TimeDelta::milliseconds(offset_ms)
}

/// Timing of the delivery loop.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    /// Seeds the second of its minute at which each schedule fires. `None` (the
    /// default, unless [`SEED_VAR`] is set) draws from the OS, so runs differ.
    pub seed: Option<u64>,
    /// How often schedules are listed (at least once a second).
    pub poll_interval: Duration,
    /// First delivery retry delay; doubled per attempt up to `retry_cap`.
    pub retry_base: Duration,
    pub retry_cap: Duration,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            seed: std::env::var(SEED_VAR)
                .ok()
                .and_then(|seed| seed.trim().parse().ok()),
            poll_interval: Duration::from_millis(500),
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(60),
        }
    }
}

/// Scheduler's defaults when a target has no RetryPolicy.
const DEFAULT_MAX_RETRY_ATTEMPTS: u32 = 185;
const DEFAULT_MAX_EVENT_AGE: Duration = Duration::from_secs(86_400);

/// What delivery needs of a schedule, read once per version of it.
#[derive(Debug, Clone)]
struct Details {
    /// When this version of the schedule fires (see [`firing_instant`]).
    due: Result<DateTime<Utc>, ExpressionError>,
    enabled: bool,
    target_arn: String,
    input: String,
    max_retry_attempts: u32,
    max_event_age: Duration,
    dead_letter_arn: Option<String>,
    delete_after: bool,
}

#[derive(Debug, Default)]
struct Tracked {
    details: Option<Details>,
    failed_deliveries: u32,
    next_attempt: Option<Instant>,
    completed: bool,
    reported_invalid: bool,
}

/// One version of one schedule: (ARN, creation date, last modification date). A name
/// re-created, or a schedule updated, is considered afresh.
type Key = (String, String, String);

struct Delivery {
    lambda: LambdaService,
    scheduler: aws_sdk_scheduler::Client,
    sqs: aws_sdk_sqs::Client,
    settings: SchedulerSettings,
    tracked: HashMap<Key, Tracked>,
    firing: StdRng,
}

/// Delivers the due schedules of `groups` until `shutdown` turns true.
pub async fn run(
    lambda: LambdaService,
    groups: Vec<String>,
    scheduler: aws_sdk_scheduler::Client,
    sqs: aws_sdk_sqs::Client,
    settings: SchedulerSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let seed = settings.seed.unwrap_or_else(rand::random);
    let mut delivery = Delivery {
        lambda,
        scheduler,
        sqs,
        settings,
        tracked: HashMap::new(),
        firing: StdRng::seed_from_u64(seed),
    };
    tracing::info!(
        ?groups,
        seed,
        "scheduler delivery started (set {SEED_VAR} to replay its firing instants)"
    );
    loop {
        let mut seen = BTreeSet::new();
        for group in &groups {
            delivery.poll_group(group, &mut seen).await;
        }
        // Forget schedules that are gone.
        delivery.tracked.retain(|key, _| seen.contains(key));
        tokio::select! {
            _ = tokio::time::sleep(delivery.settings.poll_interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    tracing::info!("scheduler delivery stopped");
}

fn date_key(date: Option<&aws_smithy_types::DateTime>) -> String {
    date.map(|d| format!("{}.{:09}", d.secs(), d.subsec_nanos()))
        .unwrap_or_default()
}

impl Delivery {
    async fn poll_group(&mut self, group: &str, seen: &mut BTreeSet<Key>) {
        let mut listed = Vec::new();
        let mut next_token = None;
        loop {
            let page = self
                .scheduler
                .list_schedules()
                .group_name(group)
                .state(ScheduleState::Enabled)
                .max_results(100)
                .set_next_token(next_token.take())
                .send()
                .await;
            match page {
                Ok(out) => {
                    listed.extend(out.schedules().iter().filter_map(|s| {
                        let name = s.name()?.to_owned();
                        let arn = s.arn().unwrap_or(&name).to_owned();
                        let key = (
                            arn,
                            date_key(s.creation_date()),
                            date_key(s.last_modification_date()),
                        );
                        Some((name, key))
                    }));
                    match out.next_token() {
                        Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                        _ => break,
                    }
                }
                Err(e) => {
                    tracing::warn!(group, error = %error_chain(&e), "ListSchedules failed");
                    // Keep what we know about this group's schedules for the next round.
                    seen.extend(
                        self.tracked
                            .keys()
                            .filter(|(arn, _, _)| arn.contains(&format!("/{group}/")))
                            .cloned(),
                    );
                    return;
                }
            }
        }
        for (name, key) in listed {
            seen.insert(key.clone());
            self.consider(group, &name, key).await;
        }
    }

    /// The schedule's details, fetched with GetSchedule the first time this version
    /// of it is seen (so a tick costs one ListSchedules page per 100 schedules).
    async fn details(&mut self, group: &str, name: &str, key: &Key) -> Option<Details> {
        if let Some(details) = self.tracked.get(key).and_then(|t| t.details.clone()) {
            return Some(details);
        }
        let schedule = match self
            .scheduler
            .get_schedule()
            .group_name(group)
            .name(name)
            .send()
            .await
        {
            Ok(schedule) => schedule,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                return None;
            }
            Err(e) => {
                tracing::warn!(group, name, error = %error_chain(&e), "GetSchedule failed");
                return None;
            }
        };
        let target = schedule.target();
        let policy = target.and_then(|t| t.retry_policy());
        let created = schedule
            .creation_date()
            .and_then(|date| DateTime::from_timestamp(date.secs(), date.subsec_nanos()))
            .unwrap_or_else(Utc::now);
        let draw: f64 = self.firing.random();
        let details = Details {
            due: due_time(
                schedule.schedule_expression().unwrap_or_default(),
                schedule.schedule_expression_timezone(),
            )
            .map(|due| firing_instant(due, created, draw)),
            enabled: schedule.state() != Some(&ScheduleState::Disabled),
            target_arn: target.map(|t| t.arn().to_owned()).unwrap_or_default(),
            // A Lambda target without Input receives an empty JSON object.
            input: target.and_then(|t| t.input()).unwrap_or("{}").to_owned(),
            max_retry_attempts: policy
                .and_then(|p| p.maximum_retry_attempts())
                .map(|n| n.max(0) as u32)
                .unwrap_or(DEFAULT_MAX_RETRY_ATTEMPTS),
            max_event_age: policy
                .and_then(|p| p.maximum_event_age_in_seconds())
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or(DEFAULT_MAX_EVENT_AGE),
            dead_letter_arn: target
                .and_then(|t| t.dead_letter_config())
                .and_then(|d| d.arn())
                .map(str::to_owned),
            delete_after: schedule.action_after_completion()
                == Some(&ActionAfterCompletion::Delete),
        };
        self.tracked.entry(key.clone()).or_default().details = Some(details.clone());
        Some(details)
    }

    async fn consider(&mut self, group: &str, name: &str, key: Key) {
        let arn = key.0.clone();
        if self.tracked.get(&key).is_some_and(|t| t.completed) {
            return;
        }
        let Some(details) = self.details(group, name, &key).await else {
            return;
        };
        let tracked = self.tracked.entry(key.clone()).or_default();
        if !details.enabled {
            return;
        }
        let due = match &details.due {
            Ok(due) => *due,
            Err(e) => {
                if !tracked.reported_invalid {
                    tracked.reported_invalid = true;
                    tracing::warn!(schedule = %arn, error = %e, "schedule is not delivered locally");
                }
                return;
            }
        };
        let now = Utc::now();
        if now < due {
            return;
        }
        if tracked.next_attempt.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let delivered = match serde_json::from_str::<Value>(&details.input) {
            Err(e) => Err(format!("Input is not JSON: {e}")),
            Ok(event) => match self.lambda.model().function_by_arn(&details.target_arn) {
                None => Err(format!(
                    "ResourceNotFoundException: no function {}",
                    details.target_arn
                )),
                Some(function) => {
                    let id = function.logical_id.clone();
                    self.lambda
                        .invoke_async(&id, event)
                        .map(|()| id)
                        .map_err(|e| error_chain(&e))
                }
            },
        };
        let tracked = self.tracked.get_mut(&key).expect("inserted above");
        match delivered {
            Ok(function) => {
                tracing::info!(schedule = %arn, function, late_ms = (now - due).num_milliseconds(), "schedule delivered");
                tracked.completed = true;
            }
            Err(reason) => {
                tracked.failed_deliveries += 1;
                let age = (now - due).to_std().unwrap_or_default();
                let retries_used = tracked.failed_deliveries - 1;
                let condition = if retries_used >= details.max_retry_attempts {
                    Some("MaximumRetryAttemptsExceeded")
                } else if age >= details.max_event_age {
                    Some("MaximumEventAgeExceeded")
                } else {
                    None
                };
                let Some(condition) = condition else {
                    let exponent = retries_used.min(16);
                    let delay = self
                        .settings
                        .retry_base
                        .saturating_mul(1 << exponent)
                        .min(self.settings.retry_cap);
                    tracked.next_attempt = Some(Instant::now() + delay);
                    tracing::warn!(schedule = %arn, reason, attempt = tracked.failed_deliveries, ?delay, "delivery failed; will retry");
                    return;
                };
                tracked.completed = true;
                let attempts = tracked.failed_deliveries;
                tracing::error!(schedule = %arn, reason, condition, "delivery abandoned");
                if let Some(dlq) = &details.dead_letter_arn {
                    self.dead_letter(
                        dlq,
                        &details.input,
                        &arn,
                        &details.target_arn,
                        &reason,
                        condition,
                        attempts,
                    )
                    .await;
                }
            }
        }
        if details.delete_after {
            match self
                .scheduler
                .delete_schedule()
                .group_name(group)
                .name(name)
                .send()
                .await
            {
                Ok(_) => {}
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) => {}
                Err(e) => {
                    tracing::warn!(schedule = %arn, error = %error_chain(&e), "DeleteSchedule after completion failed")
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn dead_letter(
        &self,
        queue_arn: &str,
        input: &str,
        schedule_arn: &str,
        target_arn: &str,
        reason: &str,
        condition: &str,
        attempts: u32,
    ) {
        let Some(queue) = self.lambda.model().queue_by_arn(queue_arn) else {
            tracing::error!(queue_arn, "DeadLetterConfig is not a queue of this stack");
            return;
        };
        let attribute = |value: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .ok()
        };
        let mut request = self
            .sqs
            .send_message()
            .queue_url(&queue.url)
            .message_body(input);
        for (name, value) in [
            ("ERROR_MESSAGE", reason.to_owned()),
            ("EXHAUSTED_RETRY_CONDITION", condition.to_owned()),
            ("RETRY_ATTEMPTS", attempts.to_string()),
            ("SCHEDULE_ARN", schedule_arn.to_owned()),
            ("TARGET_ARN", target_arn.to_owned()),
        ] {
            if let Some(value) = attribute(&value) {
                request = request.message_attributes(name, value);
            }
        }
        if queue.fifo {
            let id = ulid::Ulid::new().to_string();
            request = request.message_group_id(&id).message_deduplication_id(&id);
        }
        if let Err(e) = request.send().await {
            tracing::error!(error = %error_chain(&e), "could not send to the schedule's dead-letter queue");
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn a_schedule_fires_within_its_minute_never_before_its_creation() {
        let due = Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 30).unwrap();
        let minute = Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 0).unwrap();
        let earlier = minute - TimeDelta::minutes(5);
        assert_eq!(firing_instant(due, earlier, 0.0), minute);
        assert_eq!(
            firing_instant(due, earlier, 0.999_999_9),
            minute + TimeDelta::milliseconds(59_999)
        );
        assert_eq!(
            firing_instant(due, earlier, 0.5),
            minute + TimeDelta::seconds(30)
        );
        // Created within the minute: from the creation to the minute's end.
        let created = minute + TimeDelta::seconds(40);
        assert_eq!(firing_instant(due, created, 0.0), created);
        assert_eq!(
            firing_instant(due, created, 0.5),
            created + TimeDelta::seconds(10)
        );
        // Created after the minute: at once.
        let late = minute + TimeDelta::seconds(75);
        assert_eq!(firing_instant(due, late, 0.7), late);
    }

    #[test]
    fn seeded_draws_cover_the_whole_minute() {
        let due = Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 0).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let seconds: BTreeSet<i64> = (0..2_000)
            .map(|_| {
                let fired = firing_instant(due, due - TimeDelta::hours(1), rng.random());
                assert!(
                    fired >= due && fired < due + TimeDelta::minutes(1),
                    "{fired}"
                );
                (fired - due).num_seconds()
            })
            .collect();
        assert_eq!(
            seconds,
            (0..60).collect(),
            "every second of the minute is drawn"
        );
    }

    #[test]
    fn an_at_expression_in_utc_is_due_at_that_second() {
        let due = due_time("at(2030-01-02T03:04:05)", Some("UTC")).expect("parses");
        assert_eq!(due.to_rfc3339(), "2030-01-02T03:04:05+00:00");
        assert_eq!(due_time("at(2030-01-02T03:04:05)", None), Ok(due));
    }

    #[test]
    fn rate_cron_malformed_and_other_zones_are_refused() {
        assert!(matches!(
            due_time("rate(5 minutes)", None),
            Err(ExpressionError::NotOneTime(_))
        ));
        assert!(matches!(
            due_time("at(2030-01-02 03:04)", None),
            Err(ExpressionError::Malformed(_))
        ));
        assert!(matches!(
            due_time("at(2030-01-02T03:04:05)", Some("Europe/Paris")),
            Err(ExpressionError::UnsupportedTimezone(_))
        ));
    }
}
