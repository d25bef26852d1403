//! `make smoke-lambdas` and `make sam-local`: runs the release `bootstrap` binaries that
//! `make build-lambdas` produced against DynamoDB Local, the SQS emulator and moto
//! provisioned from template.yaml (by flashsale-local, as `make run` does), and walks one
//! sale through them with the `events/` fixtures. Each function runs either
//! - under AWS's Runtime Interface Emulator on this host (`--rie`: `aws-lambda-rie`, as
//!   the aws-sam-cli wheel bundles it), which also reports each init time; or
//! - under the SAM CLI (`--sam`): every event through `sam local invoke`, one Lambda
//!   container each, which reaches the emulators through one endpoint on the Docker
//!   bridge's gateway; then `sam local start-api` serves the template's HTTP API, and
//!   the public sale page answers through it while the protected routes answer 401
//!   (SAM does not play the JWT authorizer, so they get no claims).
//!
//! The walk:
//!
//! 1. api: GET an unknown sale -> 404 `sale_not_found`;
//! 2. api: POST /admin/sales as admin -> 201; GET it -> 200, all stock available;
//! 3. grab: POST token -> 200 grab path; POST the grab path -> 202 reserved;
//! 4. the reservation is really on the orders queue; the consumer, handed it as an SQS
//!    event, answers `{"batchItemFailures": []}` and a release schedule exists;
//!    the consumer's own fixture (unknown orders) gets a batch response too;
//! 5. release: the fixture (an order nobody holds) answers; the real reservation, once
//!    due, gives its unit back (GET shows the stock again) and a repeat changes nothing;
//!    GET order -> `expired`;
//!    paying or cancelling the lapsed order answers 409 `order_expired`, and the
//!    admin's stats count it expired;
//! 6. reconciler: a pass triggered by its scheduled-event fixture sees the sale and
//!    nothing stuck.
//!
//! Everything the binaries do goes through their own `main`: env config, SDK clients
//! from the environment (`AWS_ENDPOINT_URL_*`), and the handler wiring.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clap::Parser;
use flashsale_emulators::one_endpoint::OneEndpoint;
use flashsale_local::model::{FunctionSpec, StackModel};
use flashsale_local::provision::{Clients, provision};
use flashsale_local::resolve::StackContext;
use flashsale_local::template::Template;
use flashsale_rie::sam::{SamError, SamFunction, SamLocal};
use flashsale_rie::{InvokeError, Lambda, LambdaSpec, Outcome, StartError};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    about = "Smoke-test the built bootstrap binaries under AWS's Lambda Runtime Interface Emulator"
)]
struct Args {
    /// Where cargo-lambda put the binaries: <dir>/<bin>/bootstrap.
    #[arg(long, default_value = "target/lambda")]
    lambda_dir: PathBuf,
    /// The events/ fixtures.
    #[arg(long, default_value = "events")]
    events: PathBuf,
    #[arg(long, default_value = "template.yaml")]
    template: PathBuf,
    /// Run each bootstrap under this command (e.g. "qemu-aarch64 -L /usr/aarch64-linux-gnu").
    #[arg(long)]
    runner: Option<String>,
    /// `aws-lambda-rie` for this host (the aws-sam-cli wheel bundles it): run each
    /// bootstrap under it, on this host.
    #[arg(long, required_unless_present = "sam", conflicts_with = "sam")]
    rie: Option<PathBuf>,
    /// The `sam` executable: run each bootstrap in a Lambda container instead, with
    /// `sam local invoke`, then serve the API with `sam local start-api`.
    #[arg(long)]
    sam: Option<PathBuf>,
    /// The built template SAM runs (its CodeUris name the bootstraps' folders).
    #[arg(long, default_value = ".aws-sam/build/template.yaml", requires = "sam")]
    sam_template: PathBuf,
    /// The base image SAM runs the functions on (`--invoke-image`); unset, SAM uses
    /// AWS's image for the runtime (pulled, unless already here).
    #[arg(long, requires = "sam")]
    invoke_image: Option<String>,
    /// The address at which containers reach this machine (the Docker bridge's gateway):
    /// the emulators' one endpoint listens there.
    #[arg(long, default_value = "172.17.0.1", requires = "sam")]
    docker_host_ip: IpAddr,
}

#[derive(Debug, thiserror::Error)]
enum SmokeError {
    #[error(transparent)]
    Emulators(#[from] &'static flashsale_emulators::EmulatorError),
    #[error("the emulator start-up task failed")]
    Join(#[source] tokio::task::JoinError),
    #[error("template: {0}")]
    Template(#[from] flashsale_local::template::TemplateError),
    #[error("template model: {0}")]
    Model(#[from] flashsale_local::model::ModelError),
    #[error("provisioning: {0}")]
    Provision(#[from] flashsale_local::provision::ProvisionError),
    #[error("the template has no function {0}")]
    NoFunction(&'static str),
    #[error("could not read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not JSON", path.display())]
    Fixture {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{} is missing: run `make build-lambdas`", path.display())]
    NoBootstrap { path: PathBuf },
    #[error("starting {name}")]
    Start {
        name: String,
        #[source]
        source: StartError,
    },
    #[error("{step}")]
    Invoke {
        step: &'static str,
        #[source]
        source: InvokeError,
    },
    #[error("{step}: {detail}")]
    Check { step: &'static str, detail: String },
    #[error("sam local")]
    Sam(#[from] SamError),
    #[error("the emulators' one endpoint")]
    OneEndpoint(#[from] flashsale_emulators::one_endpoint::OneEndpointError),
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{step}: the HTTP request")]
    Http {
        step: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{step}: SQS")]
    Sqs {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn check(step: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), SmokeError> {
    if ok {
        Ok(())
    } else {
        Err(SmokeError::Check {
            step,
            detail: detail(),
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => {
            println!("smoke-lambdas: all bootstraps passed");
            ExitCode::SUCCESS
        }
        Err(error) => {
            let mut message = format!("smoke-lambdas FAILED: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!("\n  caused by: {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

struct Fixtures {
    dir: PathBuf,
}

impl Fixtures {
    fn load(&self, name: &str) -> Result<Value, SmokeError> {
        let path = self.dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|source| SmokeError::Read {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| SmokeError::Fixture { path, source })
    }

    /// An API Gateway v2 fixture re-aimed: its route's path parameters, caller and body
    /// replaced, the paths rebuilt from the route key, and the times set to now.
    fn http(
        &self,
        name: &str,
        params: &[(&str, &str)],
        sub: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Value, SmokeError> {
        let mut event = self.load(name)?;
        let route_key = event["routeKey"].as_str().unwrap_or_default().to_owned();
        let template = route_key
            .split_once(' ')
            .map_or(route_key.as_str(), |(_, path)| path);
        let mut path = template.to_owned();
        for (key, value) in params {
            event["pathParameters"][*key] = json!(value);
            path = path.replace(&format!("{{{key}}}"), value);
        }
        let stage = event["requestContext"]["stage"]
            .as_str()
            .unwrap_or("$default")
            .to_owned();
        let full_path = if stage == "$default" {
            path
        } else {
            format!("/{stage}{path}")
        };
        event["rawPath"] = json!(full_path);
        event["requestContext"]["http"]["path"] = json!(full_path);
        let now = Utc::now();
        event["requestContext"]["timeEpoch"] = json!(now.timestamp_millis());
        event["requestContext"]["time"] = json!(now.format("%d/%b/%Y:%H:%M:%S +0000").to_string());
        event["requestContext"]["requestId"] = json!(ulid::Ulid::new().to_string());
        if let Some(sub) = sub {
            let claims = &mut event["requestContext"]["authorizer"]["jwt"]["claims"];
            claims["sub"] = json!(sub);
            claims["cognito:username"] = json!(sub);
        }
        if let Some(body) = body {
            let text = body.to_string();
            event["headers"]["content-length"] = json!(text.len().to_string());
            event["body"] = json!(text);
        }
        Ok(event)
    }
}

/// The status and JSON body of an API Gateway v2 response.
fn http_answer(step: &'static str, response: &Value) -> Result<(u64, Value), SmokeError> {
    let status = response["statusCode"]
        .as_u64()
        .ok_or_else(|| SmokeError::Check {
            step,
            detail: format!("no statusCode in {response}"),
        })?;
    let body_text = response["body"].as_str().unwrap_or_default();
    let body = serde_json::from_str(body_text).map_err(|_| SmokeError::Check {
        step,
        detail: format!("status {status}, body is not JSON: {body_text:?}"),
    })?;
    Ok((status, body))
}

/// One function, however it is run.
enum Runner {
    /// Under the RIE on this host, one process for every invocation (boxed: it holds the
    /// process and its log buffers, the SAM variant only a path and names).
    Rie(Box<Lambda>),
    /// Under `sam local invoke`, a container per invocation.
    Sam(SamFunction),
}

impl Runner {
    async fn invoke(&mut self, event: &Value) -> Result<Outcome, InvokeError> {
        match self {
            Self::Rie(lambda) => lambda.invoke(event).await,
            Self::Sam(function) => function.invoke(event).await,
        }
    }

    fn logs(&self) -> String {
        match self {
            Self::Rie(lambda) => lambda.logs(),
            Self::Sam(function) => function.logs(),
        }
    }
}

async fn invoke(
    lambda: &mut Runner,
    step: &'static str,
    event: &Value,
) -> Result<Value, SmokeError> {
    let outcome = lambda
        .invoke(event)
        .await
        .map_err(|source| SmokeError::Invoke { step, source })?;
    outcome.json().map_err(|source| SmokeError::Check {
        step,
        detail: format!("{source}\n--- logs ---\n{}", lambda.logs()),
    })
}

async fn invoke_http(
    lambda: &mut Runner,
    step: &'static str,
    event: &Value,
    expected_status: u64,
) -> Result<Value, SmokeError> {
    let response = invoke(lambda, step, event).await?;
    let (status, body) = http_answer(step, &response)?;
    check(step, status == expected_status, || {
        format!(
            "expected {expected_status}, got {status}: {body}\n--- logs ---\n{}",
            lambda.logs()
        )
    })?;
    println!("  ok  {step}: {status} {body}");
    Ok(body)
}

fn function<'a>(
    model: &'a StackModel,
    logical_id: &'static str,
) -> Result<&'a FunctionSpec, SmokeError> {
    model
        .function(logical_id)
        .ok_or(SmokeError::NoFunction(logical_id))
}

/// The bootstrap cargo-lambda built of the function's bin (`BuildProperties.Binary`).
fn bootstrap_of(lambda_dir: &Path, function: &FunctionSpec) -> Result<PathBuf, SmokeError> {
    let path = lambda_dir.join(&function.binary).join("bootstrap");
    if path.is_file() {
        Ok(path)
    } else {
        Err(SmokeError::NoBootstrap { path })
    }
}

/// How the functions are run, and what the emulators are reached through.
enum Mode {
    Rie {
        rie: PathBuf,
        client_env: Vec<(&'static str, String)>,
    },
    Sam {
        sam: SamLocal,
        /// Held for as long as any container may call it.
        _endpoint: OneEndpoint,
    },
}

impl Mode {
    async fn start(&self, args: &Args, function: &FunctionSpec) -> Result<Runner, SmokeError> {
        match self {
            Self::Rie { rie, client_env } => {
                let mut env: Vec<(String, String)> = function
                    .environment
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                env.extend(client_env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
                let runner: Vec<String> = args
                    .runner
                    .as_deref()
                    .map(|r| r.split_whitespace().map(str::to_owned).collect())
                    .unwrap_or_default();
                let spec = LambdaSpec {
                    rie: rie.clone(),
                    name: function.name.clone(),
                    bootstrap: bootstrap_of(&args.lambda_dir, function)?,
                    runner,
                    env,
                    memory_mb: 256,
                    // Emulated arm64 starts slower than Lambda; the budget is for a first
                    // cold start.
                    timeout: function.timeout.max(Duration::from_secs(60)),
                };
                println!(
                    "  start {} ({})",
                    function.logical_id,
                    spec.bootstrap.display()
                );
                let lambda = Lambda::start(&spec)
                    .await
                    .map_err(|source| SmokeError::Start {
                        name: function.logical_id.clone(),
                        source,
                    })?;
                Ok(Runner::Rie(Box::new(lambda)))
            }
            Self::Sam { sam, .. } => {
                println!("  sam local invoke {}", function.logical_id);
                Ok(Runner::Sam(sam.function(&function.logical_id)))
            }
        }
    }
}

/// The SAM run: the emulators' one endpoint where containers reach this machine, and
/// each function's variables as the provisioned stack resolved them (SAM itself cannot
/// resolve a `Ref` to a resource it did not create).
async fn sam_mode(
    args: &Args,
    sam: &Path,
    emulators: &'static flashsale_emulators::Emulators,
    model: &StackModel,
) -> Result<Mode, SmokeError> {
    let endpoint = OneEndpoint::start(args.docker_host_ip, emulators).await?;
    let env_vars: BTreeMap<String, BTreeMap<String, String>> = model
        .functions
        .iter()
        .map(|function| {
            (
                function.logical_id.clone(),
                function
                    .environment
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        })
        .collect();
    let env_vars_path =
        std::env::temp_dir().join(format!("flashsale-sam-env-{}.json", std::process::id()));
    // The template declares AWS_ENDPOINT_URL (unset when deployed) for this: SAM passes
    // a container no other variable.
    let every_function = BTreeMap::from([("AWS_ENDPOINT_URL".to_owned(), endpoint.url())]);
    SamLocal::write_env_vars(&env_vars_path, &every_function, &env_vars).map_err(|source| {
        SmokeError::Write {
            path: env_vars_path.clone(),
            source,
        }
    })?;
    println!(
        "smoke-lambdas: under sam local, on {}; the containers reach the emulators at {}",
        args.invoke_image
            .as_deref()
            .unwrap_or("AWS's image for the runtime"),
        endpoint.url()
    );
    let region = flashsale_emulators::REGION.to_owned();
    let sam = SamLocal {
        sam: sam.to_path_buf(),
        template: args.sam_template.clone(),
        env_vars: env_vars_path,
        invoke_image: args.invoke_image.clone(),
        env: vec![
            ("AWS_DEFAULT_REGION".to_owned(), region.clone()),
            ("AWS_REGION".to_owned(), region),
            // What SAM hands the container as its credentials.
            ("AWS_ACCESS_KEY_ID".to_owned(), "test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), "test".to_owned()),
            ("SAM_CLI_TELEMETRY".to_owned(), "0".to_owned()),
        ],
        // A first invocation also builds SAM's image of the RIE on the base image.
        timeout: Duration::from_secs(180),
    };
    Ok(Mode::Sam {
        sam,
        _endpoint: endpoint,
    })
}

async fn run(args: &Args) -> Result<(), SmokeError> {
    let emulators = tokio::task::spawn_blocking(flashsale_emulators::try_shared_blocking)
        .await
        .map_err(SmokeError::Join)??;
    let sdk = emulators.sdk_config().await;
    let suffix = flashsale_emulators::unique_suffix();
    let template = Template::expand(&args.template, &BTreeMap::new())?;
    let context = StackContext {
        stack_name: format!("smoke-{suffix}"),
        region: flashsale_emulators::REGION.to_owned(),
        account_id: flashsale_emulators::ACCOUNT_ID.to_owned(),
        sqs_endpoint: emulators.sqs_endpoint.clone(),
    };
    let model = StackModel::build(&template, context, &BTreeMap::new())?;
    let report = provision(&model, &Clients::new(&sdk)).await?;
    println!(
        "smoke-lambdas: provisioned {} resources of template.yaml on DynamoDB Local {}, SQS {} and moto {}",
        report.resources.len(),
        emulators.dynamodb_endpoint,
        emulators.sqs_endpoint,
        emulators.moto_endpoint
    );
    let mode = match (&args.rie, &args.sam) {
        (_, Some(sam)) => sam_mode(args, sam, emulators, &model).await?,
        (Some(rie), None) => Mode::Rie {
            rie: rie.clone(),
            client_env: emulators.client_env(),
        },
        (None, None) => unreachable!("clap requires --rie or --sam"),
    };
    let fixtures = Fixtures {
        dir: args.events.clone(),
    };
    let mut api = mode.start(args, function(&model, "ApiFunction")?).await?;
    let mut grab = mode.start(args, function(&model, "GrabFunction")?).await?;
    let consumer_spec = function(&model, "OrderConsumerFunction")?;
    let mut consumer = mode.start(args, consumer_spec).await?;
    let mut release = mode
        .start(args, function(&model, "ReleaseFunction")?)
        .await?;
    let mut reconciler = mode
        .start(args, function(&model, "ReconcilerFunction")?)
        .await?;

    // 1. The public sale page of a sale that does not exist.
    let missing = format!("smoke-missing-{suffix}");
    let body = invoke_http(
        &mut api,
        "api GET unknown sale",
        &fixtures.http("api-get-sale.json", &[("sale_id", &missing)], None, None)?,
        404,
    )
    .await?;
    check(
        "api GET unknown sale",
        body["error"] == "sale_not_found",
        || body.to_string(),
    )?;

    // 2. An admin creates a sale that is active now, with a 2 s payment window.
    let sale_id = format!("smoke-{suffix}");
    let now = Utc::now();
    let draft = json!({
        "sale_id": sale_id,
        "name": "Smoke sale",
        "price": {"amount": 2_500, "currency": "EUR"},
        "stock": 3,
        "starts_at": (now - chrono::Duration::minutes(1)).to_rfc3339_opts(SecondsFormat::Secs, true),
        "ends_at": (now + chrono::Duration::hours(1)).to_rfc3339_opts(SecondsFormat::Secs, true),
        "per_user_limit": 1,
        "payment_timeout_secs": 2,
        "shards": 1,
    });
    let created = invoke_http(
        &mut api,
        "api POST /admin/sales",
        &fixtures.http("api-create-sale.json", &[], None, Some(&draft))?,
        201,
    )
    .await?;
    check(
        "api POST /admin/sales",
        created["sale_id"] == json!(sale_id),
        || created.to_string(),
    )?;
    let view = invoke_http(
        &mut api,
        "api GET sale",
        &fixtures.http("api-get-sale.json", &[("sale_id", &sale_id)], None, None)?,
        200,
    )
    .await?;
    check(
        "api GET sale",
        view["stock_available"] == 3 && view["status"] == "active",
        || view.to_string(),
    )?;

    // 3. A buyer gets a grab path and grabs.
    let buyer = format!("smoke-buyer-{suffix}");
    let pass = invoke_http(
        &mut grab,
        "grab POST token",
        &fixtures.http(
            "grab-token.json",
            &[("sale_id", &sale_id)],
            Some(&buyer),
            None,
        )?,
        200,
    )
    .await?;
    let grab_path = pass["grab_path"].as_str().unwrap_or_default().to_owned();
    let token = grab_path.rsplit('/').next().unwrap_or_default().to_owned();
    check(
        "grab POST token",
        grab_path.starts_with(&format!("/sales/{sale_id}/grab/")),
        || pass.to_string(),
    )?;
    let reserved = invoke_http(
        &mut grab,
        "grab POST grab path",
        &fixtures.http(
            "grab.json",
            &[("sale_id", &sale_id), ("token", &token)],
            Some(&buyer),
            None,
        )?,
        202,
    )
    .await?;
    let order_id = reserved["order_id"].as_str().unwrap_or_default().to_owned();
    check(
        "grab POST grab path",
        reserved["status"] == "reserved" && !order_id.is_empty(),
        || reserved.to_string(),
    )?;

    // 4. The grab really queued the reservation; the consumer sets its timer.
    let source = consumer_spec.sqs_sources.first().ok_or(SmokeError::Check {
        step: "consumer",
        detail: "OrderConsumerFunction has no SQS event".to_owned(),
    })?;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let received = sqs
        .receive_message()
        .queue_url(&source.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(5)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
        .send()
        .await
        .map_err(|e| SmokeError::Sqs {
            step: "receive the grab's message",
            source: Box::new(e),
        })?;
    let message = received
        .messages()
        .iter()
        .find(|m| m.body().is_some_and(|b| b.contains(&order_id)))
        .ok_or_else(|| SmokeError::Check {
            step: "receive the grab's message",
            detail: format!("no message for {order_id} on {}", source.queue_url),
        })?;
    let reservation: Value =
        serde_json::from_str(message.body().unwrap_or_default()).map_err(|_| {
            SmokeError::Check {
                step: "receive the grab's message",
                detail: format!("body is not JSON: {:?}", message.body()),
            }
        })?;
    println!("  ok  the grab queued {reservation}");
    let mut sqs_event = fixtures.load("order-consumer.json")?;
    let mut record = sqs_event["Records"][0].clone();
    record["messageId"] = json!(message.message_id().unwrap_or_default());
    record["receiptHandle"] = json!(message.receipt_handle().unwrap_or_default());
    record["body"] = json!(message.body().unwrap_or_default());
    record["md5OfBody"] = json!(message.md5_of_body().unwrap_or_default());
    record["eventSourceARN"] = json!(source.queue_arn);
    record["attributes"]["MessageGroupId"] = json!(order_id);
    record["attributes"]["MessageDeduplicationId"] = json!(order_id);
    sqs_event["Records"] = json!([record]);
    let answer = invoke(&mut consumer, "consumer with the real record", &sqs_event).await?;
    check(
        "consumer with the real record",
        answer["batchItemFailures"] == json!([]),
        || format!("{answer}\n--- logs ---\n{}", consumer.logs()),
    )?;
    println!("  ok  consumer with the real record: {answer}");

    let scheduler = aws_sdk_scheduler::Client::new(&sdk);
    let group = consumer_spec
        .environment
        .get("SCHEDULE_GROUP_NAME")
        .cloned()
        .unwrap_or_default();
    let schedules = scheduler
        .list_schedules()
        .group_name(&group)
        .send()
        .await
        .map_err(|e| SmokeError::Sqs {
            step: "list release schedules",
            source: Box::new(e),
        })?;
    let unique = order_id.rsplit('.').next().unwrap_or_default().to_owned();
    check(
        "a release schedule exists",
        schedules
            .schedules()
            .iter()
            .any(|s| s.name().is_some_and(|n| n.contains(&unique))),
        || {
            format!(
                "no schedule for {order_id} in {group}: {:?}",
                schedules.schedules()
            )
        },
    )?;
    println!("  ok  a release schedule for {order_id} exists in {group}");

    let fixture_answer = invoke(
        &mut consumer,
        "consumer with its fixture",
        &fixtures.load("order-consumer.json")?,
    )
    .await?;
    check(
        "consumer with its fixture",
        fixture_answer["batchItemFailures"].is_array(),
        || fixture_answer.to_string(),
    )?;
    println!("  ok  consumer with its fixture (orders nobody holds): {fixture_answer}");

    // 5. Release: the fixture's order is nobody's; the real one gives its unit back.
    let fixture_release = invoke(
        &mut release,
        "release with its fixture",
        &fixtures.load("release.json")?,
    )
    .await?;
    check(
        "release with its fixture",
        fixture_release["outcome"] == "unknown",
        || fixture_release.to_string(),
    )?;
    println!("  ok  release with its fixture (an order nobody holds): {fixture_release}");
    let due = reservation["expires_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .ok_or_else(|| SmokeError::Check {
            step: "release",
            detail: format!("no expires_at in {reservation}"),
        })?;
    let wait = (due.with_timezone(&Utc) - Utc::now())
        .to_std()
        .unwrap_or_default()
        + Duration::from_millis(300);
    tokio::time::sleep(wait).await;
    let released = invoke(&mut release, "release the real reservation", &reservation).await?;
    check(
        "release the real reservation",
        released["outcome"] == "released",
        || released.to_string(),
    )?;
    println!("  ok  release the real reservation: {released}");
    let again = invoke(&mut release, "release it again", &reservation).await?;
    check(
        "release it again",
        again["outcome"] == "already_settled" && again["status"] == "expired",
        || again.to_string(),
    )?;
    println!("  ok  release it again: {again}");
    let view = invoke_http(
        &mut api,
        "api GET sale after release",
        &fixtures.http("api-get-sale.json", &[("sale_id", &sale_id)], None, None)?,
        200,
    )
    .await?;
    check(
        "api GET sale after release",
        view["stock_available"] == 3,
        || format!("the unit did not come back exactly once: {view}"),
    )?;
    let order = invoke_http(
        &mut api,
        "api GET order after release",
        &fixtures.http(
            "api-get-order.json",
            &[("order_id", &order_id)],
            Some(&buyer),
            None,
        )?,
        200,
    )
    .await?;
    check(
        "api GET order after release",
        order["status"] == "expired",
        || order.to_string(),
    )?;
    let step = "api POST cancel the lapsed order";
    let refused = invoke_http(
        &mut api,
        step,
        &fixtures.http(
            "api-cancel-order.json",
            &[("order_id", &order_id)],
            Some(&buyer),
            None,
        )?,
        409,
    )
    .await?;
    check(step, refused["error"] == "order_expired", || {
        refused.to_string()
    })?;
    // The smoke's stack takes no card payments (no Stripe keys secret): the payment
    // route says so rather than failing.
    let step = "api POST open a payment without card payments";
    let off = invoke_http(
        &mut api,
        step,
        &fixtures.http(
            "api-open-payment.json",
            &[("order_id", &order_id)],
            Some(&buyer),
            None,
        )?,
        404,
    )
    .await?;
    check(step, off["error"] == "payments_off", || off.to_string())?;
    let stats = invoke_http(
        &mut api,
        "api GET sale stats",
        &fixtures.http("api-sale-stats.json", &[("sale_id", &sale_id)], None, None)?,
        200,
    )
    .await?;
    check(
        "api GET sale stats",
        stats["expired"] == 1 && stats["available"] == 3 && stats["consistent"] == true,
        || stats.to_string(),
    )?;

    // 6. A reconciliation pass over the stack, triggered by its scheduled-event fixture:
    //    it finds the smoke sale (still running) and nothing stuck in it.
    let report = invoke(
        &mut reconciler,
        "reconciler with its fixture",
        &fixtures.load("reconciler.json")?,
    )
    .await?;
    check(
        "reconciler with its fixture",
        report["sales"].as_u64().is_some_and(|sales| sales >= 1)
            && report["failed"] == 0
            && report["failed_sales"] == 0,
        || format!("{report}\n--- logs ---\n{}", reconciler.logs()),
    )?;
    println!("  ok  reconciler with its fixture: {report}");

    match &mode {
        Mode::Rie { .. } => {
            report_inits([
                ("api", &mut api),
                ("grab", &mut grab),
                ("order-consumer", &mut consumer),
                ("release", &mut release),
                ("reconciler", &mut reconciler),
            ])
            .await?
        }
        Mode::Sam { sam, .. } => through_start_api(sam, &sale_id, &order_id).await?,
    }
    Ok(())
}

/// Every function has been invoked, so each RIE has reported its init.
async fn report_inits(runners: [(&str, &mut Runner); 5]) -> Result<(), SmokeError> {
    for (name, runner) in runners {
        let Runner::Rie(lambda) = runner else {
            continue;
        };
        let init = lambda
            .init_duration(&json!({}))
            .await
            .map_err(|source| SmokeError::Invoke {
                step: "init report",
                source,
            })?;
        println!(
            "  init {name}: {:.1} ms (the RIE's INIT REPORT)",
            init.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The template's HTTP API under `sam local start-api`, which plays payload 2.0 but not
/// the JWT authorizer: the public sale page answers through it, and a protected route,
/// reached with no claims, is refused by the function itself.
async fn through_start_api(
    sam: &SamLocal,
    sale_id: &str,
    order_id: &str,
) -> Result<(), SmokeError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|source| SmokeError::Write {
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })?;
    println!("  sam local start-api on port {port}");
    let api = sam.start_api("127.0.0.1", port).await?;
    let outcome = start_api_checks(api.url(), sale_id, order_id).await;
    if outcome.is_err() {
        eprintln!("--- sam local start-api ---\n{}", api.logs());
    }
    api.stop(Duration::from_secs(30)).await;
    outcome
}

async fn start_api_checks(url: &str, sale_id: &str, order_id: &str) -> Result<(), SmokeError> {
    let http = reqwest::Client::new();
    let call = |step: &'static str, method: reqwest::Method, path: String| {
        let request = http.request(method, format!("{url}{path}"));
        async move {
            let response = request
                .send()
                .await
                .map_err(|source| SmokeError::Http { step, source })?;
            let status = response.status().as_u16();
            let body: Value = response
                .json()
                .await
                .map_err(|source| SmokeError::Http { step, source })?;
            println!("  ok  {step}: {status} {body}");
            Ok::<_, SmokeError>((status, body))
        }
    };
    let step = "start-api GET sale";
    let (status, view) = call(step, reqwest::Method::GET, format!("/sales/{sale_id}")).await?;
    check(
        step,
        status == 200 && view["sale_id"] == sale_id && view["stock_available"] == 3,
        || format!("{status} {view}"),
    )?;
    let step = "start-api GET unknown sale";
    let (status, missing) =
        call(step, reqwest::Method::GET, "/sales/no-such-sale".to_owned()).await?;
    check(
        step,
        status == 404 && missing["error"] == "sale_not_found",
        || format!("{status} {missing}"),
    )?;
    for (step, method, path) in [
        (
            "start-api POST token without claims",
            reqwest::Method::POST,
            format!("/sales/{sale_id}/token"),
        ),
        (
            "start-api GET order without claims",
            reqwest::Method::GET,
            format!("/orders/{order_id}"),
        ),
        (
            "start-api POST /admin/sales without claims",
            reqwest::Method::POST,
            "/admin/sales".to_owned(),
        ),
    ] {
        let (status, body) = call(step, method, path).await?;
        check(
            step,
            status == 401 && body["error"] == "unauthorized",
            || format!("{status} {body}"),
        )?;
    }
    Ok(())
}
