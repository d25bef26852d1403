//! Evaluation of the template's intrinsic functions for one local stack, the way
//! CloudFormation would evaluate them for a stack of that name in us-east-1.
//!
//! Physical names follow CloudFormation where the template names a resource, and are
//! `{stack}-{LogicalId}` where CloudFormation would add a random suffix (locally the name
//! must be stable, so that provisioning twice finds the same resources).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use crate::template::{Node, ParameterDecl, Template, scalar_string};

pub const PARTITION: &str = "aws";
pub const URL_SUFFIX: &str = "amazonaws.com";

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{at}: intrinsic function {name} is not supported by the local stack")]
    UnsupportedIntrinsic { name: String, at: String },
    #[error("{at}: {name} has a malformed argument: {what}")]
    BadArgument {
        name: String,
        at: String,
        what: String,
    },
    #[error("{at}: Ref to unknown name {target}")]
    UnknownReference { target: String, at: String },
    #[error("{at}: {target} ({kind}) cannot be referenced locally")]
    UnsupportedResourceType {
        target: String,
        kind: String,
        at: String,
    },
    #[error("{at}: {target} has no attribute {attribute} locally")]
    UnsupportedAttribute {
        target: String,
        attribute: String,
        at: String,
    },
    #[error("circular reference through {0}")]
    Cycle(String),
    #[error("parameter {name} has no Default and no override")]
    MissingParameter { name: String },
    #[error("parameter {name}: {what}")]
    InvalidParameter { name: String, what: String },
    #[error("parameter override {0} is not declared in the template")]
    UnknownParameter(String),
    #[error("parameter {name} has type {kind}, which the local stack does not support")]
    UnsupportedParameterType { name: String, kind: String },
    #[error("{at}: resource {target} is not created (its Condition is false)")]
    NotCreated { target: String, at: String },
    #[error("{at}: condition {name} is not declared")]
    UnknownCondition { name: String, at: String },
}

/// A parameter's value, as `Ref` returns it.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    String(String),
    List(Vec<String>),
}

impl ParamValue {
    fn to_json(&self) -> Value {
        match self {
            ParamValue::String(s) => Value::String(s.clone()),
            ParamValue::List(items) => {
                Value::Array(items.iter().cloned().map(Value::String).collect())
            }
        }
    }
}

/// Where the stack lives.
#[derive(Debug, Clone)]
pub struct StackContext {
    pub stack_name: String,
    pub region: String,
    pub account_id: String,
    /// The SQS endpoint queue URLs are built on (`http://127.0.0.1:5000`), as SQS builds
    /// them: `{endpoint}/{account}/{name}`.
    pub sqs_endpoint: String,
}

/// A resource's physical identity: what `Ref` and `Fn::GetAtt` return.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub kind: String,
    pub name: String,
    pub reference: String,
    pub attributes: BTreeMap<String, String>,
}

/// Evaluates intrinsic functions against one stack.
pub struct Resolver<'t> {
    template: &'t Template,
    context: StackContext,
    parameters: BTreeMap<String, ParamValue>,
    generated: Vec<String>,
    identities: HashMap<String, Identity>,
    resolving: HashSet<String>,
    conditions: HashMap<String, bool>,
}

/// Evaluation result inside a container: `Ref AWS::NoValue` removes the entry.
enum Eval {
    Value(Value),
    NoValue,
}

impl<'t> Resolver<'t> {
    /// Binds the parameters: overrides first, then defaults. A `NoEcho` parameter with
    /// neither (a secret such as the grab token key) gets a random local value long
    /// enough for its `MinLength`: locally there is no secret store to read it from.
    pub fn new(
        template: &'t Template,
        context: StackContext,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, ResolveError> {
        if let Some(unknown) = overrides
            .keys()
            .find(|k| !template.parameters.contains_key(*k))
        {
            return Err(ResolveError::UnknownParameter(unknown.clone()));
        }
        let mut parameters = BTreeMap::new();
        let mut generated = Vec::new();
        for decl in template.parameters.values() {
            let raw = match (overrides.get(&decl.name), &decl.default) {
                (Some(value), _) => value.clone(),
                (None, Some(default)) => default_string(decl, default)?,
                (None, None) if decl.no_echo => {
                    generated.push(decl.name.clone());
                    random_secret(decl.min_length.unwrap_or(0).max(32) as usize)
                }
                (None, None) => {
                    return Err(ResolveError::MissingParameter {
                        name: decl.name.clone(),
                    });
                }
            };
            parameters.insert(decl.name.clone(), bind_parameter(decl, &raw)?);
        }
        Ok(Self {
            template,
            context,
            parameters,
            generated,
            identities: HashMap::new(),
            resolving: HashSet::new(),
            conditions: HashMap::new(),
        })
    }

    pub fn context(&self) -> &StackContext {
        &self.context
    }

    pub fn parameter(&self, name: &str) -> Option<&ParamValue> {
        self.parameters.get(name)
    }

    /// Names of the parameters that got a random local value.
    pub fn generated_parameters(&self) -> &[String] {
        &self.generated
    }

    /// Evaluates `node`, resolving every intrinsic. `at` names the place for errors.
    pub fn eval(&mut self, node: &Node, at: &str) -> Result<Value, ResolveError> {
        match self.eval_inner(node, at)? {
            Eval::Value(v) => Ok(v),
            Eval::NoValue => Ok(Value::Null),
        }
    }

    fn eval_inner(&mut self, node: &Node, at: &str) -> Result<Eval, ResolveError> {
        Ok(Eval::Value(match node {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Number(n) => Value::Number(n.clone()),
            Node::String(s) => Value::String(s.clone()),
            Node::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    if let Eval::Value(v) = self.eval_inner(item, &format!("{at}[{i}]"))? {
                        out.push(v);
                    }
                }
                Value::Array(out)
            }
            Node::Map(map) => {
                let mut out = serde_json::Map::new();
                for (key, value) in map {
                    if let Eval::Value(v) = self.eval_inner(value, &format!("{at}.{key}"))? {
                        out.insert(key.clone(), v);
                    }
                }
                Value::Object(out)
            }
            Node::Intrinsic { name, arg } => return self.intrinsic(name, arg, at),
        }))
    }

    fn intrinsic(&mut self, name: &str, arg: &Node, at: &str) -> Result<Eval, ResolveError> {
        let bad = |what: &str| ResolveError::BadArgument {
            name: name.to_owned(),
            at: at.to_owned(),
            what: what.to_owned(),
        };
        match name {
            "Ref" => {
                let target = arg.as_str().ok_or_else(|| bad("expected a name"))?;
                if target == "AWS::NoValue" {
                    return Ok(Eval::NoValue);
                }
                self.reference(target, at).map(Eval::Value)
            }
            "Fn::GetAtt" => {
                let (target, attribute) = match arg {
                    Node::String(s) => s
                        .split_once('.')
                        .map(|(t, a)| (t.to_owned(), a.to_owned()))
                        .ok_or_else(|| bad("expected Resource.Attribute"))?,
                    Node::List(items) if items.len() == 2 => {
                        let target = items[0].as_str().ok_or_else(|| bad("expected a name"))?;
                        let attribute = match self.eval(&items[1], at)? {
                            Value::String(s) => s,
                            _ => return Err(bad("expected an attribute name")),
                        };
                        (target.to_owned(), attribute)
                    }
                    _ => return Err(bad("expected Resource.Attribute or [Resource, Attribute]")),
                };
                self.get_att(&target, &attribute, at)
                    .map(|s| Eval::Value(Value::String(s)))
            }
            "Fn::Sub" => {
                let (text, vars) = match arg {
                    Node::String(s) => (s.clone(), serde_json::Map::new()),
                    Node::List(items) if items.len() == 2 => {
                        let text = items[0].as_str().ok_or_else(|| bad("expected a string"))?;
                        let vars = match self.eval(&items[1], at)? {
                            Value::Object(map) => map,
                            _ => return Err(bad("expected a variable mapping")),
                        };
                        (text.to_owned(), vars)
                    }
                    _ => return Err(bad("expected a string or [string, variables]")),
                };
                self.sub(&text, &vars, at)
                    .map(|s| Eval::Value(Value::String(s)))
            }
            "Fn::Join" => {
                let Node::List(items) = arg else {
                    return Err(bad("expected [delimiter, list]"));
                };
                let [delimiter, list] = items.as_slice() else {
                    return Err(bad("expected [delimiter, list]"));
                };
                let delimiter = delimiter
                    .as_str()
                    .ok_or_else(|| bad("delimiter must be a string"))?;
                let Value::Array(values) = self.eval(list, at)? else {
                    return Err(bad("expected a list to join"));
                };
                let parts = values
                    .iter()
                    .map(|v| value_string(v).ok_or_else(|| bad("can only join scalars")))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Eval::Value(Value::String(parts.join(delimiter))))
            }
            "Fn::Select" => {
                let Node::List(items) = arg else {
                    return Err(bad("expected [index, list]"));
                };
                let [index, list] = items.as_slice() else {
                    return Err(bad("expected [index, list]"));
                };
                let index = match self.eval(index, at)? {
                    Value::Number(n) => n.as_u64(),
                    Value::String(s) => s.parse().ok(),
                    _ => None,
                }
                .ok_or_else(|| bad("index must be a whole number"))?;
                let Value::Array(values) = self.eval(list, at)? else {
                    return Err(bad("expected a list to select from"));
                };
                let index = usize::try_from(index).map_err(|_| bad("index out of range"))?;
                values
                    .into_iter()
                    .nth(index)
                    .map(Eval::Value)
                    .ok_or_else(|| bad("index out of range"))
            }
            "Fn::Split" => {
                let Node::List(items) = arg else {
                    return Err(bad("expected [delimiter, string]"));
                };
                let [delimiter, source] = items.as_slice() else {
                    return Err(bad("expected [delimiter, string]"));
                };
                let delimiter = delimiter
                    .as_str()
                    .ok_or_else(|| bad("delimiter must be a string"))?;
                let Value::String(source) = self.eval(source, at)? else {
                    return Err(bad("expected a string to split"));
                };
                Ok(Eval::Value(Value::Array(
                    source
                        .split(delimiter)
                        .map(|s| Value::String(s.to_owned()))
                        .collect(),
                )))
            }
            "Fn::If" => {
                let Node::List(items) = arg else {
                    return Err(bad("expected [condition, if-true, if-false]"));
                };
                let [condition, when_true, when_false] = items.as_slice() else {
                    return Err(bad("expected [condition, if-true, if-false]"));
                };
                let name = condition
                    .as_str()
                    .ok_or_else(|| bad("expected a condition name"))?;
                let branch = if self.condition(name, at)? {
                    when_true
                } else {
                    when_false
                };
                self.eval_inner(branch, at)
            }
            "Fn::Equals" | "Fn::Not" | "Fn::And" | "Fn::Or" | "Condition" => {
                let node = Node::Intrinsic {
                    name: name.to_owned(),
                    arg: Box::new(arg.clone()),
                };
                self.truth(&node, at).map(|b| Eval::Value(Value::Bool(b)))
            }
            other => Err(ResolveError::UnsupportedIntrinsic {
                name: other.to_owned(),
                at: at.to_owned(),
            }),
        }
    }

    /// The value of the template condition `name`, evaluated once.
    pub fn condition(&mut self, name: &str, at: &str) -> Result<bool, ResolveError> {
        if let Some(value) = self.conditions.get(name) {
            return Ok(*value);
        }
        let template = self.template;
        let node = template
            .conditions
            .get(name)
            .ok_or_else(|| ResolveError::UnknownCondition {
                name: name.to_owned(),
                at: at.to_owned(),
            })?;
        let key = format!("Conditions.{name}");
        if !self.resolving.insert(key.clone()) {
            return Err(ResolveError::Cycle(key));
        }
        let value = self.truth(node, &key);
        self.resolving.remove(&key);
        let value = value?;
        self.conditions.insert(name.to_owned(), value);
        Ok(value)
    }

    /// A condition expression: `Fn::Equals`, `Fn::Not`, `Fn::And`, `Fn::Or`, `Condition`.
    fn truth(&mut self, node: &Node, at: &str) -> Result<bool, ResolveError> {
        // `{"Condition": name}` inside a condition names another condition.
        if let Some(map) = node.as_map()
            && map.len() == 1
            && let Some(Node::String(name)) = map.get("Condition")
        {
            return self.condition(name, at);
        }
        let Node::Intrinsic { name, arg } = node else {
            return match self.eval(node, at)? {
                Value::Bool(b) => Ok(b),
                Value::String(s) if s == "true" || s == "false" => Ok(s == "true"),
                other => Err(ResolveError::BadArgument {
                    name: "condition".to_owned(),
                    at: at.to_owned(),
                    what: format!("{other} is not a condition"),
                }),
            };
        };
        let bad = |what: &str| ResolveError::BadArgument {
            name: name.clone(),
            at: at.to_owned(),
            what: what.to_owned(),
        };
        let items = || match arg.as_ref() {
            Node::List(items) => Ok(items.as_slice()),
            _ => Err(bad("expected a list")),
        };
        match name.as_str() {
            "Condition" => {
                let name = arg
                    .as_str()
                    .ok_or_else(|| bad("expected a condition name"))?;
                self.condition(name, at)
            }
            "Fn::Equals" => {
                let [a, b] = items()? else {
                    return Err(bad("expected two values"));
                };
                let a = self.eval(a, at)?;
                let b = self.eval(b, at)?;
                // CloudFormation compares the values as strings.
                Ok(value_string(&a).unwrap_or_else(|| a.to_string())
                    == value_string(&b).unwrap_or_else(|| b.to_string()))
            }
            "Fn::Not" => {
                let [inner] = items()? else {
                    return Err(bad("expected one condition"));
                };
                Ok(!self.truth(inner, at)?)
            }
            "Fn::And" | "Fn::Or" => {
                let mut results = Vec::new();
                for inner in items()? {
                    results.push(self.truth(inner, at)?);
                }
                Ok(if name == "Fn::And" {
                    results.iter().all(|b| *b)
                } else {
                    results.iter().any(|b| *b)
                })
            }
            _ => Ok(matches!(self.eval(node, at)?, Value::Bool(true))),
        }
    }

    fn sub(
        &mut self,
        text: &str,
        vars: &serde_json::Map<String, Value>,
        at: &str,
    ) -> Result<String, ResolveError> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or_else(|| ResolveError::BadArgument {
                name: "Fn::Sub".to_owned(),
                at: at.to_owned(),
                what: "unterminated ${".to_owned(),
            })?;
            let variable = &after[..end];
            if let Some(literal) = variable.strip_prefix('!') {
                // `${!Name}` is the literal text `${Name}`.
                out.push_str("${");
                out.push_str(literal);
                out.push('}');
            } else if let Some(value) = vars.get(variable) {
                out.push_str(
                    &value_string(value).ok_or_else(|| ResolveError::BadArgument {
                        name: "Fn::Sub".to_owned(),
                        at: at.to_owned(),
                        what: format!("variable {variable} is not a scalar"),
                    })?,
                );
            } else if let Some((target, attribute)) = variable
                .split_once('.')
                .filter(|(t, _)| self.template.resources.contains_key(*t))
            {
                out.push_str(&self.get_att(target, attribute, at)?);
            } else {
                let value = self.reference(variable, at)?;
                out.push_str(
                    &value_string(&value).ok_or_else(|| ResolveError::BadArgument {
                        name: "Fn::Sub".to_owned(),
                        at: at.to_owned(),
                        what: format!("{variable} is a list"),
                    })?,
                );
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// What `Ref target` returns.
    pub fn reference(&mut self, target: &str, at: &str) -> Result<Value, ResolveError> {
        let context = &self.context;
        let pseudo = match target {
            "AWS::StackName" => Some(context.stack_name.clone()),
            "AWS::Region" => Some(context.region.clone()),
            "AWS::AccountId" => Some(context.account_id.clone()),
            "AWS::Partition" => Some(PARTITION.to_owned()),
            "AWS::URLSuffix" => Some(URL_SUFFIX.to_owned()),
            "AWS::StackId" => Some(format!(
                "arn:{PARTITION}:cloudformation:{}:{}:stack/{}/local",
                context.region, context.account_id, context.stack_name
            )),
            _ => None,
        };
        if let Some(value) = pseudo {
            return Ok(Value::String(value));
        }
        if let Some(param) = self.parameters.get(target) {
            return Ok(param.to_json());
        }
        Ok(Value::String(self.identity(target, at)?.reference))
    }

    /// What `Fn::GetAtt target.attribute` returns.
    pub fn get_att(
        &mut self,
        target: &str,
        attribute: &str,
        at: &str,
    ) -> Result<String, ResolveError> {
        let identity = self.identity(target, at)?;
        identity.attributes.get(attribute).cloned().ok_or_else(|| {
            ResolveError::UnsupportedAttribute {
                target: target.to_owned(),
                attribute: attribute.to_owned(),
                at: at.to_owned(),
            }
        })
    }

    /// The physical identity of a resource, computed once.
    pub fn identity(&mut self, logical_id: &str, at: &str) -> Result<Identity, ResolveError> {
        if let Some(identity) = self.identities.get(logical_id) {
            return Ok(identity.clone());
        }
        let template = self.template;
        let decl = template
            .resource(logical_id)
            .ok_or_else(|| ResolveError::UnknownReference {
                target: logical_id.to_owned(),
                at: at.to_owned(),
            })?;
        if let Some(condition) = &decl.condition
            && !self.condition(condition, at)?
        {
            return Err(ResolveError::NotCreated {
                target: logical_id.to_owned(),
                at: at.to_owned(),
            });
        }
        if !self.resolving.insert(logical_id.to_owned()) {
            return Err(ResolveError::Cycle(logical_id.to_owned()));
        }
        let result = self.compute_identity(logical_id, &decl.kind, &decl.properties, at);
        self.resolving.remove(logical_id);
        let identity = result?;
        self.identities
            .insert(logical_id.to_owned(), identity.clone());
        Ok(identity)
    }

    fn named(
        &mut self,
        properties: &Node,
        key: &str,
        logical_id: &str,
        at: &str,
    ) -> Result<String, ResolveError> {
        match properties.get(key) {
            Some(node) => {
                match self.eval(node, &format!("Resources.{logical_id}.Properties.{key}"))? {
                    Value::String(s) => Ok(s),
                    _ => Err(ResolveError::BadArgument {
                        name: key.to_owned(),
                        at: at.to_owned(),
                        what: "a name must be a string".to_owned(),
                    }),
                }
            }
            None => Ok(format!("{}-{logical_id}", self.context.stack_name)),
        }
    }

    /// The unqualified ARN of the function a version's or an alias's `FunctionName`
    /// names (by name, as `Ref` gives it, or by ARN).
    fn function_arn(
        &mut self,
        properties: &Node,
        logical_id: &str,
        at: &str,
    ) -> Result<String, ResolveError> {
        let node = properties
            .get("FunctionName")
            .ok_or_else(|| ResolveError::BadArgument {
                name: "FunctionName".to_owned(),
                at: format!("Resources.{logical_id}.Properties"),
                what: "is required".to_owned(),
            })?;
        let name = value_string(&self.eval(node, at)?).unwrap_or_default();
        Ok(if name.starts_with("arn:") {
            name
        } else {
            let (region, account) = (&self.context.region, &self.context.account_id);
            format!("arn:{PARTITION}:lambda:{region}:{account}:function:{name}")
        })
    }

    fn compute_identity(
        &mut self,
        logical_id: &str,
        kind: &str,
        properties: &Node,
        at: &str,
    ) -> Result<Identity, ResolveError> {
        let region = self.context.region.clone();
        let account = self.context.account_id.clone();
        let identity =
            |name: String, reference: String, attributes: Vec<(&str, String)>| Identity {
                kind: kind.to_owned(),
                name,
                reference,
                attributes: attributes
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            };
        Ok(match kind {
            "AWS::DynamoDB::Table" => {
                let name = self.named(properties, "TableName", logical_id, at)?;
                let arn = format!("arn:{PARTITION}:dynamodb:{region}:{account}:table/{name}");
                identity(name.clone(), name, vec![("Arn", arn)])
            }
            "AWS::SQS::Queue" => {
                let mut name = self.named(properties, "QueueName", logical_id, at)?;
                let fifo = match properties.get("FifoQueue") {
                    Some(node) => is_true(&self.eval(node, at)?),
                    None => false,
                };
                if fifo && properties.get("QueueName").is_none() {
                    name.push_str(".fifo");
                }
                let url = format!(
                    "{}/{account}/{name}",
                    self.context.sqs_endpoint.trim_end_matches('/')
                );
                let arn = format!("arn:{PARTITION}:sqs:{region}:{account}:{name}");
                identity(
                    name.clone(),
                    url.clone(),
                    vec![("Arn", arn), ("QueueName", name), ("QueueUrl", url)],
                )
            }
            "AWS::Scheduler::ScheduleGroup" => {
                let name = self.named(properties, "Name", logical_id, at)?;
                let arn =
                    format!("arn:{PARTITION}:scheduler:{region}:{account}:schedule-group/{name}");
                identity(name.clone(), name, vec![("Arn", arn)])
            }
            "AWS::SecretsManager::Secret" => {
                let name = self.named(properties, "Name", logical_id, at)?;
                // Partial: Secrets Manager adds a random suffix when it creates the
                // secret; GetSecretValue finds the secret by this ARN all the same.
                let arn =
                    format!("arn:{PARTITION}:secretsmanager:{region}:{account}:secret:{name}");
                identity(name, arn.clone(), vec![("Id", arn)])
            }
            "AWS::IAM::Role" => {
                let name = self.named(properties, "RoleName", logical_id, at)?;
                let path = match properties.get("Path") {
                    Some(node) => {
                        value_string(&self.eval(node, at)?).unwrap_or_else(|| "/".to_owned())
                    }
                    None => "/".to_owned(),
                };
                let arn = format!("arn:{PARTITION}:iam::{account}:role{path}{name}");
                identity(name.clone(), name, vec![("Arn", arn)])
            }
            "AWS::Lambda::Function" => {
                let name = self.named(properties, "FunctionName", logical_id, at)?;
                let arn = format!("arn:{PARTITION}:lambda:{region}:{account}:function:{name}");
                identity(name.clone(), name, vec![("Arn", arn)])
            }
            // Locally one build of each function runs, whatever version or alias is
            // invoked: a version is `1`, and both ARNs qualify the function's.
            "AWS::Lambda::Version" => {
                let function = self.function_arn(properties, logical_id, at)?;
                let arn = format!("{function}:1");
                identity(arn.clone(), arn, vec![("Version", "1".to_owned())])
            }
            "AWS::Lambda::Alias" => {
                let function = self.function_arn(properties, logical_id, at)?;
                let name = self.named(properties, "Name", logical_id, at)?;
                let arn = format!("{function}:{name}");
                identity(name, arn.clone(), vec![("AliasArn", arn)])
            }
            "AWS::Events::Rule" => {
                let name = self.named(properties, "Name", logical_id, at)?;
                let arn = format!("arn:{PARTITION}:events:{region}:{account}:rule/{name}");
                identity(name, arn.clone(), vec![("Arn", arn)])
            }
            "AWS::ApiGatewayV2::Api" => {
                let id = local_api_id(&self.context.stack_name, logical_id);
                identity(
                    id.clone(),
                    id,
                    vec![("ApiEndpoint", format!("http://{logical_id}.local"))],
                )
            }
            other => {
                return Err(ResolveError::UnsupportedResourceType {
                    target: logical_id.to_owned(),
                    kind: other.to_owned(),
                    at: at.to_owned(),
                });
            }
        })
    }
}

/// A stable 10-character API id (API Gateway's are 10 lowercase alphanumerics).
fn local_api_id(stack_name: &str, logical_id: &str) -> String {
    // FNV-1a: stable across builds, unlike std's hasher.
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in stack_name.bytes().chain([b'/']).chain(logical_id.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..10)
        .map(|i| ALPHABET[((hash >> (i * 6)) % 36) as usize] as char)
        .collect()
}

/// CloudFormation booleans may be written as strings.
pub fn is_true(value: &Value) -> bool {
    matches!(value, Value::Bool(true)) || matches!(value, Value::String(s) if s == "true")
}

/// A scalar JSON value as CloudFormation stringifies it.
pub fn value_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn default_string(decl: &ParameterDecl, default: &Node) -> Result<String, ResolveError> {
    match default {
        Node::List(items) => items
            .iter()
            .map(scalar_string)
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(","))
            .ok_or_else(|| ResolveError::InvalidParameter {
                name: decl.name.clone(),
                what: "Default must be scalars".to_owned(),
            }),
        other => scalar_string(other).ok_or_else(|| ResolveError::InvalidParameter {
            name: decl.name.clone(),
            what: "Default must be a scalar".to_owned(),
        }),
    }
}

/// Checks `raw` against the declaration's constraints, as CloudFormation does when the
/// stack is created. `AllowedPattern` is not checked locally (cfn-lint checks defaults).
fn bind_parameter(decl: &ParameterDecl, raw: &str) -> Result<ParamValue, ResolveError> {
    let invalid = |what: String| ResolveError::InvalidParameter {
        name: decl.name.clone(),
        what,
    };
    let check_length = |s: &str| -> Result<(), ResolveError> {
        let len = s.chars().count() as u64;
        if let Some(min) = decl.min_length
            && len < min
        {
            return Err(invalid(format!("is {len} characters, MinLength is {min}")));
        }
        if let Some(max) = decl.max_length
            && len > max
        {
            return Err(invalid(format!("is {len} characters, MaxLength is {max}")));
        }
        Ok(())
    };
    let check_allowed = |s: &str| -> Result<(), ResolveError> {
        match &decl.allowed_values {
            Some(allowed) if !allowed.iter().any(|a| a == s) => {
                Err(invalid(format!("{s:?} is not one of {allowed:?}")))
            }
            _ => Ok(()),
        }
    };
    let check_number = |s: &str| -> Result<(), ResolveError> {
        let n: f64 = s
            .trim()
            .parse()
            .map_err(|_| invalid(format!("{s:?} is not a number")))?;
        if let Some(min) = decl.min_value
            && n < min
        {
            return Err(invalid(format!("{n} is below MinValue {min}")));
        }
        if let Some(max) = decl.max_value
            && n > max
        {
            return Err(invalid(format!("{n} is above MaxValue {max}")));
        }
        Ok(())
    };
    match decl.kind.as_str() {
        "String" => {
            check_length(raw)?;
            check_allowed(raw)?;
            Ok(ParamValue::String(raw.to_owned()))
        }
        "Number" => {
            check_number(raw)?;
            check_allowed(raw)?;
            Ok(ParamValue::String(raw.trim().to_owned()))
        }
        "CommaDelimitedList" | "List<Number>" => {
            let items: Vec<String> = raw.split(',').map(|s| s.trim().to_owned()).collect();
            for item in &items {
                if decl.kind == "List<Number>" {
                    check_number(item)?;
                }
                check_allowed(item)?;
            }
            Ok(ParamValue::List(items))
        }
        other => Err(ResolveError::UnsupportedParameterType {
            name: decl.name.clone(),
            kind: other.to_owned(),
        }),
    }
}

fn random_secret(len: usize) -> String {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn context() -> StackContext {
        StackContext {
            stack_name: "st".to_owned(),
            region: "us-east-1".to_owned(),
            account_id: "123456789012".to_owned(),
            sqs_endpoint: "http://127.0.0.1:5000/".to_owned(),
        }
    }

    fn template() -> Template {
        Template::from_json(json!({
            "Parameters": {
                "Timeout": {"Type": "Number", "Default": 180, "MinValue": 1},
                "Aud": {"Type": "CommaDelimitedList", "Default": "a,b"},
                "Secret": {"Type": "String", "NoEcho": true, "MinLength": 40},
            },
            "Resources": {
                "Q": {"Type": "AWS::SQS::Queue", "Properties": {
                    "QueueName": {"Fn::Sub": "${AWS::StackName}-q.fifo"},
                    "FifoQueue": true,
                }},
                "Dlq": {"Type": "AWS::SQS::Queue", "Properties": {"FifoQueue": true}},
                "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
                    "Environment": {"Variables": {
                        "URL": {"Ref": "Q"},
                        "ARN": {"Fn::GetAtt": ["Fn2", "Arn"]},
                        "NAME": {"Fn::GetAtt": "Q.QueueName"},
                        "JOINED": {"Fn::Join": ["-", [
                            {"Fn::Select": [1, {"Ref": "Aud"}]}, {"Ref": "Timeout"},
                        ]]},
                        "SUB": {"Fn::Sub": [
                            "${X}/${Q.Arn}/${!Literal}", {"X": {"Ref": "AWS::Region"}},
                        ]},
                        "GONE": {"Ref": "AWS::NoValue"},
                        "IMPORTED": {"Fn::ImportValue": "shared-thing"},
                    }},
                }},
                "Fn2": {"Type": "AWS::Lambda::Function"},
                "Fn2Aliaslive": {"Type": "AWS::Lambda::Alias", "Properties": {
                    "FunctionName": {"Ref": "Fn2"},
                    "FunctionVersion": {"Fn::GetAtt": ["Fn2Version", "Version"]},
                    "Name": "live",
                }},
                "Fn2Version": {"Type": "AWS::Lambda::Version", "Properties": {
                    "FunctionName": {"Ref": "Fn2"},
                }},
                "Loop1": {"Type": "AWS::SQS::Queue", "Properties": {
                    "QueueName": {"Fn::GetAtt": ["Loop2", "QueueName"]},
                }},
                "Loop2": {"Type": "AWS::SQS::Queue", "Properties": {
                    "QueueName": {"Fn::GetAtt": ["Loop1", "QueueName"]},
                }},
            },
        }))
        .expect("reads")
    }

    fn env_var(
        resolver: &mut Resolver<'_>,
        template: &Template,
        name: &str,
    ) -> Result<Value, ResolveError> {
        let node = template.resources["Fn"]
            .properties
            .get("Environment")
            .and_then(|e| e.get("Variables"))
            .and_then(|v| v.get(name))
            .expect("declared");
        resolver.eval(node, name)
    }

    #[test]
    fn intrinsics_resolve_to_local_names_urls_and_arns() {
        let template = template();
        let mut r = Resolver::new(&template, context(), &BTreeMap::new()).expect("binds");
        let s = |v: &str| Value::String(v.to_owned());
        assert_eq!(
            env_var(&mut r, &template, "URL").expect("ok"),
            s("http://127.0.0.1:5000/123456789012/st-q.fifo")
        );
        assert_eq!(
            env_var(&mut r, &template, "ARN").expect("ok"),
            s("arn:aws:lambda:us-east-1:123456789012:function:st-Fn2")
        );
        assert_eq!(
            env_var(&mut r, &template, "NAME").expect("ok"),
            s("st-q.fifo")
        );
        assert_eq!(
            env_var(&mut r, &template, "JOINED").expect("ok"),
            s("b-180")
        );
        assert_eq!(
            env_var(&mut r, &template, "SUB").expect("ok"),
            s("us-east-1/arn:aws:sqs:us-east-1:123456789012:st-q.fifo/${Literal}")
        );
        assert_eq!(
            r.identity("Dlq", "t").expect("ok").name,
            "st-Dlq.fifo",
            "an unnamed FIFO queue gets the .fifo suffix CloudFormation adds"
        );
    }

    #[test]
    fn an_alias_and_a_version_qualify_their_functions_arn() {
        let template = template();
        let mut resolver = Resolver::new(&template, context(), &BTreeMap::new()).unwrap();
        let arn = resolver.get_att("Fn2", "Arn", "test").unwrap();
        assert_eq!(
            resolver.reference("Fn2Aliaslive", "test").unwrap(),
            Value::String(format!("{arn}:live"))
        );
        assert_eq!(
            resolver.get_att("Fn2Version", "Version", "test").unwrap(),
            "1"
        );
    }

    #[test]
    fn no_value_removes_the_entry() {
        let template = Template::from_json(json!({"Resources": {"F": {"Type": "X", "Properties": {
            "A": 1,
            "B": {"Ref": "AWS::NoValue"},
            "L": ["x", {"Ref": "AWS::NoValue"}],
        }}}}))
        .expect("reads");
        let mut r = Resolver::new(&template, context(), &BTreeMap::new()).expect("binds");
        let props = r
            .eval(&template.resources["F"].properties, "F")
            .expect("evaluates");
        assert_eq!(props, serde_json::json!({"A": 1, "L": ["x"]}));
    }

    #[test]
    fn an_unsupported_intrinsic_is_a_typed_error_naming_it() {
        let template = template();
        let mut r = Resolver::new(&template, context(), &BTreeMap::new()).expect("binds");
        match env_var(&mut r, &template, "IMPORTED") {
            Err(ResolveError::UnsupportedIntrinsic { name, .. }) => {
                assert_eq!(name, "Fn::ImportValue")
            }
            other => panic!("expected UnsupportedIntrinsic, got {other:?}"),
        }
    }

    #[test]
    fn conditions_choose_the_if_branch_and_gate_resources() {
        let template = Template::from_json(json!({
            "Parameters": {"N": {"Type": "Number", "Default": 0}},
            "Conditions": {
                "HasN": {"Fn::Not": [{"Fn::Equals": [{"Ref": "N"}, 0]}]},
                "Both": {"Fn::And": [{"Condition": "HasN"}, {"Fn::Equals": ["a", "a"]}]},
            },
            "Resources": {
                "F": {"Type": "X", "Properties": {
                    "R": {"Fn::If": ["HasN", {"Ref": "N"}, {"Ref": "AWS::NoValue"}]},
                    "S": {"Fn::If": ["Both", "yes", "no"]},
                }},
                "Q": {"Type": "AWS::SQS::Queue", "Condition": "HasN"},
            },
        }))
        .expect("reads");
        let mut r = Resolver::new(&template, context(), &BTreeMap::new()).expect("binds");
        let props = r
            .eval(&template.resources["F"].properties, "F")
            .expect("evaluates");
        assert_eq!(props, serde_json::json!({"S": "no"}));
        assert!(matches!(
            r.identity("Q", "t"),
            Err(ResolveError::NotCreated { .. })
        ));

        let overrides = BTreeMap::from([("N".to_owned(), "3".to_owned())]);
        let mut r = Resolver::new(&template, context(), &overrides).expect("binds");
        let props = r
            .eval(&template.resources["F"].properties, "F")
            .expect("evaluates");
        assert_eq!(props, serde_json::json!({"R": "3", "S": "yes"}));
        assert!(r.identity("Q", "t").is_ok());
    }

    #[test]
    fn a_reference_cycle_is_reported() {
        let template = template();
        let mut r = Resolver::new(&template, context(), &BTreeMap::new()).expect("binds");
        assert!(matches!(
            r.identity("Loop1", "t"),
            Err(ResolveError::Cycle(_))
        ));
    }

    #[test]
    fn parameters_take_overrides_and_check_constraints() {
        let template = template();
        let overrides = BTreeMap::from([("Timeout".to_owned(), "2".to_owned())]);
        let r = Resolver::new(&template, context(), &overrides).expect("binds");
        assert_eq!(
            r.parameter("Timeout"),
            Some(&ParamValue::String("2".to_owned()))
        );
        assert_eq!(
            r.parameter("Aud"),
            Some(&ParamValue::List(vec!["a".to_owned(), "b".to_owned()]))
        );
        match r.parameter("Secret") {
            Some(ParamValue::String(secret)) => assert_eq!(secret.len(), 40),
            other => panic!("expected a generated secret, got {other:?}"),
        }
        assert_eq!(r.generated_parameters(), ["Secret".to_owned()]);

        let too_small = BTreeMap::from([("Timeout".to_owned(), "0".to_owned())]);
        assert!(matches!(
            Resolver::new(&template, context(), &too_small),
            Err(ResolveError::InvalidParameter { .. })
        ));
        let short_secret = BTreeMap::from([("Secret".to_owned(), "short".to_owned())]);
        assert!(matches!(
            Resolver::new(&template, context(), &short_secret),
            Err(ResolveError::InvalidParameter { .. })
        ));
        let unknown = BTreeMap::from([("Nope".to_owned(), "1".to_owned())]);
        assert!(matches!(
            Resolver::new(&template, context(), &unknown),
            Err(ResolveError::UnknownParameter(_))
        ));
    }
}
