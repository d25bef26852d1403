//! The real `bootstrap` binaries under AWS's Lambda Runtime Interface Emulator.
//!
//! `aws-lambda-rie` is AWS's own emulator of the Lambda Runtime API, the one inside
//! AWS's base images and `sam local`; the aws-sam-cli wheel bundles it for both
//! architectures (`samcli/local/rapid/aws-lambda-rie-{x86_64,arm64}`). It runs a
//! bootstrap directly on the host, without Docker: [`Lambda::start`] starts it with the
//! function's environment and free ports, and [`Lambda::invoke`] posts an event to its
//! invoke endpoint, so an invocation exercises the binary's `main` (config, clients,
//! handler) exactly as Lambda's runtime protocol drives it. The RIE initialises the
//! function on its first invocation, as on-demand Lambda does, and logs
//! `INIT REPORT(durationMs: ...)`, which [`Lambda::init_duration`] reads.
//!
//! [`sam`] runs the same bootstraps under the SAM CLI instead: `sam local invoke` and
//! `sam local start-api`, in Lambda containers on Docker.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

mod ports;
pub mod sam;
use ports::PortLease;

/// Where the aws-sam-cli wheel keeps the RIE, under a virtualenv's `site-packages`.
const RAPID_DIR: &str = "samcli/local/rapid";

/// The RIE built for this host, inside the virtualenv at `venv` (where `make tools`
/// installs aws-sam-cli), if it is there.
pub fn bundled_rie(venv: &Path) -> Option<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        other => other,
    };
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|python| {
            python
                .path()
                .join("site-packages")
                .join(RAPID_DIR)
                .join(format!("aws-lambda-rie-{arch}"))
        })
        .find(|rie| rie.is_file())
}

/// What the function answered to one invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler's answer.
    Response(Vec<u8>),
    /// The handler returned `Err` (or panicked): the runtime reported
    /// `{"errorType", "errorMessage"}`, which the RIE answers as the body.
    FunctionError(FunctionError),
}

impl Outcome {
    /// The response as JSON, or why it is not one.
    pub fn json(&self) -> Result<Value, InvokeError> {
        match self {
            Self::Response(body) => {
                serde_json::from_slice(body).map_err(|source| InvokeError::NotJson {
                    body: String::from_utf8_lossy(body).into_owned(),
                    source,
                })
            }
            Self::FunctionError(error) => Err(InvokeError::Function(error.clone())),
        }
    }

    /// The RIE answers a function error with status 200 and the error as the body, as
    /// `sam local invoke` shows it: an object of exactly `errorType` and
    /// `errorMessage` (and perhaps `stackTrace`) is one.
    pub(crate) fn of_body(body: Vec<u8>) -> Self {
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let is_error = parsed.as_object().is_some_and(|object| {
            object.contains_key("errorType")
                && object
                    .keys()
                    .all(|key| matches!(key.as_str(), "errorType" | "errorMessage" | "stackTrace"))
        });
        if !is_error {
            return Self::Response(body);
        }
        let text = |key: &str| {
            parsed
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Self::FunctionError(FunctionError {
            error_type: text("errorType"),
            error_message: text("errorMessage"),
        })
    }
}

/// An error as the runtime reports it (`{"errorType", "errorMessage"}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error_type}: {error_message}")]
pub struct FunctionError {
    pub error_type: String,
    pub error_message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{} is not there", path.display())]
    Missing { path: PathBuf },
    #[error("could not lease a free port on loopback")]
    Port(#[source] std::io::Error),
    #[error("could not start {}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the RIE exited ({status}) before it listened\n--- output ---\n{logs}")]
    Exited { status: ExitStatus, logs: String },
    #[error("the RIE did not listen on {address} within {waited:?}\n--- output ---\n{logs}")]
    NotListening {
        address: String,
        waited: Duration,
        logs: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The RIE answered with an error status: the function could not start, or its
    /// process died during the invocation (`Runtime.ExitError` in the logs).
    #[error("the RIE answered {status}: {body}\n--- function output ---\n{logs}")]
    Failed {
        status: u16,
        body: String,
        logs: String,
    },
    #[error("no answer within {timeout:?}\n--- function output ---\n{logs}")]
    TimedOut { timeout: Duration, logs: String },
    #[error("the RIE process exited ({status})\n--- function output ---\n{logs}")]
    Exited { status: ExitStatus, logs: String },
    #[error("could not reach the RIE: {source}\n--- function output ---\n{logs}")]
    Transport {
        #[source]
        source: reqwest::Error,
        logs: String,
    },
    #[error("could not wait for the RIE process")]
    Wait(#[source] std::io::Error),
    #[error("the function failed the invocation: {0}")]
    Function(FunctionError),
    #[error("the response is not JSON: {body}")]
    NotJson {
        body: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the function did not initialise\n--- function output ---\n{logs}")]
    InitFailed { logs: String },
    #[error("could not start the RIE again after another process took its port")]
    Restart(#[source] StartError),
    #[error("no INIT REPORT in the RIE's output\n--- function output ---\n{logs}")]
    NoInitReport { logs: String },
}

/// How to start one function.
#[derive(Debug, Clone)]
pub struct LambdaSpec {
    /// `aws-lambda-rie` for this host ([`bundled_rie`]).
    pub rie: PathBuf,
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub name: String,
    /// The `bootstrap` binary.
    pub bootstrap: PathBuf,
    /// A program (and its arguments) to run the binary under, e.g. `qemu-aarch64 -L
    /// /usr/aarch64-linux-gnu` for an arm64 build on an x86_64 host. Empty: the RIE runs
    /// the binary itself.
    pub runner: Vec<String>,
    /// The function's configured environment (template variables, endpoints, credentials).
    pub env: Vec<(String, String)>,
    pub memory_mb: u32,
    pub timeout: Duration,
}

/// How many pairs of ports a function is tried on. A [`PortLease`] keeps the ports of
/// cooperating processes apart, but a process outside them may still bind one first;
/// the RIE then panics before any event can reach the function, so a fresh pair is
/// safe to try.
const PORT_ATTEMPTS: usize = 5;

/// The RIE's panic when a port it was given is taken (at start for its invoke
/// endpoint, at the first invocation for the Runtime API).
fn a_port_was_taken(logs: &str) -> bool {
    logs.contains("bind: address already in use")
}

/// The RIE recorded the runtime's exit as the init's fatal error, with no report after.
fn the_runtime_exited_in_init(logs: &str) -> bool {
    logs.contains("First fatal error stored in appctx: Runtime.ExitError")
        && init_report(logs).is_none()
}

/// The init failed because the bootstrap's call to the Runtime API at `address` was
/// refused: the RIE was not listening yet.
fn the_runtime_api_refused_the_bootstrap(logs: &str, address: &str) -> bool {
    init_report(logs) == Some(InitReport::Failed)
        && logs.lines().any(|line| {
            line.contains(address)
                && (line.contains("Connection refused") || line.contains("ConnectionRefused"))
        })
}

/// One function under its own RIE. Killed when dropped.
pub struct Lambda {
    spec: LambdaSpec,
    child: Child,
    runtime_address: String,
    invoke_url: String,
    http: reqwest::Client,
    logs: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    timeout: Duration,
    // Held as long as the RIE may bind them.
    _ports: [PortLease; 2],
}

impl Lambda {
    /// Starts the RIE on two free loopback ports (its invoke endpoint and the Runtime API
    /// it serves the function), with the variables Lambda sets that the RIE does not,
    /// then the spec's environment. Nothing else of this process's environment leaks in
    /// (except PATH, to find the runner), as in Lambda. Answers once the RIE listens;
    /// tries fresh ports if another process took one first.
    pub async fn start(spec: &LambdaSpec) -> Result<Self, StartError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(spec).await {
                Err(StartError::Exited { logs, .. })
                    if attempt < PORT_ATTEMPTS && a_port_was_taken(&logs) =>
                {
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(spec: &LambdaSpec) -> Result<Self, StartError> {
        for path in [&spec.rie, &spec.bootstrap] {
            if !path.is_file() {
                return Err(StartError::Missing { path: path.clone() });
            }
        }
        // The process runs in its task root, so a relative path would not resolve.
        let bootstrap = spec
            .bootstrap
            .canonicalize()
            .map_err(|source| StartError::Spawn {
                program: spec.bootstrap.clone(),
                source,
            })?;
        let task_root = bootstrap
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let rie = spec
            .rie
            .canonicalize()
            .map_err(|source| StartError::Spawn {
                program: spec.rie.clone(),
                source,
            })?;
        let ports = [
            PortLease::take().map_err(StartError::Port)?,
            PortLease::take().map_err(StartError::Port)?,
        ];
        let invoke_address = format!("127.0.0.1:{}", ports[0].port());
        let runtime_address = format!("127.0.0.1:{}", ports[1].port());
        let mut command = Command::new(&rie);
        command
            .arg("--runtime-interface-emulator-address")
            .arg(&invoke_address)
            .arg("--runtime-api-address")
            .arg(&runtime_address)
            .args(&spec.runner)
            .arg(&bootstrap)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_FUNCTION_NAME", &spec.name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
                spec.memory_mb.to_string(),
            )
            .env(
                "AWS_LAMBDA_FUNCTION_TIMEOUT",
                spec.timeout.as_secs().max(1).to_string(),
            )
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{}", spec.name),
            )
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "rie")
            .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
            .env("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023")
            .env("_HANDLER", "bootstrap")
            .env("LAMBDA_TASK_ROOT", &task_root)
            .env("TZ", ":UTC")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&task_root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, so that dropping the Lambda ends the bootstrap (and a
            // runner such as qemu) with the RIE, not only the RIE.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| StartError::Spawn {
            program: spec.rie.clone(),
            source,
        })?;
        let logs = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(collect(stdout, Arc::clone(&logs)));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(collect(stderr, Arc::clone(&logs)));
        }
        let mut lambda = Self {
            spec: spec.clone(),
            child,
            runtime_address: runtime_address.clone(),
            invoke_url: format!(
                "http://{invoke_address}/2015-03-31/functions/function/invocations"
            ),
            http: reqwest::Client::new(),
            logs,
            readers,
            timeout: spec.timeout,
            _ports: ports,
        };
        lambda.listening(&invoke_address).await?;
        Ok(lambda)
    }

    /// Waits until the RIE listens, or fails at once if it exited (it panics when a
    /// port it was given is taken).
    async fn listening(&mut self, address: &str) -> Result<(), StartError> {
        let waited = Duration::from_secs(10);
        let until = Instant::now() + waited;
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(StartError::Exited {
                    status,
                    logs: self.logs(),
                });
            }
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(StartError::NotListening {
            address: address.to_owned(),
            waited,
            logs: self.logs(),
        })
    }

    /// Everything the RIE and the function printed so far.
    pub fn logs(&self) -> String {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The function's init time, as the RIE reports it (`INIT REPORT(durationMs: ...)`:
    /// from starting the process to its first request for an event). The RIE
    /// initialises on the first invocation, so `probe` is invoked first if nothing was
    /// yet; its answer, whatever it is, does not matter.
    pub async fn init_duration(&mut self, probe: &Value) -> Result<Duration, InvokeError> {
        if init_report(&self.logs()).is_none() {
            match self.invoke(probe).await {
                Ok(_) | Err(InvokeError::Failed { .. }) => {}
                // A runtime that exits at once can crash the RIE itself ("Unable to find
                // an exitedChannel"), after it recorded the exit: still an init failure.
                Err(InvokeError::Exited { .. } | InvokeError::Transport { .. })
                    if self.went_down().await && the_runtime_exited_in_init(&self.logs()) =>
                {
                    return Err(InvokeError::InitFailed { logs: self.logs() });
                }
                Err(other) => return Err(other),
            }
            // The RIE prints the report before it answers; the reader may lag a moment.
            let until = Instant::now() + Duration::from_secs(2);
            while init_report(&self.logs()).is_none() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let logs = self.logs();
        match init_report(&logs) {
            Some(InitReport::Done(duration)) => Ok(duration),
            Some(InitReport::Failed) => Err(InvokeError::InitFailed { logs }),
            None => Err(InvokeError::NoInitReport { logs }),
        }
    }

    /// Invokes the function with `event` and waits, at most its timeout (plus a margin
    /// for the RIE's own answer), for the answer. If the RIE lost a race of its own
    /// before the function could see the event, a new RIE on fresh ports gets it.
    pub async fn invoke(&mut self, event: &Value) -> Result<Outcome, InvokeError> {
        let mut attempt = 1;
        loop {
            match self.invoke_once(event).await {
                Err(error) if attempt < PORT_ATTEMPTS && self.never_ran_the_event(&error).await => {
                    attempt += 1;
                    // The old RIE's process group ends as it is dropped here.
                    *self = Self::start(&self.spec)
                        .await
                        .map_err(InvokeError::Restart)?;
                }
                answered => return answered,
            }
        }
    }

    /// The two races the RIE can lose at the first invocation, neither of which exists
    /// in Lambda, and after both of which no runtime ever fetched the event:
    /// - another process bound the Runtime API port first, and the RIE panicked (the
    ///   invocation then broke, or reached that process and got a 404);
    /// - the RIE starts the runtime beside its Runtime API server, not after it, so on
    ///   a busy machine the bootstrap's first call is refused and it exits.
    async fn never_ran_the_event(&mut self, error: &InvokeError) -> bool {
        match error {
            InvokeError::Exited { .. }
            | InvokeError::Transport { .. }
            | InvokeError::Failed { status: 404, .. } => {
                self.went_down().await && a_port_was_taken(&self.logs())
            }
            InvokeError::Failed { logs, .. } => {
                the_runtime_api_refused_the_bootstrap(logs, &self.runtime_address)
            }
            _ => false,
        }
    }

    /// Whether the RIE exited (it may still be going down when its connection broke);
    /// if so, its output is all in [`Self::logs`].
    async fn went_down(&mut self) -> bool {
        match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
            Ok(Ok(_)) => {}
            _ => return false,
        }
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        true
    }

    async fn invoke_once(&mut self, event: &Value) -> Result<Outcome, InvokeError> {
        if let Some(status) = self.child.try_wait().ok().flatten() {
            return Err(self.exited(status).await);
        }
        let timeout = self.timeout + Duration::from_secs(5);
        let sent = self
            .http
            .post(&self.invoke_url)
            .json(event)
            .timeout(timeout)
            .send();
        let response = tokio::select! {
            response = sent => response,
            status = self.child.wait() => {
                return Err(match status {
                    Ok(status) => self.exited(status).await,
                    Err(error) => InvokeError::Wait(error),
                });
            }
        };
        let response = match response {
            Ok(response) => response,
            Err(error) if error.is_timeout() => {
                return Err(InvokeError::TimedOut {
                    timeout,
                    logs: self.logs(),
                });
            }
            Err(source) => {
                // A broken connection is most often the RIE going down: wait for its
                // last words.
                self.went_down().await;
                return Err(InvokeError::Transport {
                    source,
                    logs: self.logs(),
                });
            }
        };
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|source| InvokeError::Transport {
                source,
                logs: self.logs(),
            })?
            .to_vec();
        // The RIE answers a function that outlived its timeout with 200 and this text.
        if body.starts_with(b"Task timed out after") {
            return Err(InvokeError::TimedOut {
                timeout: self.timeout,
                logs: self.logs(),
            });
        }
        if status != 200 {
            return Err(InvokeError::Failed {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
                logs: self.logs(),
            });
        }
        Ok(Outcome::of_body(body))
    }

    /// The RIE itself exited: its output, once the pipes have drained.
    async fn exited(&mut self, status: ExitStatus) -> InvokeError {
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        InvokeError::Exited {
            status,
            logs: self.logs(),
        }
    }
}

impl Drop for Lambda {
    /// Ends the RIE's whole process group: the RIE, the bootstrap it started and any
    /// runner. `kill_on_drop` alone would leave the bootstrap running.
    fn drop(&mut self) {
        let group = self
            .child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw);
        if let Some(group) = group {
            // Already gone is fine: there is nothing left to end.
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// What the RIE's `INIT RTDONE` and `INIT REPORT` lines said of the first init.
#[derive(Debug, Clone, Copy, PartialEq)]
enum InitReport {
    Done(Duration),
    Failed,
}

/// The first init's outcome. Two formats are in the RIE's builds: `INIT RTDONE(status:
/// error)` before `INIT REPORT(durationMs: ...)`, or the report carrying the status
/// itself, `INIT REPORT(initType: ..., durationMs: ..., status: error, ...)`.
fn init_report(logs: &str) -> Option<InitReport> {
    let report = logs.find("INIT REPORT(")?;
    let after = &logs[report..];
    let line = after.lines().next().unwrap_or_default();
    let failed_before = logs[..report].contains("INIT RTDONE(status: error)");
    let failed_in_report = line
        .split("status: ")
        .nth(1)
        .is_some_and(|status| !status.starts_with("success"));
    if failed_before || failed_in_report {
        return Some(InitReport::Failed);
    }
    let millis = line
        .split("durationMs: ")
        .nth(1)?
        .split([')', ','])
        .next()?
        .trim()
        .parse::<f64>()
        .ok()?;
    Some(InitReport::Done(Duration::from_secs_f64(millis / 1000.0)))
}

fn collect(
    stream: impl AsyncRead + Unpin + Send + 'static,
    logs: Arc<Mutex<String>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut logs = logs.lock().unwrap_or_else(PoisonError::into_inner);
            logs.push_str(&line);
            logs.push('\n');
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_report_is_read_in_both_of_the_ries_formats() {
        let done = "x INIT RTDONE(status: success)\n x INIT REPORT(durationMs: 59.131000)\n";
        assert_eq!(
            init_report(done),
            Some(InitReport::Done(Duration::from_micros(59_131)))
        );
        let newer = "INIT REPORT(initType: on-demand, durationMs: 12.50, status: success, phase: init, errorType: )";
        assert_eq!(
            init_report(newer),
            Some(InitReport::Done(Duration::from_micros(12_500)))
        );
        let failed = "INIT RTDONE(status: error)\nINIT REPORT(durationMs: 25.559000)\n";
        assert_eq!(init_report(failed), Some(InitReport::Failed));
        let failed_newer = "INIT REPORT(initType: on-demand, durationMs: 3.10, status: error, phase: init, errorType: Runtime.ExitError)";
        assert_eq!(init_report(failed_newer), Some(InitReport::Failed));
        assert_eq!(init_report("START RequestId: x"), None);
    }

    #[test]
    fn a_bootstrap_refused_by_the_runtime_api_is_told_from_one_that_failed_on_its_own() {
        let refused = "echo lambda starting\n\
            Error: hyper_util::client::legacy::Error(Connect, ConnectError(\"tcp connect error\", \
            127.0.0.1:22867, Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" }))\n\
            [INFO] (rapid) INIT RTDONE(status: error)\n[INFO] (rapid) INIT REPORT(durationMs: 16.874000)\n";
        assert!(the_runtime_api_refused_the_bootstrap(
            refused,
            "127.0.0.1:22867"
        ));
        // Its own dependency refused it: a real init failure.
        assert!(!the_runtime_api_refused_the_bootstrap(
            refused,
            "127.0.0.1:9000"
        ));
        let succeeded = refused.replace("status: error", "status: success");
        assert!(!the_runtime_api_refused_the_bootstrap(
            &succeeded,
            "127.0.0.1:22867"
        ));
    }

    #[test]
    fn only_an_error_shaped_body_is_a_function_error() {
        let error = br#"{"errorType":"Reconciler.StoreUnavailable","errorMessage":"down"}"#;
        assert_eq!(
            Outcome::of_body(error.to_vec()),
            Outcome::FunctionError(FunctionError {
                error_type: "Reconciler.StoreUnavailable".to_owned(),
                error_message: "down".to_owned(),
            })
        );
        let answer = br#"{"errorType":"x","statusCode":500}"#;
        assert_eq!(
            Outcome::of_body(answer.to_vec()),
            Outcome::Response(answer.to_vec())
        );
    }
}
