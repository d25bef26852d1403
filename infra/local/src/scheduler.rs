//! EventBridge Scheduler delivery. moto stores schedules but never fires them; this
//! loop does what the service does for one-time `at(...)` schedules.
//!
//! AWS semantics emulated:
//! - a schedule fires no earlier than its `at` time (in `ScheduleExpressionTimezone`);
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
use chrono::{DateTime, NaiveDateTime, Utc};
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

/// Timing of the delivery loop.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    /// How often schedules are listed (at least once a second).
    pub poll_interval: Duration,
    /// First delivery retry delay; doubled per attempt up to `retry_cap`.
    pub retry_base: Duration,
    pub retry_cap: Duration,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(500),
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(60),
        }
    }
}

/// Scheduler's defaults when a target has no RetryPolicy.
const DEFAULT_MAX_RETRY_ATTEMPTS: u32 = 185;
const DEFAULT_MAX_EVENT_AGE: Duration = Duration::from_secs(86_400);

#[derive(Debug, Default)]
struct Tracked {
    failed_deliveries: u32,
    next_attempt: Option<Instant>,
    completed: bool,
    reported_invalid: bool,
}

/// A schedule instance: the same name re-created later is a new schedule.
type Key = (String, String);

struct Delivery {
    lambda: LambdaService,
    scheduler: aws_sdk_scheduler::Client,
    sqs: aws_sdk_sqs::Client,
    settings: SchedulerSettings,
    tracked: HashMap<Key, Tracked>,
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
    let mut delivery = Delivery {
        lambda,
        scheduler,
        sqs,
        settings,
        tracked: HashMap::new(),
    };
    tracing::info!(?groups, "scheduler delivery started");
    loop {
        let mut seen = BTreeSet::new();
        for group in &groups {
            delivery.poll_group(group, &mut seen).await;
        }
        // Forget schedules that are gone, so a re-created name starts afresh.
        delivery.tracked.retain(|key, _| seen.contains(key));
        tokio::select! {
            _ = tokio::time::sleep(delivery.settings.poll_interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    tracing::info!("scheduler delivery stopped");
}

impl Delivery {
    async fn poll_group(&mut self, group: &str, seen: &mut BTreeSet<Key>) {
        let mut names = Vec::new();
        let mut next_token = None;
        loop {
            let page = self
                .scheduler
                .list_schedules()
                .group_name(group)
                .state(ScheduleState::Enabled)
                .set_next_token(next_token.take())
                .send()
                .await;
            match page {
                Ok(out) => {
                    names.extend(
                        out.schedules()
                            .iter()
                            .filter_map(|s| s.name().map(str::to_owned)),
                    );
                    match out.next_token() {
                        Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                        _ => break,
                    }
                }
                Err(e) => {
                    tracing::warn!(group, error = %error_chain(&e), "ListSchedules failed");
                    return;
                }
            }
        }
        for name in names {
            self.consider(group, &name, seen).await;
        }
    }

    async fn consider(&mut self, group: &str, name: &str, seen: &mut BTreeSet<Key>) {
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
                return;
            }
            Err(e) => {
                tracing::warn!(group, name, error = %error_chain(&e), "GetSchedule failed");
                return;
            }
        };
        let arn = schedule.arn().unwrap_or(name).to_owned();
        let created = schedule
            .creation_date()
            .map(|d| d.to_string())
            .unwrap_or_default();
        let key = (arn.clone(), created);
        seen.insert(key.clone());
        let tracked = self.tracked.entry(key.clone()).or_default();
        if tracked.completed || schedule.state() == Some(&ScheduleState::Disabled) {
            return;
        }
        let expression = schedule.schedule_expression().unwrap_or_default();
        let due = match due_time(expression, schedule.schedule_expression_timezone()) {
            Ok(due) => due,
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
        let Some(target) = schedule.target() else {
            return;
        };
        let delete_after =
            schedule.action_after_completion() == Some(&ActionAfterCompletion::Delete);
        let input = target.input().unwrap_or("{}");
        let delivered = match serde_json::from_str::<Value>(input) {
            Err(e) => Err(format!("Input is not JSON: {e}")),
            Ok(event) => match self.lambda.model().function_by_arn(target.arn()) {
                None => Err(format!(
                    "ResourceNotFoundException: no function {}",
                    target.arn()
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
                let policy = target.retry_policy();
                let max_attempts = policy
                    .and_then(|p| p.maximum_retry_attempts())
                    .map(|n| n.max(0) as u32)
                    .unwrap_or(DEFAULT_MAX_RETRY_ATTEMPTS);
                let max_age = policy
                    .and_then(|p| p.maximum_event_age_in_seconds())
                    .map(|s| Duration::from_secs(s.max(0) as u64))
                    .unwrap_or(DEFAULT_MAX_EVENT_AGE);
                let age = (now - due).to_std().unwrap_or_default();
                let retries_used = tracked.failed_deliveries - 1;
                let condition = if retries_used >= max_attempts {
                    Some("MaximumRetryAttemptsExceeded")
                } else if age >= max_age {
                    Some("MaximumEventAgeExceeded")
                } else {
                    None
                };
                match condition {
                    None => {
                        let exponent = retries_used.min(16);
                        let delay = self
                            .settings
                            .retry_base
                            .saturating_mul(1 << exponent)
                            .min(self.settings.retry_cap);
                        tracked.next_attempt = Some(Instant::now() + delay);
                        tracing::warn!(schedule = %arn, reason, attempt = tracked.failed_deliveries, ?delay, "delivery failed; will retry");
                        return;
                    }
                    Some(condition) => {
                        tracked.completed = true;
                        let attempts = tracked.failed_deliveries;
                        tracing::error!(schedule = %arn, reason, condition, "delivery abandoned");
                        if let Some(dlq) = target.dead_letter_config().and_then(|d| d.arn()) {
                            self.dead_letter(
                                dlq,
                                input,
                                &arn,
                                target.arn(),
                                &reason,
                                condition,
                                attempts,
                            )
                            .await;
                        }
                    }
                }
            }
        }
        if delete_after {
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
    use super::*;

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
