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
    #[error("{at}: event type {kind} is not emulated by the local stack")]
    UnsupportedEvent { at: String, kind: String },
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
        self.functions.iter().find(|f| {
            arn == f.arn
                || arn
                    .strip_prefix(f.arn.as_str())
                    .is_some_and(|rest| rest.starts_with(':') && !rest[1..].contains(':'))
        })
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
                "AWS::Serverless::Function" => function_decls.push(decl),
                "AWS::Serverless::HttpApi" => {
                    api_decls.push(decl);
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

        let mut apis = Vec::new();
        for decl in api_decls {
            let properties = merge_globals(template.globals.get("HttpApi"), &decl.properties);
            apis.push(http_api_spec(&mut resolver, &decl.logical_id, &properties)?);
        }
        let mut functions = Vec::new();
        for decl in function_decls {
            let properties = merge_globals(template.globals.get("Function"), &decl.properties);
            functions.push(function_spec(
                &mut resolver,
                template,
                decl,
                &properties,
                &queues,
                &mut apis,
            )?);
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

/// An `AWS::Serverless::HttpApi` (or SAM's implicit one).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpApiSpec {
    pub logical_id: String,
    pub api_id: String,
    pub stage: String,
    pub stage_variables: BTreeMap<String, String>,
    pub authorizers: BTreeMap<String, JwtAuthorizerSpec>,
    pub default_authorizer: Option<String>,
    /// `CorsConfiguration`: API Gateway answers preflights and adds the CORS headers.
    pub cors: Option<CorsSpec>,
    /// `DefaultRouteSettings` throttling.
    pub default_throttle: Option<Throttle>,
}

/// An HTTP API's CORS configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
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

/// One `HttpApi` event of a function.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    pub event_name: String,
    pub api_id: String,
    pub stage: String,
    pub stage_variables: BTreeMap<String, String>,
    /// Upper case, or `ANY`.
    pub method: String,
    /// `/sales/{sale_id}/grab/{token}`; `{name+}` is a greedy parameter.
    pub path: String,
    pub auth: RouteAuth,
    /// The event's `RouteSettings` throttle, else the API's default.
    pub throttle: Option<Throttle>,
}

impl RouteSpec {
    /// API Gateway's route key: `POST /sales/{sale_id}`.
    pub fn route_key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

fn http_api_spec(
    resolver: &mut Resolver<'_>,
    logical_id: &str,
    properties: &Node,
) -> Result<HttpApiSpec, ModelError> {
    let at = format!("Resources.{logical_id}.Properties");
    let api_id = resolver
        .identity(logical_id, &at)
        .map(|i| i.reference)
        .unwrap_or_else(|_| {
            // SAM's implicit API is not in the template's resources.
            format!("{logical_id}-local")
        });
    let stage = match properties.get("StageName") {
        Some(node) => string_value(resolver.eval(node, &format!("{at}.StageName"))?, &at)?,
        None => "$default".to_owned(),
    };
    let stage_variables = match properties.get("StageVariables") {
        Some(node) => string_map(resolver.eval(node, &format!("{at}.StageVariables"))?, &at)?,
        None => BTreeMap::new(),
    };
    let mut authorizers = BTreeMap::new();
    let mut default_authorizer = None;
    if let Some(auth) = properties.get("Auth") {
        let auth_at = format!("{at}.Auth");
        if let Some(node) = auth.get("DefaultAuthorizer") {
            default_authorizer = Some(string_value(resolver.eval(node, &auth_at)?, &auth_at)?);
        }
        if let Some(Node::Map(declared)) = auth.get("Authorizers") {
            for (name, decl) in declared {
                let decl_at = format!("{auth_at}.Authorizers.{name}");
                let Some(jwt) = decl.get("JwtConfiguration") else {
                    return Err(ModelError::UnsupportedAuthorizer { at: decl_at });
                };
                let jwt = resolver.eval(jwt, &decl_at)?;
                let issuer = jwt.get("issuer").and_then(value_string).ok_or_else(|| {
                    ModelError::Invalid {
                        at: decl_at.clone(),
                        what: "JwtConfiguration needs an issuer".to_owned(),
                    }
                })?;
                let audience = match jwt.get("audience") {
                    Some(Value::Array(items)) => items.iter().filter_map(value_string).collect(),
                    Some(other) => value_string(other).into_iter().collect(),
                    None => Vec::new(),
                };
                let source = match decl.get("IdentitySource") {
                    Some(node) => string_value(resolver.eval(node, &decl_at)?, &decl_at)?,
                    None => "$request.header.Authorization".to_owned(),
                };
                let header = source
                    .strip_prefix("$request.header.")
                    .ok_or_else(|| ModelError::Invalid {
                        at: decl_at.clone(),
                        what: format!("IdentitySource {source} is not a request header"),
                    })?
                    .to_owned();
                authorizers.insert(
                    name.clone(),
                    JwtAuthorizerSpec {
                        name: name.clone(),
                        issuer,
                        audience,
                        header,
                    },
                );
            }
        }
        if let Some(name) = &default_authorizer
            && !authorizers.contains_key(name)
        {
            return Err(ModelError::UnknownAuthorizer {
                at: auth_at,
                name: name.clone(),
                api: logical_id.to_owned(),
            });
        }
    }
    let cors = match properties.get("CorsConfiguration") {
        None => None,
        Some(node) => {
            let cors_at = format!("{at}.CorsConfiguration");
            match resolver.eval(node, &cors_at)? {
                // `CorsConfiguration: true` allows every origin, method and header.
                Value::Bool(true) => Some(CorsSpec {
                    allow_origins: vec!["*".to_owned()],
                    allow_methods: vec!["*".to_owned()],
                    allow_headers: vec!["*".to_owned()],
                    expose_headers: Vec::new(),
                    max_age: None,
                    allow_credentials: None,
                }),
                Value::Bool(false) => None,
                value => Some(from_value(value, &cors_at)?),
            }
        }
    };
    let default_throttle = match properties.get("DefaultRouteSettings") {
        Some(node) => throttle(
            resolver.eval(node, &format!("{at}.DefaultRouteSettings"))?,
            &at,
        )?,
        None => None,
    };
    Ok(HttpApiSpec {
        logical_id: logical_id.to_owned(),
        api_id,
        stage,
        stage_variables,
        authorizers,
        default_authorizer,
        cors,
        default_throttle,
    })
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

/// One function: where its code is, its resolved environment and its triggers.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    /// `functions/grab`: picks the in-process implementation.
    pub code_uri: String,
    pub timeout: Duration,
    /// Globals merged with the function's own variables, every intrinsic resolved.
    pub environment: BTreeMap<String, String>,
    pub routes: Vec<RouteSpec>,
    pub sqs_sources: Vec<SqsSourceSpec>,
    /// `Schedule` events: EventBridge rules that invoke the function on a rate.
    pub schedules: Vec<RuleSpec>,
    pub async_invoke: AsyncInvokeConfig,
    /// `ReservedConcurrentExecutions`: how many invocations may run at once.
    pub reserved_concurrency: Option<u32>,
}

/// A `Schedule` event: an EventBridge rule with a `rate(...)` expression.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub event_name: String,
    pub rule_name: String,
    pub rule_arn: String,
    pub expression: String,
    pub period: Duration,
    /// The rule's `Input`: sent instead of the Scheduled Event when set.
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

/// An `SQS` event: an event source mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct SqsSourceSpec {
    pub event_name: String,
    pub queue_arn: String,
    pub queue_url: String,
    pub batch_size: i32,
    pub report_batch_item_failures: bool,
    pub enabled: bool,
    pub maximum_batching_window: Duration,
}

/// How Lambda retries an asynchronous invocation (EventBridge Scheduler invokes
/// asynchronously): `EventInvokeConfig`, with Lambda's defaults.
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
    template: &Template,
    decl: &ResourceDecl,
    properties: &Node,
    queues: &[QueueSpec],
    apis: &mut Vec<HttpApiSpec>,
) -> Result<FunctionSpec, ModelError> {
    let id = &decl.logical_id;
    let at = format!("Resources.{id}.Properties");
    let identity = resolver.identity(id, &at)?;
    let code_uri = match properties.get("CodeUri") {
        Some(node) => string_value(resolver.eval(node, &format!("{at}.CodeUri"))?, &at)?,
        None => {
            return Err(ModelError::Invalid {
                at,
                what: "CodeUri is required".to_owned(),
            });
        }
    };
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
    let async_invoke = match properties.get("EventInvokeConfig") {
        None => AsyncInvokeConfig::default(),
        Some(node) => async_invoke_config(
            resolver.eval(node, &format!("{at}.EventInvokeConfig"))?,
            &at,
        )?,
    };

    let reserved_concurrency = match properties.get("ReservedConcurrentExecutions") {
        Some(node) => match resolver.eval(node, &format!("{at}.ReservedConcurrentExecutions"))? {
            Value::Null => None,
            value => Some(u64_value(&value, &at)? as u32),
        },
        None => None,
    };

    let mut routes = Vec::new();
    let mut sqs_sources = Vec::new();
    let mut schedules = Vec::new();
    if let Some(Node::Map(events)) = properties.get("Events") {
        for (event_name, event) in events {
            let event_at = format!("{at}.Events.{event_name}");
            let kind = event.get("Type").and_then(Node::as_str).unwrap_or_default();
            let empty = Node::Map(BTreeMap::new());
            let props = event.get("Properties").unwrap_or(&empty);
            match kind {
                "HttpApi" => routes.push(route_spec(
                    resolver, template, event_name, props, &event_at, apis,
                )?),
                "Schedule" => {
                    schedules.push(rule_spec(resolver, id, event_name, props, &event_at)?)
                }
                "SQS" => sqs_sources.push(sqs_source_spec(
                    resolver, event_name, props, &event_at, queues,
                )?),
                other => {
                    return Err(ModelError::UnsupportedEvent {
                        at: event_at,
                        kind: other.to_owned(),
                    });
                }
            }
        }
    }
    Ok(FunctionSpec {
        logical_id: id.clone(),
        name: identity.name,
        arn: identity.attributes.get("Arn").cloned().unwrap_or_default(),
        code_uri,
        timeout,
        environment,
        routes,
        sqs_sources,
        schedules,
        async_invoke,
        reserved_concurrency,
    })
}

fn rule_spec(
    resolver: &mut Resolver<'_>,
    function_id: &str,
    event_name: &str,
    props: &Node,
    at: &str,
) -> Result<RuleSpec, ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
        schedule: String,
        #[serde(default)]
        input: Option<String>,
        #[serde(default, deserialize_with = "lenient_opt_bool")]
        enabled: Option<bool>,
        #[serde(default)]
        state: Option<String>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default, rename = "Description")]
        _description: Option<String>,
    }
    let raw: Raw = from_value(resolver.eval(props, at)?, at)?;
    let period = rate_period(&raw.schedule).ok_or_else(|| ModelError::Invalid {
        at: at.to_owned(),
        what: format!(
            "schedule {:?}: only rate(...) rules are emulated locally",
            raw.schedule
        ),
    })?;
    let input = raw
        .input
        .map(|text| {
            serde_json::from_str(&text).map_err(|e| ModelError::Invalid {
                at: at.to_owned(),
                what: format!("Input is not JSON: {e}"),
            })
        })
        .transpose()?;
    let context = resolver.context();
    let rule_name = raw
        .name
        .unwrap_or_else(|| format!("{}-{function_id}{event_name}", context.stack_name));
    let rule_arn = format!(
        "arn:aws:events:{}:{}:rule/{rule_name}",
        context.region, context.account_id
    );
    let enabled = match (raw.enabled, raw.state.as_deref()) {
        (Some(enabled), _) => enabled,
        (None, Some(state)) => state == "ENABLED",
        (None, None) => true,
    };
    Ok(RuleSpec {
        event_name: event_name.to_owned(),
        rule_name,
        rule_arn,
        expression: raw.schedule,
        period,
        input,
        enabled,
    })
}

fn async_invoke_config(value: Value, at: &str) -> Result<AsyncInvokeConfig, ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
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
        #[serde(rename = "Type")]
        kind: Option<String>,
        destination: String,
    }
    let raw: Raw = from_value(value, at)?;
    if let Some(n) = raw.maximum_retry_attempts
        && n > 2
    {
        return Err(ModelError::Invalid {
            at: at.to_owned(),
            what: format!("MaximumRetryAttempts {n}: Lambda allows 0..=2"),
        });
    }
    let defaults = AsyncInvokeConfig::default();
    let on_failure_queue_arn = match raw.destination_config.and_then(|d| d.on_failure) {
        None => None,
        Some(d)
            if d.kind.as_deref().is_none_or(|k| k == "SQS")
                && d.destination.starts_with("arn:aws:sqs:") =>
        {
            Some(d.destination)
        }
        Some(d) => {
            return Err(ModelError::Invalid {
                at: at.to_owned(),
                what: format!(
                    "only SQS OnFailure destinations are emulated, not {}",
                    d.destination
                ),
            });
        }
    };
    Ok(AsyncInvokeConfig {
        maximum_retry_attempts: raw
            .maximum_retry_attempts
            .map(|n| n as u32)
            .unwrap_or(defaults.maximum_retry_attempts),
        maximum_event_age: raw
            .maximum_event_age_in_seconds
            .map(Duration::from_secs)
            .unwrap_or(defaults.maximum_event_age),
        on_failure_queue_arn,
    })
}

/// The logical id a `!Ref X` node names, without evaluating it.
fn referenced_logical_id(node: &Node) -> Option<&str> {
    match node {
        Node::Intrinsic { name, arg } if name == "Ref" => arg.as_str(),
        _ => None,
    }
}

fn route_spec(
    resolver: &mut Resolver<'_>,
    template: &Template,
    event_name: &str,
    props: &Node,
    at: &str,
    apis: &mut Vec<HttpApiSpec>,
) -> Result<RouteSpec, ModelError> {
    // Without ApiId, SAM attaches the route to its implicit API, configured by Globals.
    let api_logical_id = match props.get("ApiId") {
        Some(node) => referenced_logical_id(node)
            .ok_or_else(|| ModelError::Invalid {
                at: at.to_owned(),
                what: "ApiId must be !Ref of an HttpApi of this template".to_owned(),
            })?
            .to_owned(),
        None => "ServerlessHttpApi".to_owned(),
    };
    if !apis.iter().any(|a| a.logical_id == api_logical_id) {
        if template.resource(&api_logical_id).is_some() {
            return Err(ModelError::Invalid {
                at: at.to_owned(),
                what: format!("ApiId {api_logical_id} is not an AWS::Serverless::HttpApi"),
            });
        }
        let empty = Node::Map(BTreeMap::new());
        let properties = merge_globals(template.globals.get("HttpApi"), &empty);
        apis.push(http_api_spec(resolver, &api_logical_id, &properties)?);
    }
    let api = apis
        .iter()
        .find(|a| a.logical_id == api_logical_id)
        .expect("inserted above");

    let path = match props.get("Path") {
        Some(node) => string_value(resolver.eval(node, at)?, at)?,
        None => "$default".to_owned(),
    };
    let method = match props.get("Method") {
        Some(node) => string_value(resolver.eval(node, at)?, at)?.to_ascii_uppercase(),
        None => "ANY".to_owned(),
    };
    let auth_node = props.get("Auth");
    let named = match auth_node.and_then(|a| a.get("Authorizer")) {
        Some(node) => Some(string_value(resolver.eval(node, at)?, at)?),
        None => api.default_authorizer.clone(),
    };
    let auth = match named.as_deref() {
        None | Some("NONE") => RouteAuth::Public,
        Some(name) => {
            let authorizer = api.authorizers.get(name).cloned().ok_or_else(|| {
                ModelError::UnknownAuthorizer {
                    at: at.to_owned(),
                    name: name.to_owned(),
                    api: api.logical_id.clone(),
                }
            })?;
            let scopes = match auth_node.and_then(|a| a.get("AuthorizationScopes")) {
                Some(node) => match resolver.eval(node, at)? {
                    Value::Array(items) => items.iter().filter_map(value_string).collect(),
                    _ => {
                        return Err(ModelError::Invalid {
                            at: at.to_owned(),
                            what: "AuthorizationScopes must be a list".to_owned(),
                        });
                    }
                },
                None => Vec::new(),
            };
            RouteAuth::Jwt { authorizer, scopes }
        }
    };
    let route_throttle = match props.get("RouteSettings") {
        Some(node) => throttle(resolver.eval(node, at)?, at)?,
        None => None,
    };
    Ok(RouteSpec {
        event_name: event_name.to_owned(),
        api_id: api.api_id.clone(),
        stage: api.stage.clone(),
        stage_variables: api.stage_variables.clone(),
        method,
        path,
        auth,
        throttle: route_throttle.or(api.default_throttle),
    })
}

fn sqs_source_spec(
    resolver: &mut Resolver<'_>,
    event_name: &str,
    props: &Node,
    at: &str,
    queues: &[QueueSpec],
) -> Result<SqsSourceSpec, ModelError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase", deny_unknown_fields)]
    struct Raw {
        queue: String,
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
    let raw: Raw = from_value(resolver.eval(props, at)?, at)?;
    let queue = queues.iter().find(|q| q.arn == raw.queue).ok_or_else(|| {
        ModelError::UnknownEventSource {
            at: at.to_owned(),
            arn: raw.queue.clone(),
        }
    })?;
    let batch_size = raw.batch_size.unwrap_or(10);
    // ReceiveMessage takes at most 10; larger batches need a batching window, which the
    // local poller does not assemble across receives.
    if !(1..=10).contains(&batch_size) {
        return Err(ModelError::Invalid {
            at: at.to_owned(),
            what: format!("BatchSize {batch_size}: the local event source mapping supports 1..=10"),
        });
    }
    Ok(SqsSourceSpec {
        event_name: event_name.to_owned(),
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
    })
}

// ---------------------------------------------------------------- helpers

/// SAM's Globals merge: maps merge key by key, lists are the global entries followed by
/// the resource's, and any other value of the resource wins.
pub fn merge_globals(globals: Option<&Node>, own: &Node) -> Node {
    match (globals, own) {
        (None, own) => own.clone(),
        (Some(Node::Map(global)), Node::Map(local)) => {
            let mut merged = global.clone();
            for (key, value) in local {
                let combined = merge_globals(global.get(key), value);
                merged.insert(key.clone(), combined);
            }
            Node::Map(merged)
        }
        (Some(Node::List(global)), Node::List(local)) => {
            Node::List(global.iter().chain(local).cloned().collect())
        }
        (Some(_), own) => own.clone(),
    }
}

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

fn string_value(value: Value, at: &str) -> Result<String, ModelError> {
    value_string(&value).ok_or_else(|| ModelError::Invalid {
        at: at.to_owned(),
        what: format!("expected a string, found {value}"),
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

    fn project_template() -> Template {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        Template::from_path(&path).expect("template.yaml parses")
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
        let overrides = BTreeMap::from([("OrdersVisibilityTimeout".to_owned(), "2".to_owned())]);
        let model = StackModel::build(&project_template(), context(), &overrides).expect("model");

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
        assert_eq!(consumer.code_uri, "functions/order-consumer");
        assert_eq!(consumer.timeout, Duration::from_secs(30));
        assert_eq!(
            consumer.environment["TABLE_NAME"], "st-table",
            "Globals are merged"
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
            Some("*".to_owned())
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
        let template = Template::parse(
            "Resources:\n  T:\n    Type: AWS::DynamoDB::Table\n    Properties:\n      KeySchema: []\n      AttributeDefinitions: []\n      KinesisStreamSpecification: {}\n",
        )
        .expect("parses");
        let err = StackModel::build(&template, context(), &BTreeMap::new()).expect_err("rejected");
        assert!(
            err.to_string().contains("KinesisStreamSpecification"),
            "{err}"
        );
    }

    fn secret_model(generate: &str) -> Result<StackModel, ModelError> {
        let template = Template::parse(&format!(
            "Resources:\n  S:\n    Type: AWS::SecretsManager::Secret\n    Properties:\n      GenerateSecretString: {generate}\n"
        ))
        .expect("parses");
        StackModel::build(&template, context(), &BTreeMap::new())
    }

    fn generated(generate: &str) -> GeneratedSecret {
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
        let only_digits = generated(
            "{ PasswordLength: 40, ExcludeLowercase: true, ExcludeUppercase: true, ExcludePunctuation: true, ExcludeCharacters: \"01\" }",
        );
        for _ in 0..50 {
            let value = only_digits.generate();
            assert_eq!(value.chars().count(), 40);
            assert!(value.chars().all(|c| ('2'..='9').contains(&c)), "{value}");
        }

        // Secrets Manager's defaults: 32 characters of every class but the space, at
        // least one of each.
        let defaults = generated("{}");
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

        let templated = generated(
            "{ SecretStringTemplate: '{\"user\":\"ops\"}', GenerateStringKey: password, PasswordLength: 33 }",
        );
        let value: Value = serde_json::from_str(&templated.generate()).expect("JSON");
        assert_eq!(value["user"], "ops");
        assert_eq!(value["password"].as_str().map(str::len), Some(33));
    }

    #[test]
    fn an_impossible_generated_secret_is_an_error() {
        for generate in [
            "{ PasswordLength: 0 }",
            "{ ExcludeLowercase: true, ExcludeUppercase: true, ExcludeNumbers: true, ExcludePunctuation: true }",
            "{ PasswordLength: 2 }",
            "{ GenerateStringKey: password }",
            "{ Length: 64 }",
        ] {
            assert!(secret_model(generate).is_err(), "{generate} was accepted");
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

    #[test]
    fn an_unemulated_event_type_is_an_error() {
        let template = Template::parse(
            "Resources:\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: x\n      Events:\n        E:\n          Type: Kinesis\n          Properties: {}\n",
        )
        .expect("parses");
        assert!(matches!(
            StackModel::build(&template, context(), &BTreeMap::new()),
            Err(ModelError::UnsupportedEvent { .. })
        ));
    }

    #[test]
    fn globals_merge_maps_and_let_the_function_win() {
        let template = Template::parse(
            "Globals:\n  Function:\n    Timeout: 10\n    Environment:\n      Variables: { A: g, B: g }\nResources:\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: x\n      Timeout: 20\n      Environment:\n        Variables: { B: f, C: f }\n",
        )
        .expect("parses");
        let model = StackModel::build(&template, context(), &BTreeMap::new()).expect("model");
        let f = model.function("F").expect("function");
        assert_eq!(f.timeout, Duration::from_secs(20));
        let env: Vec<_> = f
            .environment
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(env, ["A=g", "B=f", "C=f"]);
    }
}
