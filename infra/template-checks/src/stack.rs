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

/// sam_expand.py's output for `template` with `overrides`, kept under the temp dir by a
/// digest of what decides it: the template, the script, the translator's version, and
/// the overrides of the parameters SAM reads itself. cargo-nextest runs each test in a
/// process of its own, and each one (and each start of the local stack) would otherwise
/// spend a Python start and a SAM transform on the same template.
///
/// Which parameters SAM reads is learned as overrides name them (sam_expand.py's
/// `--probe`) and kept beside the expansions: an override of any other parameter cannot
/// change the expansion (SAM leaves its `Ref`s to CloudFormation), so override sets that
/// differ only in those share one expansion, and need no Python once it is cached.
fn expansion(template: &Path, overrides: &BTreeMap<String, String>) -> Result<Vec<u8>, CheckError> {
    use sha2::{Digest, Sha256};

    let python = workspace::venv_python();
    let script = workspace::root().join("infra/template-checks/sam_expand.py");
    let dir = std::env::temp_dir().join("flashsale-sam-expansions");
    // Without the translator there is nothing to key on; the run below says what is missing.
    let template_key = translator_version_file(&python)
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
            Ok(format!("{:x}", key.finalize()))
        })
        .transpose()?;
    let learned_path = template_key
        .as_ref()
        .map(|key| dir.join(format!("{key}.sam-parameters.json")));
    let mut learned: BTreeMap<String, bool> = learned_path
        .as_ref()
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default();
    let name_value = |(name, value): (&String, &String)| format!("{name}={value}");
    // Sorted as strings, the one order both paths below key the cache by.
    let mut read_by_sam: Vec<String> = overrides
        .iter()
        .filter(|(name, _)| learned.get(*name) == Some(&true))
        .map(name_value)
        .collect();
    read_by_sam.sort();
    let unprobed: Vec<String> = overrides
        .iter()
        .filter(|(name, _)| !learned.contains_key(*name))
        .map(name_value)
        .collect();
    let cache_of = |applied: &[String]| {
        template_key.as_ref().map(|key| {
            let mut digest = Sha256::new();
            for argument in applied {
                digest.update((argument.len() as u64).to_le_bytes());
                digest.update(argument.as_bytes());
            }
            dir.join(format!("{key}-{:x}.json", digest.finalize()))
        })
    };
    if unprobed.is_empty()
        && let Some(cached) = cache_of(&read_by_sam).and_then(|cache| std::fs::read(cache).ok())
    {
        return Ok(cached);
    }

    let program = python.display().to_string();
    let output = Command::new(&python)
        .arg(&script)
        .arg(template)
        .args(&read_by_sam)
        .args(
            unprobed
                .iter()
                .flat_map(|argument| ["--probe", argument.as_str()]),
        )
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
    let mut applied = read_by_sam;
    if !unprobed.is_empty() {
        let answer: serde_json::Value =
            serde_json::from_slice(&output.stdout).map_err(|source| CheckError::Json {
                what: "sam_expand.py output".to_owned(),
                source,
            })?;
        let read: BTreeSet<&str> = answer["sam_parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .collect();
        for (name, value) in overrides
            .iter()
            .filter(|(name, _)| !learned.contains_key(*name))
        {
            if read.contains(name.as_str()) {
                applied.push(format!("{name}={value}"));
            }
        }
        for argument in &unprobed {
            let name = argument
                .split_once('=')
                .map_or(argument.as_str(), |(name, _)| name);
            learned.insert(name.to_owned(), read.contains(name));
        }
        applied.sort();
        if let Some(path) = &learned_path {
            let text = serde_json::to_vec(&learned).expect("a map of strings serializes");
            write_atomically(&dir, path, &text);
        }
    }
    if let Some(cache) = cache_of(&applied) {
        write_atomically(&dir, &cache, &output.stdout);
    }
    Ok(output.stdout)
}

/// Best effort: a cache that cannot be written only costs the next process a transform.
/// Written under a name of this process's, then renamed, so no reader sees half of it.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) {
    if std::fs::create_dir_all(dir).is_ok() {
        let partial = path.with_extension(format!("{}.partial", std::process::id()));
        if std::fs::write(&partial, bytes).is_ok() {
            let _ = std::fs::rename(&partial, path);
        }
    }
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

    /// Needs the tools venv's aws-sam-translator, as every test of this crate does.
    #[test]
    fn only_the_overrides_sam_reads_reach_it_and_which_those_are_is_remembered() {
        let template = workspace::root().join("template.yaml");
        let overrides = BTreeMap::from([
            (
                "SalePageOrigin".to_owned(),
                "https://shop.example".to_owned(),
            ),
            ("GrabThrottleRateLimit".to_owned(), "7".to_owned()),
        ]);
        let stack = Stack::load_with(&template, &overrides).expect("expands");
        let body = &stack.expanded["Resources"]["HttpApi"]["Properties"]["Body"];
        assert_eq!(
            body["x-amazon-apigateway-cors"]["allowOrigins"],
            json!(["https://shop.example"]),
            "SAM resolves the CORS origins itself, so the override reached it"
        );
        assert_eq!(
            stack.expanded["Resources"]["HttpApiStage"]["Properties"]["RouteSettings"]["POST /sales/{sale_id}/grab/{token}"]
                ["ThrottlingRateLimit"],
            json!({"Ref": "GrabThrottleRateLimit"}),
            "SAM leaves the throttle to CloudFormation: the evaluation applies it"
        );

        let learned = std::fs::read_dir(std::env::temp_dir().join("flashsale-sam-expansions"))
            .expect("the cache exists")
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".sam-parameters.json")
            })
            .filter_map(|entry| std::fs::read(entry.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<BTreeMap<String, bool>>(&bytes).ok())
            .find(|learned| learned.contains_key("GrabThrottleRateLimit"))
            .expect("what was learned is kept");
        assert_eq!(learned.get("SalePageOrigin"), Some(&true));
        assert_eq!(learned.get("GrabThrottleRateLimit"), Some(&false));

        let again = Stack::load_with(&template, &overrides).expect("expands");
        assert_eq!(again.expanded, stack.expanded);
    }

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
