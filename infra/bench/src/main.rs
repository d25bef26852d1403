//! `flashsale-bench`: the counting proxy as a program, the init measurement, and the
//! whole `make bench` run that writes docs/benchmarks.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use flashsale_bench::contention::{self, ContentionSizes};
use flashsale_bench::external::{self, Measured};
use flashsale_bench::fulfilment::{self, ExportSizes};
use flashsale_bench::init;
use flashsale_bench::pause::{self, PauseSizes};
use flashsale_bench::proxy::{ConflictMode, Proxy, ProxyOptions};
use flashsale_bench::report::{BenchReport, Machine};
use flashsale_bench::scenarios::{self, RejectionSizes, Session};
use flashsale_bench::stack::{BenchStack, LIFTED_THROTTLES, StackSpec};

#[derive(Debug, Parser)]
#[command(name = "flashsale-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A counting pass-through on 127.0.0.1 in front of an emulator, until Ctrl-C.
    Proxy {
        /// `http://127.0.0.1:8000`
        #[arg(long)]
        upstream: String,
        /// 0: any free port (printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Play DynamoDB's transaction conflicts from the start, with this commit time
        /// (a DynamoDB Local upstream; `PUT /__conflicts` changes it later).
        #[arg(long, value_name = "MS")]
        conflict_commit_ms: Option<u64>,
    },
    /// Sizes and init times of the function binaries in a folder.
    Init {
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        /// `target/release` (cargo) or `target/lambda` (cargo-lambda).
        #[arg(long, default_value = "target/release")]
        bin_dir: PathBuf,
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Also time this many warm invocations of the grab function with this HTTP
        /// event, re-aimed at a route it does not serve (no I/O).
        #[arg(long, default_value_t = 0)]
        invokes: usize,
        #[arg(long, default_value = "events/grab.json")]
        event: PathBuf,
        /// `aws-lambda-rie` (default: the one aws-sam-cli bundles in `.tools/venv`).
        #[arg(long)]
        rie: Option<PathBuf>,
    },
    /// Every measurement, written to the report.
    Run(RunArgs),
    /// Only the contention scenario (section 7) at `make bench`'s sizes, printed as
    /// JSON: a quicker loop while working on the grab's write shape. Not a report.
    Contention {
        #[arg(long, default_value = "template.yaml")]
        template: PathBuf,
        #[arg(long, default_value = "target/release/flashsale-local")]
        local_bin: PathBuf,
        /// Commit times of the surge and the textbook client (default: `make bench`'s).
        #[arg(long = "commit-ms", value_name = "MS")]
        commit_times_ms: Vec<u64>,
        /// Skip the per-shard curve.
        #[arg(long)]
        no_curve: bool,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Tiny sizes; fail unless the report is written and its counts agree.
    #[arg(long)]
    smoke: bool,
    #[arg(long, default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// How the run was started, for the report.
    #[arg(long, default_value = "make bench")]
    command: String,
    #[arg(long, default_value = "template.yaml")]
    template: PathBuf,
    /// The local stack's binary.
    #[arg(long, default_value = "target/release/flashsale-local")]
    local_bin: PathBuf,
    /// The host-architecture function binaries, for sizes and init.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// cargo-lambda's output (`make build-lambdas`), sizes only, when present.
    #[arg(long, default_value = "target/lambda")]
    lambda_dir: PathBuf,
    /// `aws-lambda-rie` (default: the one aws-sam-cli bundles in `.tools/venv`).
    #[arg(long)]
    rie: Option<PathBuf>,
    /// The cargo target folder (criterion writes its estimates there).
    #[arg(long, default_value = "target")]
    target_dir: PathBuf,
    /// More arguments for `flashsale-pipeline`, after `--concurrency N`.
    #[arg(long, allow_hyphen_values = true, num_args = 0..)]
    pipeline_args: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Stack(#[from] flashsale_bench::stack::StackError),
    #[error(transparent)]
    Scenario(#[from] scenarios::ScenarioError),
    #[error("the contention scenario")]
    Contention(#[from] contention::ContentionError),
    #[error(transparent)]
    Init(#[from] init::InitError),
    #[error(transparent)]
    Proxy(#[from] flashsale_bench::proxy::ProxyError),
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the event {}: {reason}", path.display())]
    Event { path: PathBuf, reason: String },
    #[error("no aws-lambda-rie under {}: run `make tools` (it installs aws-sam-cli), or pass --rie", .0.display())]
    NoRie(PathBuf),
    #[error("the smoke's report is inconsistent: {0}")]
    Inconsistent(String),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Proxy {
            upstream,
            port,
            conflict_commit_ms,
        } => proxy(&upstream, port, conflict_commit_ms).await,
        Command::Init {
            template,
            bin_dir,
            runs,
            invokes,
            event,
            rie,
        } => match rie_or_bundled(rie) {
            Ok(rie) => print_init(&rie, &template, &bin_dir, runs, invokes, &event).await,
            Err(error) => Err(error),
        },
        Command::Run(args) => run(&args).await,
        Command::Contention {
            template,
            local_bin,
            commit_times_ms,
            no_curve,
        } => contention_only(template, local_bin, commit_times_ms, no_curve).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = format!("flashsale-bench: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn proxy(
    upstream: &str,
    port: u16,
    conflict_commit_ms: Option<u64>,
) -> Result<(), BenchError> {
    let options = ProxyOptions {
        conflicts: conflict_commit_ms
            .map(|ms| ConflictMode::with_commit_time(Duration::from_millis(ms))),
    };
    let proxy = Proxy::start_with(upstream, port, options).await?;
    let conflicts = conflict_commit_ms
        .map_or_else(|| "off".to_owned(), |ms| format!("on, commit time {ms} ms"));
    println!(
        "{} -> {upstream}  (GET /__counts, POST /__reset, PUT|DELETE /__faults, \
         GET|PUT|DELETE /__conflicts; transaction conflicts {conflicts})",
        proxy.url()
    );
    let _ = tokio::signal::ctrl_c().await;
    Ok(())
}

/// The RIE given, or the one `make tools` installed with aws-sam-cli.
fn rie_or_bundled(rie: Option<PathBuf>) -> Result<PathBuf, BenchError> {
    let venv = Path::new(".tools/venv");
    rie.or_else(|| flashsale_rie::bundled_rie(venv))
        .ok_or_else(|| BenchError::NoRie(venv.to_owned()))
}

async fn print_init(
    rie: &Path,
    template: &Path,
    bin_dir: &Path,
    runs: usize,
    invokes: usize,
    event: &Path,
) -> Result<(), BenchError> {
    let model = init::functions(template)?;
    if invokes > 0 {
        let bad_event = |reason: String| BenchError::Event {
            path: event.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(event).map_err(|e| bad_event(e.to_string()))?;
        let mut event: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad_event(e.to_string()))?;
        event["routeKey"] = serde_json::json!("GET /bench/unrouted");
        event["rawPath"] = serde_json::json!("/bench/unrouted");
        event["requestContext"]["http"]["method"] = serde_json::json!("GET");
        event["requestContext"]["http"]["path"] = serde_json::json!("/bench/unrouted");
        let trips =
            init::unrouted_invocations(rie, &model, bin_dir, "GrabFunction", &event, invokes)
                .await?;
        println!(
            "GrabFunction unrouted invoke round trip: p50 {} ms  p95 {} ms  ({invokes} invokes)",
            trips.map_or("-".to_owned(), |p| format!("{:.3}", p.p50_ms)),
            trips.map_or("-".to_owned(), |p| format!("{:.3}", p.p95_ms)),
        );
    }
    for f in init::measure(rie, &model, bin_dir, runs).await? {
        println!(
            "{:<24} {:>10} bytes  init p50 {} ms  p95 {} ms  ({} runs)",
            f.function,
            f.bytes,
            f.init
                .map_or("-".to_owned(), |p| format!("{:.2}", p.p50_ms)),
            f.init
                .map_or("-".to_owned(), |p| format!("{:.2}", p.p95_ms)),
            f.init.map_or(0, |p| p.count),
        );
    }
    Ok(())
}

/// The sizes of one run: `make bench`'s, or the smoke's.
struct Sizes {
    rejection: RejectionSizes,
    surge_buyers: usize,
    surge_concurrency: usize,
    lapse_orders: usize,
    lapse_window_secs: u32,
    lapse_wait: Duration,
    init_runs: usize,
    pipeline_concurrency: &'static [usize],
    /// `flashsale-pipeline --grabs`: `None` keeps the tool's own (600). At 600 the
    /// smoke's debug build spent 60 s of `make test` here (measured).
    pipeline_grabs: Option<usize>,
    tool_limit: Duration,
    contention: ContentionSizes,
    pause: PauseSizes,
    export: ExportSizes,
}

/// The template's `SaleRefreshMs`: the bound the pause is measured against.
const SALE_REFRESH: Duration = Duration::from_secs(2);

const RUN: Sizes = Sizes {
    rejection: RejectionSizes {
        stock: 20,
        first_attempts: 2000,
        retries: 200,
        concurrency: 32,
        min_idle: Duration::from_secs(10),
    },
    surge_buyers: 200,
    surge_concurrency: 16,
    lapse_orders: 10,
    lapse_window_secs: 60,
    // The deadline's minute, plus Scheduler's minute of slack, plus margin.
    lapse_wait: Duration::from_secs(150),
    init_runs: 20,
    pipeline_concurrency: &[8, 32],
    pipeline_grabs: None,
    tool_limit: Duration::from_secs(1800),
    contention: ContentionSizes {
        commit_times_ms: &[15, 30],
        warm_up_surges: 3,
        rounds: 3,
        stock: 100,
        shards: 10,
        buyers: 1500,
        concurrency: 48,
        grab_attempts: 40,
        curve_commit_times_ms: &[5, 15, 30],
        // A shard holds at most `MAX_UNITS_PER_SHARD` (250) units.
        curve_stock: 250,
        curve_reservers: 16,
        curve_reservations: 200,
        drain_timeout: Duration::from_secs(120),
        quiet: Some(flashsale_bench::quiet::QUIET),
    },
    pause: PauseSizes {
        concurrency: 32,
        paths: 3000,
        holder_every: Duration::from_millis(50),
        before: Duration::from_secs(3),
        after: Duration::from_secs(6),
        sale_refresh: SALE_REFRESH,
        stock: 20_000,
    },
    export: ExportSizes {
        orders: 100_000,
        seed_concurrency: 64,
        page: 1000,
    },
};

const SMOKE: Sizes = Sizes {
    rejection: RejectionSizes {
        stock: 3,
        first_attempts: 20,
        retries: 4,
        concurrency: 4,
        min_idle: Duration::from_secs(1),
    },
    surge_buyers: 4,
    surge_concurrency: 2,
    lapse_orders: 2,
    lapse_window_secs: 2,
    lapse_wait: Duration::from_secs(10),
    init_runs: 2,
    pipeline_concurrency: &[2],
    pipeline_grabs: Some(40),
    tool_limit: Duration::from_secs(120),
    contention: ContentionSizes {
        commit_times_ms: &[15],
        warm_up_surges: 1,
        rounds: 1,
        stock: 6,
        shards: 2,
        buyers: 30,
        concurrency: 6,
        grab_attempts: 40,
        curve_commit_times_ms: &[15],
        curve_stock: 40,
        curve_reservers: 4,
        curve_reservations: 20,
        drain_timeout: Duration::from_secs(30),
        quiet: None,
    },
    pause: PauseSizes {
        concurrency: 4,
        paths: 150,
        holder_every: Duration::from_millis(50),
        before: Duration::from_secs(1),
        after: Duration::from_secs(3),
        sale_refresh: SALE_REFRESH,
        stock: 2_000,
    },
    export: ExportSizes {
        orders: 300,
        seed_concurrency: 8,
        page: 100,
    },
};

async fn contention_only(
    template: PathBuf,
    local_bin: PathBuf,
    commit_times_ms: Vec<u64>,
    no_curve: bool,
) -> Result<(), BenchError> {
    let mut sizes = RUN.contention;
    // The sizes hold `'static` slices: a command line's are leaked, once per process.
    if !commit_times_ms.is_empty() {
        sizes.commit_times_ms = Vec::leak(commit_times_ms);
    }
    if no_curve {
        sizes.curve_commit_times_ms = &[];
    }
    let stack = BenchStack::start(&StackSpec {
        local_bin,
        template,
        parameter_overrides: LIFTED_THROTTLES.iter().map(|s| (*s).to_owned()).collect(),
    })
    .await?;
    let session = Session::open(&stack).await?;
    let report = contention::contention(&session, &stack, &sizes).await?;
    for run in &report.runs {
        let gateway = &run.gateway;
        eprintln!(
            "commit {}: sold {} left {:?} 503s {} of {} ({:.2} %), writes/unit {:.2}, \
             sell-out gateway {:?} textbook {:?} ratio {:.2}",
            run.label(),
            gateway.sold,
            gateway.left,
            gateway.unavailable,
            gateway.answers,
            gateway.unavailable_share() * 100.0,
            gateway.writes_per_unit().unwrap_or(f64::NAN),
            gateway.sell_out,
            run.textbook.target_reached_after,
            run.sell_out_ratio().unwrap_or(f64::NAN),
        );
        let ms = |marks: &[std::time::Duration]| {
            marks
                .iter()
                .map(|at| format!("{:.0}", at.as_secs_f64() * 1000.0))
                .collect::<Vec<_>>()
                .join(" ")
        };
        eprintln!(
            "  units 1, 25 %, 50 %, 75 %, all at (ms): gateway {} · textbook {}",
            ms(&gateway.milestones),
            ms(&run.textbook.milestones),
        );
        eprintln!(
            "  same client: textbook {:?} ({:.2} writes/unit) · take then hold {:?} ({:.2}) · adaptive {:?} ({:.2})",
            run.textbook.target_reached_after,
            run.textbook.writes_per_reservation().unwrap_or(f64::NAN),
            run.take_then_hold.target_reached_after,
            run.take_then_hold
                .writes_per_reservation()
                .unwrap_or(f64::NAN),
            run.adaptive.target_reached_after,
            run.adaptive.writes_per_reservation().unwrap_or(f64::NAN),
        );
    }
    for &commit_time_ms in sizes.commit_times_ms {
        eprintln!(
            "commit {commit_time_ms} ms, every run: mean gateway / mean textbook sell-out {:.2}",
            report
                .pooled_sell_out_ratio(commit_time_ms)
                .unwrap_or(f64::NAN)
        );
    }
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    println!("{json}");
    Ok(())
}

async fn run(args: &RunArgs) -> Result<(), BenchError> {
    let sizes = if args.smoke { &SMOKE } else { &RUN };
    let machine = Machine::probe(&args.command);
    let workspace = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));

    // Init first, before the emulators compete for the cores.
    eprintln!(
        "bench: bootstrap sizes and init ({} runs each)",
        sizes.init_runs
    );
    let model = init::functions(&args.template)?;
    let rie = rie_or_bundled(args.rie.clone())?;
    let bootstraps = init::measure(&rie, &model, &args.bin_dir, sizes.init_runs).await?;
    let deployed_arch = std::fs::read_to_string(args.lambda_dir.join("ARCH"))
        .ok()
        .map(|arch| arch.trim().to_owned());
    let deployed = match deployed_arch {
        Some(_) => init::measure(&rie, &model, &args.lambda_dir, 0)
            .await
            .unwrap_or_default(),
        None => Vec::new(),
    };

    eprintln!("bench: starting the emulators, the proxies and the local stack");
    let overrides: Vec<String> = LIFTED_THROTTLES.iter().map(|s| (*s).to_owned()).collect();
    let stack = BenchStack::start(&StackSpec {
        local_bin: args.local_bin.clone(),
        template: args.template.clone(),
        parameter_overrides: overrides,
    })
    .await?;
    let session = Session::open(&stack).await?;
    // First, while no earlier sale has holds whose timers or reconciliation could write
    // during its windows; it leaves none of its own.
    let contention = contention::contention(&session, &stack, &sizes.contention).await?;
    eprintln!("bench: 1. rejections after sell-out");
    let rejection = scenarios::rejection_cost(&session, &stack, sizes.rejection).await?;
    eprintln!("bench: 6. latency per route");
    let surge =
        scenarios::route_latencies(&session, sizes.surge_buyers, sizes.surge_concurrency).await?;
    eprintln!(
        "bench: 4. release lateness (a {} s window, up to {} s more)",
        sizes.lapse_window_secs,
        sizes.lapse_wait.as_secs()
    );
    let lateness = scenarios::release_lateness(
        &session,
        sizes.lapse_orders,
        sizes.lapse_window_secs,
        sizes.lapse_wait,
    )
    .await?;
    eprintln!("bench: 8. pause under a surge");
    let pause = pause::pause_under_surge(&session, &sizes.pause).await?;
    eprintln!(
        "bench: 9. the fulfilment export of {} paid orders",
        sizes.export.orders
    );
    let export = fulfilment::export_at_size(&session, &stack, &sizes.export).await?;
    let stack_env = vec![(
        "FLASHSALE_BENCH_SMOKE".to_owned(),
        u8::from(args.smoke).to_string(),
    )];
    drop(session);
    drop(stack);

    eprintln!("bench: 2. pipeline ratio");
    let mut pipeline = Vec::new();
    let mut pipeline_args = args.pipeline_args.clone();
    let grabs_given = pipeline_args
        .iter()
        .any(|arg| arg == "--grabs" || arg.starts_with("--grabs="));
    if let Some(grabs) = sizes.pipeline_grabs.filter(|_| !grabs_given) {
        pipeline_args.extend(["--grabs".to_owned(), grabs.to_string()]);
    }
    for &concurrency in sizes.pipeline_concurrency {
        pipeline.push(
            external::pipeline(
                &workspace,
                !args.smoke,
                concurrency,
                &pipeline_args,
                &stack_env,
                sizes.tool_limit,
            )
            .await,
        );
    }
    eprintln!("bench: 3. grab handler and Redis");
    let handler = if args.smoke {
        Measured::NotAvailable("skipped in the smoke (criterion needs a release build)".to_owned())
    } else {
        external::grab_handler_bench(&workspace, &args.target_dir, sizes.tool_limit).await
    };
    let redis_ops_per_sec = if args.smoke {
        Measured::NotAvailable(
            "skipped in the smoke (redis-server is installed by make bench)".to_owned(),
        )
    } else {
        external::redis_seed(&workspace, &stack_env, sizes.tool_limit).await
    };

    let report = BenchReport {
        machine,
        smoke: args.smoke,
        rejection,
        pipeline,
        handler,
        redis_ops_per_sec,
        lateness,
        bootstraps,
        bootstraps_built_as: format!("{}, {}", args.bin_dir.display(), std::env::consts::ARCH),
        deployed,
        deployed_arch,
        surge,
        contention,
        pause,
        export,
    };
    let markdown = report.markdown();
    if let Some(dir) = args.report.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
            path: dir.to_owned(),
            source,
        })?;
    }
    std::fs::write(&args.report, &markdown).map_err(|source| BenchError::Write {
        path: args.report.clone(),
        source,
    })?;
    println!("{markdown}");
    eprintln!("bench: wrote {}", args.report.display());
    if args.smoke {
        let problems = report.inconsistencies();
        if !problems.is_empty() {
            return Err(BenchError::Inconsistent(problems.join("; ")));
        }
        eprintln!("bench: smoke consistent");
    }
    Ok(())
}
