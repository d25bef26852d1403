//! One endpoint in front of the emulators routes each SDK call to the emulator of the
//! service it is signed for: what one reaches through it, the emulator itself holds.

use std::net::{IpAddr, Ipv4Addr};

use aws_config::BehaviorVersion;
use aws_credential_types::Credentials;
use aws_types::region::Region;
use flashsale_emulators::one_endpoint::OneEndpoint;

#[tokio::test(flavor = "multi_thread")]
async fn each_service_called_through_one_endpoint_reaches_its_own_emulator() {
    let emulators = flashsale_emulators::shared().await;
    let endpoint = OneEndpoint::start(IpAddr::V4(Ipv4Addr::LOCALHOST), emulators)
        .await
        .expect("the endpoint listens");
    let through = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(flashsale_emulators::REGION))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(endpoint.url())
        .load()
        .await;
    let direct = emulators.sdk_config().await;
    let name = format!("one-endpoint-{}", flashsale_emulators::unique_suffix());

    aws_sdk_dynamodb::Client::new(&through)
        .create_table()
        .table_name(&name)
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .expect("an attribute"),
        )
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .expect("a key"),
        )
        .send()
        .await
        .expect("CreateTable through the endpoint");
    let table = aws_sdk_dynamodb::Client::new(&direct)
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .expect("DynamoDB Local holds the table");
    assert_eq!(
        table.table().and_then(|t| t.table_name()),
        Some(name.as_str())
    );

    let queue = aws_sdk_sqs::Client::new(&through)
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .expect("CreateQueue through the endpoint");
    let queue_url = queue.queue_url().expect("a queue URL").to_owned();
    aws_sdk_sqs::Client::new(&direct)
        .get_queue_attributes()
        .queue_url(&queue_url)
        .send()
        .await
        .expect("the SQS emulator holds the queue");

    aws_sdk_secretsmanager::Client::new(&through)
        .create_secret()
        .name(&name)
        .secret_string("s3cret")
        .send()
        .await
        .expect("CreateSecret through the endpoint");
    let secret = aws_sdk_secretsmanager::Client::new(&direct)
        .get_secret_value()
        .secret_id(&name)
        .send()
        .await
        .expect("moto holds the secret");
    assert_eq!(secret.secret_string(), Some("s3cret"));

    aws_sdk_scheduler::Client::new(&through)
        .create_schedule_group()
        .name(&name)
        .send()
        .await
        .expect("CreateScheduleGroup through the endpoint");
    let group = aws_sdk_scheduler::Client::new(&direct)
        .get_schedule_group()
        .name(&name)
        .send()
        .await
        .expect("moto holds the schedule group");
    assert_eq!(group.name(), Some(name.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsigned_request_is_refused_not_guessed_at() {
    let emulators = flashsale_emulators::shared().await;
    let endpoint = OneEndpoint::start(IpAddr::V4(Ipv4Addr::LOCALHOST), emulators)
        .await
        .expect("the endpoint listens");
    let answer = reqwest::Client::new()
        .post(endpoint.url())
        .body("{}")
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), reqwest::StatusCode::BAD_REQUEST);
}
