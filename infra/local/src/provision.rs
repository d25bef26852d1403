//! Creates the stack's tables, queues, schedule groups and secrets on the emulators, as
//! CloudFormation would. Idempotent: what exists is checked and kept (a secret keeps
//! its value, so tokens signed before a restart stay valid); a mutable queue
//! attribute that differs is updated (as a stack update would); a difference that
//! CloudFormation could only fix by replacing the resource is an error, never a silent
//! second resource.

use std::collections::BTreeMap;
use std::fmt;

use aws_sdk_dynamodb::types as ddb;
use aws_sdk_scheduler::error::ProvideErrorMetadata;
use serde_json::Value;

use crate::model::{
    KeyElement, QueueSpec, ScheduleGroupSpec, SecondaryIndex, SecretSpec, StackModel, TableSpec,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{operation} for {resource} failed")]
    Aws {
        operation: &'static str,
        resource: String,
        #[source]
        source: BoxError,
    },
    #[error(
        "{resource} exists but differs from the template ({what}); it would need replacing: use another stack name"
    )]
    Drift { resource: String, what: String },
    #[error("{resource}: invalid specification: {what}")]
    Invalid { resource: String, what: String },
    #[error(
        "secret {resource} has ARN {actual}, which the ARN the environment was resolved with ({expected}) does not name"
    )]
    SecretArnMismatch {
        resource: String,
        expected: String,
        actual: String,
    },
    #[error("queue {resource} has URL {actual}, but the environment was resolved with {expected}")]
    QueueUrlMismatch {
        resource: String,
        expected: String,
        actual: String,
    },
}

fn aws(operation: &'static str, resource: &str, source: impl Into<BoxError>) -> ProvisionError {
    ProvisionError::Aws {
        operation,
        resource: resource.to_owned(),
        source: source.into(),
    }
}

/// What provisioning did to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created,
    Unchanged,
    /// The named attributes were set to the template's values.
    Updated(Vec<String>),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Created => f.write_str("created"),
            Change::Unchanged => f.write_str("unchanged"),
            Change::Updated(keys) => write!(f, "updated {}", keys.join(", ")),
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedResource {
    pub logical_id: String,
    pub kind: &'static str,
    pub physical_id: String,
    pub change: Change,
}

/// What provisioning did, resource by resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionReport {
    pub resources: Vec<ProvisionedResource>,
}

impl ProvisionReport {
    /// True when nothing was created or updated.
    pub fn is_unchanged(&self) -> bool {
        self.resources.iter().all(|r| r.change == Change::Unchanged)
    }
}

/// The clients provisioning talks to.
#[derive(Debug, Clone)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub scheduler: aws_sdk_scheduler::Client,
    pub secretsmanager: aws_sdk_secretsmanager::Client,
}

impl Clients {
    pub fn new(sdk: &aws_config::SdkConfig) -> Self {
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(sdk),
            sqs: aws_sdk_sqs::Client::new(sdk),
            scheduler: aws_sdk_scheduler::Client::new(sdk),
            secretsmanager: aws_sdk_secretsmanager::Client::new(sdk),
        }
    }
}

/// Provisions every table, queue, schedule group and secret of `model`.
pub async fn provision(
    model: &StackModel,
    clients: &Clients,
) -> Result<ProvisionReport, ProvisionError> {
    let mut report = ProvisionReport::default();
    for table in &model.tables {
        let change = provision_table(&clients.dynamodb, table).await?;
        report.resources.push(ProvisionedResource {
            logical_id: table.logical_id.clone(),
            kind: "AWS::DynamoDB::Table",
            physical_id: table.name.clone(),
            change,
        });
    }
    for queue in &model.queues {
        let change = provision_queue(&clients.sqs, queue).await?;
        report.resources.push(ProvisionedResource {
            logical_id: queue.logical_id.clone(),
            kind: "AWS::SQS::Queue",
            physical_id: queue.url.clone(),
            change,
        });
    }
    for group in &model.schedule_groups {
        let change = provision_schedule_group(&clients.scheduler, group).await?;
        report.resources.push(ProvisionedResource {
            logical_id: group.logical_id.clone(),
            kind: "AWS::Scheduler::ScheduleGroup",
            physical_id: group.name.clone(),
            change,
        });
    }
    for secret in &model.secrets {
        let (arn, change) = provision_secret(&clients.secretsmanager, secret).await?;
        report.resources.push(ProvisionedResource {
            logical_id: secret.logical_id.clone(),
            kind: "AWS::SecretsManager::Secret",
            physical_id: arn,
            change,
        });
    }
    Ok(report)
}

// ---------------------------------------------------------------- DynamoDB

fn key_schema(
    resource: &str,
    keys: &[KeyElement],
) -> Result<Vec<ddb::KeySchemaElement>, ProvisionError> {
    keys.iter()
        .map(|k| {
            ddb::KeySchemaElement::builder()
                .attribute_name(&k.attribute_name)
                .key_type(ddb::KeyType::from(k.key_type.as_str()))
                .build()
                .map_err(|e| invalid(resource, e))
        })
        .collect()
}

fn invalid(resource: &str, error: impl fmt::Display) -> ProvisionError {
    ProvisionError::Invalid {
        resource: resource.to_owned(),
        what: error.to_string(),
    }
}

fn projection(index: &SecondaryIndex) -> ddb::Projection {
    let mut builder = ddb::Projection::builder();
    if let Some(kind) = &index.projection.projection_type {
        builder = builder.projection_type(ddb::ProjectionType::from(kind.as_str()));
    }
    for attribute in &index.projection.non_key_attributes {
        builder = builder.non_key_attributes(attribute);
    }
    builder.build()
}

fn throughput(
    resource: &str,
    t: &crate::model::Throughput,
) -> Result<ddb::ProvisionedThroughput, ProvisionError> {
    ddb::ProvisionedThroughput::builder()
        .read_capacity_units(t.read_capacity_units as i64)
        .write_capacity_units(t.write_capacity_units as i64)
        .build()
        .map_err(|e| invalid(resource, e))
}

fn schema_pairs(keys: &[KeyElement]) -> Vec<(String, String)> {
    keys.iter()
        .map(|k| (k.attribute_name.clone(), k.key_type.clone()))
        .collect()
}

fn actual_pairs(keys: &[ddb::KeySchemaElement]) -> Vec<(String, String)> {
    keys.iter()
        .map(|k| {
            (
                k.attribute_name().to_owned(),
                k.key_type().as_str().to_owned(),
            )
        })
        .collect()
}

async fn provision_table(
    client: &aws_sdk_dynamodb::Client,
    table: &TableSpec,
) -> Result<Change, ProvisionError> {
    let name = table.name.as_str();
    let p = &table.properties;
    let existing = match client.describe_table().table_name(name).send().await {
        Ok(out) => out.table,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            None
        }
        Err(e) => return Err(aws("DescribeTable", name, e)),
    };
    let mut change = Change::Unchanged;
    match existing {
        Some(actual) => {
            let expected_keys = schema_pairs(&p.key_schema);
            if actual_pairs(actual.key_schema()) != expected_keys {
                return Err(ProvisionError::Drift {
                    resource: name.to_owned(),
                    what: "key schema".to_owned(),
                });
            }
            let mut expected_indexes: Vec<_> = p
                .global_secondary_indexes
                .iter()
                .map(|i| (i.index_name.clone(), schema_pairs(&i.key_schema)))
                .collect();
            let mut actual_indexes: Vec<_> = actual
                .global_secondary_indexes()
                .iter()
                .map(|i| {
                    (
                        i.index_name().unwrap_or_default().to_owned(),
                        actual_pairs(i.key_schema()),
                    )
                })
                .collect();
            expected_indexes.sort();
            actual_indexes.sort();
            if expected_indexes != actual_indexes {
                return Err(ProvisionError::Drift {
                    resource: name.to_owned(),
                    what: "global secondary indexes".to_owned(),
                });
            }
        }
        None => {
            let mut request = client
                .create_table()
                .table_name(name)
                .set_key_schema(Some(key_schema(name, &p.key_schema)?));
            for attribute in &p.attribute_definitions {
                request = request.attribute_definitions(
                    ddb::AttributeDefinition::builder()
                        .attribute_name(&attribute.attribute_name)
                        .attribute_type(ddb::ScalarAttributeType::from(
                            attribute.attribute_type.as_str(),
                        ))
                        .build()
                        .map_err(|e| invalid(name, e))?,
                );
            }
            let billing = p.billing_mode.as_deref().unwrap_or("PROVISIONED");
            request = request.billing_mode(ddb::BillingMode::from(billing));
            if let Some(t) = &p.provisioned_throughput {
                request = request.provisioned_throughput(throughput(name, t)?);
            }
            for index in &p.global_secondary_indexes {
                let mut gsi = ddb::GlobalSecondaryIndex::builder()
                    .index_name(&index.index_name)
                    .set_key_schema(Some(key_schema(name, &index.key_schema)?))
                    .projection(projection(index));
                if let Some(t) = &index.provisioned_throughput {
                    gsi = gsi.provisioned_throughput(throughput(name, t)?);
                }
                request =
                    request.global_secondary_indexes(gsi.build().map_err(|e| invalid(name, e))?);
            }
            for index in &p.local_secondary_indexes {
                request = request.local_secondary_indexes(
                    ddb::LocalSecondaryIndex::builder()
                        .index_name(&index.index_name)
                        .set_key_schema(Some(key_schema(name, &index.key_schema)?))
                        .projection(projection(index))
                        .build()
                        .map_err(|e| invalid(name, e))?,
                );
            }
            if let Some(stream) = &p.stream_specification {
                request = request.stream_specification(
                    ddb::StreamSpecification::builder()
                        .stream_enabled(true)
                        .stream_view_type(ddb::StreamViewType::from(
                            stream.stream_view_type.as_str(),
                        ))
                        .build()
                        .map_err(|e| invalid(name, e))?,
                );
            }
            match request.send().await {
                Ok(_) => change = Change::Created,
                // Another provisioner (a parallel test on the same stack name) won the race.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_in_use_exception()) => {}
                Err(e) => return Err(aws("CreateTable", name, e)),
            }
        }
    }

    if let Some(ttl) = &p.time_to_live_specification {
        let current = client
            .describe_time_to_live()
            .table_name(name)
            .send()
            .await
            .map_err(|e| aws("DescribeTimeToLive", name, e))?;
        let description = current.time_to_live_description();
        let enabled = matches!(
            description.and_then(|d| d.time_to_live_status()),
            Some(ddb::TimeToLiveStatus::Enabled | ddb::TimeToLiveStatus::Enabling)
        );
        let same_attribute =
            description.and_then(|d| d.attribute_name()) == Some(ttl.attribute_name.as_str());
        if enabled != ttl.enabled || (ttl.enabled && !same_attribute) {
            client
                .update_time_to_live()
                .table_name(name)
                .time_to_live_specification(
                    ddb::TimeToLiveSpecification::builder()
                        .attribute_name(&ttl.attribute_name)
                        .enabled(ttl.enabled)
                        .build()
                        .map_err(|e| invalid(name, e))?,
                )
                .send()
                .await
                .map_err(|e| aws("UpdateTimeToLive", name, e))?;
            if change == Change::Unchanged {
                change = Change::Updated(vec!["TimeToLiveSpecification".to_owned()]);
            }
        }
    }
    Ok(change)
}

// ---------------------------------------------------------------- SQS

/// Queue attributes that are JSON documents, compared as JSON (SQS may reformat them).
const JSON_ATTRIBUTES: [&str; 2] = ["RedrivePolicy", "RedriveAllowPolicy"];

fn same_attribute(key: &str, expected: &str, actual: Option<&str>) -> bool {
    let Some(actual) = actual else {
        return false;
    };
    if JSON_ATTRIBUTES.contains(&key) {
        let normalize = |text: &str| -> Option<Value> {
            let mut value: Value = serde_json::from_str(text).ok()?;
            // maxReceiveCount may come back as a string or a number.
            if let Some(count) = value.get_mut("maxReceiveCount")
                && let Some(s) = count.as_str().and_then(|s| s.parse::<u64>().ok())
            {
                *count = Value::from(s);
            }
            Some(value)
        };
        normalize(expected).is_some() && normalize(expected) == normalize(actual)
    } else {
        expected == actual
    }
}

fn is_missing_queue(error: &impl ProvideErrorMetadata) -> bool {
    matches!(
        error.code(),
        Some("QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue")
    )
}

async fn provision_queue(
    client: &aws_sdk_sqs::Client,
    queue: &QueueSpec,
) -> Result<Change, ProvisionError> {
    let name = queue.name.as_str();
    let existing_url = match client.get_queue_url().queue_name(name).send().await {
        Ok(out) => out.queue_url,
        Err(e) if is_missing_queue(&e) => None,
        Err(e) => return Err(aws("GetQueueUrl", name, e)),
    };
    let (url, change) = match existing_url {
        None => {
            let attributes = queue
                .attributes
                .iter()
                .map(|(k, v)| {
                    (
                        aws_sdk_sqs::types::QueueAttributeName::from(k.as_str()),
                        v.clone(),
                    )
                })
                .collect();
            let out = client
                .create_queue()
                .queue_name(name)
                .set_attributes(Some(attributes))
                .send()
                .await
                .map_err(|e| aws("CreateQueue", name, e))?;
            (out.queue_url.unwrap_or_default(), Change::Created)
        }
        Some(url) => {
            let current = client
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
                .send()
                .await
                .map_err(|e| aws("GetQueueAttributes", name, e))?;
            let current: BTreeMap<String, String> = current
                .attributes
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.as_str().to_owned(), v))
                .collect();
            let fifo_now = current.get("FifoQueue").is_some_and(|v| v == "true");
            if fifo_now != queue.fifo {
                return Err(ProvisionError::Drift {
                    resource: name.to_owned(),
                    what: "FifoQueue".to_owned(),
                });
            }
            let differing: BTreeMap<&String, &String> = queue
                .attributes
                .iter()
                .filter(|(k, v)| {
                    k.as_str() != "FifoQueue"
                        && !same_attribute(k, v, current.get(*k).map(String::as_str))
                })
                .collect();
            if differing.is_empty() {
                (url, Change::Unchanged)
            } else {
                let attributes = differing
                    .iter()
                    .map(|(k, v)| {
                        (
                            aws_sdk_sqs::types::QueueAttributeName::from(k.as_str()),
                            (*v).clone(),
                        )
                    })
                    .collect();
                client
                    .set_queue_attributes()
                    .queue_url(&url)
                    .set_attributes(Some(attributes))
                    .send()
                    .await
                    .map_err(|e| aws("SetQueueAttributes", name, e))?;
                (
                    url,
                    Change::Updated(differing.keys().map(|k| (*k).clone()).collect()),
                )
            }
        }
    };
    if url != queue.url {
        return Err(ProvisionError::QueueUrlMismatch {
            resource: name.to_owned(),
            expected: queue.url.clone(),
            actual: url,
        });
    }
    Ok(change)
}

// ---------------------------------------------------------------- Scheduler

async fn provision_schedule_group(
    client: &aws_sdk_scheduler::Client,
    group: &ScheduleGroupSpec,
) -> Result<Change, ProvisionError> {
    let name = group.name.as_str();
    // Look before creating: moto's CreateScheduleGroup replaces an existing group and
    // drops its schedules, where AWS would answer ConflictException.
    match client.get_schedule_group().name(name).send().await {
        Ok(_) => return Ok(Change::Unchanged),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) => {}
        Err(e) => return Err(aws("GetScheduleGroup", name, e)),
    }
    match client.create_schedule_group().name(name).send().await {
        Ok(_) => Ok(Change::Created),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conflict_exception()) =>
        {
            Ok(Change::Unchanged)
        }
        Err(e) => Err(aws("CreateScheduleGroup", name, e)),
    }
}

// ---------------------------------------------------------------- Secrets Manager

/// Creates the secret with a freshly drawn value, or keeps the one that exists, value
/// and all: a restarted stack must go on accepting what the old one signed. Answers
/// the secret's full ARN.
async fn provision_secret(
    client: &aws_sdk_secretsmanager::Client,
    secret: &SecretSpec,
) -> Result<(String, Change), ProvisionError> {
    let name = secret.name.as_str();
    let (arn, change) = match client.describe_secret().secret_id(name).send().await {
        Ok(existing) => (existing.arn.unwrap_or_default(), Change::Unchanged),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            let created = client
                .create_secret()
                .name(name)
                .set_description(secret.description.clone())
                .secret_string(secret.value.draw())
                .send()
                .await;
            match created {
                Ok(out) => (out.arn.unwrap_or_default(), Change::Created),
                // Another provisioner (a parallel test on the same stack name) won the
                // race; its value stands.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_exists_exception()) =>
                {
                    let existing = client
                        .describe_secret()
                        .secret_id(name)
                        .send()
                        .await
                        .map_err(|e| aws("DescribeSecret", name, e))?;
                    (existing.arn.unwrap_or_default(), Change::Unchanged)
                }
                Err(e) => return Err(aws("CreateSecret", name, e)),
            }
        }
        Err(e) => return Err(aws("DescribeSecret", name, e)),
    };
    // The functions were given the partial ARN; it must name this very secret.
    let named = arn
        .strip_prefix(secret.arn.as_str())
        .and_then(|suffix| suffix.strip_prefix('-'))
        .is_some_and(|random| !random.is_empty() && !random.contains(':'));
    if !named {
        return Err(ProvisionError::SecretArnMismatch {
            resource: name.to_owned(),
            expected: secret.arn.clone(),
            actual: arn,
        });
    }
    Ok((arn, change))
}
