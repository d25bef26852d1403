//! The load tool: a surge on a new sale of a running stack (local or deployed), with a
//! JSON report, PNG plots and an audit of every invariant; and `model`, a capacity
//! model of a sale on AWS (no network).
//!
//! ```sh
//! cargo run -p flashsale-load --bin flashsale-load -- --stock 100 --buyers 1500 --attempts 2000 --report target/load/report.json
//! cargo run -p flashsale-load --bin flashsale-load -- --api https://api.example.com --tokens-file tokens.tsv --admin-user ops
//! cargo run -p flashsale-load --bin flashsale-load -- model --stock 100 --buyers 1000000 --arrival uniform:10
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use clap::{Args, Parser, Subcommand};
use flashsale_load::ApiClient;
use flashsale_load::model::{
    self, Arrival, Calls, Challenge, Contention, Prices, Quotas, Scenario, Work,
};
use flashsale_load::report::RunConfig;
use flashsale_load::tokens::{TokenFile, TokenSource};
use flashsale_load::{LoadRun, Outputs, audit};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Parser)]
#[command(
    about = "Surge a flash sale on a running flashsale stack, report and audit it; or model a sale's capacity on AWS",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    surge: SurgeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Walk a sale through every AWS layer's quota: the first bottleneck, the time to
    /// sell out, the share throttled at each layer, the cost per sale. No network.
    Model(Box<ModelArgs>),
}

#[derive(Debug, Args)]
struct SurgeArgs {
    /// Base URL of the HTTP API: the local stack, or a deployed stage.
    #[arg(
        long = "api",
        alias = "api-url",
        env = "FLASHSALE_API_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    api_url: String,
    /// Units on sale.
    #[arg(long, default_value_t = 100)]
    stock: u32,
    /// Stock shards (distinct partition keys).
    #[arg(long, default_value_t = 8)]
    shards: u16,
    /// Units one buyer may hold.
    #[arg(long, default_value_t = 1)]
    per_user_limit: u32,
    /// Distinct buyers.
    #[arg(long, default_value_t = 1500)]
    buyers: usize,
    /// Grab attempts in all (>= buyers; the extra are second tries by the first buyers).
    #[arg(long, default_value_t = 2000)]
    attempts: usize,
    /// Retries of a 429 or 503 answer per attempt (jittered, honouring Retry-After).
    #[arg(long, default_value_t = 400)]
    retries: u32,
    /// The sale's payment window.
    #[arg(long, default_value_t = 900)]
    payment_timeout: u32,
    /// Share of the reserved orders to pay (0 to 1), by card through Stripe with its
    /// test card: the deployment must take card payments in test mode.
    #[arg(long, default_value_t = 0.0)]
    pay_ratio: f64,
    /// Stripe's API, where the page's Stripe.js would confirm the card: the local
    /// Stripe under `make run`.
    #[arg(long, default_value = "https://api.stripe.com")]
    stripe_api: String,
    /// Wait until every unpaid unit has lapsed back, then audit available = stock - paid.
    /// Use a short --payment-timeout: timers fire within the minute after the deadline.
    #[arg(long)]
    await_expiry: bool,
    /// How long past the payment timeout to wait for lapsed units, in seconds.
    #[arg(long, default_value_t = 240)]
    expiry_grace: u64,
    /// Tokens from a file (`user_id<TAB>jwt` lines, or JSON), for a deployed API. The
    /// admin is --admin-user; every other user is a buyer.
    #[arg(long, conflicts_with = "token_command")]
    tokens_file: Option<PathBuf>,
    /// Tokens from a command printing a JWT, with `{user_id}` in it, e.g. `./mint {user_id}`.
    #[arg(long)]
    token_command: Option<String>,
    /// The admin's user id (its token must carry the admin group).
    #[arg(long, default_value = "load-admin")]
    admin_user: String,
    /// The sale to create (default `load-<unix ms>`).
    #[arg(long)]
    sale_id: Option<String>,
    /// Write the JSON report here, and the PNG plots beside it.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Requests in flight while minting tokens and fetching grab paths.
    #[arg(long, default_value_t = 64)]
    preparation_concurrency: usize,
    /// The sale asks every buyer for a solved challenge of this work (derivations at
    /// most, 1000 to 10000000). The tool solves each in Rust, as a scripted buyer
    /// would, and reports the CPU that cost.
    #[arg(long, value_name = "WORK")]
    challenge: Option<u32>,
}

#[derive(Debug, Args)]
struct ModelArgs {
    #[arg(long, default_value_t = 100.0)]
    stock: f64,
    /// Stock shards (K).
    #[arg(long, default_value_t = 10.0)]
    shards: f64,
    #[arg(long, default_value_t = 1_000_000.0)]
    buyers: f64,
    /// `uniform:SECS`, or `profile:W1,W2,...` with a weight per second.
    #[arg(long, default_value = "uniform:10")]
    arrival: String,
    /// Share of reservations paid; the rest lapse back through a timer.
    #[arg(long, default_value_t = 0.5)]
    pay_ratio: f64,
    /// Buyers keep retrying after the sale sold out (they ignore the cached status).
    #[arg(long)]
    keep_retrying: bool,
    /// Calls per request from a `make bench` JSON (replaces the call flags below).
    #[arg(long)]
    calls_from: Option<PathBuf>,
    /// Write the model's answer as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    calls: Calls,
    #[command(flatten)]
    quotas: Quotas,
    #[command(flatten)]
    work: Work,
    #[command(flatten)]
    contention: Contention,
    #[command(flatten)]
    challenge: Challenge,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Model(args)) => run_model(*args),
        None => run_surge(cli.surge).await,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Answers whether the audit passed.
async fn run_surge(args: SurgeArgs) -> Result<bool, Box<dyn std::error::Error>> {
    if args.attempts < args.buyers {
        return Err("--attempts must be at least --buyers".into());
    }
    if !(0.0..=1.0).contains(&args.pay_ratio) {
        return Err("--pay-ratio is a share between 0 and 1".into());
    }
    let tokens = match (&args.tokens_file, &args.token_command) {
        (Some(path), _) => TokenSource::File(TokenFile::read(path)?),
        (None, Some(command)) => TokenSource::Command(command.clone()),
        (None, None) => TokenSource::Local,
    };
    let token_source = match &tokens {
        TokenSource::Local => "local /local/token".to_owned(),
        TokenSource::File(_) => format!(
            "file {}",
            args.tokens_file
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        ),
        TokenSource::Command(command) => format!("command {command}"),
    };
    let run_id = Utc::now().timestamp_millis();
    let sale_id = args
        .sale_id
        .clone()
        .unwrap_or_else(|| format!("load-{run_id}"));
    let run = LoadRun {
        config: RunConfig {
            api_url: args.api_url.clone(),
            sale_id: sale_id.clone(),
            stock: args.stock,
            shards: args.shards,
            per_user_limit: args.per_user_limit,
            buyers: args.buyers,
            attempts: args.attempts,
            retries: args.retries,
            payment_timeout_secs: args.payment_timeout,
            pay_ratio: args.pay_ratio,
            stripe_api: args.stripe_api.trim_end_matches('/').to_owned(),
            await_expiry: args.await_expiry,
            token_source,
            challenge_work: args.challenge,
        },
        tokens,
        admin_user: args.admin_user.clone(),
        buyer_prefix: format!("load-{run_id}"),
        preparation_concurrency: args.preparation_concurrency,
        expiry_grace: Duration::from_secs(args.expiry_grace),
    };
    let client = ApiClient::new(&args.api_url);

    let bar = ProgressBar::new(u64::try_from(args.attempts)?);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} {pos}/{len} answered {per_sec} [{elapsed}] {msg}",
    )?);
    bar.enable_steady_tick(Duration::from_millis(200));
    let report = flashsale_load::run(
        &client,
        &run,
        |_| bar.inc(1),
        |step| bar.set_message(step.to_owned()),
    )
    .await;
    bar.finish_and_clear();
    let report = report?;

    println!(
        "sale {sale_id}: stock {} in {} shards, {} buyers, {} attempts",
        args.stock, args.shards, args.buyers, args.attempts
    );
    println!("outcomes: {:?}", report.outcomes);
    println!("answers (retries included): {:?}", report.answers);
    let routes = &report.routes;
    for (name, route) in [
        ("token", &routes.token),
        ("grab", &routes.grab),
        ("grab attempt", &routes.grab_attempt),
        ("pay", &routes.pay),
    ] {
        if route.count > 0 {
            println!(
                "{name:<13} n={:<6} p50 {:>8.1} ms  p90 {:>8.1} ms  p99 {:>8.1} ms  max {:>8.1} ms",
                route.count, route.p50_ms, route.p90_ms, route.p99_ms, route.max_ms
            );
        }
    }
    println!(
        "throughput: {:.0} attempts/s, {:.0} answers/s, {:.1} reservations/s over {:.2} s",
        report.throughput.attempts_per_sec,
        report.throughput.answers_per_sec,
        report.throughput.reservations_per_sec,
        report.throughput.surge_secs
    );
    if let Some(cost) = &report.challenge {
        println!(
            "challenge: {} solves, {:.0} derivations each (p50 {:.0}, p90 {:.0}), \
             {:.1} ms CPU each (p90 {:.1}): {:.1} solves and {:.0} derivations per core-second",
            cost.solves,
            cost.derivations_mean,
            cost.derivations_p50,
            cost.derivations_p90,
            cost.cpu_ms.mean_ms,
            cost.cpu_ms.p90_ms,
            cost.solves_per_core_second,
            cost.derivations_per_core_second
        );
    }
    println!(
        "paid: {} (too late to pay: {})",
        report.paid, report.lapsed_before_payment
    );
    println!("\n{}", audit::table(&report.audit));
    if let Some(path) = &args.report {
        let outputs = Outputs::beside(path);
        outputs.write(&report)?;
        println!(
            "report: {}\nplots: {} {}",
            outputs.report.display(),
            outputs.latency_png.display(),
            outputs.timeline_png.display()
        );
    }
    if !report.audit_passed {
        eprintln!("audit FAILED");
    }
    Ok(report.audit_passed)
}

fn run_model(args: ModelArgs) -> Result<bool, Box<dyn std::error::Error>> {
    let calls = match &args.calls_from {
        Some(path) => Calls::from_bench_json(&std::fs::read_to_string(path)?)?,
        None => args.calls,
    };
    let scenario = Scenario {
        stock: args.stock,
        shards: args.shards,
        buyers: args.buyers,
        arrival: Arrival::parse(&args.arrival)?,
        pay_ratio: args.pay_ratio,
        clients_stop_on_sold_out: !args.keep_retrying,
        calls,
        quotas: args.quotas,
        work: args.work,
        contention: args.contention,
        challenge: args.challenge,
        prices: Prices::default(),
    };
    let outcome = model::run(&scenario);
    print!("{}", model::render(&scenario, &outcome));
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "scenario": scenario, "outcome": outcome });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)?;
    }
    Ok(true)
}
