use aws_sdk_dynamodb::types::{BillingMode, KeyType, ProjectionType, TimeToLiveStatus};
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, FlexibleTimeWindow, FlexibleTimeWindowMode, Target,
};
use aws_sdk_sqs::types::QueueAttributeName;
use flashsale_local::LocalStack;
use flashsale_local::provision::{Change, Clients, provision};
use serde_json::Value;

use crate::{options, start};

fn keys(schema: &[aws_sdk_dynamodb::types::KeySchemaElement]) -> Vec<(String, KeyType)> {
    schema
        .iter()
        .map(|k| (k.attribute_name().to_owned(), k.key_type().clone()))
        .collect()
}

async fn queue_attributes(
    stack: &LocalStack,
    logical_id: &str,
) -> std::collections::HashMap<QueueAttributeName, String> {
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk_config);
    sqs.get_queue_attributes()
        .queue_url(stack.queue_url(logical_id).expect("queue in template"))
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default()
}

/// The value of the stack's secret, read by the ARN its functions are given.
async fn secret_value(stack: &LocalStack, logical_id: &str) -> String {
    aws_sdk_secretsmanager::Client::new(&stack.sdk_config)
        .get_secret_value()
        .secret_id(stack.secret_arn(logical_id).expect("secret in template"))
        .send()
        .await
        .expect("GetSecretValue by the functions' ARN")
        .secret_string
        .expect("a string secret")
}

#[tokio::test]
async fn provisioning_creates_the_table_queues_and_schedule_group_the_template_declares() {
    let stack = start(options("prov").parameter("OrdersVisibilityTimeout", "7")).await;
    assert!(
        stack
            .provisioned
            .resources
            .iter()
            .all(|r| r.change == Change::Created),
        "a new stack creates everything: {:?}",
        stack.provisioned
    );

    let dynamodb = aws_sdk_dynamodb::Client::new(&stack.sdk_config);
    let table_name = stack.table_name("Table").expect("table in template");
    assert_eq!(table_name, format!("{}-table", stack.model.stack_name));
    let table = dynamodb
        .describe_table()
        .table_name(table_name)
        .send()
        .await
        .expect("DescribeTable")
        .table
        .expect("table");
    assert_eq!(
        keys(table.key_schema()),
        [
            ("pk".to_owned(), KeyType::Hash),
            ("sk".to_owned(), KeyType::Range)
        ]
    );
    assert_eq!(
        table.billing_mode_summary().and_then(|b| b.billing_mode()),
        Some(&BillingMode::PayPerRequest)
    );
    let mut indexes: Vec<_> = table.global_secondary_indexes().iter().collect();
    indexes.sort_by_key(|gsi| gsi.index_name().map(str::to_owned));
    assert_eq!(indexes.len(), 2, "{indexes:?}");
    for (gsi, name) in indexes.into_iter().zip(["gsi1", "gsi2"]) {
        assert_eq!(gsi.index_name(), Some(name));
        assert_eq!(
            keys(gsi.key_schema()),
            [
                (format!("{name}pk"), KeyType::Hash),
                (format!("{name}sk"), KeyType::Range)
            ]
        );
        assert_eq!(
            gsi.projection().and_then(|p| p.projection_type()),
            Some(&ProjectionType::All)
        );
    }
    let ttl = dynamodb
        .describe_time_to_live()
        .table_name(table_name)
        .send()
        .await
        .expect("DescribeTimeToLive")
        .time_to_live_description
        .expect("ttl description");
    assert_eq!(ttl.attribute_name(), Some("ttl"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));

    let orders = queue_attributes(&stack, "OrdersQueue").await;
    let dlq = queue_attributes(&stack, "OrdersDLQ").await;
    assert_eq!(orders[&QueueAttributeName::FifoQueue], "true");
    assert_eq!(
        orders[&QueueAttributeName::ContentBasedDeduplication],
        "false"
    );
    assert_eq!(
        orders[&QueueAttributeName::VisibilityTimeout],
        "7",
        "the override applies"
    );
    let redrive: Value =
        serde_json::from_str(&orders[&QueueAttributeName::RedrivePolicy]).expect("redrive JSON");
    assert_eq!(
        redrive["deadLetterTargetArn"],
        dlq[&QueueAttributeName::QueueArn].as_str()
    );
    assert_eq!(redrive["maxReceiveCount"].as_u64(), Some(5));
    assert_eq!(dlq[&QueueAttributeName::FifoQueue], "true");
    assert_eq!(dlq[&QueueAttributeName::MessageRetentionPeriod], "1209600");

    let scheduler = aws_sdk_scheduler::Client::new(&stack.sdk_config);
    let group = scheduler
        .get_schedule_group()
        .name(
            stack
                .schedule_group_name("ReleaseScheduleGroup")
                .expect("group in template"),
        )
        .send()
        .await
        .expect("the schedule group exists");
    assert_eq!(
        group.name(),
        stack.schedule_group_name("ReleaseScheduleGroup")
    );

    // The grab-token key: generated as GenerateSecretString asks (64 letters and
    // digits), and named by the grab's environment.
    let grab_env = &stack
        .model
        .function("GrabFunction")
        .expect("grab")
        .environment;
    assert_eq!(
        grab_env.get("GRAB_TOKEN_SECRET_ARN").map(String::as_str),
        stack.secret_arn("GrabTokenSecret")
    );
    let key = secret_value(&stack, "GrabTokenSecret").await;
    assert_eq!(key.len(), 64, "{key}");
    assert!(key.chars().all(|c| c.is_ascii_alphanumeric()), "{key}");
    let created = stack
        .provisioned
        .resources
        .iter()
        .find(|r| r.logical_id == "GrabTokenSecret")
        .expect("the secret is in the report");
    assert!(
        created.physical_id.starts_with(&format!(
            "{}-",
            stack.secret_arn("GrabTokenSecret").unwrap()
        )),
        "the report names the full ARN: {created:?}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn provisioning_twice_changes_nothing_and_keeps_existing_schedules() {
    let first = start(options("prov-twice")).await;
    let stack_name = first.model.stack_name.clone();
    let group = first
        .schedule_group_name("ReleaseScheduleGroup")
        .expect("group")
        .to_owned();
    let scheduler = aws_sdk_scheduler::Client::new(&first.sdk_config);
    scheduler
        .create_schedule()
        .name("kept")
        .group_name(&group)
        .schedule_expression("at(2099-01-01T00:00:00)")
        .flexible_time_window(
            FlexibleTimeWindow::builder()
                .mode(FlexibleTimeWindowMode::Off)
                .build()
                .expect("window"),
        )
        .target(
            Target::builder()
                .arn(
                    &first
                        .model
                        .function("ReleaseFunction")
                        .expect("release")
                        .arn,
                )
                .role_arn("arn:aws:iam::123456789012:role/local")
                .input("{}")
                .build()
                .expect("target"),
        )
        .action_after_completion(ActionAfterCompletion::Delete)
        .send()
        .await
        .expect("CreateSchedule");

    // Provisioning the same model again, and a second stack start with the same name.
    let again = provision(&first.model, &Clients::new(&first.sdk_config))
        .await
        .expect("provisions again");
    assert!(
        again.is_unchanged(),
        "second run changed something: {again:?}"
    );
    let mut options = options("unused");
    options.stack_name = stack_name.clone();
    let second = start(options).await;
    assert!(
        second.provisioned.is_unchanged(),
        "{:?}",
        second.provisioned
    );

    assert_eq!(
        secret_value(&second, "GrabTokenSecret").await,
        secret_value(&first, "GrabTokenSecret").await,
        "a restart keeps the grab-token key, so the grab paths it signed stay valid"
    );
    let secrets = aws_sdk_secretsmanager::Client::new(&first.sdk_config)
        .list_secrets()
        .filters(
            aws_sdk_secretsmanager::types::Filter::builder()
                .key(aws_sdk_secretsmanager::types::FilterNameStringType::Name)
                .values(&stack_name)
                .build(),
        )
        .send()
        .await
        .expect("ListSecrets")
        .secret_list
        .unwrap_or_default();
    let ours = secrets
        .iter()
        .filter(|s| s.name().is_some_and(|n| n.starts_with(&stack_name)))
        .count();
    assert_eq!(ours, first.model.secrets.len(), "no duplicate secrets");

    let sqs = aws_sdk_sqs::Client::new(&first.sdk_config);
    let queues = sqs
        .list_queues()
        .queue_name_prefix(&stack_name)
        .send()
        .await
        .expect("ListQueues")
        .queue_urls
        .unwrap_or_default();
    assert_eq!(
        queues.len(),
        first.model.queues.len(),
        "no duplicate queues: {queues:?}"
    );
    let dynamodb = aws_sdk_dynamodb::Client::new(&first.sdk_config);
    // Every page: the emulators may be shared with other tests' tables.
    let tables: Vec<String> = dynamodb
        .list_tables()
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .expect("ListTables");
    let ours = tables.iter().filter(|t| t.starts_with(&stack_name)).count();
    assert_eq!(ours, 1);
    scheduler
        .get_schedule()
        .group_name(&group)
        .name("kept")
        .send()
        .await
        .expect("re-provisioning kept the group's schedules");
    second.shutdown().await;
    first.shutdown().await;
}
