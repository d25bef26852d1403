//! IAM policy statements, read from the expanded template.

use serde_json::Value;

use crate::CheckError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// One statement of a policy document. `Action` and `Resource` may be a string or a list
/// in IAM; both are normalised to lists here.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The inline policy this statement belongs to.
    pub policy: String,
    pub sid: Option<String>,
    pub effect: Effect,
    pub actions: Vec<String>,
    /// `Resource` values (intrinsics kept as JSON), empty when the statement uses
    /// `NotResource`.
    pub resources: Vec<Value>,
    pub not_resources: Vec<Value>,
    pub condition: Option<Value>,
}

/// What a role may do: its inline statements and its managed policy ARNs.
#[derive(Debug, Clone, PartialEq)]
pub struct RolePolicies {
    pub statements: Vec<Statement>,
    pub managed_policy_arns: Vec<String>,
}

fn shape(what: &str, detail: impl Into<String>) -> CheckError {
    CheckError::Shape {
        what: what.to_owned(),
        detail: detail.into(),
    }
}

fn one_or_many(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// Reads an `AWS::IAM::Role` resource of the expanded template.
pub fn role_policies(role_id: &str, role: &Value) -> Result<RolePolicies, CheckError> {
    let properties = &role["Properties"];
    let mut statements = Vec::new();
    for policy in properties["Policies"].as_array().into_iter().flatten() {
        let name = policy["PolicyName"]
            .as_str()
            .ok_or_else(|| shape(role_id, "a policy without a literal PolicyName"))?;
        statements.extend(document_statements(name, &policy["PolicyDocument"])?);
    }
    let managed_policy_arns = properties["ManagedPolicyArns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|arn| {
            arn.as_str().map(str::to_owned).ok_or_else(|| {
                shape(
                    role_id,
                    format!("a managed policy that is not a literal ARN: {arn}"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(RolePolicies {
        statements,
        managed_policy_arns,
    })
}

/// The statements of one policy document.
pub fn document_statements(policy: &str, document: &Value) -> Result<Vec<Statement>, CheckError> {
    one_or_many(&document["Statement"])
        .iter()
        .map(|statement| {
            let effect = match statement["Effect"].as_str() {
                Some("Allow") => Effect::Allow,
                Some("Deny") => Effect::Deny,
                other => return Err(shape(policy, format!("statement effect {other:?}"))),
            };
            let actions = one_or_many(&statement["Action"])
                .iter()
                .map(|action| {
                    action
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| shape(policy, format!("non-literal action {action}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if actions.is_empty() {
                return Err(shape(
                    policy,
                    "a statement with no Action (NotAction is not used here)",
                ));
            }
            Ok(Statement {
                policy: policy.to_owned(),
                sid: statement["Sid"].as_str().map(str::to_owned),
                effect,
                actions,
                resources: one_or_many(&statement["Resource"]),
                not_resources: one_or_many(&statement["NotResource"]),
                condition: statement.get("Condition").cloned(),
            })
        })
        .collect()
}

/// Whether an IAM action pattern (`service:Name`, `*` and `?` wildcards, case-insensitive
/// as IAM is) covers `action`.
pub fn action_matches(pattern: &str, action: &str) -> bool {
    let pattern: Vec<char> = pattern.to_ascii_lowercase().chars().collect();
    let action: Vec<char> = action.to_ascii_lowercase().chars().collect();
    glob(&pattern, &action)
}

fn glob(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some(('?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_patterns_match_like_iam() {
        assert!(action_matches("sqs:SendMessage*", "sqs:SendMessage"));
        assert!(action_matches("sqs:SendMessage*", "sqs:sendmessagebatch"));
        assert!(action_matches("dynamodb:GetItem", "dynamodb:getitem"));
        assert!(action_matches("*", "iam:PassRole"));
        assert!(action_matches("dynamodb:?etItem", "dynamodb:GetItem"));
        assert!(!action_matches("dynamodb:GetItem", "dynamodb:GetItems"));
        assert!(!action_matches("sqs:Send*", "sns:SendMessage"));
    }
}
