//! [`EventBridgeScheduler`]: one-time schedules that release unpaid orders.

use async_trait::async_trait;
use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::operation::create_schedule::CreateScheduleError;
use aws_sdk_scheduler::operation::delete_schedule::DeleteScheduleError;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode,
    RetryPolicy, Target,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use flashsale_domain::ports::ReleaseScheduler;
use flashsale_domain::{OrderId, Reservation, StoreError};

use crate::classify::store_error;

const SCHEDULE: &str = "scheduler.schedule_release";
const CANCEL: &str = "scheduler.cancel_release";

/// How long after an order's deadline its timer may fire at the latest. The rest of the
/// 5 s promise (a lapsed unit back on sale within 5 s of its deadline) is left for the
/// asynchronous invocation to start the release and for its transaction.
pub const FIRING_SLACK: TimeDelta = TimeDelta::seconds(3);

/// How long before an order's deadline its timer may fire at the most: the whole
/// firing minute, when it begins `60 s - FIRING_SLACK` before the deadline. The release
/// function must be able to wait that long within its Lambda timeout.
pub const MAX_EARLY_FIRING: TimeDelta = TimeDelta::seconds(2 * 60 - 3);

/// Scheduler's own ceilings: a release that keeps failing is retried for a day.
const MAX_RETRY_ATTEMPTS: i32 = 185;
const MAX_EVENT_AGE_SECS: i32 = 86_400;

/// What a release schedule invokes, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseTarget {
    pub function_arn: String,
    pub role_arn: String,
    /// The SQS queue Scheduler parks a release in when every retry failed, instead of
    /// dropping it (and the unit it would return).
    pub dead_letter_arn: Option<String>,
}

/// This scheduler was built without a [`ReleaseTarget`], so it can only delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no release target is configured, so no schedule can be created")]
pub struct NoReleaseTarget;

/// Implements [`ReleaseScheduler`] with one-time EventBridge Scheduler schedules.
///
/// Each order's schedule is named after it, so creating it twice finds the first
/// (`ConflictException`, treated as success) instead of making a second timer. The
/// schedule deletes itself after it fires.
#[derive(Debug, Clone)]
pub struct EventBridgeScheduler {
    client: Client,
    group_name: String,
    target: Option<ReleaseTarget>,
}

impl EventBridgeScheduler {
    /// `target` may be `None` for a function that only cancels timers (the API's pay and
    /// cancel); `schedule_release` then fails with a `Permanent` [`NoReleaseTarget`].
    pub fn new(
        client: Client,
        group_name: impl Into<String>,
        target: Option<ReleaseTarget>,
    ) -> Self {
        Self {
            client,
            group_name: group_name.into(),
            target,
        }
    }

    /// `release-{ulid}`: 34 characters, inside Scheduler's 64, unique per order.
    pub fn schedule_name(order_id: &OrderId) -> String {
        format!("release-{}", order_id.unique_part())
    }

    /// The `at()` of an order's timer, created at `now`, so that the release is on time
    /// whatever second of its minute Scheduler picks.
    ///
    /// Scheduler fires a one-time schedule anywhere in the minute of its `at()` ("if you
    /// set your schedule to run at 1:00, it will invoke the target API between 1:00:00
    /// and 1:00:59"), and the release function waits out what is left of the payment
    /// window when it is invoked early (at most [`MAX_EARLY_FIRING`]). So the minute is
    /// the latest one whose whole firing window ends by `expires_at +`
    /// [`FIRING_SLACK`]: fired at its first second, the release waits for the
    /// deadline; fired at its last, it runs at most `FIRING_SLACK` after it.
    ///
    /// It is never a time in the past when the timer is created: what Scheduler does
    /// with a past `at()` is not documented. When the ideal minute has already begun
    /// (payment windows shorter than about two minutes, or a consumer that opens the
    /// order late), `at()` is the next whole second after `now` instead: a valid, future
    /// time whose firing window (at most a minute) is the earliest one can ask for. Such
    /// a release can come up to about `60 s - window` late, 45 s for a 15 s window,
    /// since a minute-precision timer cannot do better with one schedule. A buyer paying
    /// after the deadline is refused whatever the timer's lag, and pay gives the unit
    /// back itself then.
    pub fn at_expression(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> String {
        let minute = TimeDelta::minutes(1);
        let ideal = (expires_at + FIRING_SLACK - minute)
            .duration_trunc(minute)
            .unwrap_or(expires_at);
        let earliest = (now + TimeDelta::seconds(1))
            .duration_trunc(TimeDelta::seconds(1))
            .unwrap_or(now);
        format!("at({})", ideal.max(earliest).format("%Y-%m-%dT%H:%M:%S"))
    }
}

#[async_trait]
impl ReleaseScheduler for EventBridgeScheduler {
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let target = self
            .target
            .as_ref()
            .ok_or_else(|| StoreError::permanent(SCHEDULE, NoReleaseTarget))?;
        let input = crate::correlation::message_json(reservation)
            .map_err(|error| StoreError::permanent(SCHEDULE, error))?;
        let target = Target::builder()
            .arn(&target.function_arn)
            .role_arn(&target.role_arn)
            .input(input)
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_retry_attempts(MAX_RETRY_ATTEMPTS)
                    .maximum_event_age_in_seconds(MAX_EVENT_AGE_SECS)
                    .build(),
            )
            .set_dead_letter_config(
                target
                    .dead_letter_arn
                    .as_ref()
                    .map(|arn| DeadLetterConfig::builder().arn(arn).build()),
            )
            .build()
            .map_err(|error| StoreError::permanent(SCHEDULE, error))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|error| StoreError::permanent(SCHEDULE, error))?;
        let result = self
            .client
            .create_schedule()
            .name(Self::schedule_name(&reservation.order_id))
            .group_name(&self.group_name)
            .schedule_expression(Self::at_expression(reservation.expires_at, Utc::now()))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window)
            .target(target)
            .action_after_completion(ActionAfterCompletion::Delete)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Named after the order: it exists, so this order's timer is already set.
            Err(error)
                if matches!(
                    error.as_service_error(),
                    Some(CreateScheduleError::ConflictException(_))
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(store_error(SCHEDULE, error)),
        }
    }

    async fn cancel_release(&self, order_id: &OrderId) -> Result<(), StoreError> {
        let result = self
            .client
            .delete_schedule()
            .name(Self::schedule_name(order_id))
            .group_name(&self.group_name)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Already fired (and deleted itself), already cancelled, or never created.
            Err(error)
                if matches!(
                    error.as_service_error(),
                    Some(DeleteScheduleError::ResourceNotFoundException(_))
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(store_error(CANCEL, error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone};

    use super::*;

    fn minute_of(expression: &str) -> DateTime<Utc> {
        let inner = &expression["at(".len()..expression.len() - 1];
        chrono::NaiveDateTime::parse_from_str(inner, "%Y-%m-%dT%H:%M:%S")
            .expect("at(yyyy-mm-ddThh:mm:ss)")
            .and_utc()
    }

    /// The earliest and the latest instant Scheduler may fire a timer created at
    /// `created` for `deadline`: the minute of its `at()` (60 s precision), never before
    /// the creation.
    fn firings(deadline: DateTime<Utc>, created: DateTime<Utc>) -> [DateTime<Utc>; 2] {
        let at = minute_of(&EventBridgeScheduler::at_expression(deadline, created));
        assert!(at > created, "an at() in the past: {at} for {created}");
        let minute = at.duration_trunc(Duration::minutes(1)).unwrap();
        [
            minute.max(created),
            minute + Duration::minutes(1) - Duration::milliseconds(1),
        ]
    }

    #[test]
    fn the_at_expression_is_the_latest_minute_whose_firings_all_end_by_the_slack() {
        let created = Utc.with_ymd_and_hms(2026, 3, 4, 5, 0, 0).unwrap();
        // Deadline 05:15:57: the minute 05:15 fires by 05:15:59.999, 3 s late at most.
        let deadline = Utc.with_ymd_and_hms(2026, 3, 4, 5, 15, 57).unwrap();
        assert_eq!(
            EventBridgeScheduler::at_expression(deadline, created),
            "at(2026-03-04T05:15:00)"
        );
        // A millisecond earlier, 05:15 could fire 3.001 s late: 05:14.
        assert_eq!(
            EventBridgeScheduler::at_expression(deadline - Duration::milliseconds(1), created),
            "at(2026-03-04T05:14:00)"
        );
        let new_year = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 30).unwrap();
        assert_eq!(
            EventBridgeScheduler::at_expression(new_year, created),
            "at(2026-12-31T23:59:00)"
        );
    }

    #[test]
    fn every_firing_of_a_window_of_a_minute_or_more_is_within_the_slack_and_the_wait() {
        let start = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 0).unwrap();
        // Creation at every 0.7 s of a minute, windows from 57 s to 16 min.
        for created_ms in (0..60_000).step_by(700) {
            let created = start + Duration::milliseconds(created_ms);
            for window_ms in (57_000..960_000).step_by(1_300) {
                let deadline = created + Duration::milliseconds(window_ms);
                // An ideal minute that has begun is named from the next whole second
                // on, which rolls into the next minute when the timer is created in the
                // last two seconds of it: up to 2 s more, still within the 5 s goal.
                for fired in firings(deadline, created) {
                    assert!(
                        fired <= deadline + FIRING_SLACK + Duration::seconds(2),
                        "created {created}, deadline {deadline}: fired {fired}"
                    );
                    assert!(
                        deadline - fired < MAX_EARLY_FIRING,
                        "created {created}, deadline {deadline}: fired {fired}, too early"
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_window_fires_after_its_creation_and_at_most_a_minute_late() {
        let start = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 0).unwrap();
        for created_ms in (0..60_000).step_by(500) {
            let created = start + Duration::milliseconds(created_ms);
            let at = minute_of(&EventBridgeScheduler::at_expression(created, created));
            assert!(at > created, "never a time in the past");
            assert!(
                at <= created + Duration::seconds(2),
                "the next whole second"
            );
            for window_secs in [0, 1, 2, 15, 30, 56] {
                let deadline = created + Duration::seconds(window_secs);
                // The at() is at most 2 s after the creation, and fires within a minute.
                let bound = Duration::seconds((62 - window_secs).max(3));
                for fired in firings(deadline, created) {
                    assert!(fired - deadline <= bound, "{window_secs} s: fired {fired}");
                    assert!(deadline - fired < MAX_EARLY_FIRING);
                }
            }
        }
        // A consumer that sets the timer after its deadline sets it for now.
        let late = start + Duration::seconds(90);
        assert_eq!(
            EventBridgeScheduler::at_expression(start, late),
            "at(2026-03-04T05:07:31)"
        );
    }

    #[test]
    fn the_longest_early_firing_leaves_the_slack_of_two_minutes() {
        assert_eq!(
            MAX_EARLY_FIRING + FIRING_SLACK,
            Duration::minutes(2),
            "a firing minute starts at most 2 min - slack before the deadline"
        );
    }

    #[test]
    fn schedule_names_fit_schedulers_limit() {
        let sale = flashsale_domain::SaleId::parse("s".repeat(64)).expect("valid");
        let name = EventBridgeScheduler::schedule_name(&OrderId::new(sale));
        assert!(name.len() <= 64, "{name}");
        assert!(name.starts_with("release-"));
    }
}
