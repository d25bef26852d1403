//! `make run`: the local stack on fixed ports until Ctrl-C or SIGTERM.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use flashsale_emulators::EmulatorOptions;
use flashsale_local::lambda::error_chain;
use flashsale_local::model::RouteAuth;
use flashsale_local::{EmulatorSource, LocalStack, StackOptions};

/// Runs template.yaml locally: DynamoDB Local, the SQS emulator and moto, the HTTP API with its JWT
/// authorizer, the SQS event source mapping and EventBridge Scheduler delivery.
#[derive(Debug, Parser)]
#[command(name = "flashsale-local", version)]
struct Cli {
    /// The SAM template to run.
    #[arg(long, env = "FLASHSALE_TEMPLATE", default_value = "template.yaml")]
    template: PathBuf,
    /// Prefix of every resource name.
    #[arg(long, env = "FLASHSALE_STACK_NAME", default_value = "flashsale-local")]
    stack_name: String,
    /// Address the HTTP API listens on.
    #[arg(long, env = "FLASHSALE_API_HOST", default_value = "127.0.0.1")]
    api_host: IpAddr,
    /// Port of the HTTP API (0: any free port).
    #[arg(long, env = "FLASHSALE_API_PORT", default_value_t = 3000)]
    api_port: u16,
    /// Port of DynamoDB Local (0: any free port).
    #[arg(long, env = "FLASHSALE_DYNAMODB_PORT", default_value_t = 8000)]
    dynamodb_port: u16,
    /// Port of moto, for Scheduler (0: any free port).
    #[arg(long, env = "FLASHSALE_MOTO_PORT", default_value_t = 5000)]
    moto_port: u16,
    /// Port of the SQS emulator (0: any free port).
    #[arg(long, env = "FLASHSALE_SQS_PORT", default_value_t = 9324)]
    sqs_port: u16,
    /// Port of localstripe, the fake Stripe (0: any free port).
    #[arg(long, env = "FLASHSALE_STRIPE_PORT", default_value_t = 8420)]
    stripe_port: u16,
    /// Template parameters, like `sam deploy --parameter-overrides`: Key=Value ...
    #[arg(
        long,
        env = "FLASHSALE_PARAMETER_OVERRIDES",
        value_delimiter = ' ',
        num_args = 0..,
        value_parser = parse_override
    )]
    parameter_overrides: Vec<(String, String)>,
    /// HS256 key of local tokens (random per run when unset).
    #[arg(long, env = "FLASHSALE_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
}

fn parse_override(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{text:?} is not Key=Value"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        // The banner goes to stdout; logs to stderr.
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let mut options = StackOptions::new(cli.stack_name);
    options.template = cli.template;
    options.api_host = cli.api_host;
    options.api_port = cli.api_port;
    options.parameter_overrides = cli
        .parameter_overrides
        .into_iter()
        .collect::<BTreeMap<_, _>>();
    options.jwt_secret = cli.jwt_secret.map(String::into_bytes);
    options.emulators = EmulatorSource::Own(EmulatorOptions {
        dynamodb_port: cli.dynamodb_port,
        moto_port: cli.moto_port,
        sqs_port: cli.sqs_port,
        stripe_port: cli.stripe_port,
        stripe_webhook: None,
        tools_dir: None,
    });

    // Signals are watched from the start, so a SIGTERM during start-up still stops the
    // emulators (dropping the half-built stack stops them).
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                eprintln!("flashsale-local: cannot watch SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        };
    let stack = tokio::select! {
        started = LocalStack::start(options) => started,
        _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        _ = terminate.recv() => return ExitCode::SUCCESS,
    };
    let stack = match stack {
        Ok(stack) => stack,
        Err(e) => {
            eprintln!("flashsale-local: {}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    print_banner(&stack);
    if let Some(metrics) = flashsale_local::metrics::LocalMetrics::install() {
        metrics.print_while_changing(std::time::Duration::from_secs(3));
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("flashsale-local: stopping");
    stack.shutdown().await;
    ExitCode::SUCCESS
}

fn print_banner(stack: &LocalStack) {
    let model = &stack.model;
    let mut out = String::new();
    out.push_str(&format!(
        "\nflashsale local stack `{}` is up\n\n",
        model.stack_name
    ));
    out.push_str(&format!("  Sale page  {}/?sale=<sale id>\n", stack.api_url));
    out.push_str(&format!("  Admin      {}/admin.html\n", stack.api_url));
    out.push_str(&format!("  HTTP API   {}\n", stack.api_url));
    out.push_str(&format!("  Metrics    {}/local/metrics\n", stack.api_url));
    out.push_str(&format!("  DynamoDB   {}\n", stack.dynamodb_endpoint));
    out.push_str(&format!("  SQS        {}\n", stack.sqs_endpoint));
    out.push_str(&format!("  Scheduler  {}\n", stack.moto_endpoint));
    if let Some(stripe) = &stack.stripe_endpoint {
        out.push_str(&format!(
            "  Stripe     {stripe} (card payments; webhook registered, test cards: 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined)\n"
        ));
    }
    out.push('\n');
    for resource in &stack.provisioned.resources {
        out.push_str(&format!(
            "  {:<30} {:<32} {}\n",
            resource.kind, resource.physical_id, resource.change
        ));
    }
    if !model.generated_parameters.is_empty() {
        out.push_str(&format!(
            "\n  generated local values for NoEcho parameters: {}\n",
            model.generated_parameters.join(", ")
        ));
    }
    out.push_str("\n  routes:\n");
    let mut routes: Vec<_> = model.routes().collect();
    routes.sort_by(|a, b| (&a.1.path, &a.1.method).cmp(&(&b.1.path, &b.1.method)));
    for (function, route) in routes {
        let auth = match &route.auth {
            RouteAuth::Public => "public",
            RouteAuth::Jwt { .. } => "JWT",
        };
        out.push_str(&format!(
            "    {:<40} {:<7} -> {}\n",
            route.route_key(),
            auth,
            function.logical_id
        ));
    }
    for function in &model.functions {
        for source in &function.sqs_sources {
            out.push_str(&format!(
                "\n  SQS {} -> {} (batch {})",
                source.queue_url, function.logical_id, source.batch_size
            ));
        }
    }
    for function in &model.functions {
        for rule in &function.schedules {
            out.push_str(&format!(
                "\n  rule {} {} -> {}{}",
                rule.rule_name,
                rule.expression,
                function.logical_id,
                if rule.enabled { "" } else { " (disabled)" }
            ));
        }
    }
    for group in &model.schedule_groups {
        out.push_str(&format!(
            "\n  schedules in group {} are delivered locally",
            group.name
        ));
    }
    let api = &stack.api_url;
    out.push_str(&format!(
        "\n\n  get a token (LOCAL ONLY route; admin: true for the admin group):\n    \
         TOKEN=$(curl -s -X POST {api}/local/token -H 'content-type: application/json' \
         -d '{{\"user_id\":\"alice\",\"admin\":false}}' | sed -E 's/.*\"token\":\"([^\"]+)\".*/\\1/')\n    \
         curl -s -H \"Authorization: Bearer $TOKEN\" {api}/orders/some-order-id\n\n  \
         Ctrl-C stops everything.\n"
    ));
    println!("{out}");
}
