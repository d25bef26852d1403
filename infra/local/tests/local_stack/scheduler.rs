use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_scheduler::types::{
    ActionAfterCompletion, FlexibleTimeWindow, FlexibleTimeWindowMode, RetryPolicy, Target,
};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use flashsale_local::lambda::AsyncRetryTiming;
use flashsale_local::{LocalStack, function_fn};
use serde_json::{Value, json};

use crate::{Recorder, eventually, options, start};

/// The minute that has just begun: a schedule for it fires in what is left of it.
fn this_minute() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(TimeDelta::minutes(1))
        .expect("a representable minute")
}

/// A minute that ended before the schedule is created: it fires at once.
fn a_minute_ago() -> DateTime<Utc> {
    this_minute() - TimeDelta::minutes(2)
}

async fn create_schedule(
    stack: &LocalStack,
    name: &str,
    due: DateTime<Utc>,
    target_arn: &str,
    input: &Value,
) {
    let scheduler = aws_sdk_scheduler::Client::new(&stack.sdk_config);
    scheduler
        .create_schedule()
        .name(name)
        .group_name(
            stack
                .schedule_group_name("ReleaseScheduleGroup")
                .expect("group"),
        )
        .schedule_expression(format!("at({})", due.format("%Y-%m-%dT%H:%M:%S")))
        .schedule_expression_timezone("UTC")
        .flexible_time_window(
            FlexibleTimeWindow::builder()
                .mode(FlexibleTimeWindowMode::Off)
                .build()
                .expect("window"),
        )
        .target(
            Target::builder()
                .arn(target_arn)
                .role_arn("arn:aws:iam::123456789012:role/local-scheduler")
                .input(input.to_string())
                .retry_policy(
                    RetryPolicy::builder()
                        .maximum_retry_attempts(185)
                        .maximum_event_age_in_seconds(86_400)
                        .build(),
                )
                .build()
                .expect("target"),
        )
        .action_after_completion(ActionAfterCompletion::Delete)
        .send()
        .await
        .expect("CreateSchedule");
}

async fn schedule_exists(stack: &LocalStack, name: &str) -> bool {
    let scheduler = aws_sdk_scheduler::Client::new(&stack.sdk_config);
    match scheduler
        .get_schedule()
        .group_name(
            stack
                .schedule_group_name("ReleaseScheduleGroup")
                .expect("group"),
        )
        .name(name)
        .send()
        .await
    {
        Ok(_) => true,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            false
        }
        Err(e) => panic!("GetSchedule failed: {e:?}"),
    }
}

fn release_arn(stack: &LocalStack) -> String {
    stack
        .model
        .function("ReleaseFunction")
        .expect("release function")
        .arn
        .clone()
}

fn recording_target(recorder: Recorder) -> Arc<dyn flashsale_local::LambdaFunction> {
    function_fn(move |event: Value| {
        let recorder = recorder.clone();
        async move {
            recorder.record(&event);
            Ok(json!({"released": true}))
        }
    })
}

#[tokio::test]
async fn a_schedule_fires_once_within_its_minute_with_its_input_then_is_deleted() {
    let recorder = Recorder::default();
    let mut options =
        options("sched-once").function("ReleaseFunction", recording_target(recorder.clone()));
    // Seeded, so a failure can be replayed; which second is drawn does not matter.
    options.scheduler.seed = Some(20_261_130);
    let stack = start(options).await;
    let created = Utc::now();
    let minute = this_minute();
    let input = json!({"order_id": "o-1", "sale_id": "s-1"});
    create_schedule(&stack, "release-o-1", minute, &release_arn(&stack), &input).await;

    // Within the rest of the minute, as AWS may; generous for a loaded machine.
    eventually(Duration::from_secs(180), "the schedule to fire", || {
        recorder.count() > 0
    })
    .await;
    let (fired_at, event) = recorder.snapshot()[0].clone();
    let fired_wall = Utc::now() - chrono::Duration::from_std(fired_at.elapsed()).expect("elapsed");
    // moto records the creation to the second; the minute itself is exact.
    assert!(
        fired_wall >= minute && fired_wall + TimeDelta::seconds(1) >= created,
        "fired early: at {fired_wall}, created {created}, minute {minute}"
    );
    assert_eq!(event, input, "the target receives the schedule's Input");

    let deadline = Instant::now() + Duration::from_secs(60);
    while schedule_exists(&stack, "release-o-1").await {
        assert!(
            Instant::now() < deadline,
            "ActionAfterCompletion DELETE was not honoured"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Deleted after delivering: nothing is left that could deliver again.
    assert_eq!(recorder.count(), 1, "invoked exactly once");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_failing_target_is_retried_by_the_asynchronous_invocation() {
    let recorder = Recorder::default();
    let calls = Arc::new(AtomicU32::new(0));
    let target = {
        let recorder = recorder.clone();
        function_fn(move |event: Value| {
            let recorder = recorder.clone();
            let calls = calls.clone();
            async move {
                recorder.record(&event);
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err("the store is unavailable".into())
                } else {
                    Ok(json!({}))
                }
            }
        })
    };
    let mut options = options("sched-retry").function("ReleaseFunction", target);
    options.async_retry = AsyncRetryTiming {
        delays: vec![Duration::from_millis(300), Duration::from_millis(300)],
    };
    let stack = start(options).await;
    let input = json!({"order_id": "o-2"});
    create_schedule(
        &stack,
        "release-o-2",
        a_minute_ago(),
        &release_arn(&stack),
        &input,
    )
    .await;

    eventually(
        Duration::from_secs(60),
        "two retries after two failures",
        || recorder.count() >= 3,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let events: Vec<Value> = recorder.snapshot().into_iter().map(|(_, e)| e).collect();
    assert_eq!(
        events,
        vec![input.clone(), input.clone(), input],
        "retried with the same event, then stopped"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_target_failing_every_retry_lands_in_the_on_failure_destination() {
    let recorder = Recorder::default();
    let target = {
        let recorder = recorder.clone();
        function_fn(move |event: Value| {
            let recorder = recorder.clone();
            async move {
                recorder.record(&event);
                Err("always failing".into())
            }
        })
    };
    let mut options = options("sched-dest").function("ReleaseFunction", target);
    options.async_retry = AsyncRetryTiming {
        delays: vec![Duration::from_millis(200)],
    };
    let stack = start(options).await;
    let destination = stack
        .model
        .function("ReleaseFunction")
        .and_then(|f| f.async_invoke.on_failure_queue_arn.clone())
        .and_then(|arn| stack.model.queue_by_arn(&arn).map(|q| q.url.clone()))
        .expect("the template gives the release function an OnFailure queue");
    let input = json!({"order_id": "o-3"});
    create_schedule(
        &stack,
        "release-o-3",
        a_minute_ago(),
        &release_arn(&stack),
        &input,
    )
    .await;

    let sqs = aws_sdk_sqs::Client::new(&stack.sdk_config);
    let started = Instant::now();
    let record = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no failure record arrived"
        );
        let out = sqs
            .receive_message()
            .queue_url(&destination)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage");
        if let Some(message) = out.messages.unwrap_or_default().into_iter().next() {
            break serde_json::from_str::<Value>(message.body().unwrap_or_default())
                .expect("a JSON record");
        }
    };
    assert_eq!(record["requestPayload"], input);
    assert_eq!(record["requestContext"]["condition"], "RetriesExhausted");
    assert_eq!(record["requestContext"]["approximateInvokeCount"], 3);
    assert_eq!(recorder.count(), 3, "one attempt and Lambda's two retries");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_schedule_whose_target_cannot_be_reached_is_kept_and_retried() {
    let recorder = Recorder::default();
    let stack = start(
        options("sched-unreachable")
            .function("ReleaseFunction", recording_target(recorder.clone())),
    )
    .await;
    let missing = format!(
        "arn:aws:lambda:us-east-1:123456789012:function:{}-Missing",
        stack.model.stack_name
    );
    create_schedule(
        &stack,
        "release-nowhere",
        a_minute_ago(),
        &missing,
        &json!({}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        schedule_exists(&stack, "release-nowhere").await,
        "a failed delivery keeps the schedule while its retry policy allows"
    );
    assert_eq!(recorder.count(), 0);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_future_schedule_is_not_fired_early() {
    let recorder = Recorder::default();
    let stack = start(
        options("sched-future").function("ReleaseFunction", recording_target(recorder.clone())),
    )
    .await;
    create_schedule(
        &stack,
        "release-later",
        this_minute() + TimeDelta::hours(1),
        &release_arn(&stack),
        &json!({"order_id": "later"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(recorder.count(), 0, "fired before its time");
    assert!(schedule_exists(&stack, "release-later").await);
    stack.shutdown().await;
}
