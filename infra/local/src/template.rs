//! `template.yaml` as data: the template as SAM's translator expands it, plain
//! CloudFormation in JSON, turned into a [`Node`] tree in which every intrinsic function
//! is explicit. Nothing is evaluated here; see [`crate::resolve`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("could not expand the template {} with SAM's translator", path.display())]
    Expand {
        path: PathBuf,
        #[source]
        source: flashsale_template_checks::CheckError,
    },
    #[error("the template is not a mapping at the top level")]
    NotAMapping,
    #[error("{path}: {what}")]
    Shape { path: String, what: String },
}

/// A template value with its intrinsic functions made explicit.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    List(Vec<Node>),
    Map(BTreeMap<String, Node>),
    /// An intrinsic function call, named as in long form (`Ref`, `Fn::GetAtt`, `Condition`).
    Intrinsic {
        name: String,
        arg: Box<Node>,
    },
}

impl Node {
    pub fn as_map(&self) -> Option<&BTreeMap<String, Node>> {
        match self {
            Node::Map(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    /// `self[key]` for a map, else `None`.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map().and_then(|map| map.get(key))
    }
}

/// One template parameter's declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct ParameterDecl {
    pub name: String,
    pub kind: String,
    pub default: Option<Node>,
    pub no_echo: bool,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_value: Option<f64>,
    pub max_value: Option<f64>,
    pub allowed_values: Option<Vec<String>>,
}

/// One entry of `Resources`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDecl {
    pub logical_id: String,
    pub kind: String,
    pub properties: Node,
    /// The resource's `Metadata` (SAM keeps a function's `BuildProperties` there).
    pub metadata: Node,
    /// The resource's `Condition`, if any.
    pub condition: Option<String>,
}

/// A CloudFormation template (SAM's already expanded).
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub parameters: BTreeMap<String, ParameterDecl>,
    /// `Conditions`, by name.
    pub conditions: BTreeMap<String, Node>,
    pub resources: BTreeMap<String, ResourceDecl>,
}

impl Template {
    /// `path` as CloudFormation deploys it: expanded by AWS's SAM translator (through
    /// flashsale-template-checks, the one reader of SAM in this workspace) with
    /// `overrides` given to it as `sam local --parameter-overrides` gives them. What is
    /// left is plain CloudFormation, which the local stack evaluates itself.
    pub fn expand(
        path: &Path,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, TemplateError> {
        let stack = flashsale_template_checks::stack::Stack::load_with(path, overrides).map_err(
            |source| TemplateError::Expand {
                path: path.to_owned(),
                source,
            },
        )?;
        Self::from_json(stack.expanded)
    }

    /// A plain CloudFormation template in its JSON form (intrinsics in long form).
    pub fn from_json(json: Value) -> Result<Self, TemplateError> {
        let Node::Map(mut root) = to_node(json) else {
            return Err(TemplateError::NotAMapping);
        };
        let parameters = match root.remove("Parameters") {
            None => BTreeMap::new(),
            Some(Node::Map(params)) => params
                .into_iter()
                .map(|(name, decl)| {
                    let decl = parameter_decl(&name, decl)?;
                    Ok((name, decl))
                })
                .collect::<Result<_, TemplateError>>()?,
            Some(_) => return Err(shape("Parameters", "must be a mapping")),
        };
        let conditions = match root.remove("Conditions") {
            None => BTreeMap::new(),
            Some(Node::Map(conditions)) => conditions,
            Some(_) => return Err(shape("Conditions", "must be a mapping")),
        };
        let resources = match root.remove("Resources") {
            Some(Node::Map(resources)) => resources
                .into_iter()
                .map(|(id, decl)| {
                    let decl = resource_decl(&id, decl)?;
                    Ok((id, decl))
                })
                .collect::<Result<_, TemplateError>>()?,
            _ => return Err(shape("Resources", "must be a mapping")),
        };
        Ok(Self {
            parameters,
            conditions,
            resources,
        })
    }

    /// The resource, if declared.
    pub fn resource(&self, logical_id: &str) -> Option<&ResourceDecl> {
        self.resources.get(logical_id)
    }

    /// Logical ids of every resource of `kind`, in template (alphabetical) order.
    pub fn resources_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a ResourceDecl> {
        self.resources.values().filter(move |r| r.kind == kind)
    }
}

fn shape(path: &str, what: &str) -> TemplateError {
    TemplateError::Shape {
        path: path.to_owned(),
        what: what.to_owned(),
    }
}

fn parameter_decl(name: &str, decl: Node) -> Result<ParameterDecl, TemplateError> {
    let path = format!("Parameters.{name}");
    let Node::Map(mut map) = decl else {
        return Err(shape(&path, "must be a mapping"));
    };
    let kind = match map.remove("Type") {
        Some(Node::String(kind)) => kind,
        _ => return Err(shape(&path, "needs a string Type")),
    };
    let number = |node: Option<Node>, key: &str| -> Result<Option<f64>, TemplateError> {
        match node {
            None => Ok(None),
            Some(Node::Number(n)) => Ok(n.as_f64()),
            Some(Node::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|_| shape(&format!("{path}.{key}"), "must be a number")),
            Some(_) => Err(shape(&format!("{path}.{key}"), "must be a number")),
        }
    };
    let min_value = number(map.remove("MinValue"), "MinValue")?;
    let max_value = number(map.remove("MaxValue"), "MaxValue")?;
    // Lengths are whole numbers; the float round trip is exact for any real length.
    let min_length = number(map.remove("MinLength"), "MinLength")?.map(|n| n as u64);
    let max_length = number(map.remove("MaxLength"), "MaxLength")?.map(|n| n as u64);
    let no_echo = match map.remove("NoEcho") {
        None => false,
        Some(Node::Bool(b)) => b,
        Some(Node::String(s)) => s.eq_ignore_ascii_case("true"),
        Some(_) => return Err(shape(&format!("{path}.NoEcho"), "must be a boolean")),
    };
    let allowed_values = match map.remove("AllowedValues") {
        None => None,
        Some(Node::List(values)) => Some(
            values
                .into_iter()
                .map(|v| {
                    scalar_string(&v).ok_or_else(|| shape(&path, "AllowedValues must be scalars"))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(shape(&format!("{path}.AllowedValues"), "must be a list")),
    };
    Ok(ParameterDecl {
        name: name.to_owned(),
        kind,
        default: map.remove("Default"),
        no_echo,
        min_length,
        max_length,
        min_value,
        max_value,
        allowed_values,
    })
}

/// A scalar as CloudFormation sees it: a string.
pub fn scalar_string(node: &Node) -> Option<String> {
    match node {
        Node::String(s) => Some(s.clone()),
        Node::Number(n) => Some(n.to_string()),
        Node::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn resource_decl(id: &str, decl: Node) -> Result<ResourceDecl, TemplateError> {
    let path = format!("Resources.{id}");
    let Node::Map(mut map) = decl else {
        return Err(shape(&path, "must be a mapping"));
    };
    let kind = match map.remove("Type") {
        Some(Node::String(kind)) => kind,
        _ => return Err(shape(&path, "needs a string Type")),
    };
    let condition = match map.remove("Condition") {
        None => None,
        Some(Node::String(c)) => Some(c),
        Some(_) => return Err(shape(&format!("{path}.Condition"), "must be a string")),
    };
    Ok(ResourceDecl {
        logical_id: id.to_owned(),
        kind,
        properties: map
            .remove("Properties")
            .unwrap_or(Node::Map(BTreeMap::new())),
        metadata: map.remove("Metadata").unwrap_or(Node::Null),
        condition,
    })
}

fn is_intrinsic_key(key: &str) -> bool {
    key == "Ref" || key.starts_with("Fn::")
}

/// A JSON value as a [`Node`]: a mapping whose only key is `Ref` or `Fn::*` is that
/// function's call. `Condition` as a sole key stays a mapping: it is also a plain
/// property name (in IAM statements), and [`crate::resolve`] reads it where a
/// condition is expected.
fn to_node(json: Value) -> Node {
    match json {
        Value::Null => Node::Null,
        Value::Bool(b) => Node::Bool(b),
        Value::Number(n) => Node::Number(n),
        Value::String(s) => Node::String(s),
        Value::Array(items) => Node::List(items.into_iter().map(to_node).collect()),
        Value::Object(map) => {
            if map.len() == 1
                && let Some((key, _)) = map.iter().next()
                && is_intrinsic_key(key)
            {
                let (name, arg) = map.into_iter().next().expect("one entry");
                return Node::Intrinsic {
                    name,
                    arg: Box::new(to_node(arg)),
                };
            }
            Node::Map(map.into_iter().map(|(k, v)| (k, to_node(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_forms_become_intrinsics_and_condition_stays_a_mapping() {
        let t = Template::from_json(json!({"Resources": {"A": {"Type": "X", "Properties": {
            "R": {"Ref": "B"},
            "G": {"Fn::GetAtt": ["B", "Arn"]},
            "J": {"Fn::Join": [",", ["a", {"Ref": "B"}]]},
            "C": {"Condition": "IsProd"},
            "M": {"Ref": "B", "Other": 1},
        }}}}))
        .expect("reads");
        let props = &t.resources["A"].properties;
        let intrinsic = |name: &str, arg: Node| Node::Intrinsic {
            name: name.to_owned(),
            arg: Box::new(arg),
        };
        assert_eq!(
            props.get("R"),
            Some(&intrinsic("Ref", Node::String("B".into())))
        );
        assert!(
            matches!(props.get("G"), Some(Node::Intrinsic { name, .. }) if name == "Fn::GetAtt")
        );
        let Some(Node::Intrinsic { arg, .. }) = props.get("J") else {
            panic!("Fn::Join is a call")
        };
        assert!(
            matches!(&**arg, Node::List(items) if matches!(&items[1], Node::List(inner) if matches!(inner[1], Node::Intrinsic { .. })))
        );
        assert!(matches!(props.get("C"), Some(Node::Map(_))));
        assert!(
            matches!(props.get("M"), Some(Node::Map(m)) if m.len() == 2),
            "two keys: a mapping"
        );
    }

    #[test]
    fn parameters_keep_their_constraints() {
        let t = Template::from_json(json!({
            "Parameters": {
                "S": {"Type": "String", "NoEcho": true, "MinLength": 32},
                "N": {"Type": "Number", "Default": 180, "MinValue": 1},
            },
            "Resources": {},
        }))
        .expect("reads");
        assert!(t.parameters["S"].no_echo);
        assert_eq!(t.parameters["S"].min_length, Some(32));
        assert_eq!(t.parameters["S"].default, None);
        assert_eq!(t.parameters["N"].min_value, Some(1.0));
        assert_eq!(t.parameters["N"].default, Some(Node::Number(180.into())));
    }

    #[test]
    fn a_template_without_resources_is_rejected() {
        assert!(matches!(
            Template::from_json(json!({"Parameters": {}})),
            Err(TemplateError::Shape { .. })
        ));
    }
}
