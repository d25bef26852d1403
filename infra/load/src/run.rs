//! The load tool for real use: a surge on a new sale of a local or deployed stack,
//! paying for some orders and, if asked, waiting until every unpaid unit has lapsed
//! back; then a JSON report, PNG plots and an audit of every invariant.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::audit::{AfterExpiry, AuditInput};
use crate::client::{ApiClient, ClientError};
use crate::report::{LoadReport, Percentiles, RunConfig};
use crate::surge::{self, Outcome, SurgePlan};
use crate::tokens::{TokenError, TokenSource};
use crate::{audit, plot, report};

/// Stripe's rate limit in test mode, which a stack paid by the load tool is in: about
/// 25 write operations a second for the account (docs.stripe.com/rate-limits).
const STRIPE_TEST_MODE_WRITES_PER_SEC: u32 = 25;
/// The writes one payment costs Stripe (docs/capacity.md, "Stripe's rate limit"): the
/// PaymentIntent created, the card confirmed, the money captured.
const STRIPE_WRITES_PER_PAYMENT: u32 = 3;

/// The least time between two payments' starts, so that the run's payments stay under
/// Stripe's test-mode limit with room for the account's other traffic (half of it).
fn payment_spacing() -> Duration {
    Duration::from_secs(1) * STRIPE_WRITES_PER_PAYMENT * 2 / STRIPE_TEST_MODE_WRITES_PER_SEC
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Tokens(#[from] TokenError),
    #[error("{what} answered {status}: {body}")]
    Refused {
        what: &'static str,
        status: StatusCode,
        body: Value,
    },
    #[error("{0}")]
    TimedOut(String),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
}

/// A run: its configuration and where its tokens come from.
#[derive(Debug, Clone)]
pub struct LoadRun {
    pub config: RunConfig,
    pub tokens: TokenSource,
    pub admin_user: String,
    /// Generated buyers are `{buyer_prefix}-{n}` (local tokens or a token command).
    pub buyer_prefix: String,
    /// Requests in flight while minting tokens and fetching grab paths.
    pub preparation_concurrency: usize,
    /// The longest wait for lapsed units to come back with `await_expiry`, counted
    /// from the end of the surge on top of the payment timeout.
    pub expiry_grace: Duration,
}

/// Runs the whole thing; `on_answer` sees each grab attempt's outcome, `say` progress.
pub async fn run(
    client: &ApiClient,
    run: &LoadRun,
    on_answer: impl Fn(&Outcome) + Send + Sync,
    say: impl Fn(&str),
) -> Result<LoadReport, LoadError> {
    let config = &run.config;
    say("minting tokens");
    let people = run
        .tokens
        .participants(
            client,
            &run.admin_user,
            config.buyers,
            &run.buyer_prefix,
            run.preparation_concurrency,
        )
        .await?;
    create_sale(client, &people.admin, config).await?;

    say("fetching grab paths, then grabbing");
    let plan = SurgePlan {
        sale_id: config.sale_id.clone(),
        buyers: config.buyers,
        attempts: config.attempts,
        user_prefix: run.buyer_prefix.clone(),
        retries_when_unavailable: config.retries,
        preparation_concurrency: run.preparation_concurrency,
        challenge: config.challenge_work.is_some(),
    };
    let surge = surge::run_prepared(client, &plan, &people.buyers, on_answer).await?;
    let surge_ended = Instant::now();
    let stats_after_surge = stats(client, &people.admin, &config.sale_id).await?;

    say("paying");
    let tokens: BTreeMap<&str, &str> = people
        .buyers
        .iter()
        .map(|(buyer, token)| (buyer.as_str(), token.as_str()))
        .collect();
    let orders: Vec<(&str, &str)> = surge
        .reserved
        .iter()
        .flat_map(|(buyer, orders)| {
            orders
                .iter()
                .map(move |order| (buyer.as_str(), order.as_str()))
        })
        .collect();
    let to_pay = share(orders.len(), config.pay_ratio);
    let mut pay_latencies = Vec::with_capacity(to_pay);
    let mut paid = 0;
    let mut lapsed_before_payment = 0;
    let mut pacer = tokio::time::interval(payment_spacing());
    pacer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for (buyer, order) in orders.iter().take(to_pay) {
        pacer.tick().await;
        let token = tokens[buyer];
        let started = Instant::now();
        let answer = client.pay_by_card(token, order, &config.stripe_api).await?;
        pay_latencies.push(started.elapsed());
        if answer.status == StatusCode::OK && answer.str_field("status") == Some("paid") {
            paid += 1;
        } else if answer.error_code() == Some("order_expired")
            || answer.str_field("status") == Some("expired")
        {
            // Paid too late (a short window, a slow surge): the unit lapses back, which
            // the audit after expiry counts like any unpaid one.
            lapsed_before_payment += 1;
        } else {
            return Err(LoadError::Refused {
                what: "paying an order",
                status: answer.status,
                body: answer.body,
            });
        }
    }

    let stats_final = if config.await_expiry {
        say("waiting for unpaid units to lapse back");
        let deadline = surge_ended
            + Duration::from_secs(u64::from(config.payment_timeout_secs))
            + run.expiry_grace;
        wait_for_expiry(client, &people.admin, &config.sale_id, deadline).await?
    } else {
        stats(client, &people.admin, &config.sale_id).await?
    };

    let mut attempts_by_buyer = BTreeMap::new();
    for attempt in 0..config.attempts {
        let (buyer, _) = &people.buyers[attempt % people.buyers.len().max(1)];
        *attempts_by_buyer.entry(buyer.clone()).or_default() += 1;
    }
    let outcomes = report::outcome_kinds(&surge);
    let settled = ["reserved", "sold_out", "limit_reached"];
    let unresolved = outcomes
        .iter()
        .filter(|(kind, _)| !settled.contains(&kind.as_str()))
        .map(|(_, count)| count)
        .sum();
    let checks = audit::audit(&AuditInput {
        stock: config.stock,
        per_user_limit: config.per_user_limit,
        attempts_by_buyer,
        reserved: &surge.reserved,
        unresolved,
        stats_after_surge: &stats_after_surge,
        after_expiry: config.await_expiry.then_some(AfterExpiry {
            stats: &stats_final,
            paid,
        }),
    });
    let grab_requests: Vec<Duration> = surge.grab_answers.iter().map(|a| a.latency).collect();
    Ok(LoadReport {
        config: config.clone(),
        answers: report::answer_kinds(&surge.grab_answers),
        outcomes,
        reserved: surge.reserved_count(),
        buyers_with_orders: surge.reserved.len(),
        paid,
        lapsed_before_payment,
        routes: report::Routes {
            token: Percentiles::of(&surge.token_latencies),
            grab: Percentiles::of(&grab_requests),
            grab_attempt: Percentiles::of(&surge.latencies),
            pay: Percentiles::of(&pay_latencies),
        },
        throughput: report::throughput(&surge),
        timeline: report::timeline(&surge.grab_answers),
        stats_after_surge,
        stats_final,
        audit_passed: checks.iter().all(|check| check.passed),
        audit: checks,
        challenge: report::ChallengeCost::of(&surge.solves),
        grab_latencies: grab_requests,
    })
}

/// `ratio` of `n`, rounded to the nearest whole order.
fn share(n: usize, ratio: f64) -> usize {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let wanted = (n as f64 * ratio.clamp(0.0, 1.0)).round() as usize;
    wanted.min(n)
}

async fn create_sale(client: &ApiClient, admin: &str, config: &RunConfig) -> Result<(), LoadError> {
    let now = Utc::now();
    let mut sale = json!({
        "sale_id": config.sale_id,
        "name": format!("load test {}", config.sale_id),
        "price": crate::client::sale_price(),
        "stock": config.stock,
        "shards": config.shards,
        "per_user_limit": config.per_user_limit,
        "payment_timeout_secs": config.payment_timeout_secs,
        "starts_at": now - chrono::Duration::seconds(1),
        "ends_at": now + chrono::Duration::hours(1),
    });
    if let Some(work) = config.challenge_work {
        sale["challenge_work"] = json!(work);
    }
    // A busy answer (503) may still have committed: after one, a 409 `sale_exists`
    // on the retry is that sale.
    let mut answered_busy = false;
    for retry in 0..20 {
        let created = client.create_sale(admin, &sale).await?;
        match created.status {
            StatusCode::CREATED => return Ok(()),
            StatusCode::CONFLICT
                if answered_busy && created.error_code() == Some("sale_exists") =>
            {
                return Ok(());
            }
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                answered_busy |= created.status == StatusCode::SERVICE_UNAVAILABLE;
                tokio::time::sleep(surge::backoff(retry)).await;
            }
            status => {
                return Err(LoadError::Refused {
                    what: "creating the sale",
                    status,
                    body: created.body,
                });
            }
        }
    }
    Err(LoadError::TimedOut(
        "creating the sale stayed busy after 20 tries".to_owned(),
    ))
}

async fn stats(client: &ApiClient, admin: &str, sale_id: &str) -> Result<Value, LoadError> {
    let answer = client.stats(admin, sale_id).await?;
    if answer.status == StatusCode::OK {
        Ok(answer.body)
    } else {
        Err(LoadError::Refused {
            what: "the sale's stats",
            status: answer.status,
            body: answer.body,
        })
    }
}

/// Polls the stats until nothing is held any more (every unpaid unit lapsed back).
async fn wait_for_expiry(
    client: &ApiClient,
    admin: &str,
    sale_id: &str,
    deadline: Instant,
) -> Result<Value, LoadError> {
    loop {
        let current = stats(client, admin, sale_id).await?;
        let held = current.get("reserved").and_then(Value::as_u64).unwrap_or(0);
        if held == 0 {
            return Ok(current);
        }
        if Instant::now() >= deadline {
            return Err(LoadError::TimedOut(format!(
                "unpaid units were still held at the deadline: {current}"
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Where a report's files go: the JSON itself and two PNGs beside it.
#[derive(Debug, Clone)]
pub struct Outputs {
    pub report: PathBuf,
    pub latency_png: PathBuf,
    pub timeline_png: PathBuf,
}

impl Outputs {
    /// `dir/report.json` gives `dir/report-latency.png` and `dir/report-timeline.png`.
    pub fn beside(report: &Path) -> Self {
        let stem = report.file_stem().map_or_else(
            || "report".into(),
            |stem| stem.to_string_lossy().into_owned(),
        );
        let dir = report.parent().unwrap_or_else(|| Path::new(""));
        Self {
            report: report.to_owned(),
            latency_png: dir.join(format!("{stem}-latency.png")),
            timeline_png: dir.join(format!("{stem}-timeline.png")),
        }
    }

    pub fn write(&self, report: &LoadReport) -> Result<(), LoadError> {
        let write_error = |path: &Path| {
            let path = path.to_owned();
            move |source| LoadError::Write { path, source }
        };
        if let Some(dir) = self
            .report
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(write_error(dir))?;
        }
        let json = serde_json::to_vec_pretty(report).expect("a report serializes");
        std::fs::write(&self.report, json).map_err(write_error(&self.report))?;
        let grab_requests = report.routes.grab.count;
        plot::latency_histogram(
            &self.latency_png,
            &format!(
                "grab route latency, {grab_requests} requests (p50 {:.1} ms, p99 {:.1} ms)",
                report.routes.grab.p50_ms, report.routes.grab.p99_ms
            ),
            &report.grab_latencies,
        )?;
        plot::timeline(
            &self.timeline_png,
            &format!(
                "grab answers per second: sale {} (stock {}, {} buyers)",
                report.config.sale_id, report.config.stock, report.config.buyers
            ),
            &report.timeline,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_payments_ask_stripe_for_at_most_half_its_test_mode_write_limit() {
        let payments_per_sec = 1.0 / payment_spacing().as_secs_f64();
        let writes_per_sec = payments_per_sec * f64::from(STRIPE_WRITES_PER_PAYMENT);
        assert!(
            writes_per_sec <= f64::from(STRIPE_TEST_MODE_WRITES_PER_SEC) / 2.0 + 1e-9,
            "{writes_per_sec} writes a second"
        );
        assert_eq!(payment_spacing(), Duration::from_millis(240));
    }
}
