//! A Lambda Runtime API emulator for running the real `bootstrap` binaries.
//!
//! A `provided.al2023` function is a process that asks the Runtime API for its next event
//! (`GET /2018-06-01/runtime/invocation/next`) and posts the answer back
//! (`.../{request_id}/response` or `.../{request_id}/error`, or `init/error` if it
//! cannot start). [`RuntimeApi`] serves that API on loopback for one function, and
//! [`Lambda`] starts the function's binary pointed at it, with the environment Lambda
//! would give it, so `invoke` exercises the binary's `main`: config, clients, handler.
//!
//! Why Rust and not a script: the smoke test needs the workspace's emulators
//! (flashsale-emulators) and the template provisioning (flashsale-local), and the
//! emulator's own tests prove it against the `lambda_runtime` crate the functions use.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// What the function answered to one invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The body posted to `/response`.
    Response(Vec<u8>),
    /// The error posted to `/error`: the handler returned `Err` or panicked.
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
}

/// An error as the runtime reports it (`{"errorType", "errorMessage"}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error_type}: {error_message}")]
pub struct FunctionError {
    pub error_type: String,
    pub error_message: String,
}

impl FunctionError {
    fn from_body(body: &[u8], header_type: Option<&str>) -> Self {
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let text = |key: &str| parsed.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            error_type: text("errorType")
                .or_else(|| header_type.map(str::to_owned))
                .unwrap_or_else(|| "Unknown".to_owned()),
            error_message: text("errorMessage")
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("could not bind the Runtime API on loopback")]
    Bind(#[source] std::io::Error),
    #[error("could not start {}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the function reported an init error: {error}\n--- function output ---\n{logs}")]
    InitFailed { error: FunctionError, logs: String },
    #[error(
        "the function process exited ({status}) before answering\n--- function output ---\n{logs}"
    )]
    Exited { status: ExitStatus, logs: String },
    #[error("no answer within {timeout:?}\n--- function output ---\n{logs}")]
    TimedOut { timeout: Duration, logs: String },
    #[error("the function failed the invocation: {0}")]
    Function(FunctionError),
    #[error("the response is not JSON: {body}")]
    NotJson {
        body: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the Runtime API stopped")]
    ApiStopped,
    #[error("could not wait for the function process")]
    Wait(#[source] std::io::Error),
}

struct Invocation {
    request_id: String,
    event: Vec<u8>,
    deadline: Duration,
    reply: oneshot::Sender<Outcome>,
}

struct ApiState {
    function_arn: String,
    next: tokio::sync::Mutex<mpsc::UnboundedReceiver<Invocation>>,
    in_flight: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    init_error: watch::Sender<Option<FunctionError>>,
    /// When the function first asked for an event: it is initialised then.
    first_poll: watch::Sender<Option<Instant>>,
}

/// The Runtime API of one function, on 127.0.0.1 and a free port.
pub struct RuntimeApi {
    address: SocketAddr,
    invocations: mpsc::UnboundedSender<Invocation>,
    init_error: watch::Receiver<Option<FunctionError>>,
    first_poll: watch::Receiver<Option<Instant>>,
    server: JoinHandle<()>,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

const PREFIX: &str = "/2018-06-01/runtime";

impl RuntimeApi {
    /// Serves the Runtime API for the function `function_arn` names.
    pub async fn start(function_arn: impl Into<String>) -> Result<Self, EmulatorError> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(EmulatorError::Bind)?;
        let address = listener.local_addr().map_err(EmulatorError::Bind)?;
        let (invocations, receiver) = mpsc::unbounded_channel();
        let (init_sender, init_error) = watch::channel(None);
        let (first_poll_sender, first_poll) = watch::channel(None);
        let state = Arc::new(ApiState {
            function_arn: function_arn.into(),
            next: tokio::sync::Mutex::new(receiver),
            in_flight: Mutex::new(HashMap::new()),
            init_error: init_sender,
            first_poll: first_poll_sender,
        });
        let app = Router::new()
            .route(&format!("{PREFIX}/invocation/next"), get(next_invocation))
            .route(
                &format!("{PREFIX}/invocation/{{request_id}}/response"),
                post(post_response),
            )
            .route(
                &format!("{PREFIX}/invocation/{{request_id}}/error"),
                post(post_error),
            )
            .route(&format!("{PREFIX}/init/error"), post(post_init_error))
            .with_state(state);
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(
                    error = &error as &dyn std::error::Error,
                    "runtime API server stopped"
                );
            }
        });
        Ok(Self {
            address,
            invocations,
            init_error,
            first_poll,
            server,
        })
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Queues `event` for the function's next `GET .../next` and waits for its answer.
    /// `deadline` is what the function is told it has (`Lambda-Runtime-Deadline-Ms`).
    pub async fn invoke(&self, event: &Value, deadline: Duration) -> Result<Outcome, InvokeError> {
        let (reply, answer) = oneshot::channel();
        let invocation = Invocation {
            request_id: ulid::Ulid::new().to_string().to_lowercase(),
            event: event.to_string().into_bytes(),
            deadline,
            reply,
        };
        self.invocations
            .send(invocation)
            .map_err(|_| InvokeError::ApiStopped)?;
        let mut init_error = self.init_error.clone();
        tokio::select! {
            outcome = answer => outcome.map_err(|_| InvokeError::ApiStopped),
            changed = init_error.wait_for(Option::is_some) => match changed {
                Ok(error) => Err(InvokeError::InitFailed {
                    error: error.clone().unwrap_or_else(|| FunctionError {
                        error_type: "Unknown".to_owned(),
                        error_message: String::new(),
                    }),
                    logs: String::new(),
                }),
                Err(_) => Err(InvokeError::ApiStopped),
            },
        }
    }
}

async fn next_invocation(State(state): State<Arc<ApiState>>) -> Response {
    let polled_at = Instant::now();
    state.first_poll.send_if_modified(|first| {
        let unset = first.is_none();
        if unset {
            *first = Some(polled_at);
        }
        unset
    });
    let mut next = state.next.lock().await;
    let Some(invocation) = next.recv().await else {
        return StatusCode::GONE.into_response();
    };
    drop(next);
    let deadline_ms = SystemTime::now()
        .checked_add(invocation.deadline)
        .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_millis());
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    put(
        "lambda-runtime-aws-request-id",
        invocation.request_id.clone(),
    );
    put("lambda-runtime-deadline-ms", deadline_ms.to_string());
    put(
        "lambda-runtime-invoked-function-arn",
        state.function_arn.clone(),
    );
    put(
        "lambda-runtime-trace-id",
        format!(
            "Root=1-{:08x}-{:024x};Parent={:016x};Sampled=0",
            deadline_ms / 1000,
            0,
            0
        ),
    );
    put("content-type", "application/json".to_owned());
    state
        .in_flight
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(invocation.request_id, invocation.reply);
    (StatusCode::OK, headers, invocation.event).into_response()
}

fn answer(state: &ApiState, request_id: &str, outcome: Outcome) -> StatusCode {
    let reply = state
        .in_flight
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(request_id);
    match reply {
        Some(reply) => {
            // The invoker may have given up (timeout); the answer is then moot.
            let _ = reply.send(outcome);
            StatusCode::ACCEPTED
        }
        None => StatusCode::BAD_REQUEST,
    }
}

async fn post_response(
    State(state): State<Arc<ApiState>>,
    UrlPath(request_id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    answer(&state, &request_id, Outcome::Response(body.to_vec()))
}

async fn post_error(
    State(state): State<Arc<ApiState>>,
    UrlPath(request_id): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header_type = headers
        .get("lambda-runtime-function-error-type")
        .and_then(|v| v.to_str().ok());
    let error = FunctionError::from_body(&body, header_type);
    answer(&state, &request_id, Outcome::FunctionError(error))
}

async fn post_init_error(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header_type = headers
        .get("lambda-runtime-function-error-type")
        .and_then(|v| v.to_str().ok());
    state
        .init_error
        .send_replace(Some(FunctionError::from_body(&body, header_type)));
    StatusCode::ACCEPTED
}

/// How to start one function.
#[derive(Debug, Clone)]
pub struct LambdaSpec {
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub name: String,
    /// The `bootstrap` binary.
    pub bootstrap: PathBuf,
    /// A program (and its arguments) to run the binary under, e.g. `qemu-aarch64 -L
    /// /usr/aarch64-linux-gnu` for an arm64 build on an x86_64 host. Empty: run directly.
    pub runner: Vec<String>,
    /// The function's configured environment (template variables, endpoints, credentials).
    pub env: Vec<(String, String)>,
    pub memory_mb: u32,
    pub timeout: Duration,
}

/// A function process attached to its own Runtime API. Killed when dropped.
pub struct Lambda {
    api: RuntimeApi,
    child: Child,
    logs: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    timeout: Duration,
    exited: Option<ExitStatus>,
    spawned_at: Instant,
}

impl Lambda {
    /// Starts the function with the variables Lambda sets for a `provided.al2023`
    /// function, then the spec's environment. Nothing else of this process's environment
    /// leaks in (except PATH, to find the runner), as in Lambda.
    pub async fn start(spec: &LambdaSpec) -> Result<Self, EmulatorError> {
        let arn = format!(
            "arn:aws:lambda:{}:{}:function:{}",
            flashsale_emulators::REGION,
            flashsale_emulators::ACCOUNT_ID,
            spec.name
        );
        let api = RuntimeApi::start(arn).await?;
        // The process runs in its task root, so a relative path would not resolve.
        let bootstrap = spec
            .bootstrap
            .canonicalize()
            .map_err(|source| EmulatorError::Spawn {
                program: spec.bootstrap.clone(),
                source,
            })?;
        let (program, args): (PathBuf, Vec<String>) = match spec.runner.split_first() {
            Some((runner, runner_args)) => {
                let mut args = runner_args.to_vec();
                args.push(bootstrap.display().to_string());
                (PathBuf::from(runner), args)
            }
            None => (bootstrap.clone(), Vec::new()),
        };
        let task_root = bootstrap
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let mut command = Command::new(&program);
        command
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", &spec.name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
                spec.memory_mb.to_string(),
            )
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{}", spec.name),
            )
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "smoke")
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
            .kill_on_drop(true);
        let spawned_at = Instant::now();
        let mut child = command.spawn().map_err(|source| EmulatorError::Spawn {
            program: program.clone(),
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
        Ok(Self {
            api,
            child,
            logs,
            readers,
            timeout: spec.timeout,
            exited: None,
            spawned_at,
        })
    }

    /// Everything the function printed so far (its logs).
    pub fn logs(&self) -> String {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Init time: from spawning the process to its first `GET .../invocation/next`, when
    /// it is ready for its first event. Waits at most the function's timeout.
    pub async fn init_duration(&mut self) -> Result<Duration, InvokeError> {
        let mut first_poll = self.api.first_poll.clone();
        let mut init_error = self.api.init_error.clone();
        let timeout = self.timeout;
        let result = tokio::select! {
            polled = first_poll.wait_for(Option::is_some) => match polled.ok().and_then(|at| *at) {
                Some(at) => Ok(at.saturating_duration_since(self.spawned_at)),
                None => Err(InvokeError::ApiStopped),
            },
            failed = init_error.wait_for(Option::is_some) => Err(match failed.ok().and_then(|e| e.clone()) {
                Some(error) => InvokeError::InitFailed { error, logs: String::new() },
                None => InvokeError::ApiStopped,
            }),
            status = self.child.wait() => {
                let status = status.map_err(InvokeError::Wait)?;
                self.exited = Some(status);
                Err(InvokeError::Exited { status, logs: String::new() })
            }
            () = tokio::time::sleep(timeout) => Err(InvokeError::TimedOut { timeout, logs: String::new() }),
        };
        result.map_err(|error| self.with_logs(error))
    }

    /// Invokes the function with `event` and waits, at most its timeout, for the answer.
    /// A process that dies, or reports an init error, fails the invocation with its logs.
    pub async fn invoke(&mut self, event: &Value) -> Result<Outcome, InvokeError> {
        if let Some(status) = self.exited {
            return Err(InvokeError::Exited {
                status,
                logs: self.logs(),
            });
        }
        let timeout = self.timeout;
        let result = tokio::select! {
            outcome = tokio::time::timeout(timeout, self.api.invoke(event, timeout)) => match outcome {
                Ok(result) => result,
                Err(_) => Err(InvokeError::TimedOut { timeout, logs: String::new() }),
            },
            status = self.child.wait() => {
                let status = status.map_err(InvokeError::Wait)?;
                self.exited = Some(status);
                // The pipes close with the process: let the readers take the rest.
                for reader in self.readers.drain(..) {
                    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
                }
                Err(InvokeError::Exited { status, logs: String::new() })
            }
        };
        result.map_err(|error| self.with_logs(error))
    }

    fn with_logs(&self, error: InvokeError) -> InvokeError {
        match error {
            InvokeError::InitFailed { error, .. } => InvokeError::InitFailed {
                error,
                logs: self.logs(),
            },
            InvokeError::Exited { status, .. } => InvokeError::Exited {
                status,
                logs: self.logs(),
            },
            InvokeError::TimedOut { timeout, .. } => InvokeError::TimedOut {
                timeout,
                logs: self.logs(),
            },
            other => other,
        }
    }
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
