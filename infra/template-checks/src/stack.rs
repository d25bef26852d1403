//! The template, as written and as deployed.
//!
//! Expansion is done by aws-sam-translator (from the tools venv) through
//! `sam_expand.py`: re-implementing SAM's policy templates, event-source permissions
//! and Globals merging here would test our reading of SAM, not SAM.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::CheckError;
use crate::workspace;

/// The template before and after the SAM transform.
#[derive(Debug, Clone)]
pub struct Stack {
    /// As written (short tags turned into `{"Ref": ..}` / `{"Fn::GetAtt": ..}` forms).
    pub raw: Value,
    /// What CloudFormation would deploy: plain resources, roles, routes.
    pub expanded: Value,
}

impl Stack {
    /// Expands `template` with the venv's aws-sam-translator, parameters at their
    /// defaults. Offline.
    pub fn load(template: &Path) -> Result<Self, CheckError> {
        Self::load_with(template, &BTreeMap::new())
    }

    /// Expands `template` with `overrides` given to the translator, as `sam local
    /// --parameter-overrides` gives them. Offline.
    pub fn load_with(
        template: &Path,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, CheckError> {
        let expansion = expansion(template, overrides)?;
        let mut both: Value =
            serde_json::from_slice(&expansion).map_err(|source| CheckError::Json {
                what: "sam_expand.py output".to_owned(),
                source,
            })?;
        let shape = |detail: &str| CheckError::Shape {
            what: "sam_expand.py output".to_owned(),
            detail: detail.to_owned(),
        };
        let raw = both.get_mut("raw").ok_or_else(|| shape("no raw"))?.take();
        let expanded = both
            .get_mut("expanded")
            .ok_or_else(|| shape("no expanded"))?
            .take();
        Ok(Self { raw, expanded })
    }

    /// Logical ids of the template's resources of `kind`, as written.
    pub fn raw_resources_of(&self, kind: &str) -> Vec<String> {
        resources_of(&self.raw, kind)
    }

    /// Logical ids of the deployed resources of `kind`.
    pub fn expanded_resources_of(&self, kind: &str) -> Vec<String> {
        resources_of(&self.expanded, kind)
    }

    pub fn raw_resource(&self, logical_id: &str) -> &Value {
        &self.raw["Resources"][logical_id]
    }

    pub fn expanded_resource(&self, logical_id: &str) -> &Value {
        &self.expanded["Resources"][logical_id]
    }

    /// The default of a template parameter, as a number.
    pub fn parameter_default_number(&self, name: &str) -> Option<f64> {
        match &self.raw["Parameters"][name]["Default"] {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }
}

/// The workspace's template.yaml, expanded once per test process. FLASHSALE_TEMPLATE
/// names another file instead (a mutated copy, to see the checks fail).
pub fn workspace_stack() -> &'static Stack {
    static STACK: std::sync::OnceLock<Stack> = std::sync::OnceLock::new();
    STACK.get_or_init(|| {
        let path = std::env::var_os("FLASHSALE_TEMPLATE").map_or_else(
            || workspace::root().join("template.yaml"),
            std::path::PathBuf::from,
        );
        Stack::load(&path)
            .expect("the template expands with aws-sam-translator (make template-tools)")
    })
}

fn resources_of(template: &Value, kind: &str) -> Vec<String> {
    template["Resources"]
        .as_object()
        .map(|resources| {
            resources
                .iter()
                .filter(|(_, resource)| resource["Type"] == kind)
                .map(|(id, _)| id.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Every logical id (or parameter) that `value` refers to: `Ref`, `Fn::GetAtt`, and the
/// `${Name}` / `${Name.Attr}` variables of `Fn::Sub` (pseudo parameters excluded).
pub fn references(value: &Value) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    collect_references(value, &mut found);
    found
}

fn collect_references(value: &Value, found: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("Ref", Value::String(name)) => {
                        if !name.starts_with("AWS::") {
                            found.insert(name.clone());
                        }
                    }
                    ("Fn::GetAtt", Value::Array(parts)) => {
                        if let Some(Value::String(name)) = parts.first() {
                            found.insert(name.clone());
                        }
                    }
                    ("Fn::GetAtt", Value::String(dotted)) => {
                        if let Some(name) = dotted.split('.').next() {
                            found.insert(name.to_owned());
                        }
                    }
                    ("Fn::Sub", Value::String(text)) => {
                        sub_variables(text, &BTreeSet::new(), found)
                    }
                    ("Fn::Sub", Value::Array(parts)) => {
                        let locals: BTreeSet<String> = parts
                            .get(1)
                            .and_then(Value::as_object)
                            .map(|vars| vars.keys().cloned().collect())
                            .unwrap_or_default();
                        if let Some(Value::String(text)) = parts.first() {
                            sub_variables(text, &locals, found);
                        }
                        if let Some(vars) = parts.get(1) {
                            collect_references(vars, found);
                        }
                    }
                    _ => collect_references(inner, found),
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| collect_references(item, found)),
        _ => {}
    }
}

fn sub_variables(text: &str, locals: &BTreeSet<String>, found: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let variable = &after[..end];
        let name = variable.split('.').next().unwrap_or(variable);
        if !variable.starts_with('!') && !name.starts_with("AWS::") && !locals.contains(name) {
            found.insert(name.to_owned());
        }
        rest = &after[end + 1..];
    }
}

/// sam_expand.py's output for `template`, kept under the temp dir by a digest of what
/// decides it: the template, the overrides, the script and the translator's version.
/// cargo-nextest runs each test in a process of its own, and each one (and each start
/// of the local stack) would otherwise spend a Python start and a SAM transform on the
/// same template.
fn expansion(template: &Path, overrides: &BTreeMap<String, String>) -> Result<Vec<u8>, CheckError> {
    use sha2::{Digest, Sha256};

    let python = workspace::venv_python();
    let script = workspace::root().join("infra/template-checks/sam_expand.py");
    let arguments: Vec<String> = overrides
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    // Without the translator there is nothing to key on; the run below says what is missing.
    let cache = translator_version_file(&python)
        .map(|translator| -> Result<_, CheckError> {
            let mut key = Sha256::new();
            for input in [template, &script, &translator] {
                let bytes = std::fs::read(input).map_err(|source| CheckError::Read {
                    path: input.to_path_buf(),
                    source,
                })?;
                key.update((bytes.len() as u64).to_le_bytes());
                key.update(bytes);
            }
            for argument in &arguments {
                key.update((argument.len() as u64).to_le_bytes());
                key.update(argument.as_bytes());
            }
            Ok(std::env::temp_dir()
                .join("flashsale-sam-expansions")
                .join(format!("{:x}.json", key.finalize())))
        })
        .transpose()?;
    if let Some(cached) = cache.as_ref().and_then(|cache| std::fs::read(cache).ok()) {
        return Ok(cached);
    }
    let program = python.display().to_string();
    let output = Command::new(&python)
        .arg(&script)
        .arg(template)
        .args(&arguments)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("SAM_CLI_TELEMETRY", "0")
        .output()
        .map_err(|source| CheckError::Spawn {
            program: program.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(CheckError::ToolFailed {
            program: format!("{program} {}", script.display()),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    // Best effort: a cache that cannot be written only costs the next process a transform.
    // Written under a name of this process's, then renamed, so no reader sees half of it.
    if let Some(cache) = cache
        && let Some(dir) = cache.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        let partial = cache.with_extension(format!("{}.partial", std::process::id()));
        if std::fs::write(&partial, &output.stdout).is_ok() {
            let _ = std::fs::rename(&partial, &cache);
        }
    }
    Ok(output.stdout)
}

/// The translator's `__init__.py`, which holds its `__version__`, in the venv `python`
/// belongs to (`<venv>/bin/python` → `<venv>/lib/python3.*/site-packages`).
fn translator_version_file(python: &Path) -> Option<std::path::PathBuf> {
    let lib = python.parent()?.parent()?.join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("site-packages/samtranslator/__init__.py"))
        .find(|candidate| candidate.exists())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_cover_ref_getatt_and_sub_but_not_pseudo_parameters_or_sub_locals() {
        let value = json!({
            "a": {"Ref": "Table"},
            "b": {"Fn::GetAtt": ["OrdersQueue", "Arn"]},
            "c": {"Fn::Sub": "arn:${AWS::Partition}:x:${ReleaseScheduleGroup}/${Table.Arn}"},
            "d": {"Fn::Sub": ["${queueName}", {"queueName": {"Fn::GetAtt": ["OrdersDLQ", "QueueName"]}}]},
            "e": {"Ref": "AWS::AccountId"}
        });
        let found: Vec<String> = references(&value).into_iter().collect();
        assert_eq!(
            found,
            ["OrdersDLQ", "OrdersQueue", "ReleaseScheduleGroup", "Table"]
        );
    }
}
