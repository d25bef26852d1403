//! The stack a benchmark runs against: the emulators (started here, on free ports), a
//! counting proxy in front of each, and the local stack (`flashsale-local`, a separate
//! process) pointed at the proxies, so every call the functions make is counted.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use flashsale_emulators::{EmulatorOptions, Emulators};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::proxy::{Proxy, ProxyError};

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("emulators")]
    Emulators(#[from] flashsale_emulators::EmulatorError),
    #[error("the emulator start-up task failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("proxy")]
    Proxy(#[from] ProxyError),
    #[error("{} is missing: build it first (make bench does)", path.display())]
    NoBinary { path: PathBuf },
    #[error("could not start the local stack")]
    Spawn(#[source] std::io::Error),
    #[error("the local stack exited before serving; see {}", log.display())]
    Exited { log: PathBuf },
    #[error("the local stack did not serve on {url} within {waited:?}; see {}", log.display())]
    NotReady {
        url: String,
        waited: Duration,
        log: PathBuf,
    },
}

/// How to start the local stack.
#[derive(Debug, Clone)]
pub struct StackSpec {
    /// The `flashsale-local` binary (release for `make bench`).
    pub local_bin: PathBuf,
    pub template: PathBuf,
    /// `Key=Value` template parameters, e.g. the lifted throttles.
    pub parameter_overrides: Vec<String>,
}

/// Template parameters that take the gateway's throttles out of the measurement: the
/// bench measures what the functions and emulators sustain, not the local rate limits.
pub const LIFTED_THROTTLES: [&str; 6] = [
    "DefaultThrottleRateLimit=1000000",
    "DefaultThrottleBurstLimit=1000000",
    "GrabThrottleRateLimit=1000000",
    "GrabThrottleBurstLimit=1000000",
    "TokenThrottleRateLimit=1000000",
    "TokenThrottleBurstLimit=1000000",
];

pub struct BenchStack {
    // Field order is drop order: the stack stops first, then the proxies, then the
    // emulators.
    local: GuardedChild,
    pub api_url: String,
    /// The emulators' own endpoints (uncounted), for tools that measure them raw.
    pub dynamodb_endpoint: String,
    pub moto_endpoint: String,
    /// The local Stripe, where a buyer's page confirms a card.
    pub stripe_endpoint: String,
    /// In front of DynamoDB Local.
    pub dynamodb: Proxy,
    /// In front of the SQS emulator.
    pub sqs: Proxy,
    /// In front of moto (EventBridge Scheduler).
    pub moto: Proxy,
    /// The physical names of the stack's resources start with it.
    pub stack_name: String,
    pub log: PathBuf,
    _emulators: Emulators,
}

impl BenchStack {
    pub async fn start(spec: &StackSpec) -> Result<Self, StackError> {
        if !spec.local_bin.is_file() {
            return Err(StackError::NoBinary {
                path: spec.local_bin.clone(),
            });
        }
        let emulators =
            tokio::task::spawn_blocking(|| Emulators::start(&EmulatorOptions::default())).await??;
        let dynamodb = Proxy::start(&emulators.dynamodb_endpoint, 0).await?;
        let sqs = Proxy::start(&emulators.sqs_endpoint, 0).await?;
        let moto = Proxy::start(&emulators.moto_endpoint, 0).await?;
        let api_port = free_port().map_err(StackError::Spawn)?;
        let suffix = flashsale_emulators::unique_suffix();
        let log = std::env::temp_dir().join(format!("flashsale-bench-local-{suffix}.log"));
        let stack_name = format!("bench-{suffix}");
        let mut command = Command::new(&spec.local_bin);
        command
            .args(["--stack-name", &stack_name])
            .arg("--template")
            .arg(&spec.template)
            .args(["--api-port", &api_port.to_string()])
            .arg("--parameter-overrides")
            .args(&spec.parameter_overrides)
            // The emulators are reused through these, so the stack talks to the proxies.
            .env("FLASHSALE_DYNAMODB_ENDPOINT", dynamodb.url())
            .env("FLASHSALE_MOTO_ENDPOINT", moto.url())
            .env("FLASHSALE_SQS_ENDPOINT", sqs.url())
            // Stripe is reused, not proxied: its calls are not AWS's.
            .env("FLASHSALE_STRIPE_ENDPOINT", &emulators.stripe_endpoint)
            .env("RUST_LOG", "warn");
        let local = GuardedChild::spawn(command, &log)?;
        let mut stack = Self {
            local,
            api_url: format!("http://127.0.0.1:{api_port}"),
            dynamodb_endpoint: emulators.dynamodb_endpoint.clone(),
            moto_endpoint: emulators.moto_endpoint.clone(),
            stripe_endpoint: emulators.stripe_endpoint.clone(),
            dynamodb,
            sqs,
            moto,
            stack_name,
            log,
            _emulators: emulators,
        };
        stack.wait_until_serving().await?;
        Ok(stack)
    }

    async fn wait_until_serving(&mut self) -> Result<(), StackError> {
        const READY_TIMEOUT: Duration = Duration::from_secs(180);
        let client = reqwest::Client::new();
        let probe = format!("{}/sales/bench-probe", self.api_url);
        let started = Instant::now();
        loop {
            // Any answer (404 for a sale nobody made) means the API is up and provisioned.
            if client.get(&probe).send().await.is_ok() {
                return Ok(());
            }
            if self.local.exited() {
                return Err(StackError::Exited {
                    log: self.log.clone(),
                });
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(StackError::NotReady {
                    url: self.api_url.clone(),
                    waited: READY_TIMEOUT,
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr().map(|a| a.port()))
}

/// A child in a process group of its own behind a shell guard that reads its stdin:
/// dropping this stops the group, and if the bench dies without dropping, the pipe
/// closes and the guard stops the child. No process outlives the bench.
struct GuardedChild {
    child: Child,
    _lifeline: Option<ChildStdin>,
}

/// The guard ends with its child (so an early exit is seen), while a reader of stdin in
/// the same group stops the child when the bench goes. Stdin goes through fd 3: a
/// background list's own stdin is /dev/null.
const GUARD_SCRIPT: &str = r#"exec 3<&0
"$@" 3<&- & guarded=$!
trap 'kill $guarded 2>/dev/null; wait $guarded; exit 0' TERM INT
{ cat <&3 >/dev/null; kill $guarded 2>/dev/null; } &
wait $guarded"#;

impl GuardedChild {
    fn spawn(command: Command, log: &Path) -> Result<Self, StackError> {
        use std::os::unix::process::CommandExt as _;

        let out = File::create(log).map_err(StackError::Spawn)?;
        let err = out.try_clone().map_err(StackError::Spawn)?;
        let mut guard = Command::new("sh");
        guard
            .args(["-c", GUARD_SCRIPT, "flashsale-bench-guard"])
            .arg(command.get_program())
            .args(command.get_args())
            .envs(
                command
                    .get_envs()
                    .filter_map(|(key, value)| value.map(|value| (key, value))),
            )
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let mut child = guard.spawn().map_err(StackError::Spawn)?;
        let lifeline = child.stdin.take();
        Ok(Self {
            child,
            _lifeline: lifeline,
        })
    }

    fn exited(&mut self) -> bool {
        // The guard leads the group; it ends when the guarded process does.
        matches!(self.child.try_wait(), Ok(Some(_)) | Err(_))
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }
}

impl Drop for GuardedChild {
    fn drop(&mut self) {
        let _ = killpg(self.pgid(), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}
