//! The workspace around the template: its crates and their bins (from `cargo metadata`),
//! the tools venv, and the operations each AWS SDK crate offers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::CheckError;

/// The workspace root (this crate lives at `infra/template-checks`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tools venv's python, which has aws-sam-translator (`make template-tools`).
pub fn venv_python() -> PathBuf {
    let tools = std::env::var_os("FLASHSALE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools"));
    tools.join("venv/bin/python")
}

/// A workspace package as `cargo metadata` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    /// The directory holding its Cargo.toml, canonical.
    pub dir: PathBuf,
    /// Names and source paths of its `bin` targets.
    pub bins: Vec<(String, PathBuf)>,
}

/// The workspace's own packages. Runs `cargo metadata --no-deps`, which needs no network.
pub fn packages() -> Result<Vec<Package>, CheckError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .map_err(|source| CheckError::Spawn {
            program: cargo.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(CheckError::ToolFailed {
            program: format!("{cargo} metadata"),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).map_err(|source| CheckError::Json {
            what: "cargo metadata".to_owned(),
            source,
        })?;
    let shape = |detail: &str| CheckError::Shape {
        what: "cargo metadata".to_owned(),
        detail: detail.to_owned(),
    };
    let mut packages = Vec::new();
    for package in metadata["packages"]
        .as_array()
        .ok_or_else(|| shape("no packages"))?
    {
        let name = package["name"]
            .as_str()
            .ok_or_else(|| shape("package without name"))?;
        let manifest = package["manifest_path"]
            .as_str()
            .ok_or_else(|| shape("package without manifest_path"))?;
        let dir = Path::new(manifest)
            .parent()
            .ok_or_else(|| shape("manifest_path without a directory"))?;
        let bins = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|target| {
                target["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "bin"))
            })
            .filter_map(|target| {
                Some((
                    target["name"].as_str()?.to_owned(),
                    PathBuf::from(target["src_path"].as_str()?),
                ))
            })
            .collect();
        packages.push(Package {
            name: name.to_owned(),
            dir: canonical(dir)?,
            bins,
        });
    }
    Ok(packages)
}

/// `path`, canonicalized (so `functions/grab` and `/work/x/functions/grab` compare equal).
pub fn canonical(path: &Path) -> Result<PathBuf, CheckError> {
    path.canonicalize().map_err(|source| CheckError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The version of `crate_name` that Cargo.lock pins (the first entry of that name).
pub fn locked_version(crate_name: &str) -> Result<String, CheckError> {
    let lock_path = root().join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path).map_err(|source| CheckError::Read {
        path: lock_path.clone(),
        source,
    })?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("name = \"{crate_name}\"")
            && let Some(version) = lines
                .next()
                .and_then(|next| next.trim().strip_prefix("version = \""))
                .and_then(|rest| rest.strip_suffix('"'))
        {
            return Ok(version.to_owned());
        }
    }
    Err(CheckError::Shape {
        what: lock_path.display().to_string(),
        detail: format!("no locked version of {crate_name}"),
    })
}

/// Every operation of an AWS SDK for Rust crate, in the snake_case its fluent client
/// methods use: the names of the crate's `src/operation/*` modules, one per API.
/// Read from the cargo registry copy the build itself compiles.
pub fn sdk_operations(crate_name: &str) -> Result<BTreeSet<String>, CheckError> {
    let version = locked_version(crate_name)?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or_else(|| CheckError::Shape {
            what: "CARGO_HOME".to_owned(),
            detail: "neither CARGO_HOME nor HOME is set".to_owned(),
        })?;
    let registry = cargo_home.join("registry/src");
    let indexes = std::fs::read_dir(&registry).map_err(|source| CheckError::Read {
        path: registry.clone(),
        source,
    })?;
    for index in indexes.flatten() {
        let operations_dir = index
            .path()
            .join(format!("{crate_name}-{version}/src/operation"));
        if !operations_dir.is_dir() {
            continue;
        }
        let entries = std::fs::read_dir(&operations_dir).map_err(|source| CheckError::Read {
            path: operations_dir.clone(),
            source,
        })?;
        let operations: BTreeSet<String> = entries
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
            .collect();
        if !operations.is_empty() {
            return Ok(operations);
        }
    }
    Err(CheckError::Shape {
        what: registry.display().to_string(),
        detail: format!(
            "{crate_name}-{version} is not in the cargo registry; build the workspace first"
        ),
    })
}

/// `get_item` -> `GetItem`: the API name an SDK operation calls, which is also the IAM
/// action name for every operation this project uses.
pub fn api_name(operation: &str) -> String {
    operation
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_operation_names_become_api_names() {
        assert_eq!(api_name("get_item"), "GetItem");
        assert_eq!(api_name("transact_write_items"), "TransactWriteItems");
        assert_eq!(api_name("send_message"), "SendMessage");
    }
}
