//! The stack as the local stack needs it: the template evaluated for one stack name,
//! with typed specs for every resource it provisions and every function it runs.
//!
//! Properties are deserialized strictly: a property the local stack would have to act
//! on but does not know is an error naming it, never silently dropped. Properties that
//! have no local effect (tags, encryption, backups) are accepted and listed as such.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::edge::{EdgeRateRule, WebAclError, WebAclProperties};
use crate::resolve::{ParamValue, ResolveError, Resolver, StackContext, value_string};
use crate::template::{Node, ResourceDecl, Template};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("{at}: {source}")]
    Properties {
        at: String,
        #[source]
        source: serde_path_to_error::Error<serde_json::Error>,
    },
    #[error("{at}: {what}")]
    Invalid { at: String, what: String },
    #[error("{at}: {target} is no function of this template")]
    UnknownFunction { at: String, target: String },
    #[error("{at}: event source {arn} is not a queue of this template")]
    UnknownEventSource { at: String, arn: String },
    #[error("{at}: authorizer {name} is not declared on API {api}")]
    UnknownAuthorizer {
        at: String,
        name: String,
        api: String,
    },
    #[error("{at}: only JWT authorizers are emulated locally")]
    UnsupportedAuthorizer { at: String },
    #[error("{at}: {source}")]
    WebAcl {
        at: String,
        #[source]
        source: WebAclError,
    },
    #[error("route {route_key} is declared twice ({first} and {second})")]
    DuplicateRoute {
        route_key: String,
        first: String,
        second: String,
    },
}

/// The evaluated stack.
#[derive(Debug, Clone)]
pub struct StackModel {
    pub stack_name: String,
    pub region: String,
    pub account_id: String,
    pub parameters: BTreeMap<String, ParamValue>,
    /// Parameters that had no value and got a random local one (NoEcho secrets).
    pub generated_parameters: Vec<String>,
    pub tables: Vec<TableSpec>,
    /// Dead-letter targets come before the queues that redrive to them.
    pub queues: Vec<QueueSpec>,
    pub schedule_groups: Vec<ScheduleGroupSpec>,
    pub secrets: Vec<SecretSpec>,
    pub functions: Vec<FunctionSpec>,
    pub apis: Vec<HttpApiSpec>,
    /// The headers CloudFront adds to the pages' responses, as (name, value): the
    /// response headers policy named by a distribution's default behaviour (the pages).
    /// The local static server adds them too.
    pub page_headers: Vec<(String, String)>,
    /// The rate-based rules of the CloudFront-scoped web ACL, if the template creates
    /// one: the local gateway plays them before any route (see [`crate::edge`]).
    pub edge_rules: Vec<EdgeRateRule>,
    /// Resources the local stack does not create (IAM roles: locally nothing is
    /// authorized; the HTTP API: served in-process), as (logical id, type).
    pub not_provisioned: Vec<(String, String)>,
}

impl StackModel {
    pub fn function(&self, logical_id: &str) -> Option<&FunctionSpec> {
        self.functions.iter().find(|f| f.logical_id == logical_id)
    }

    /// The function an invocation ARN names: plain, `:$LATEST` or an alias/version
    /// qualifier all reach the one local version.
    pub fn function_by_arn(&self, arn: &str) -> Option<&FunctionSpec> {
        self.functions.iter().find(|f| f.is_invoked_by(arn))
    }

    pub fn queue(&self, logical_id: &str) -> Option<&QueueSpec> {
        self.queues.iter().find(|q| q.logical_id == logical_id)
    }

    pub fn queue_by_arn(&self, arn: &str) -> Option<&QueueSpec> {
        self.queues.iter().find(|q| q.arn == arn)
    }

    pub fn table(&self, logical_id: &str) -> Option<&TableSpec> {
        self.tables.iter().find(|t| t.logical_id == logical_id)
    }

    pub fn schedule_group(&self, logical_id: &str) -> Option<&ScheduleGroupSpec> {
        self.schedule_groups
            .iter()
            .find(|g| g.logical_id == logical_id)
    }

    pub fn secret(&self, logical_id: &str) -> Option<&SecretSpec> {
        self.secrets.iter().find(|s| s.logical_id == logical_id)
    }

    /// Every HTTP route of every function.
    pub fn routes(&self) -> impl Iterator<Item = (&FunctionSpec, &RouteSpec)> {
        self.functions
            .iter()
            .flat_map(|f| f.routes.iter().map(move |r| (f, r)))
    }

    /// Evaluates `template` for the stack in `context`, with `overrides` applied to its
    /// parameters.
    pub fn build(
        template: &Template,
        context: StackContext,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, ModelError> {
        let mut resolver = Resolver::new(template, context.clone(), overrides)?;
        let mut tables = Vec::new();
        let mut queues = Vec::new();
        let mut schedule_groups = Vec::new();
        let mut secrets = Vec::new();
        let mut not_provisioned = Vec::new();
        let mut function_decls = Vec::new();
        let mut api_decls = Vec::new();
        let mut stage_decls = Vec::new();
        let mut mapping_decls = Vec::new();
        let mut invoke_config_decls = Vec::new();
        let mut rule_decls = Vec::new();
        let mut distribution_decls = Vec::new();
        let mut edge_rules = Vec::new();
        for decl in template.resources.values() {
            if let Some(condition) = &decl.condition
                && !resolver.condition(condition, &format!("Resources.{}", decl.logical_id))?
            {
                continue;
            }
            match decl.kind.as_str() {
                "AWS::DynamoDB::Table" => tables.push(table_spec(&mut resolver, decl)?),
                "AWS::SQS::Queue" => queues.push(queue_spec(&mut resolver, decl)?),
                "AWS::Scheduler::ScheduleGroup" => {
                    schedule_groups.push(schedule_group_spec(&mut resolver, decl)?)
                }
                "AWS::SecretsManager::Secret" => secrets.push(secret_spec(&mut resolver, decl)?),
                "AWS::Lambda::Function" => function_decls.push(decl),
                "AWS::Lambda::EventSourceMapping" => mapping_decls.push(decl),
                "AWS::Lambda::EventInvokeConfig" => invoke_config_decls.push(decl),
                "AWS::Events::Rule" => rule_decls.push(decl),
                // Served in-process by the local gateway.
                "AWS::ApiGatewayV2::Api" => {
                    api_decls.push(decl);
                    not_provisioned.push((decl.logical_id.clone(), decl.kind.clone()));
                }
                "AWS::ApiGatewayV2::Stage" => {
                    stage_decls.push(decl);
                    not_provisioned.push((decl.logical_id.clone(), decl.kind.clone()));
                }
                "AWS::WAFv2::WebACL" => {
                    let acl: WebAclProperties = typed_properties(&mut resolver, decl)?;
                    if acl.scope == "CLOUDFRONT" {
                        edge_rules.extend(acl.rules().map_err(|source| ModelError::WebAcl {
                            at: format!("Resources.{}", decl.logical_id),
                            source,
                        })?);
                    }
                    not_provisioned.push((decl.logical_id.clone(), decl.kind.clone()));
                }
                "AWS::CloudFront::Distribution" => {
                    distribution_decls.push(decl);
                    not_provisioned.push((decl.logical_id.clone(), decl.kind.clone()));
                }
                _ => not_provisioned.push((decl.logical_id.clone(), decl.kind.clone())),
            }
        }
        let queues = order_queues(queues);

        let mut functions = Vec::new();
        for decl in function_decls {
            functions.push(function_spec(&mut resolver, decl)?);
        }
        for decl in invoke_config_decls {
            let at = format!("Resources.{}.Properties.FunctionName", decl.logical_id);
            let (target, config) = async_invoke_config(&mut resolver, decl)?;
            invoked(&mut functions, &target, &at)?.async_invoke = config;
        }
        for decl in mapping_decls {
            let at = format!("Resources.{}.Properties.FunctionName", decl.logical_id);
            let (target, source) = sqs_source_spec(&mut resolver, decl, &queues)?;
            invoked(&mut functions, &target, &at)?
                .sqs_sources
                .push(source);
        }
        for decl in rule_decls {
            let at = format!("Resources.{}.Properties.Targets", decl.logical_id);
            for (target, rule) in rule_specs(&mut resolver, decl)? {
                invoked(&mut functions, &target, &at)?.schedules.push(rule);
            }
        }
        let mut apis = Vec::new();
        for decl in api_decls {
            let (api, routes) = http_api_spec(&mut resolver, decl, &stage_decls)?;
            let at = format!("Resources.{}.Properties.Body", decl.logical_id);
            for (target, route) in routes {
                invoked(&mut functions, &target, &at)?.routes.push(route);
            }
            apis.push(api);
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for function in &functions {
            for route in &function.routes {
                if let Some(first) = seen.insert(route.route_key(), function.logical_id.clone()) {
                    return Err(ModelError::DuplicateRoute {
                        route_key: route.route_key(),
                        first,
                        second: function.logical_id.clone(),
                    });
                }
            }
        }

        let mut page_headers = Vec::new();
        for decl in distribution_decls {
            page_headers.extend(pages_response_headers(&mut resolver, template, decl)?);
        }

        let parameters = template
            .parameters
            .keys()
            .filter_map(|name| resolver.parameter(name).map(|v| (name.clone(), v.clone())))
            .collect();
        Ok(Self {
            stack_name: context.stack_name,
            region: context.region,
            account_id: context.account_id,
            parameters,
            generated_parameters: resolver.generated_parameters().to_vec(),
            tables,
            queues,
            schedule_groups,
            secrets,
            functions,
            apis,
            page_headers,
            edge_rules,
            not_provisioned,
        })
    }
}

/// The headers of the response headers policy that `distribution`'s default behaviour
/// names, if it names one of this template's. Read from the template's nodes: the rest of
/// the distribution (its origins' domain names) has no local value.
fn pages_response_headers(
    resolver: &mut Resolver<'_>,
    template: &Template,
    distribution: &ResourceDecl,
) -> Result<Vec<(String, String)>, ModelError> {
    let named = distribution
        .properties
        .as_map()
        .and_then(|p| p.get("DistributionConfig")?.as_map())
        .and_then(|config| config.get("DefaultCacheBehavior")?.as_map())
        .and_then(|behaviour| behaviour.get("ResponseHeadersPolicyId"));
    let policy = match named {
        Some(Node::Intrinsic { name, arg }) if name == "Ref" => arg
            .as_str()
            .and_then(|id| template.resources.get(id))
            .filter(|decl| decl.kind == "AWS::CloudFront::ResponseHeadersPolicy"),
        _ => None,
    };
    let Some(policy) = policy else {
        return Ok(Vec::new());
    };
    let properties: ResponseHeadersPolicyProperties = typed_properties(resolver, policy)?;
    let config = properties.response_headers_policy_config;
    let mut headers = Vec::new();
    if let Some(security) = config.security_headers_config {
        if let Some(csp) = security.content_security_policy {
            headers.push((
                "content-security-policy".to_owned(),
                // `connect-src 'self' ${IdentityProviderOrigin}` with no origin leaves a
                // space before the `;`, which browsers ignore; the header reads cleaner
                // without it.
                csp.content_security_policy
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .replace(" ;", ";"),
            ));
        }
        if let Some(hsts) = security.strict_transport_security {
            let mut value = format!("max-age={}", hsts.access_control_max_age_sec);
            if hsts.include_subdomains.unwrap_or(false) {
                value.push_str("; includeSubDomains");
            }
            if hsts.preload.unwrap_or(false) {
                value.push_str("; preload");
            }
            headers.push(("strict-transport-security".to_owned(), value));
        }
        if security.content_type_options.is_some() {
            headers.push(("x-content-type-options".to_owned(), "nosniff".to_owned()));
        }
        if let Some(frame) = security.frame_options {
            headers.push(("x-frame-options".to_owned(), frame.frame_option));
        }
        if let Some(referrer) = security.referrer_policy {
            headers.push(("referrer-policy".to_owned(), referrer.referrer_policy));
        }
    }
    if let Some(custom) = config.custom_headers_config {
        headers.extend(custom.items.into_iter().map(|h| (h.header, h.value)));
    }
    Ok(headers)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ResponseHeadersPolicyProperties {
    response_headers_policy_config: ResponseHeadersPolicyConfig,
}

/// What of a response headers policy a browser sees (its name, comment, CORS and
/// server-timing settings are CloudFront's own business here).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ResponseHeadersPolicyConfig {
    security_headers_config: Option<SecurityHeadersConfig>,
    custom_headers_config: Option<CustomHeadersConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SecurityHeadersConfig {
    content_security_policy: Option<ContentSecurityPolicyConfig>,
    strict_transport_security: Option<StrictTransportSecurityConfig>,
    content_type_options: Option<Value>,
    frame_options: Option<FrameOptionsConfig>,
    referrer_policy: Option<ReferrerPolicyConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ContentSecurityPolicyConfig {
    content_security_policy: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StrictTransportSecurityConfig {
    access_control_max_age_sec: u64,
    include_subdomains: Option<bool>,
    preload: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FrameOptionsConfig {
    frame_option: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ReferrerPolicyConfig {
    referrer_policy: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CustomHeadersConfig {
    items: Vec<CustomHeader>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CustomHeader {
    header: String,
    value: String,
}

// ---------------------------------------------------------------- DynamoDB

/// A DynamoDB table to provision.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    pub properties: TableProperties,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct TableProperties {
    #[serde(default)]
    pub table_name: Option<String>,
    #[serde(default)]
    pub billing_mode: Option<String>,
    pub attribute_definitions: Vec<AttributeDefinition>,
    pub key_schema: Vec<KeyElement>,
    #[serde(default)]
    pub global_secondary_indexes: Vec<SecondaryIndex>,
    #[serde(default)]
    pub local_secondary_indexes: Vec<SecondaryIndex>,
    #[serde(default)]
    pub provisioned_throughput: Option<Throughput>,
    #[serde(default)]
    pub time_to_live_specification: Option<TimeToLive>,
    #[serde(default)]
    pub stream_specification: Option<StreamSpecification>,
    // Accepted; no local effect.
    #[serde(default, rename = "Tags")]
    pub _tags: Option<Value>,
    #[serde(default, rename = "PointInTimeRecoverySpecification")]
    pub _pitr: Option<Value>,
    #[serde(default, rename = "SSESpecification")]
    pub _sse: Option<Value>,
    #[serde(default, rename = "DeletionProtectionEnabled")]
    pub _deletion_protection: Option<Value>,
    #[serde(default, rename = "ContributorInsightsSpecification")]
    pub _contributor_insights: Option<Value>,
    #[serde(default, rename = "TableClass")]
    pub _table_class: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct AttributeDefinition {
    pub attribute_name: String,
    pub attribute_type: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct KeyElement {
    pub attribute_name: String,
    pub key_type: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct SecondaryIndex {
    pub index_name: String,
    pub key_schema: Vec<KeyElement>,
    pub projection: Projection,
    #[serde(default)]
    pub provisioned_throughput: Option<Throughput>,
    #[serde(default, rename = "ContributorInsightsSpecification")]
    pub _contributor_insights: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct Projection {
    #[serde(default)]
    pub projection_type: Option<String>,
    #[serde(default)]
    pub non_key_attributes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct Throughput {
    #[serde(deserialize_with = "lenient_u64")]
    pub read_capacity_units: u64,
    #[serde(deserialize_with = "lenient_u64")]
    pub write_capacity_units: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct TimeToLive {
    pub attribute_name: String,
    #[serde(deserialize_with = "lenient_bool")]
    pub enabled: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct StreamSpecification {
    pub stream_view_type: String,
}

fn table_spec(resolver: &mut Resolver<'_>, decl: &ResourceDecl) -> Result<TableSpec, ModelError> {
    let identity = resolver.identity(&decl.logical_id, "Resources")?;
    let properties: TableProperties = typed_properties(resolver, decl)?;
    Ok(TableSpec {
        logical_id: decl.logical_id.clone(),
        name: identity.name,
        arn: identity.attributes.get("Arn").cloned().unwrap_or_default(),
        properties,
    })
}

// ---------------------------------------------------------------- SQS

/// An SQS queue to provision.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    pub url: String,
    pub fifo: bool,
    /// The queue attributes CreateQueue/SetQueueAttributes take, as SQS spells them.
    pub attributes: BTreeMap<String, String>,
    pub redrive: Option<RedrivePolicy>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedrivePolicy {
    pub dead_letter_target_arn: String,
    #[serde(deserialize_with = "lenient_u64")]
    pub max_receive_count: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct QueueProperties {
    #[serde(default, rename = "QueueName")]
    _queue_name: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    fifo_queue: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    content_based_deduplication: Option<bool>,
    #[serde(default)]
    deduplication_scope: Option<String>,
    #[serde(default)]
    fifo_throughput_limit: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    visibility_timeout: Option<u64>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    message_retention_period: Option<u64>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    delay_seconds: Option<u64>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    maximum_message_size: Option<u64>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    receive_message_wait_time_seconds: Option<u64>,
    #[serde(default)]
    redrive_policy: Option<RedrivePolicy>,
    #[serde(default)]
    redrive_allow_policy: Option<Value>,
    // Accepted; no local effect.
    #[serde(default, rename = "Tags")]
    _tags: Option<Value>,
    #[serde(default, rename = "SqsManagedSseEnabled")]
    _sse: Option<Value>,
    #[serde(default, rename = "KmsMasterKeyId")]
    _kms: Option<Value>,
    #[serde(default, rename = "KmsDataKeyReusePeriodSeconds")]
    _kms_reuse: Option<Value>,
}

fn queue_spec(resolver: &mut Resolver<'_>, decl: &ResourceDecl) -> Result<QueueSpec, ModelError> {
    let identity = resolver.identity(&decl.logical_id, "Resources")?;
    let p: QueueProperties = typed_properties(resolver, decl)?;
    let fifo = p.fifo_queue.unwrap_or(false);
    let mut attributes = BTreeMap::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            attributes.insert(key.to_owned(), value);
        }
    };
    if fifo {
        put("FifoQueue", Some("true".to_owned()));
        put(
            "ContentBasedDeduplication",
            Some(p.content_based_deduplication.unwrap_or(false).to_string()),
        );
    } else if p.content_based_deduplication.is_some() {
        return Err(ModelError::Invalid {
            at: format!("Resources.{}", decl.logical_id),
            what: "ContentBasedDeduplication needs FifoQueue".to_owned(),
        });
    }
    put("DeduplicationScope", p.deduplication_scope);
    put("FifoThroughputLimit", p.fifo_throughput_limit);
    put(
        "VisibilityTimeout",
        p.visibility_timeout.map(|v| v.to_string()),
    );
    put(
        "MessageRetentionPeriod",
        p.message_retention_period.map(|v| v.to_string()),
    );
    put("DelaySeconds", p.delay_seconds.map(|v| v.to_string()));
    put(
        "MaximumMessageSize",
        p.maximum_message_size.map(|v| v.to_string()),
    );
    put(
        "ReceiveMessageWaitTimeSeconds",
        p.receive_message_wait_time_seconds.map(|v| v.to_string()),
    );
    put(
        "RedrivePolicy",
        p.redrive_policy.as_ref().map(|r| {
            serde_json::json!({
                "deadLetterTargetArn": r.dead_letter_target_arn,
                "maxReceiveCount": r.max_receive_count,
            })
            .to_string()
        }),
    );
    put(
        "RedriveAllowPolicy",
        p.redrive_allow_policy.as_ref().map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
    );
    Ok(QueueSpec {
        logical_id: decl.logical_id.clone(),
        name: identity.name,
        arn: identity.attributes.get("Arn").cloned().unwrap_or_default(),
        url: identity.reference,
        fifo,
        attributes,
        redrive: p.redrive_policy,
    })
}

/// Orders queues so every dead-letter target precedes its sources: SQS refuses a
/// redrive policy to a queue that does not exist yet.
fn order_queues(mut pending: Vec<QueueSpec>) -> Vec<QueueSpec> {
    let mut ordered: Vec<QueueSpec> = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let ready = pending.iter().position(|q| match &q.redrive {
            None => true,
            Some(r) => {
                ordered.iter().any(|o| o.arn == r.dead_letter_target_arn)
                    || !pending.iter().any(|p| p.arn == r.dead_letter_target_arn)
            }
        });
        // A redrive cycle cannot be created in SQS either; keep the template order and
        // let SQS report it.
        let index = ready.unwrap_or(0);
        ordered.push(pending.remove(index));
    }
    ordered
}

// ---------------------------------------------------------------- Scheduler

/// An EventBridge Scheduler schedule group to provision.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleGroupSpec {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct ScheduleGroupProperties {
    #[serde(default, rename = "Name")]
    _name: Option<String>,
    #[serde(default, rename = "Tags")]
    _tags: Option<Value>,
}

fn schedule_group_spec(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
) -> Result<ScheduleGroupSpec, ModelError> {
    let identity = resolver.identity(&decl.logical_id, "Resources")?;
    let _: ScheduleGroupProperties = typed_properties(resolver, decl)?;
    Ok(ScheduleGroupSpec {
        logical_id: decl.logical_id.clone(),
        name: identity.name,
        arn: identity.attributes.get("Arn").cloned().unwrap_or_default(),
    })
}

// ---------------------------------------------------------------- Secrets Manager

/// A Secrets Manager secret to provision.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretSpec {
    pub logical_id: String,
    pub name: String,
    /// What `Ref` gives locally: the ARN without the random suffix Secrets Manager
    /// appends when it creates the secret (a partial ARN, which GetSecretValue accepts
    /// like the full one). The suffix is only known once the secret exists, and the
    /// functions' environments are resolved before.
    pub arn: String,
    pub description: Option<String>,
    pub value: SecretValue,
}

/// What a new secret holds. An existing secret keeps its value.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretValue {
    /// `SecretString`, as written.
    Literal(String),
    /// `GenerateSecretString`: a random value, drawn when the secret is created.
    Generated(GeneratedSecret),
}

impl SecretValue {
    /// The value a secret created now gets.
    pub fn draw(&self) -> String {
        match self {
            SecretValue::Literal(text) => text.clone(),
            SecretValue::Generated(generated) => generated.generate(),
        }
    }
}

/// `GenerateSecretString`, as Secrets Manager's GetRandomPassword reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedSecret {
    pub length: usize,
    /// The characters the value is drawn from, after every exclusion.
    pub alphabet: Vec<char>,
    /// Character classes of which the value holds at least one each
    /// (`RequireEachIncludedType`, on by default).
    pub required: Vec<Vec<char>>,
    /// `SecretStringTemplate` and `GenerateStringKey`: the value goes into this JSON
    /// object under that key.
    pub template: Option<(serde_json::Map<String, Value>, String)>,
}

/// The punctuation Secrets Manager draws from (and `ExcludePunctuation` removes).
const PUNCTUATION: &str = r##"!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~"##;

impl GeneratedSecret {
    /// A fresh value from the operating system's entropy (rand's CSPRNG).
    pub fn generate(&self) -> String {
        use rand::seq::IndexedRandom as _;
        let mut rng = rand::rng();
        // Drawn whole and redrawn until every required class is present: no position
        // is biased towards a class. With 64 characters of three classes a redraw is
        // rare (about 1 in 10^5).
        let password = loop {
            let candidate: String = (0..self.length)
                .filter_map(|_| self.alphabet.choose(&mut rng))
                .collect();
            if self
                .required
                .iter()
                .all(|class| candidate.chars().any(|c| class.contains(&c)))
            {
                break candidate;
            }
        };
        match &self.template {
            None => password,
            Some((object, key)) => {
                let mut object = object.clone();
                object.insert(key.clone(), Value::String(password));
                Value::Object(object).to_string()
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct SecretProperties {
    #[serde(default, rename = "Name")]
    _name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    secret_string: Option<String>,
    #[serde(default)]
    generate_secret_string: Option<GenerateSecretString>,
    // Accepted; no local effect.
    #[serde(default, rename = "KmsKeyId")]
    _kms: Option<Value>,
    #[serde(default, rename = "Tags")]
    _tags: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct GenerateSecretString {
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    password_length: Option<u64>,
    #[serde(default)]
    exclude_characters: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    exclude_lowercase: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    exclude_uppercase: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    exclude_numbers: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    exclude_punctuation: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    include_space: Option<bool>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    require_each_included_type: Option<bool>,
    #[serde(default)]
    secret_string_template: Option<String>,
    #[serde(default)]
    generate_string_key: Option<String>,
}

fn secret_spec(resolver: &mut Resolver<'_>, decl: &ResourceDecl) -> Result<SecretSpec, ModelError> {
    let at = format!("Resources.{}", decl.logical_id);
    let invalid = |what: &str| ModelError::Invalid {
        at: at.clone(),
        what: what.to_owned(),
    };
    let identity = resolver.identity(&decl.logical_id, "Resources")?;
    let p: SecretProperties = typed_properties(resolver, decl)?;
    let value = match (p.secret_string, p.generate_secret_string) {
        (Some(text), None) => SecretValue::Literal(text),
        (None, Some(generate)) => SecretValue::Generated(generated_secret(generate, &invalid)?),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "SecretString and GenerateSecretString are mutually exclusive",
            ));
        }
        (None, None) => {
            return Err(invalid(
                "the local stack needs SecretString or GenerateSecretString",
            ));
        }
    };
    Ok(SecretSpec {
        logical_id: decl.logical_id.clone(),
        name: identity.name,
        arn: identity.reference,
        description: p.description,
        value,
    })
}

fn generated_secret(
    g: GenerateSecretString,
    invalid: &impl Fn(&str) -> ModelError,
) -> Result<GeneratedSecret, ModelError> {
    let length = g.password_length.unwrap_or(32);
    if !(1..=4096).contains(&length) {
        return Err(invalid("PasswordLength must be 1 to 4096"));
    }
    let excluded: Vec<char> = g.exclude_characters.unwrap_or_default().chars().collect();
    let classes: Vec<(bool, Vec<char>)> = [
        (g.exclude_lowercase, ('a'..='z').collect::<Vec<_>>()),
        (g.exclude_uppercase, ('A'..='Z').collect()),
        (g.exclude_numbers, ('0'..='9').collect()),
        (g.exclude_punctuation, PUNCTUATION.chars().collect()),
        (Some(!g.include_space.unwrap_or(false)), vec![' ']),
    ]
    .into_iter()
    .map(|(exclude, class)| {
        let kept = class
            .into_iter()
            .filter(|c| !excluded.contains(c))
            .collect();
        (!exclude.unwrap_or(false), kept)
    })
    .collect();
    let included: Vec<Vec<char>> = classes
        .into_iter()
        .filter(|(included, class)| *included && !class.is_empty())
        .map(|(_, class)| class)
        .collect();
    let alphabet: Vec<char> = included.concat();
    if alphabet.is_empty() {
        return Err(invalid("GenerateSecretString excludes every character"));
    }
    let required = if g.require_each_included_type.unwrap_or(true) {
        included
    } else {
        Vec::new()
    };
    if required.len() as u64 > length {
        return Err(invalid(
            "PasswordLength is shorter than the character types RequireEachIncludedType asks for",
        ));
    }
    let template = match (g.secret_string_template, g.generate_string_key) {
        (None, None) => None,
        (Some(template), Some(key)) => match serde_json::from_str(&template) {
            Ok(Value::Object(object)) => Some((object, key)),
            _ => return Err(invalid("SecretStringTemplate must be a JSON object")),
        },
        _ => {
            return Err(invalid(
                "SecretStringTemplate and GenerateStringKey go together",
            ));
        }
    };
    Ok(GeneratedSecret {
        length: length as usize,
        alphabet,
        required,
        template,
    })
}

// ---------------------------------------------------------------- HTTP API

/// An `AWS::ApiGatewayV2::Api` defined by an OpenAPI body (as SAM writes an `HttpApi`),
/// with its stage.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpApiSpec {
    pub logical_id: String,
    pub api_id: String,
    pub stage: String,
    pub stage_variables: BTreeMap<String, String>,
    /// The body's JWT authorizers, by security scheme name.
    pub authorizers: BTreeMap<String, JwtAuthorizerSpec>,
    /// `x-amazon-apigateway-cors`: API Gateway answers preflights and adds the CORS
    /// headers.
    pub cors: Option<CorsSpec>,
    /// The stage's `DefaultRouteSettings` throttling.
    pub default_throttle: Option<Throttle>,
}

/// An HTTP API's CORS configuration, as the OpenAPI extension spells it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CorsSpec {
    #[serde(default)]
    pub allow_origins: Vec<String>,
    #[serde(default)]
    pub allow_methods: Vec<String>,
    #[serde(default)]
    pub allow_headers: Vec<String>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default, deserialize_with = "lenient_opt_u64")]
    pub max_age: Option<u64>,
    #[serde(default, deserialize_with = "lenient_opt_bool")]
    pub allow_credentials: Option<bool>,
}

impl CorsSpec {
    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if allowed.
    pub fn allowed_origin(&self, origin: &str) -> Option<String> {
        if self.allow_origins.iter().any(|o| o == "*") {
            Some("*".to_owned())
        } else {
            self.allow_origins
                .iter()
                .find(|o| o.eq_ignore_ascii_case(origin))
                .map(|_| origin.to_owned())
        }
    }
}

/// A route's throttle: a token bucket of `burst_limit` refilled at `rate_limit` per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    pub rate_limit: f64,
    pub burst_limit: u64,
}

/// A JWT authorizer: what API Gateway checks before the function runs.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtAuthorizerSpec {
    pub name: String,
    pub issuer: String,
    pub audience: Vec<String>,
    /// The request header that carries the token (`Authorization`).
    pub header: String,
}

/// Which authorizer guards a route.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteAuth {
    Public,
    Jwt {
        authorizer: JwtAuthorizerSpec,
        /// Scopes of which the token must carry at least one (none: any token).
        scopes: Vec<String>,
    },
}

/// One route of an HTTP API, integrated with a function.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    pub api_id: String,
    pub stage: String,
    pub stage_variables: BTreeMap<String, String>,
    /// Upper case, or `ANY`.
    pub method: String,
    /// `/sales/{sale_id}/grab/{token}`; `{name+}` is a greedy parameter.
    pub path: String,
    pub auth: RouteAuth,
    /// The stage's `RouteSettings` throttle for this route, else its default.
    pub throttle: Option<Throttle>,
}

impl RouteSpec {
    /// API Gateway's route key: `POST /sales/{sale_id}`.
    pub fn route_key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// The parts of an OpenAPI body API Gateway acts on; the rest (`info`, `responses`,
/// `parameters`) documents the API and has no local effect.
#[derive(Deserialize)]
struct OpenApiBody {
    paths: BTreeMap<String, BTreeMap<String, Value>>,
    #[serde(default)]
    components: Option<OpenApiComponents>,
    /// The operations' default security requirement.
    #[serde(default)]
    security: Option<Vec<BTreeMap<String, Vec<String>>>>,
    #[serde(default, rename = "x-amazon-apigateway-cors")]
    cors: Option<CorsSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OpenApiComponents {
    #[serde(default)]
    security_schemes: BTreeMap<String, SecurityScheme>,
}

#[derive(Deserialize)]
struct SecurityScheme {
    #[serde(rename = "x-amazon-apigateway-authorizer")]
    authorizer: Option<ApiAuthorizer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiAuthorizer {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    identity_source: Option<Value>,
    #[serde(default)]
    jwt_configuration: Option<JwtConfiguration>,
}

#[derive(Deserialize)]
struct JwtConfiguration {
    issuer: String,
    #[serde(default)]
    audience: Vec<String>,
}

#[derive(Deserialize)]
struct Operation {
    #[serde(default)]
    security: Option<Vec<BTreeMap<String, Vec<String>>>>,
    #[serde(rename = "x-amazon-apigateway-integration")]
    integration: Integration,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Integration {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    payload_format_version: Option<String>,
    uri: String,
}

/// An `AWS::ApiGatewayV2::Stage`'s settings that shape requests.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StageSettings {
    stage_name: String,
    #[serde(default)]
    stage_variables: BTreeMap<String, Value>,
    #[serde(default)]
    default_route_settings: Option<Value>,
    #[serde(default)]
    route_settings: BTreeMap<String, Value>,
}

const OPENAPI_METHODS: [&str; 8] = [
    "get",
    "put",
    "post",
    "delete",
    "options",
    "head",
    "patch",
    "x-amazon-apigateway-any-method",
];

/// The API `decl` with its stage among `stages`, and its routes, each with the ARN the
/// integration invokes.
fn http_api_spec(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
    stages: &[&ResourceDecl],
) -> Result<(HttpApiSpec, Vec<(String, RouteSpec)>), ModelError> {
    let at = format!("Resources.{}.Properties", decl.logical_id);
    let api_id = resolver.identity(&decl.logical_id, &at)?.reference;
    let body_node = decl
        .properties
        .get("Body")
        .ok_or_else(|| ModelError::Invalid {
            at: at.clone(),
            what: "only an API defined by an OpenAPI Body (as SAM writes an HttpApi) is emulated"
                .to_owned(),
        })?;
    let body_at = format!("{at}.Body");
    let body: OpenApiBody = from_value(resolver.eval(body_node, &body_at)?, &body_at)?;

    let mut stage = None;
    for candidate in stages {
        let stage_at = format!("Resources.{}.Properties", candidate.logical_id);
        let Some(api) = candidate.properties.get("ApiId") else {
            continue;
        };
        if value_string(&resolver.eval(api, &stage_at)?).as_deref() != Some(api_id.as_str()) {
            continue;
        }
        // Only what shapes a request: the access log's destination has no local value.
        let mut settings = serde_json::Map::new();
        for key in [
            "StageName",
            "StageVariables",
            "DefaultRouteSettings",
            "RouteSettings",
        ] {
            if let Some(node) = candidate.properties.get(key) {
                settings.insert(
                    key.to_owned(),
                    resolver.eval(node, &format!("{stage_at}.{key}"))?,
                );
            }
        }
        let settings: StageSettings = from_value(Value::Object(settings), &stage_at)?;
        stage = Some((settings, stage_at));
    }
    let (stage_name, stage_variables, default_throttle, route_throttles) = match stage {
        None => (
            "$default".to_owned(),
            BTreeMap::new(),
            None,
            BTreeMap::new(),
        ),
        Some((settings, stage_at)) => {
            let default_throttle = match settings.default_route_settings {
                Some(value) => throttle(value, &stage_at)?,
                None => None,
            };
            let mut route_throttles = BTreeMap::new();
            for (route_key, value) in settings.route_settings {
                if let Some(limit) = throttle(value, &format!("{stage_at}.RouteSettings"))? {
                    route_throttles.insert(route_key, limit);
                }
            }
            let variables = string_map(
                Value::Object(settings.stage_variables.into_iter().collect()),
                &stage_at,
            )?;
            (
                settings.stage_name,
                variables,
                default_throttle,
                route_throttles,
            )
        }
    };

    let mut authorizers = BTreeMap::new();
    let schemes = body
        .components
        .map(|c| c.security_schemes)
        .unwrap_or_default();
    for (name, scheme) in schemes {
        let scheme_at = format!("{body_at}.components.securitySchemes.{name}");
        let authorizer = scheme
            .authorizer
            .filter(|a| a.kind == "jwt")
            .ok_or_else(|| ModelError::UnsupportedAuthorizer {
                at: scheme_at.clone(),
            })?;
        let jwt = authorizer
            .jwt_configuration
            .ok_or_else(|| ModelError::Invalid {
                at: scheme_at.clone(),
                what: "a JWT authorizer needs a jwtConfiguration".to_owned(),
            })?;
        // API Gateway takes the identity source as a string or a list of one.
        let source = match authorizer.identity_source {
            None => "$request.header.Authorization".to_owned(),
            Some(Value::Array(items)) => items.first().and_then(value_string).unwrap_or_default(),
            Some(other) => value_string(&other).unwrap_or_default(),
        };
        let header = source
            .strip_prefix("$request.header.")
            .ok_or_else(|| ModelError::Invalid {
                at: scheme_at.clone(),
                what: format!("identitySource {source} is not a request header"),
            })?
            .to_owned();
        authorizers.insert(
            name.clone(),
            JwtAuthorizerSpec {
                name,
                issuer: jwt.issuer,
                audience: jwt.audience,
                header,
            },
        );
    }

    let mut routes = Vec::new();
    for (path, operations) in body.paths {
        for (method, operation) in operations {
            if !OPENAPI_METHODS.contains(&method.as_str()) {
                continue;
            }
            let op_at = format!("{body_at}.paths.{path}.{method}");
            let operation: Operation = from_value(operation, &op_at)?;
            let integration = operation.integration;
            if integration.kind != "aws_proxy"
                || integration.payload_format_version.as_deref() != Some("2.0")
            {
                return Err(ModelError::Invalid {
                    at: op_at,
                    what: "only Lambda proxy integrations of payload format 2.0 are emulated"
                        .to_owned(),
                });
            }
            let function_arn = integration
                .uri
                .split_once("/functions/")
                .and_then(|(_, rest)| rest.strip_suffix("/invocations"))
                .ok_or_else(|| ModelError::Invalid {
                    at: op_at.clone(),
                    what: format!("integration uri {} invokes no function", integration.uri),
                })?
                .to_owned();
            let auth = match operation.security.or_else(|| body.security.clone()) {
                None => RouteAuth::Public,
                Some(requirements) => match requirements.into_iter().next() {
                    None => RouteAuth::Public,
                    Some(requirement) => match requirement.into_iter().next() {
                        None => RouteAuth::Public,
                        // SAM marks an `Authorizer: NONE` route so.
                        Some((name, _)) if name == "NONE" => RouteAuth::Public,
                        Some((name, scopes)) => RouteAuth::Jwt {
                            authorizer: authorizers.get(&name).cloned().ok_or_else(|| {
                                ModelError::UnknownAuthorizer {
                                    at: op_at.clone(),
                                    name: name.clone(),
                                    api: decl.logical_id.clone(),
                                }
                            })?,
                            scopes,
                        },
                    },
                },
            };
            let method = match method.as_str() {
                "x-amazon-apigateway-any-method" => "ANY".to_owned(),
                other => other.to_ascii_uppercase(),
            };
            let route_key = format!("{method} {path}");
            routes.push((
                function_arn,
                RouteSpec {
                    api_id: api_id.clone(),
                    stage: stage_name.clone(),
                    stage_variables: stage_variables.clone(),
                    throttle: route_throttles
                        .get(&route_key)
                        .copied()
                        .or(default_throttle),
                    method,
                    path: path.clone(),
                    auth,
                },
            ));
        }
    }
    Ok((
        HttpApiSpec {
            logical_id: decl.logical_id.clone(),
            api_id,
            stage: stage_name,
            stage_variables,
            authorizers,
            cors: body.cors,
            default_throttle,
        },
        routes,
    ))
}

/// The throttle of a `RouteSettings`/`DefaultRouteSettings` value, if it sets one.
fn throttle(value: Value, at: &str) -> Result<Option<Throttle>, ModelError> {
    let number = |key: &str| -> Result<Option<f64>, ModelError> {
        match value.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(Value::String(s)) => s.trim().parse().map(Some).map_err(|_| ModelError::Invalid {
                at: at.to_owned(),
                what: format!("{key} must be a number"),
            }),
            Some(other) => Err(ModelError::Invalid {
                at: at.to_owned(),
                what: format!("{key} must be a number, found {other}"),
            }),
        }
    };
    let rate = number("ThrottlingRateLimit")?;
    let burst = number("ThrottlingBurstLimit")?;
    Ok(match (rate, burst) {
        (None, None) => None,
        (rate, burst) => Some(Throttle {
            // An unset half is unlimited, as in API Gateway.
            rate_limit: rate.unwrap_or(f64::INFINITY),
            burst_limit: burst.map(|b| b as u64).unwrap_or(u64::MAX),
        }),
    })
}

// ---------------------------------------------------------------- functions

/// One function: which bootstrap it runs, its resolved environment and its triggers.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    /// The cargo bin SAM's rust-cargolambda build makes its bootstrap of
    /// (`Metadata.BuildProperties.Binary`): picks the in-process implementation.
    pub binary: String,
    pub timeout: Duration,
    /// Its environment variables, every intrinsic resolved.
    pub environment: BTreeMap<String, String>,
    pub routes: Vec<RouteSpec>,
    pub sqs_sources: Vec<SqsSourceSpec>,
    /// EventBridge rules that invoke the function on a rate.
    pub schedules: Vec<RuleSpec>,
    pub async_invoke: AsyncInvokeConfig,
    /// `ReservedConcurrentExecutions`: how many invocations may run at once.
    pub reserved_concurrency: Option<u32>,
}

impl FunctionSpec {
    /// Whether `target` (its name or ARN, either one qualified by a version or an alias,
    /// as Lambda takes them) invokes this function: locally one build of each runs.
    pub fn is_invoked_by(&self, target: &str) -> bool {
        [self.arn.as_str(), self.name.as_str()]
            .iter()
            .any(|unqualified| {
                target.strip_prefix(unqualified).is_some_and(|rest| {
                    rest.is_empty() || (rest.starts_with(':') && !rest[1..].contains(':'))
                })
            })
    }
}

/// An `AWS::Events::Rule` target: a `rate(...)` schedule that invokes a function.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    /// The rule's logical id.
    pub logical_id: String,
    pub rule_name: String,
    pub rule_arn: String,
    pub expression: String,
    pub period: Duration,
    /// The target's `Input`: sent instead of the Scheduled Event when set.
    pub input: Option<Value>,
    pub enabled: bool,
}

/// The period of an EventBridge `rate(N minute|minutes|hour|hours|day|days)` expression.
pub fn rate_period(expression: &str) -> Option<Duration> {
    let inner = expression.trim().strip_prefix("rate(")?.strip_suffix(')')?;
    let (count, unit) = inner.trim().split_once(' ')?;
    let count: u64 = count.parse().ok().filter(|n| *n > 0)?;
    let unit_secs = match (count, unit.trim()) {
        (1, "minute") | (2.., "minutes") => 60,
        (1, "hour") | (2.., "hours") => 3600,
        (1, "day") | (2.., "days") => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(count * unit_secs))
}

/// An `AWS::Lambda::EventSourceMapping` from an SQS queue.
#[derive(Debug, Clone, PartialEq)]
pub struct SqsSourceSpec {
    /// The mapping's logical id.
    pub logical_id: String,
    pub queue_arn: String,
    pub queue_url: String,
    pub batch_size: i32,
    pub report_batch_item_failures: bool,
    pub enabled: bool,
    pub maximum_batching_window: Duration,
}

/// How Lambda retries an asynchronous invocation (EventBridge Scheduler invokes
/// asynchronously): `AWS::Lambda::EventInvokeConfig`, with Lambda's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct AsyncInvokeConfig {
    pub maximum_retry_attempts: u32,
    pub maximum_event_age: Duration,
    /// An SQS queue ARN that receives the invocation record once retries are exhausted.
    pub on_failure_queue_arn: Option<String>,
}

impl Default for AsyncInvokeConfig {
    fn default() -> Self {
        Self {
            maximum_retry_attempts: 2,
            maximum_event_age: Duration::from_secs(6 * 3600),
            on_failure_queue_arn: None,
        }
    }
}

fn function_spec(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
) -> Result<FunctionSpec, ModelError> {
    let id = &decl.logical_id;
    let at = format!("Resources.{id}.Properties");
    let identity = resolver.identity(id, &at)?;
    let properties = &decl.properties;
    let binary = decl
        .metadata
        .get("BuildProperties")
        .and_then(|p| p.get("Binary"))
        .and_then(Node::as_str)
        .ok_or_else(|| ModelError::Invalid {
            at: format!("Resources.{id}.Metadata"),
            what:
                "BuildProperties.Binary must name the function's bin (SAM's rust-cargolambda build)"
                    .to_owned(),
        })?
        .to_owned();
    let timeout = match properties.get("Timeout") {
        Some(node) => {
            let value = resolver.eval(node, &format!("{at}.Timeout"))?;
            Duration::from_secs(u64_value(&value, &at)?)
        }
        // Lambda's default.
        None => Duration::from_secs(3),
    };
    let environment = match properties
        .get("Environment")
        .and_then(|e| e.get("Variables"))
    {
        Some(node) => string_map(
            resolver.eval(node, &format!("{at}.Environment.Variables"))?,
            &at,
        )?,
        None => BTreeMap::new(),
    };
    let reserved_concurrency = match properties.get("ReservedConcurrentExecutions") {
        Some(node) => match resolver.eval(node, &format!("{at}.ReservedConcurrentExecutions"))? {
            Value::Null => None,
            value => Some(u64_value(&value, &at)? as u32),
        },
        None => None,
    };
    Ok(FunctionSpec {
        logical_id: id.clone(),
        name: identity.name,
        arn: identity.attributes.get("Arn").cloned().unwrap_or_default(),
        binary,
        timeout,
        environment,
        routes: Vec::new(),
        sqs_sources: Vec::new(),
        schedules: Vec::new(),
        async_invoke: AsyncInvokeConfig::default(),
        reserved_concurrency,
    })
}

/// The function among `functions` that `target` invokes.
fn invoked<'f>(
    functions: &'f mut [FunctionSpec],
    target: &str,
    at: &str,
) -> Result<&'f mut FunctionSpec, ModelError> {
    functions
        .iter_mut()
        .find(|f| f.is_invoked_by(target))
        .ok_or_else(|| ModelError::UnknownFunction {
            at: at.to_owned(),
            target: target.to_owned(),
        })
}

/// An `AWS::Events::Rule`'s schedule, once per target: (the target's ARN, the rule).
fn rule_specs(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
) -> Result<Vec<(String, RuleSpec)>, ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
        #[serde(default)]
        schedule_expression: Option<String>,
        #[serde(default)]
        state: Option<String>,
        #[serde(default, rename = "Name")]
        _name: Option<String>,
        #[serde(default, rename = "Description")]
        _description: Option<String>,
        #[serde(default)]
        targets: Vec<Target>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Target {
        arn: String,
        #[serde(rename = "Id")]
        _id: String,
        #[serde(default)]
        input: Option<String>,
    }
    let at = format!("Resources.{}.Properties", decl.logical_id);
    let raw: Raw = typed_properties(resolver, decl)?;
    let expression = raw.schedule_expression.ok_or_else(|| ModelError::Invalid {
        at: at.clone(),
        what: "only scheduled rules are emulated locally, not event patterns".to_owned(),
    })?;
    let period = rate_period(&expression).ok_or_else(|| ModelError::Invalid {
        at: at.clone(),
        what: format!("schedule {expression:?}: only rate(...) rules are emulated locally"),
    })?;
    let identity = resolver.identity(&decl.logical_id, &at)?;
    let enabled = raw.state.as_deref().is_none_or(|state| state == "ENABLED");
    raw.targets
        .into_iter()
        .map(|target| {
            let input = target
                .input
                .map(|text| {
                    serde_json::from_str(&text).map_err(|e| ModelError::Invalid {
                        at: at.clone(),
                        what: format!("Input is not JSON: {e}"),
                    })
                })
                .transpose()?;
            Ok((
                target.arn,
                RuleSpec {
                    logical_id: decl.logical_id.clone(),
                    rule_name: identity.name.clone(),
                    rule_arn: identity.reference.clone(),
                    expression: expression.clone(),
                    period,
                    input,
                    enabled,
                },
            ))
        })
        .collect()
}

/// An `AWS::Lambda::EventInvokeConfig`: (the function it configures, the config).
fn async_invoke_config(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
) -> Result<(String, AsyncInvokeConfig), ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
        function_name: String,
        qualifier: String,
        #[serde(default, deserialize_with = "lenient_opt_u64")]
        maximum_retry_attempts: Option<u64>,
        #[serde(default, deserialize_with = "lenient_opt_u64")]
        maximum_event_age_in_seconds: Option<u64>,
        #[serde(default)]
        destination_config: Option<DestinationConfig>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct DestinationConfig {
        #[serde(default)]
        on_failure: Option<Destination>,
        #[serde(default, rename = "OnSuccess")]
        _on_success: Option<Value>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Destination {
        destination: String,
    }
    let at = format!("Resources.{}.Properties", decl.logical_id);
    let raw: Raw = typed_properties(resolver, decl)?;
    if let Some(n) = raw.maximum_retry_attempts
        && n > 2
    {
        return Err(ModelError::Invalid {
            at,
            what: format!("MaximumRetryAttempts {n}: Lambda allows 0..=2"),
        });
    }
    let defaults = AsyncInvokeConfig::default();
    let on_failure_queue_arn = match raw.destination_config.and_then(|d| d.on_failure) {
        None => None,
        Some(d) if d.destination.starts_with("arn:aws:sqs:") => Some(d.destination),
        Some(d) => {
            return Err(ModelError::Invalid {
                at,
                what: format!(
                    "only SQS OnFailure destinations are emulated, not {}",
                    d.destination
                ),
            });
        }
    };
    Ok((
        format!("{}:{}", raw.function_name, raw.qualifier),
        AsyncInvokeConfig {
            maximum_retry_attempts: raw
                .maximum_retry_attempts
                .map(|n| n as u32)
                .unwrap_or(defaults.maximum_retry_attempts),
            maximum_event_age: raw
                .maximum_event_age_in_seconds
                .map(Duration::from_secs)
                .unwrap_or(defaults.maximum_event_age),
            on_failure_queue_arn,
        },
    ))
}

/// An `AWS::Lambda::EventSourceMapping` from one of `queues`: (the function it
/// invokes, the mapping).
fn sqs_source_spec(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
    queues: &[QueueSpec],
) -> Result<(String, SqsSourceSpec), ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
        event_source_arn: String,
        function_name: String,
        #[serde(default, deserialize_with = "lenient_opt_u64")]
        batch_size: Option<u64>,
        #[serde(default)]
        function_response_types: Vec<String>,
        #[serde(default, deserialize_with = "lenient_opt_bool")]
        enabled: Option<bool>,
        #[serde(default, deserialize_with = "lenient_opt_u64")]
        maximum_batching_window_in_seconds: Option<u64>,
        // Concurrency limits: locally a single poller runs.
        #[serde(default, rename = "ScalingConfig")]
        _scaling: Option<Value>,
    }
    let at = format!("Resources.{}.Properties", decl.logical_id);
    let raw: Raw = typed_properties(resolver, decl)?;
    let queue = queues
        .iter()
        .find(|q| q.arn == raw.event_source_arn)
        .ok_or_else(|| ModelError::UnknownEventSource {
            at: at.clone(),
            arn: raw.event_source_arn.clone(),
        })?;
    let batch_size = raw.batch_size.unwrap_or(10);
    // ReceiveMessage takes at most 10; larger batches need a batching window, which the
    // local poller does not assemble across receives.
    if !(1..=10).contains(&batch_size) {
        return Err(ModelError::Invalid {
            at,
            what: format!("BatchSize {batch_size}: the local event source mapping supports 1..=10"),
        });
    }
    Ok((
        raw.function_name,
        SqsSourceSpec {
            logical_id: decl.logical_id.clone(),
            queue_arn: queue.arn.clone(),
            queue_url: queue.url.clone(),
            batch_size: batch_size as i32,
            report_batch_item_failures: raw
                .function_response_types
                .iter()
                .any(|t| t == "ReportBatchItemFailures"),
            enabled: raw.enabled.unwrap_or(true),
            maximum_batching_window: Duration::from_secs(
                raw.maximum_batching_window_in_seconds.unwrap_or(0),
            ),
        },
    ))
}

// ---------------------------------------------------------------- helpers

fn typed_properties<T: DeserializeOwned>(
    resolver: &mut Resolver<'_>,
    decl: &ResourceDecl,
) -> Result<T, ModelError> {
    let at = format!("Resources.{}.Properties", decl.logical_id);
    let value = resolver.eval(&decl.properties, &at)?;
    from_value(value, &at)
}

fn from_value<T: DeserializeOwned>(value: Value, at: &str) -> Result<T, ModelError> {
    // Round trip through text so serde_path_to_error can name the offending field.
    let text = value.to_string();
    let mut de = serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(&mut de).map_err(|source| ModelError::Properties {
        at: at.to_owned(),
        source,
    })
}

fn u64_value(value: &Value, at: &str) -> Result<u64, ModelError> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| ModelError::Invalid {
        at: at.to_owned(),
        what: format!("expected a whole number, found {value}"),
    })
}

fn string_map(value: Value, at: &str) -> Result<BTreeMap<String, String>, ModelError> {
    let Value::Object(map) = value else {
        return Err(ModelError::Invalid {
            at: at.to_owned(),
            what: "expected a mapping".to_owned(),
        });
    };
    map.into_iter()
        .map(|(k, v)| {
            let v = value_string(&v).ok_or_else(|| ModelError::Invalid {
                at: format!("{at}.{k}"),
                what: "expected a scalar".to_owned(),
            })?;
            Ok((k, v))
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Lenient {
    Bool(bool),
    Number(u64),
    String(String),
}

pub(crate) fn lenient_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Lenient::deserialize(d)? {
        Lenient::Number(n) => Ok(n),
        Lenient::String(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number"))),
        Lenient::Bool(b) => Err(serde::de::Error::custom(format!("{b} is not a number"))),
    }
}

fn lenient_opt_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    lenient_u64(d).map(Some)
}

fn lenient_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Lenient::deserialize(d)? {
        Lenient::Bool(b) => Ok(b),
        Lenient::String(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Lenient::String(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(serde::de::Error::custom("expected a boolean")),
    }
}

fn lenient_opt_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    lenient_bool(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn project_template(overrides: &BTreeMap<String, String>) -> Template {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        Template::expand(&path, overrides)
            .expect("template.yaml expands with aws-sam-translator (make template-tools)")
    }

    fn context() -> StackContext {
        StackContext {
            stack_name: "st".to_owned(),
            region: "us-east-1".to_owned(),
            account_id: "123456789012".to_owned(),
            sqs_endpoint: "http://127.0.0.1:5000".to_owned(),
        }
    }

    #[test]
    fn the_project_template_evaluates_to_its_resources_routes_and_environments() {
        let overrides = BTreeMap::from([
            ("OrdersVisibilityTimeout".to_owned(), "2".to_owned()),
            (
                "SalePageOrigin".to_owned(),
                "https://shop.example".to_owned(),
            ),
        ]);
        let model =
            StackModel::build(&project_template(&overrides), context(), &overrides).expect("model");

        let table = model.table("Table").expect("table");
        assert_eq!(table.name, "st-table");
        assert_eq!(
            table.properties.global_secondary_indexes[0].index_name,
            "gsi1"
        );

        let orders = model.queue("OrdersQueue").expect("orders queue");
        let dlq_position = model
            .queues
            .iter()
            .position(|q| q.logical_id == "OrdersDLQ");
        let orders_position = model
            .queues
            .iter()
            .position(|q| q.logical_id == "OrdersQueue");
        assert!(dlq_position < orders_position, "the DLQ is created first");
        assert_eq!(orders.attributes["VisibilityTimeout"], "2");
        assert_eq!(orders.attributes["FifoQueue"], "true");
        let redrive = orders.redrive.as_ref().expect("redrive");
        assert_eq!(
            redrive.dead_letter_target_arn,
            "arn:aws:sqs:us-east-1:123456789012:st-orders-dlq.fifo"
        );
        assert_eq!(redrive.max_receive_count, 5);

        let consumer = model.function("OrderConsumerFunction").expect("consumer");
        assert_eq!(consumer.binary, "order-consumer");
        assert_eq!(consumer.timeout, Duration::from_secs(30));
        assert_eq!(
            consumer.environment["TABLE_NAME"], "st-table",
            "SAM merged the Globals"
        );
        assert_eq!(
            consumer.environment["RELEASE_FUNCTION_ARN"],
            "arn:aws:lambda:us-east-1:123456789012:function:st-ReleaseFunction:live",
            "timers invoke the release's live alias, so a rollback moves them too"
        );
        assert_eq!(
            consumer.environment["ORDERS_DLQ_URL"],
            "http://127.0.0.1:5000/123456789012/st-orders-dlq.fifo"
        );
        let source = &consumer.sqs_sources[0];
        assert_eq!(source.queue_url, orders.url);
        assert_eq!(source.batch_size, 10);
        assert!(source.report_batch_item_failures);

        let grab = model.function("GrabFunction").expect("grab");
        assert_eq!(grab.environment["SOLD_OUT_RECHECK_MS"], "1000");
        let secret = model
            .secret("GrabTokenSecret")
            .expect("the grab-token secret");
        assert_eq!(secret.name, "st-GrabTokenSecret");
        assert_eq!(
            grab.environment["GRAB_TOKEN_SECRET_ARN"],
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:st-GrabTokenSecret"
        );
        assert_eq!(grab.environment["GRAB_TOKEN_SECRET_ARN"], secret.arn);
        let SecretValue::Generated(generated) = &secret.value else {
            panic!("the stack generates the key: {:?}", secret.value);
        };
        assert_eq!(generated.length, 64);
        let key = generated.generate();
        assert_eq!(key.len(), 64, "{key}");
        assert!(key.chars().all(|c| c.is_ascii_alphanumeric()), "{key}");
        assert_ne!(key, generated.generate(), "each draw is fresh");
        assert!(
            model.generated_parameters.is_empty(),
            "no parameter is a secret any more: {:?}",
            model.generated_parameters
        );

        let get_sale = model
            .routes()
            .find(|(_, r)| r.route_key() == "GET /sales/{sale_id}")
            .expect("route");
        assert_eq!(get_sale.1.auth, RouteAuth::Public);
        let (owner, create) = model
            .routes()
            .find(|(_, r)| r.route_key() == "POST /admin/sales")
            .expect("route");
        assert_eq!(owner.logical_id, "ApiFunction");
        match &create.auth {
            RouteAuth::Jwt { authorizer, scopes } => {
                assert_eq!(authorizer.header, "Authorization");
                assert_eq!(authorizer.audience, vec!["flashsale".to_owned()]);
                assert!(scopes.is_empty());
            }
            RouteAuth::Public => panic!("admin route must be protected"),
        }
        assert_eq!(create.stage, "dev");
        let grab = model
            .routes()
            .find(|(_, r)| r.route_key() == "POST /sales/{sale_id}/grab/{token}")
            .expect("route");
        assert_eq!(
            grab.1.throttle,
            Some(Throttle {
                rate_limit: 300.0,
                burst_limit: 50
            }),
            "the route's settings win over the API default"
        );
        assert_eq!(
            create.throttle.map(|t| t.burst_limit),
            Some(2000),
            "other routes get DefaultRouteSettings"
        );
        let cors = model.apis[0].cors.as_ref().expect("the API has CORS");
        assert_eq!(
            cors.allowed_origin("https://shop.example"),
            Some("https://shop.example".to_owned()),
            "the override reached SAM, which resolves the CORS origins itself"
        );
        assert_eq!(cors.allowed_origin("https://elsewhere.example"), None);
        assert_eq!(cors.max_age, Some(600));

        let release = model.function("ReleaseFunction").expect("release");
        assert_eq!(release.async_invoke.maximum_retry_attempts, 2);
        assert_eq!(
            release.async_invoke.on_failure_queue_arn.as_deref(),
            Some("arn:aws:sqs:us-east-1:123456789012:st-release-failures")
        );
        let reconciler = model.function("ReconcilerFunction").expect("reconciler");
        assert_eq!(reconciler.schedules.len(), 1);
        assert_eq!(reconciler.schedules[0].period, Duration::from_secs(60));
        assert_eq!(reconciler.async_invoke.maximum_retry_attempts, 0);
        assert_eq!(
            model
                .function("GrabFunction")
                .and_then(|f| f.reserved_concurrency),
            Some(120)
        );
        assert_eq!(
            model
                .function_by_arn(
                    "arn:aws:lambda:us-east-1:123456789012:function:st-ReleaseFunction:$LATEST"
                )
                .map(|f| f.logical_id.as_str()),
            Some("ReleaseFunction")
        );
    }

    #[test]
    fn an_unknown_table_property_is_an_error_naming_it() {
        let template = Template::from_json(json!({"Resources": {"T": {
            "Type": "AWS::DynamoDB::Table",
            "Properties": {
                "KeySchema": [],
                "AttributeDefinitions": [],
                "KinesisStreamSpecification": {},
            },
        }}}))
        .expect("reads");
        let err = StackModel::build(&template, context(), &BTreeMap::new()).expect_err("rejected");
        assert!(
            err.to_string().contains("KinesisStreamSpecification"),
            "{err}"
        );
    }

    fn secret_model(generate: Value) -> Result<StackModel, ModelError> {
        let template = Template::from_json(json!({"Resources": {"S": {
            "Type": "AWS::SecretsManager::Secret",
            "Properties": {"GenerateSecretString": generate},
        }}}))
        .expect("reads");
        StackModel::build(&template, context(), &BTreeMap::new())
    }

    fn generated(generate: Value) -> GeneratedSecret {
        match secret_model(generate).expect("model").secrets[0]
            .value
            .clone()
        {
            SecretValue::Generated(generated) => generated,
            other => panic!("expected a generated value, got {other:?}"),
        }
    }

    #[test]
    fn a_generated_secret_honours_length_exclusions_and_required_types() {
        let only_digits = generated(json!({
            "PasswordLength": 40,
            "ExcludeLowercase": true,
            "ExcludeUppercase": true,
            "ExcludePunctuation": true,
            "ExcludeCharacters": "01",
        }));
        for _ in 0..50 {
            let value = only_digits.generate();
            assert_eq!(value.chars().count(), 40);
            assert!(value.chars().all(|c| ('2'..='9').contains(&c)), "{value}");
        }

        // Secrets Manager's defaults: 32 characters of every class but the space, at
        // least one of each.
        let defaults = generated(json!({}));
        for _ in 0..50 {
            let value = defaults.generate();
            assert_eq!(value.chars().count(), 32);
            assert!(!value.contains(' '), "{value}");
            for class in [
                char::is_ascii_lowercase,
                char::is_ascii_uppercase,
                char::is_ascii_digit,
                char::is_ascii_punctuation,
            ] {
                assert!(value.chars().any(|c| class(&c)), "{value}");
            }
        }

        let templated = generated(json!({
            "SecretStringTemplate": "{\"user\":\"ops\"}",
            "GenerateStringKey": "password",
            "PasswordLength": 33,
        }));
        let value: Value = serde_json::from_str(&templated.generate()).expect("JSON");
        assert_eq!(value["user"], "ops");
        assert_eq!(value["password"].as_str().map(str::len), Some(33));
    }

    #[test]
    fn an_impossible_generated_secret_is_an_error() {
        for generate in [
            json!({"PasswordLength": 0}),
            json!({
                "ExcludeLowercase": true,
                "ExcludeUppercase": true,
                "ExcludeNumbers": true,
                "ExcludePunctuation": true,
            }),
            json!({"PasswordLength": 2}),
            json!({"GenerateStringKey": "password"}),
            json!({"Length": 64}),
        ] {
            assert!(
                secret_model(generate.clone()).is_err(),
                "{generate} was accepted"
            );
        }
    }

    #[test]
    fn rate_expressions_give_their_period() {
        assert_eq!(rate_period("rate(1 minute)"), Some(Duration::from_secs(60)));
        assert_eq!(
            rate_period("rate(5 minutes)"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            rate_period("rate(2 hours)"),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(
            rate_period("rate(1 minutes)"),
            None,
            "EventBridge wants the singular"
        );
        assert_eq!(rate_period("cron(0 * * * ? *)"), None);
    }

    /// A function as SAM expands one, with its live alias.
    fn function(binary: &str) -> Value {
        json!({
            "Type": "AWS::Lambda::Function",
            "Metadata": {"BuildProperties": {"Binary": binary}},
            "Properties": {"Handler": "bootstrap", "Runtime": "provided.al2023"},
        })
    }

    #[test]
    fn an_event_pattern_rule_is_an_error_and_a_rate_rule_reaches_its_target() {
        let rule = |properties: Value| {
            let template = Template::from_json(json!({"Resources": {
                "F": function("f"),
                "FAliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {
                    "FunctionName": {"Ref": "F"}, "FunctionVersion": "1", "Name": "live",
                }},
                "R": {"Type": "AWS::Events::Rule", "Properties": properties},
            }}))
            .expect("reads");
            StackModel::build(&template, context(), &BTreeMap::new())
        };
        let target = json!([{"Arn": {"Ref": "FAliaslive"}, "Id": "T", "Input": "{\"x\":1}"}]);
        let model = rule(json!({"ScheduleExpression": "rate(5 minutes)", "Targets": target}))
            .expect("model");
        let schedule = &model.function("F").expect("function").schedules[0];
        assert_eq!(schedule.period, Duration::from_secs(300));
        assert_eq!(schedule.rule_name, "st-R");
        assert_eq!(schedule.input, Some(json!({"x": 1})));
        assert!(matches!(
            rule(json!({"EventPattern": {"source": ["aws.s3"]}, "Targets": target})),
            Err(ModelError::Properties { .. })
        ));
        assert!(matches!(
            rule(json!({"Targets": target})),
            Err(ModelError::Invalid { .. })
        ));
        assert!(matches!(
            rule(json!({"ScheduleExpression": "rate(1 minute)",
                        "Targets": [{"Arn": "arn:aws:lambda:us-east-1:123456789012:function:other", "Id": "T"}]})),
            Err(ModelError::UnknownFunction { .. })
        ));
    }

    #[test]
    fn a_route_reaches_the_function_its_integration_invokes_with_the_stages_throttle() {
        let integration = |alias: &str| {
            json!({
                "type": "aws_proxy",
                "payloadFormatVersion": "2.0",
                "httpMethod": "POST",
                "uri": {"Fn::Sub": format!("arn:${{AWS::Partition}}:apigateway:${{AWS::Region}}:lambda:path/2015-03-31/functions/${{{alias}}}/invocations")},
            })
        };
        let template = Template::from_json(json!({"Resources": {
            "A": function("a"),
            "AAliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {
                "FunctionName": {"Ref": "A"}, "FunctionVersion": "1", "Name": "live",
            }},
            "B": function("b"),
            "Api": {"Type": "AWS::ApiGatewayV2::Api", "Properties": {"Body": {
                "openapi": "3.0.1",
                "paths": {
                    "/a/{id}": {
                        "get": {
                            "security": [{"NONE": []}],
                            "x-amazon-apigateway-integration": integration("AAliaslive"),
                        },
                        "post": {
                            "security": [{"Jwt": ["orders/write"]}],
                            "x-amazon-apigateway-integration": integration("B.Arn"),
                        },
                    },
                    "$default": {
                        "x-amazon-apigateway-any-method": {
                            "x-amazon-apigateway-integration": integration("B.Arn"),
                        },
                    },
                },
                "components": {"securitySchemes": {"Jwt": {
                    "type": "oauth2",
                    "x-amazon-apigateway-authorizer": {
                        "type": "jwt",
                        "identitySource": "$request.header.X-Token",
                        "jwtConfiguration": {"issuer": "https://issuer.example", "audience": ["aud"]},
                    },
                }}},
            }}},
            "Stage": {"Type": "AWS::ApiGatewayV2::Stage", "Properties": {
                "ApiId": {"Ref": "Api"},
                "StageName": "v1",
                "AccessLogSettings": {"DestinationArn": {"Fn::GetAtt": ["Logs", "Arn"]}},
                "DefaultRouteSettings": {"ThrottlingRateLimit": 10, "ThrottlingBurstLimit": 5},
                "RouteSettings": {"POST /a/{id}": {"ThrottlingRateLimit": 1}},
            }},
            "Logs": {"Type": "AWS::Logs::LogGroup"},
        }}))
        .expect("reads");
        let model = StackModel::build(&template, context(), &BTreeMap::new()).expect("model");
        let route = |key: &str| {
            model
                .routes()
                .find(|(_, r)| r.route_key() == key)
                .map(|(f, r)| (f.logical_id.clone(), r.clone()))
                .unwrap_or_else(|| panic!("no route {key}"))
        };
        let (owner, get) = route("GET /a/{id}");
        assert_eq!(owner, "A");
        assert_eq!(get.auth, RouteAuth::Public);
        assert_eq!(get.stage, "v1");
        assert_eq!(
            get.throttle,
            Some(Throttle {
                rate_limit: 10.0,
                burst_limit: 5
            })
        );
        let (owner, post) = route("POST /a/{id}");
        assert_eq!(owner, "B");
        let RouteAuth::Jwt { authorizer, scopes } = post.auth else {
            panic!("the POST route is guarded")
        };
        assert_eq!(authorizer.header, "X-Token");
        assert_eq!(scopes, ["orders/write"]);
        assert_eq!(
            post.throttle,
            Some(Throttle {
                rate_limit: 1.0,
                burst_limit: u64::MAX
            }),
            "an unset half of a route's settings is unlimited"
        );
        assert_eq!(route("ANY $default").0, "B");
    }
}
