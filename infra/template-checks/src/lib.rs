//! Reads `template.yaml` the way CloudFormation will deploy it, and the Rust sources the
//! way the compiler will run them, so tests can hold one against the other.
//!
//! - [`stack`]: the template, raw and expanded by AWS's own SAM translator.
//! - [`iam`]: policy statements and IAM action matching.
//! - [`rust_source`]: a small lexer-level reader of Rust files: function bodies, the
//!   functions they call, and the AWS SDK operations they invoke.
//! - [`workspace`]: paths, crate manifests, and the SDK crates' operation lists.

pub mod iam;
pub mod rust_source;
pub mod stack;
pub mod workspace;

use std::path::PathBuf;

/// Why a check could not even read what it checks.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("could not read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not run {program}; run `make template-tools` to install it")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    ToolFailed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{what} is not valid JSON")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what}: {detail}")]
    Shape { what: String, detail: String },
}
