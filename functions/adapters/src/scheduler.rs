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

    /// Scheduler fires with 60-second precision: a schedule `at(01:00:30)` runs at
    /// some point between 01:00:00 and 01:00:59, possibly before the order has expired,
    /// which the release would refuse (a failed invocation, a retry a minute later, an
    /// alarm). Rounding the expiry up to the next whole minute makes every firing land
    /// after it, at most 119 s late; a buyer paying after the deadline is refused
    /// whatever the timer's lag, and pay releases the unit itself then.
    pub fn at_expression(expires_at: DateTime<Utc>) -> String {
        let fires_from = expires_at
            .duration_round_up(TimeDelta::minutes(1))
            .unwrap_or(expires_at);
        format!("at({})", fires_from.format("%Y-%m-%dT%H:%M:%S"))
    }
}

#[async_trait]
impl ReleaseScheduler for EventBridgeScheduler {
    async fn schedule_release(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let target = self
            .target
            .as_ref()
            .ok_or_else(|| StoreError::permanent(SCHEDULE, NoReleaseTarget))?;
        let input = crate::correlation::reservation_json(reservation)
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
            .schedule_expression(Self::at_expression(reservation.expires_at))
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

    #[test]
    fn the_at_expression_is_the_first_whole_utc_minute_not_before_the_expiry() {
        let minute = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 0).unwrap();
        assert_eq!(
            EventBridgeScheduler::at_expression(minute),
            "at(2026-03-04T05:06:00)"
        );
        for later in [
            Duration::milliseconds(1),
            Duration::seconds(7),
            Duration::milliseconds(59_999),
        ] {
            assert_eq!(
                EventBridgeScheduler::at_expression(minute + later),
                "at(2026-03-04T05:07:00)",
                "{later}"
            );
        }
        let year_end = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 30).unwrap();
        assert_eq!(
            EventBridgeScheduler::at_expression(year_end),
            "at(2027-01-01T00:00:00)"
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
