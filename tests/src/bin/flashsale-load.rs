//! The load tool: a surge of buyers against a running stack (`make run`), with the
//! report the invariant test asserts on.
//!
//! ```sh
//! cargo run -p flashsale-e2e --bin flashsale-load -- --stock 100 --buyers 1500 --attempts 2000 --shards 8
//! ```

use std::time::Duration;

use chrono::Utc;
use clap::Parser;
use flashsale_e2e::ApiClient;
use flashsale_e2e::client::expect_status;
use flashsale_e2e::surge::{self, Outcome, SurgePlan};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::StatusCode;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Surge a flash sale on a running flashsale stack and report what happened")]
struct Args {
    /// Base URL of the HTTP API.
    #[arg(
        long,
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
    /// Distinct buyers.
    #[arg(long, default_value_t = 1500)]
    buyers: usize,
    /// Grab attempts in all (>= buyers; the extra are second tries).
    #[arg(long, default_value_t = 2000)]
    attempts: usize,
    /// Retries of a 503 answer per attempt.
    #[arg(long, default_value_t = 400)]
    retries: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.attempts < args.buyers {
        return Err("--attempts must be at least --buyers".into());
    }
    let client = ApiClient::new(&args.api_url);
    let run = Utc::now().timestamp_millis();
    let sale_id = format!("load-{run}");
    let admin = client.local_token("load-admin", true).await?;
    let created = client
        .create_sale(
            &admin,
            &json!({
                "sale_id": sale_id,
                "name": "load test",
                "stock": args.stock,
                "shards": args.shards,
                "starts_at": Utc::now(),
                "ends_at": Utc::now() + chrono::Duration::hours(1),
            }),
        )
        .await?;
    expect_status(&created, StatusCode::CREATED, "/admin/sales")?;

    let bar = ProgressBar::new(u64::try_from(args.attempts)?);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} {pos}/{len} answered {per_sec} [{elapsed}] {msg}",
    )?);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message("preparing buyers");
    let plan = SurgePlan {
        sale_id: sale_id.clone(),
        buyers: args.buyers,
        attempts: args.attempts,
        user_prefix: format!("load-{run}"),
        retries_when_unavailable: args.retries,
        preparation_concurrency: 64,
    };
    let report = surge::run(&client, &plan, |outcome| {
        if matches!(outcome, Outcome::Reserved { .. }) {
            bar.set_message("grabbing");
        }
        bar.inc(1);
    })
    .await?;
    bar.finish_and_clear();

    println!(
        "sale {sale_id}: stock {} in {} shards",
        args.stock, args.shards
    );
    println!("{report}");
    let stats = client.stats(&admin, &sale_id).await?;
    println!("stats: {}", stats.body);
    let oversold = report.reserved_count() > usize::try_from(args.stock)?;
    let doubled = report.buyers_with_more_than_one();
    if oversold || !doubled.is_empty() {
        return Err(format!(
            "invariant broken: oversold={oversold}, buyers holding two={doubled:?}"
        )
        .into());
    }
    Ok(())
}
