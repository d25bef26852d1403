//! Bootstrap sizes and init times.
//!
//! Init is measured as Lambda sees it on the host architecture: the real binary is
//! started under AWS's Runtime Interface Emulator with the environment the template
//! gives it, and init is what the RIE's `INIT REPORT` says (from the process's start to
//! its first request for an event; the RIE initialises on the first invocation, an
//! empty event here, whose answer does not matter). The grab reads
//! its key from Secrets Manager during init; [`InitSecrets`] answers that one call on
//! loopback, so the round trip is measured without moto competing for the cores.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flashsale_local::model::{FunctionSpec, StackModel};
use flashsale_local::resolve::StackContext;
use flashsale_local::template::Template;
use flashsale_rie::{Lambda, LambdaSpec};
use serde::Serialize;

use crate::stats::Percentiles;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("template: {0}")]
    Template(#[from] flashsale_local::template::TemplateError),
    #[error("template model: {0}")]
    Model(#[from] flashsale_local::model::ModelError),
    #[error("{} is missing", path.display())]
    NoBinary { path: PathBuf },
    #[error("could not serve Secrets Manager for the init measurement")]
    Secrets(#[source] std::io::Error),
    #[error("starting {name}")]
    Start {
        name: String,
        #[source]
        source: flashsale_rie::StartError,
    },
    #[error("{name} did not become ready")]
    NotReady {
        name: String,
        #[source]
        source: flashsale_rie::InvokeError,
    },
}

/// One function's binary and how fast it starts.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionInit {
    pub function: String,
    pub bin: String,
    pub bytes: u64,
    pub init: Option<Percentiles>,
}

/// The template's functions with their environment, resolved as a deploy would.
pub fn functions(template: &Path) -> Result<StackModel, InitError> {
    let template = Template::expand(template, &BTreeMap::new())?;
    let context = StackContext {
        stack_name: "bench-init".to_owned(),
        region: flashsale_emulators::REGION.to_owned(),
        account_id: flashsale_emulators::ACCOUNT_ID.to_owned(),
        // Never contacted during init: the functions make no call before their first event.
        sqs_endpoint: "http://127.0.0.1:9".to_owned(),
    };
    Ok(StackModel::build(&template, context, &BTreeMap::new())?)
}

/// Sizes of `<dir>/<bin>/bootstrap` (cargo-lambda's layout) or `<dir>/<bin>` (cargo's).
pub fn binary_path(dir: &Path, bin: &str) -> Option<PathBuf> {
    [dir.join(bin).join("bootstrap"), dir.join(bin)]
        .into_iter()
        .find(|path| path.is_file())
}

/// Secrets Manager for the init measurement: answers `GetSecretValue` (the one call a
/// function makes before its first event) with a key of 64 letters, as the template's
/// generated secret; any other call gets a 400, so a measurement that made one fails.
struct InitSecrets {
    endpoint: String,
    server: tokio::task::JoinHandle<()>,
}

impl InitSecrets {
    async fn start() -> std::io::Result<Self> {
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = service_fn(|request: http::Request<hyper::body::Incoming>| {
                        std::future::ready(Ok::<_, std::convert::Infallible>(secret_answer(
                            &request,
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { endpoint, server })
    }
}

impl Drop for InitSecrets {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn secret_answer<B>(
    request: &http::Request<B>,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let target = request
        .headers()
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok());
    let (status, body) = if target == Some("secretsmanager.GetSecretValue") {
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:bench-init-AbCdEf";
        (
            http::StatusCode::OK,
            serde_json::json!({
                "ARN": arn,
                "Name": "bench-init",
                "SecretString": "k".repeat(64),
                "VersionId": "bench",
                "VersionStages": ["AWSCURRENT"],
            }),
        )
    } else {
        (
            http::StatusCode::BAD_REQUEST,
            serde_json::json!({"__type": "InvalidRequestException", "message": "not served"}),
        )
    };
    http::Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.1")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap_or_default()
}

const CLIENT_ENV: [(&str, &str); 6] = [
    ("AWS_REGION", flashsale_emulators::REGION),
    ("AWS_DEFAULT_REGION", flashsale_emulators::REGION),
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
    // Nothing listens there: a measurement that reached AWS would fail, not pass.
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
];

/// How to start `function`'s binary from `binaries`, with the template's environment.
fn spec_for(
    rie: &Path,
    function: &FunctionSpec,
    binaries: &Path,
    secrets: &InitSecrets,
) -> Result<LambdaSpec, InitError> {
    let bin = &function.binary;
    let path = binary_path(binaries, bin).ok_or_else(|| InitError::NoBinary {
        path: binaries.join(bin),
    })?;
    let mut env: Vec<(String, String)> = function
        .environment
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(
        CLIENT_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env.push((
        "AWS_ENDPOINT_URL_SECRETS_MANAGER".to_owned(),
        secrets.endpoint.clone(),
    ));
    Ok(LambdaSpec {
        rie: rie.to_owned(),
        name: function.name.clone(),
        bootstrap: path,
        runner: Vec::new(),
        env,
        memory_mb: 256,
        timeout: Duration::from_secs(30),
    })
}

async fn started(spec: &LambdaSpec, function: &FunctionSpec) -> Result<Lambda, InitError> {
    Lambda::start(spec)
        .await
        .map_err(|source| InitError::Start {
            name: function.logical_id.clone(),
            source,
        })
}

/// Starts each function's binary `runs` times; `runs == 0` measures sizes only.
pub async fn measure(
    rie: &Path,
    model: &StackModel,
    binaries: &Path,
    runs: usize,
) -> Result<Vec<FunctionInit>, InitError> {
    let secrets = InitSecrets::start().await.map_err(InitError::Secrets)?;
    let mut results = Vec::new();
    for function in &model.functions {
        let spec = spec_for(rie, function, binaries, &secrets)?;
        let bytes = std::fs::metadata(&spec.bootstrap)
            .map(|m| m.len())
            .unwrap_or(0);
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let mut lambda = started(&spec, function).await?;
            let init = lambda
                .init_duration(&serde_json::json!({}))
                .await
                .map_err(|source| InitError::NotReady {
                    name: function.logical_id.clone(),
                    source,
                })?;
            samples.push(init);
            // Dropping the Lambda kills the process before the next run starts.
        }
        results.push(FunctionInit {
            function: function.logical_id.clone(),
            bin: function.binary.clone(),
            bytes,
            init: Percentiles::of(&samples),
        })
    }
    Ok(results)
}

/// Round trips of `count` invocations of one warm function with an HTTP event for a
/// route it does not serve: answered by parsing, routing and an error body, with no I/O,
/// so it shows what the build does to the handler's own CPU work (plus a constant
/// loopback exchange with the RIE).
pub async fn unrouted_invocations(
    rie: &Path,
    model: &StackModel,
    binaries: &Path,
    logical_id: &str,
    event: &serde_json::Value,
    count: usize,
) -> Result<Option<Percentiles>, InitError> {
    let Some(function) = model.function(logical_id) else {
        return Ok(None);
    };
    let secrets = InitSecrets::start().await.map_err(InitError::Secrets)?;
    let spec = spec_for(rie, function, binaries, &secrets)?;
    let mut lambda = started(&spec, function).await?;
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let sent = std::time::Instant::now();
        lambda
            .invoke(event)
            .await
            .map_err(|source| InitError::NotReady {
                name: function.logical_id.clone(),
                source,
            })?;
        samples.push(sent.elapsed());
    }
    Ok(Percentiles::of(&samples))
}
