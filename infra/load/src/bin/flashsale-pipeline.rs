//! How close the local grab pipeline comes to its database: grab successes per second
//! through the local gateway (token, then grab: authorizer, grab function, DynamoDB
//! Local, the SQS emulator, with the consumer and scheduler working behind) against raw
//! `TransactWriteItems` per second of the grab's own shape (the very adapter the grab
//! calls) on the same DynamoDB Local, side by side in one run.
//!
//! ```sh
//! # starts a stack of its own, gateway throttles lifted:
//! cargo run --release -p flashsale-load --bin flashsale-pipeline -- --concurrency 8,32 --grabs 600
//! # or against `make run` (its throttles apply; lift them with LOCAL_PARAMETERS):
//! cargo run --release -p flashsale-load --bin flashsale-pipeline -- --api http://127.0.0.1:3000 \
//!   --dynamodb-endpoint http://127.0.0.1:8000 --table flashsale-local-table
//! ```
//!
//! Prints one JSON line per concurrency level.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Parser;
use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::{OrderBook, ReserveRefusal, SaleCatalog, StockLedger};
use flashsale_domain::{OrderId, Reservation, Sale, SaleId, UserId};
use flashsale_emulators::EmulatorOptions;
use flashsale_load::ApiClient;
use flashsale_load::client::expect_status;
use flashsale_local::{EmulatorSource, LocalStack, StackOptions};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "flashsale-pipeline",
    about = "Grab successes/s through the local gateway versus raw TransactWriteItems/s of the grab's shape on the same DynamoDB Local; one JSON line per concurrency level",
    after_help = "Output fields: concurrency, grabs, raw_transact_per_s, raw_reserve_open_per_s (the grab's writes, then the consumer's read of the hold, per unit), gateway_grabs_per_s, ratio (gateway/raw), ratio_to_reserve_open (gateway/raw_reserve_open), http_503, http_429, failures, raw_p50_ms, raw_p99_ms, gateway_p50_ms, gateway_p99_ms.\n\nWithout --api it starts its own stack (DynamoDB Local, the SQS emulator, moto; free ports) with every gateway throttle lifted, so only the stack itself limits the rate."
)]
struct Args {
    /// Concurrency levels to measure, comma-separated; each gets both measurements.
    #[arg(long, value_delimiter = ',', default_values_t = [8usize, 32])]
    concurrency: Vec<usize>,
    /// Grabs per measurement (each by a distinct buyer, on a sale that cannot sell out).
    #[arg(long, default_value_t = 600)]
    grabs: usize,
    /// Target a running local stack at this URL instead of starting one (needs
    /// --dynamodb-endpoint and --table; its gateway throttles apply).
    #[arg(long, requires_all = ["dynamodb_endpoint", "table"])]
    api: Option<String>,
    /// DynamoDB Local of the stack --api names.
    #[arg(long)]
    dynamodb_endpoint: Option<String>,
    /// The stack's table (its physical name, as `make run` prints it).
    #[arg(long)]
    table: Option<String>,
    /// How long to wait for the consumer to drain one level's orders before the next.
    #[arg(long, default_value_t = 180)]
    drain_timeout_secs: u64,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The stack under measurement: the API, and the grab's store on its DynamoDB Local.
struct Target {
    api: ApiClient,
    store: DynamoStore,
    admin: String,
    /// Held so that a stack this tool started lives as long as the measurement.
    _own: Option<LocalStack>,
}

/// A request every throttle lets through: the pipeline, not the gateway's rate limit,
/// is what is measured.
const UNTHROTTLED: &str = "1000000";

async fn target(args: &Args) -> Result<Target, Failure> {
    let (api_url, dynamodb_endpoint, table, own) = match &args.api {
        Some(api) => (
            api.clone(),
            args.dynamodb_endpoint
                .clone()
                .ok_or("--dynamodb-endpoint")?,
            args.table.clone().ok_or("--table")?,
            None,
        ),
        None => {
            let mut options =
                StackOptions::new(format!("pipeline-{}", flashsale_emulators::unique_suffix()));
            for limit in [
                "DefaultThrottleRateLimit",
                "DefaultThrottleBurstLimit",
                "GrabThrottleRateLimit",
                "GrabThrottleBurstLimit",
                "TokenThrottleRateLimit",
                "TokenThrottleBurstLimit",
            ] {
                options = options.parameter(limit, UNTHROTTLED);
            }
            options.emulators = EmulatorSource::Own(EmulatorOptions::default());
            let stack = LocalStack::start(options).await?;
            let table = stack
                .table_name("Table")
                .ok_or("the template has no Table")?;
            (
                stack.api_url.clone(),
                stack.dynamodb_endpoint.clone(),
                table.to_owned(),
                Some(stack),
            )
        }
    };
    let sdk = flashsale_emulators::sdk_config_for(flashsale_emulators::LocalEndpoints {
        dynamodb: dynamodb_endpoint,
        sqs: String::new(),
        moto: String::new(),
    })
    .await;
    let api = ApiClient::new(api_url);
    let admin = api.local_token("pipeline-admin", true).await?;
    Ok(Target {
        api,
        store: DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), table),
        admin,
        _own: own,
    })
}

/// A sale large enough that no measurement sells it out.
async fn new_sale(target: &Target, label: &str, stock: usize) -> Result<Sale, Failure> {
    let sale_id = format!("pipeline-{label}-{}", flashsale_emulators::unique_suffix());
    let draft = json!({
        "sale_id": sale_id,
        "name": "pipeline measurement",
        "price": flashsale_load::client::sale_price(),
        "stock": stock,
        "starts_at": Utc::now() - chrono::Duration::seconds(5),
        "ends_at": Utc::now() + chrono::Duration::hours(1),
        "payment_timeout_secs": 3600,
    });
    // A busy answer may hide a committed create, so a retry's 409 (this run's unique
    // id) means it is there.
    let mut attempt = 0;
    loop {
        let created = target.api.create_sale(&target.admin, &draft).await?;
        match created.status {
            StatusCode::CREATED => break,
            StatusCode::CONFLICT if attempt > 0 => break,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS if attempt < 20 => {
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            _ => expect_status(&created, StatusCode::CREATED, "/admin/sales")?,
        }
    }
    let sale = target
        .store
        .find_sale(&SaleId::parse(sale_id)?)
        .await?
        .ok_or("the sale just created is not in the table")?;
    Ok(sale)
}

/// Runs `jobs` jobs on `concurrency` workers; answers the wall time.
async fn run_workers<F, Fut>(concurrency: usize, jobs: usize, job: F) -> Duration
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let job = Arc::new(job);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (job, next) = (job.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= jobs {
                        break;
                    }
                    job(index).await;
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    started.elapsed()
}

#[derive(Debug, Default)]
struct Tally {
    successes: AtomicUsize,
    failures: AtomicUsize,
    status_503: AtomicUsize,
    status_429: AtomicUsize,
    latencies_us: std::sync::Mutex<Vec<u64>>,
}

impl Tally {
    fn latency(&self, since: Instant) {
        let micros = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Ok(mut latencies) = self.latencies_us.lock() {
            latencies.push(micros);
        }
    }

    fn percentile_ms(&self, quantile: f64) -> f64 {
        let Ok(mut latencies) = self.latencies_us.lock() else {
            return f64::NAN;
        };
        if latencies.is_empty() {
            return f64::NAN;
        }
        latencies.sort_unstable();
        let rank = ((latencies.len() - 1) as f64 * quantile).round() as usize;
        latencies[rank] as f64 / 1000.0
    }
}

/// What a raw measurement sends for each unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RawWork {
    /// The grab's transaction only.
    Reserve,
    /// The grab's writes, then the consumer's read of the hold (`OrderBook::find`):
    /// every DynamoDB call a sold unit costs through the pipeline.
    ReserveAndOpen,
}

/// Raw: the grab's writes (and with [`RawWork::ReserveAndOpen`] the consumer's read of
/// the hold), through the functions' own adapter, straight to DynamoDB.
async fn raw(
    target: &Target,
    sale: Sale,
    concurrency: usize,
    grabs: usize,
    work: RawWork,
) -> (Duration, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let store = Arc::new(target.store.clone());
    let sale = Arc::new(sale);
    let elapsed = run_workers(concurrency, grabs, {
        let tally = tally.clone();
        move |index| {
            let (store, sale, tally) = (store.clone(), sale.clone(), tally.clone());
            async move {
                let Ok(user) = UserId::parse(format!("raw-buyer-{index}")) else {
                    tally.failures.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let now = Utc::now();
                let mut reservation = Reservation {
                    order_id: OrderId::new(sale.sale_id.clone()),
                    sale_id: sale.sale_id.clone(),
                    shard: 0,
                    user_id: user,
                    created_at: now,
                    expires_at: sale.payment_deadline(now),
                    price: sale.price,
                };
                let started = Instant::now();
                // Shard by shard in the buyer's order, as the grab does: near the end a
                // buyer's first shard may be empty while others still hold stock.
                let mut reserved = false;
                for shard in sale.shard_order(&reservation.user_id) {
                    reservation.shard = shard;
                    match store.reserve(&sale, shard, &reservation).await {
                        Ok(Ok(())) => reserved = true,
                        Ok(Err(ReserveRefusal::ShardEmpty(_))) => continue,
                        _ => {}
                    }
                    break;
                }
                let done = reserved
                    && (work == RawWork::Reserve
                        || matches!(
                            store.find(&reservation.order_id, &reservation.user_id).await,
                            Ok(Some((order, _))) if order.status.is_open()
                        ));
                if done {
                    tally.latency(started);
                    tally.successes.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
    .await;
    (elapsed, tally)
}

/// Through the gateway: a buyer asks for a grab path, then grabs through it. A 503 or
/// 429 is counted and the step retried, as a buyer's page would.
async fn gateway(
    target: &Target,
    sale: &Sale,
    concurrency: usize,
    grabs: usize,
) -> Result<(Duration, Arc<Tally>), Failure> {
    // Tokens first: the identity provider is not part of the pipeline.
    let mut tokens = Vec::with_capacity(grabs);
    for index in 0..grabs {
        let user = format!("gw-buyer-{}-{index}", sale.sale_id.as_str());
        tokens.push(target.api.local_token(&user, false).await?);
    }
    let tokens = Arc::new(tokens);
    let tally = Arc::new(Tally::default());
    let api = target.api.clone();
    let sale_id = sale.sale_id.as_str().to_owned();
    let elapsed = run_workers(concurrency, grabs, {
        let tally = tally.clone();
        move |index| {
            let (api, tokens, tally, sale_id) =
                (api.clone(), tokens.clone(), tally.clone(), sale_id.clone());
            async move {
                let token = &tokens[index];
                let started = Instant::now();
                let pass = call(&api, &tally, &format!("/sales/{sale_id}/token"), token).await;
                let Some(path) = pass
                    .as_ref()
                    .and_then(|(status, body)| (*status == StatusCode::OK).then_some(body))
                    .and_then(|body| body.get("grab_path").and_then(Value::as_str))
                    .map(str::to_owned)
                else {
                    tally.failures.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                match call(&api, &tally, &path, token).await {
                    Some((StatusCode::ACCEPTED, _)) => {
                        tally.latency(started);
                        tally.successes.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        tally.failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    })
    .await;
    Ok((elapsed, tally))
}

/// POSTs `path`, retrying (and counting) 503 and 429 answers, at most a few times.
async fn call(
    api: &ApiClient,
    tally: &Tally,
    path: &str,
    token: &str,
) -> Option<(StatusCode, Value)> {
    const ATTEMPTS: u32 = 20;
    for attempt in 0..ATTEMPTS {
        let response = api.send(Method::POST, path, Some(token), None).await.ok()?;
        match response.status {
            StatusCode::SERVICE_UNAVAILABLE => tally.status_503.fetch_add(1, Ordering::Relaxed),
            StatusCode::TOO_MANY_REQUESTS => tally.status_429.fetch_add(1, Ordering::Relaxed),
            status => return Some((status, response.body)),
        };
        tokio::time::sleep(backoff(attempt)).await;
    }
    None
}

/// Full jitter over a doubling ceiling, from 10 ms to half a second.
fn backoff(attempt: u32) -> Duration {
    let ceiling = 10u64.saturating_mul(1 << attempt.min(6)).min(500);
    Duration::from_millis(rand::random_range(1..=ceiling))
}

/// Waits until the consumer has turned every reservation of `sale` into an order, so
/// one level's queue work does not run into the next level's measurement.
async fn drained(target: &Target, sale: &Sale, within: Duration) -> Result<(), Failure> {
    let started = Instant::now();
    loop {
        let stats = target
            .api
            .stats(&target.admin, sale.sale_id.as_str())
            .await?;
        if stats.body.get("reserved").and_then(Value::as_u64) == Some(0) {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(format!(
                "reservations still waiting after {within:?}: {}",
                stats.body
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn per_second(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = Args::parse();
    if args.grabs == 0 || args.concurrency.contains(&0) {
        return Err("--grabs and every --concurrency level must be positive".into());
    }
    let target = target(&args).await?;
    // Room for every grab of a level, so none is refused as sold out.
    let stock = args.grabs;
    for &concurrency in &args.concurrency {
        let raw_sale = new_sale(&target, "raw", stock).await?;
        let (raw_elapsed, raw_tally) =
            raw(&target, raw_sale, concurrency, args.grabs, RawWork::Reserve).await;
        let pair_sale = new_sale(&target, "pair", stock).await?;
        let (pair_elapsed, pair_tally) = raw(
            &target,
            pair_sale,
            concurrency,
            args.grabs,
            RawWork::ReserveAndOpen,
        )
        .await;
        let gateway_sale = new_sale(&target, "gw", stock).await?;
        let (gateway_elapsed, gateway_tally) =
            gateway(&target, &gateway_sale, concurrency, args.grabs).await?;
        let raw_rate = per_second(raw_tally.successes.load(Ordering::Relaxed), raw_elapsed);
        let pair_rate = per_second(pair_tally.successes.load(Ordering::Relaxed), pair_elapsed);
        let gateway_rate = per_second(
            gateway_tally.successes.load(Ordering::Relaxed),
            gateway_elapsed,
        );
        println!(
            "{}",
            json!({
                "concurrency": concurrency,
                "grabs": args.grabs,
                "raw_transact_per_s": round(raw_rate, 1),
                "raw_reserve_open_per_s": round(pair_rate, 1),
                "gateway_grabs_per_s": round(gateway_rate, 1),
                "ratio": round(gateway_rate / raw_rate.max(f64::EPSILON), 3),
                "ratio_to_reserve_open": round(gateway_rate / pair_rate.max(f64::EPSILON), 3),
                "http_503": gateway_tally.status_503.load(Ordering::Relaxed),
                "http_429": gateway_tally.status_429.load(Ordering::Relaxed),
                "failures": raw_tally.failures.load(Ordering::Relaxed)
                    + pair_tally.failures.load(Ordering::Relaxed)
                    + gateway_tally.failures.load(Ordering::Relaxed),
                "raw_p50_ms": round(raw_tally.percentile_ms(0.5), 1),
                "raw_p99_ms": round(raw_tally.percentile_ms(0.99), 1),
                "gateway_p50_ms": round(gateway_tally.percentile_ms(0.5), 1),
                "gateway_p99_ms": round(gateway_tally.percentile_ms(0.99), 1),
            })
        );
        let last = Some(&concurrency) == args.concurrency.last();
        let within = Duration::from_secs(args.drain_timeout_secs);
        if !last && let Err(error) = drained(&target, &gateway_sale, within).await {
            // The next level still runs; its numbers include this level's queue work.
            eprintln!("flashsale-pipeline: {error}");
        }
    }
    Ok(())
}
