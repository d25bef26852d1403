//! `EventBridgeScheduler` against moto's EventBridge Scheduler.

mod support;

use std::error::Error as _;

use aws_sdk_scheduler::operation::get_schedule::GetScheduleError;
use aws_sdk_scheduler::types::{ActionAfterCompletion, FlexibleTimeWindowMode};
use flashsale_adapters::{
    EventBridgeScheduler, FIRING_SLACK, MAX_EARLY_FIRING, NoReleaseTarget, ReleaseTarget,
};
use flashsale_domain::ports::ReleaseScheduler;
use flashsale_domain::{Reservation, StoreError};

const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:release";
const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/scheduler";
const DLQ_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:release-schedules-dlq";

async fn client() -> aws_sdk_scheduler::Client {
    aws_sdk_scheduler::Client::new(&support::sdk_config().await)
}

/// A fresh schedule group, as the stack's `ReleaseScheduleGroup`.
async fn group(client: &aws_sdk_scheduler::Client) -> String {
    let name = format!("releases-{}", flashsale_emulators::unique_suffix());
    client
        .create_schedule_group()
        .name(&name)
        .send()
        .await
        .expect("create the group");
    name
}

fn scheduler(client: &aws_sdk_scheduler::Client, group: &str) -> EventBridgeScheduler {
    EventBridgeScheduler::new(
        client.clone(),
        group,
        Some(ReleaseTarget {
            function_arn: FUNCTION_ARN.to_owned(),
            role_arn: ROLE_ARN.to_owned(),
            dead_letter_arn: Some(DLQ_ARN.to_owned()),
        }),
    )
}

fn a_reservation() -> Reservation {
    let sale = support::sale(5, 1, 1);
    support::reservation(&sale, &support::user("alice"), 0)
}

async fn schedule_count(client: &aws_sdk_scheduler::Client, group: &str) -> usize {
    client
        .list_schedules()
        .group_name(group)
        .send()
        .await
        .expect("list")
        .schedules
        .len()
}

#[tokio::test]
async fn scheduling_twice_makes_one_self_deleting_one_time_schedule() {
    let client = client().await;
    let group = group(&client).await;
    let scheduler = scheduler(&client, &group);
    let reservation = a_reservation();
    let before = chrono::Utc::now();

    scheduler
        .schedule_release(&reservation)
        .await
        .expect("schedule");
    scheduler
        .schedule_release(&reservation)
        .await
        .expect("scheduling again is success");
    assert_eq!(schedule_count(&client, &group).await, 1);

    let name = EventBridgeScheduler::schedule_name(&reservation.order_id);
    let schedule = client
        .get_schedule()
        .group_name(&group)
        .name(&name)
        .send()
        .await
        .expect("the schedule exists");
    let expression = schedule.schedule_expression().expect("an expression");
    let after = chrono::Utc::now();
    assert!(
        [before, after]
            .map(|now| EventBridgeScheduler::at_expression(reservation.expires_at, now))
            .contains(&expression.to_owned()),
        "{expression}"
    );
    // Scheduler fires anywhere in the minute its at() names: that minute ends by the
    // deadline plus the slack, and starts no more than the release can wait before it.
    let minute = chrono::NaiveDateTime::parse_from_str(expression, "at(%Y-%m-%dT%H:%M:%S)")
        .expect("an at() expression")
        .and_utc();
    assert_eq!(minute.timestamp() % 60, 0, "{expression}");
    assert!(
        minute + chrono::Duration::minutes(1) <= reservation.expires_at + FIRING_SLACK,
        "{expression}"
    );
    assert!(
        reservation.expires_at - minute <= MAX_EARLY_FIRING,
        "{expression}"
    );
    assert_eq!(schedule.schedule_expression_timezone(), Some("UTC"));
    assert_eq!(
        schedule.action_after_completion(),
        Some(&ActionAfterCompletion::Delete)
    );
    assert_eq!(
        schedule.flexible_time_window().map(|window| window.mode()),
        Some(&FlexibleTimeWindowMode::Off)
    );
    let target = schedule.target().expect("a target");
    assert_eq!(target.arn(), FUNCTION_ARN);
    assert_eq!(target.role_arn(), ROLE_ARN);
    let input: Reservation = serde_json::from_str(target.input().expect("an input"))
        .expect("the input is a reservation");
    assert_eq!(input, reservation);
    let retry = target.retry_policy().expect("a retry policy");
    assert_eq!(retry.maximum_retry_attempts(), Some(185));
    assert_eq!(retry.maximum_event_age_in_seconds(), Some(86_400));
    assert_eq!(
        target.dead_letter_config().and_then(|dlq| dlq.arn()),
        Some(DLQ_ARN),
        "a release Scheduler cannot deliver is parked, not dropped"
    );
}

#[tokio::test]
async fn cancelling_removes_the_schedule_and_a_missing_one_is_success() {
    let client = client().await;
    let group = group(&client).await;
    let scheduler = scheduler(&client, &group);
    let reservation = a_reservation();
    scheduler
        .schedule_release(&reservation)
        .await
        .expect("schedule");

    scheduler
        .cancel_release(&reservation.order_id)
        .await
        .expect("cancel");
    let gone = client
        .get_schedule()
        .group_name(&group)
        .name(EventBridgeScheduler::schedule_name(&reservation.order_id))
        .send()
        .await
        .expect_err("deleted");
    assert!(
        matches!(
            gone.as_service_error(),
            Some(GetScheduleError::ResourceNotFoundException(_))
        ),
        "{gone:?}"
    );
    scheduler
        .cancel_release(&reservation.order_id)
        .await
        .expect("cancelling again is success");
    scheduler
        .cancel_release(&a_reservation().order_id)
        .await
        .expect("cancelling a timer never set is success");
    assert_eq!(schedule_count(&client, &group).await, 0);
}

#[tokio::test]
async fn a_scheduler_without_a_target_only_deletes() {
    let client = client().await;
    let group = group(&client).await;
    let delete_only = EventBridgeScheduler::new(client.clone(), &group, None);
    let reservation = a_reservation();

    let error = delete_only
        .schedule_release(&reservation)
        .await
        .expect_err("no target");
    assert!(matches!(error, StoreError::Permanent { .. }), "{error:?}");
    assert!(
        error
            .source()
            .is_some_and(|source| source.is::<NoReleaseTarget>()),
        "{error:?}"
    );
    assert_eq!(schedule_count(&client, &group).await, 0);

    scheduler(&client, &group)
        .schedule_release(&reservation)
        .await
        .expect("schedule");
    delete_only
        .cancel_release(&reservation.order_id)
        .await
        .expect("it can still delete");
    assert_eq!(schedule_count(&client, &group).await, 0);
}

#[tokio::test]
async fn an_unreachable_scheduler_is_a_transient_error() {
    let config = aws_sdk_scheduler::config::Builder::from(&support::sdk_config().await)
        .endpoint_url(support::closed_endpoint())
        .build();
    let unreachable = scheduler(&aws_sdk_scheduler::Client::from_conf(config), "any");
    let error = unreachable
        .schedule_release(&a_reservation())
        .await
        .expect_err("nobody listens");
    assert!(error.is_retryable(), "{error:?}");
    let error = unreachable
        .cancel_release(&a_reservation().order_id)
        .await
        .expect_err("nobody listens");
    assert!(error.is_retryable(), "{error:?}");
}
