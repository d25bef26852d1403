//! The same functions under the real SAM CLI: `sam local invoke` and `sam local
//! start-api`, each running a bootstrap in a Lambda container (AWS's RIE inside an image
//! of the template's runtime and architecture) on the machine's Docker.
//!
//! A container is handed only the environment variables its template declares, with
//! the values `--env-vars` gives them (SAM resolves a `Ref` to a parameter, but neither
//! a resource it did not create nor a condition: those reach the function empty unless
//! given). Nothing else of this process's environment reaches it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::{InvokeError, Outcome};

/// What every `sam local` command of one run shares.
#[derive(Debug, Clone)]
pub struct SamLocal {
    /// The `sam` executable.
    pub sam: PathBuf,
    /// The built template (`sam build`'s `.aws-sam/build/template.yaml`, or one whose
    /// `CodeUri`s name the built bootstraps' folders).
    pub template: PathBuf,
    /// The `--env-vars` file ([`SamLocal::write_env_vars`]).
    pub env_vars: PathBuf,
    /// `--invoke-image`: the base image to run the functions on, when AWS's own cannot
    /// be pulled. `None`: SAM pulls AWS's image for the runtime.
    pub invoke_image: Option<String>,
    /// Environment for the `sam` process itself (region, telemetry).
    pub env: Vec<(String, String)>,
    /// Longest one command may take (a first run builds SAM's image layer).
    pub timeout: Duration,
}

impl SamLocal {
    /// Writes an `--env-vars` file: the values for every function (under
    /// `Parameters`), then each function's own, by logical id.
    pub fn write_env_vars(
        path: &Path,
        every_function: &BTreeMap<String, String>,
        by_function: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> std::io::Result<()> {
        let mut file = serde_json::Map::new();
        file.insert("Parameters".to_owned(), serde_json::json!(every_function));
        for (logical_id, vars) in by_function {
            file.insert(logical_id.clone(), serde_json::json!(vars));
        }
        let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
        std::fs::write(path, text)
    }

    fn common_args(&self, command: &mut Command) {
        command
            .arg("--template")
            .arg(&self.template)
            .arg("--env-vars")
            .arg(&self.env_vars)
            .arg("--skip-pull-image");
        if let Some(image) = &self.invoke_image {
            command.arg("--invoke-image").arg(image);
        }
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }

    /// One function, invoked by `sam local invoke`, one container per event.
    pub fn function(&self, logical_id: &str) -> SamFunction {
        SamFunction {
            sam: self.clone(),
            logical_id: logical_id.to_owned(),
            logs: String::new(),
        }
    }

    /// `sam local start-api` on `port` of `host`, answering once it listens.
    pub async fn start_api(&self, host: &str, port: u16) -> Result<SamApi, SamError> {
        let mut command = Command::new(&self.sam);
        command
            .args(["local", "start-api", "--host", host, "--port"])
            .arg(port.to_string());
        self.common_args(&mut command);
        let log_path = std::env::temp_dir().join(format!(
            "flashsale-sam-start-api-{}-{port}.log",
            std::process::id()
        ));
        let log = std::fs::File::create(&log_path).map_err(SamError::Spawn)?;
        let err_log = log.try_clone().map_err(SamError::Spawn)?;
        command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .process_group(0);
        let child = command.spawn().map_err(SamError::Spawn)?;
        let mut api = SamApi {
            child,
            url: format!("http://{host}:{port}"),
            log_path,
            stopped: false,
        };
        let until = Instant::now() + self.timeout;
        let address = format!("{host}:{port}");
        while Instant::now() < until {
            if let Ok(Some(status)) = api.child.try_wait() {
                return Err(SamError::Exited {
                    status: status.to_string(),
                    logs: api.logs(),
                });
            }
            if tokio::net::TcpStream::connect(&address).await.is_ok() {
                return Ok(api);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(SamError::NotListening {
            address,
            logs: api.logs(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SamError {
    #[error("could not start sam")]
    Spawn(#[source] std::io::Error),
    #[error("sam exited ({status})\n--- output ---\n{logs}")]
    Exited { status: String, logs: String },
    #[error("sam local start-api did not listen on {address}\n--- output ---\n{logs}")]
    NotListening { address: String, logs: String },
}

/// One function of the template, run by `sam local invoke`.
pub struct SamFunction {
    sam: SamLocal,
    logical_id: String,
    logs: String,
}

impl SamFunction {
    /// What SAM, the RIE and the function printed for the last invocation.
    pub fn logs(&self) -> String {
        self.logs.clone()
    }

    /// `sam local invoke <LogicalId> --event -`: SAM starts a container, the RIE in it
    /// runs the bootstrap, which gets `event`; SAM prints the answer (or the runtime's
    /// error object) as the last line of its standard output, its own and the function's
    /// logs on standard error.
    pub async fn invoke(&mut self, event: &Value) -> Result<Outcome, InvokeError> {
        let mut command = Command::new(&self.sam.sam);
        command
            .args(["local", "invoke"])
            .arg(&self.logical_id)
            .args(["--event", "-"]);
        self.sam.common_args(&mut command);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(InvokeError::Wait)?;
        if let Some(mut stdin) = child.stdin.take() {
            let body = serde_json::to_vec(event).unwrap_or_default();
            stdin.write_all(&body).await.map_err(InvokeError::Wait)?;
        }
        let finished = tokio::time::timeout(self.sam.timeout, child.wait_with_output()).await;
        let output = match finished {
            Ok(output) => output.map_err(InvokeError::Wait)?,
            Err(_) => {
                return Err(InvokeError::TimedOut {
                    timeout: self.sam.timeout,
                    logs: self.logs.clone(),
                });
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        self.logs = format!("{}{stdout}", String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            return Err(InvokeError::Failed {
                status: u16::try_from(output.status.code().unwrap_or(-1)).unwrap_or(u16::MAX),
                body: stdout,
                logs: self.logs.clone(),
            });
        }
        let answer = stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or_default();
        if answer.starts_with("Task timed out after") {
            return Err(InvokeError::TimedOut {
                timeout: self.sam.timeout,
                logs: self.logs.clone(),
            });
        }
        Ok(Outcome::of_body(answer.as_bytes().to_vec()))
    }
}

/// A running `sam local start-api`. [`SamApi::stop`] ends it and waits while SAM
/// removes its containers; dropping it only asks SAM to stop.
pub struct SamApi {
    child: Child,
    url: String,
    log_path: PathBuf,
    stopped: bool,
}

impl SamApi {
    /// `http://host:port`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What SAM printed so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl SamApi {
    /// SAM removes its containers on SIGTERM (a SIGKILL would leave them running):
    /// sends it and waits up to `grace` for SAM to exit, then kills what is left.
    pub async fn stop(mut self, grace: Duration) {
        self.terminate();
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
        }
        self.stopped = true;
    }

    fn terminate(&self) {
        if let Some(group) = self
            .child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw)
        {
            // Already gone is fine: there is nothing left to stop.
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
        }
    }
}

impl Drop for SamApi {
    fn drop(&mut self) {
        if !self.stopped {
            self.terminate();
        }
        let _ = std::fs::remove_file(&self.log_path);
    }
}
