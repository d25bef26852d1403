//! `template.yaml` as data: YAML with CloudFormation's short tags (`!Ref`, `!GetAtt`,
//! `!Sub`...) and long forms (`Ref`, `Fn::GetAtt`...), turned into a [`Node`] tree in
//! which every intrinsic function is explicit. Nothing is evaluated here; see
//! [`crate::resolve`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_norway::Value as Yaml;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("could not read the template {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the template is not valid YAML")]
    Yaml(#[source] serde_norway::Error),
    #[error("the template is not a mapping at the top level")]
    NotAMapping,
    #[error("{path}: mapping keys must be strings")]
    NonStringKey { path: String },
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
    /// The resource's `Condition`, if any (the local stack does not evaluate conditions).
    pub condition: Option<String>,
}

/// A parsed SAM/CloudFormation template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub parameters: BTreeMap<String, ParameterDecl>,
    /// `Globals` (SAM), by section (`Function`, `HttpApi`...).
    pub globals: BTreeMap<String, Node>,
    /// `Conditions`, by name.
    pub conditions: BTreeMap<String, Node>,
    pub resources: BTreeMap<String, ResourceDecl>,
}

impl Template {
    pub fn from_path(path: &Path) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|source| TemplateError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let yaml: Yaml = serde_norway::from_str(text).map_err(TemplateError::Yaml)?;
        let root = to_node(yaml, "")?;
        let Node::Map(mut root) = root else {
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
        let globals = match root.remove("Globals") {
            None => BTreeMap::new(),
            Some(Node::Map(globals)) => globals,
            Some(_) => return Err(shape("Globals", "must be a mapping")),
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
            globals,
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
        condition,
    })
}

/// The long-form name of a short tag: `!Ref` -> `Ref`, `!Condition` -> `Condition`,
/// `!GetAtt` -> `Fn::GetAtt`.
fn long_name(tag: &str) -> String {
    let tag = tag.trim_start_matches('!');
    match tag {
        "Ref" | "Condition" => tag.to_owned(),
        other => format!("Fn::{other}"),
    }
}

fn is_intrinsic_key(key: &str) -> bool {
    key == "Ref" || key == "Condition" || key.starts_with("Fn::")
}

fn to_node(yaml: Yaml, path: &str) -> Result<Node, TemplateError> {
    Ok(match yaml {
        Yaml::Null => Node::Null,
        Yaml::Bool(b) => Node::Bool(b),
        Yaml::Number(n) => Node::Number(yaml_number(&n, path)?),
        Yaml::String(s) => Node::String(s),
        Yaml::Sequence(items) => Node::List(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| to_node(item, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Mapping(mapping) => {
            let mut map = BTreeMap::new();
            for (key, value) in mapping {
                let key = match key {
                    Yaml::String(s) => s,
                    _ => {
                        return Err(TemplateError::NonStringKey {
                            path: path.to_owned(),
                        });
                    }
                };
                let child = format!("{path}.{key}");
                map.insert(key, to_node(value, &child)?);
            }
            // Long form: a mapping with the function name as its only key.
            if map.len() == 1
                && let Some((key, _)) = map.iter().next()
                && is_intrinsic_key(key)
            {
                let (name, arg) = map.into_iter().next().expect("one entry");
                // `Condition` as a key is also a plain property name (e.g. in IAM
                // statements), so only `Ref`/`Fn::*` are taken as functions here.
                if name == "Condition" {
                    return Ok(Node::Map(BTreeMap::from([(name, arg)])));
                }
                return Ok(Node::Intrinsic {
                    name,
                    arg: Box::new(arg),
                });
            }
            Node::Map(map)
        }
        Yaml::Tagged(tagged) => {
            let name = long_name(&tagged.tag.to_string());
            let arg = to_node(tagged.value, path)?;
            Node::Intrinsic {
                name,
                arg: Box::new(arg),
            }
        }
    })
}

fn yaml_number(n: &serde_norway::Number, path: &str) -> Result<serde_json::Number, TemplateError> {
    if let Some(u) = n.as_u64() {
        Ok(u.into())
    } else if let Some(i) = n.as_i64() {
        Ok(i.into())
    } else {
        n.as_f64()
            .and_then(serde_json::Number::from_f64)
            .ok_or_else(|| shape(path, "numbers must be finite"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intrinsic(name: &str, arg: Node) -> Node {
        Node::Intrinsic {
            name: name.to_owned(),
            arg: Box::new(arg),
        }
    }

    #[test]
    fn short_and_long_forms_parse_to_the_same_intrinsics() {
        let short = Template::parse(
            "Resources:\n  A:\n    Type: X\n    Properties:\n      R: !Ref B\n      G: !GetAtt B.Arn\n      S: !Sub '${B}-x'\n      J: !Join [',', [a, !Ref B]]\n",
        )
        .expect("parses");
        let long = Template::parse(
            "Resources:\n  A:\n    Type: X\n    Properties:\n      R: {Ref: B}\n      G: {'Fn::GetAtt': B.Arn}\n      S: {'Fn::Sub': '${B}-x'}\n      J: {'Fn::Join': [',', [a, {Ref: B}]]}\n",
        )
        .expect("parses");
        assert_eq!(short, long);
        let props = &short.resources["A"].properties;
        assert_eq!(
            props.get("R"),
            Some(&intrinsic("Ref", Node::String("B".into())))
        );
        assert_eq!(
            props.get("G"),
            Some(&intrinsic("Fn::GetAtt", Node::String("B.Arn".into())))
        );
    }

    #[test]
    fn parameters_keep_their_constraints() {
        let t = Template::parse(
            "Parameters:\n  S:\n    Type: String\n    NoEcho: true\n    MinLength: 32\n  N:\n    Type: Number\n    Default: 180\n    MinValue: 1\nResources: {}\n",
        )
        .expect("parses");
        assert!(t.parameters["S"].no_echo);
        assert_eq!(t.parameters["S"].min_length, Some(32));
        assert_eq!(t.parameters["S"].default, None);
        assert_eq!(t.parameters["N"].min_value, Some(1.0));
        assert_eq!(t.parameters["N"].default, Some(Node::Number(180.into())));
    }

    #[test]
    fn a_template_without_resources_is_rejected() {
        assert!(matches!(
            Template::parse("Parameters: {}\n"),
            Err(TemplateError::Shape { .. })
        ));
    }
}
