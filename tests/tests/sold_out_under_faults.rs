//! Sold out only when the stock says so, under combined faults (issue 52): one surge per
//! reserve path (`adaptive`, `take_then_hold`, `transaction`) on a local stack whose
//! DynamoDB calls go through the fault proxy, which plays DynamoDB's transaction
//! conflicts (15 ms commit time) and, at the same time, a seeded random fault mix whose
//! rates each surge draws from its seed: 5 to 8 % each of a 500 before the request
//! reaches the table, a 500 after the table applied it, a throttle, a connection reset
//! before it, and a connection dropped after the table applied it; 10 to 15 % a delay
//! of 100 to 400 ms. (A surge makes as few as 170 DynamoDB requests, the gate answering
//! the rest: at 5 % a kind goes uninjected in one surge in 6,000, and check 4 fails.)
//!
//! Each surge: a sale of 30 units on 4 shards with a 120 s payment window; 150 buyers
//! fetch their grab paths, then each sends its grab twice at once (a double click: the
//! same path, both concurrently), each send retrying 429, 500 and 503 with the same
//! request (marked `X-Retry-Attempt`, as the sale page marks it) after the
//! `Retry-After` it was given (at most 2 s), until a 202 or a 4xx. Right after the last
//! answer, the truth is read straight from DynamoDB Local (the shards, the takes, the
//! holds) and the stats through the admin API, and the surge asserts:
//! 1. a buyer told `sold_out` means every shard is empty;
//! 2. no take on a shard lacks a hold behind it (the reconciler's take grace is 600 s
//!    here, so it cannot have hidden one);
//! 3. every 202 names an open hold of its buyer, and no buyer holds two;
//! 4. every kind of fault of the mix was really injected;
//! 5. the history checks the simulation runs (`flashsale_domain::testing::history`),
//!    on the same answers and the table read through the same ports: never oversold,
//!    every unit accounted for, no buyer over the limit, every 202 a hold of its buyer,
//!    and no hold that no grab answered 202 for unless its buyer gave up in doubt.
//!
//! Every surge prints one row (path, seed, answers, what was left, the faults); the
//! surges all run before the assertions, and each path ends with a total row.
//!
//! `FLASHSALE_CHAOS_SURGES` (default 1) sets the surges per path (`make chaos` runs 20);
//! the mix's seed is drawn from the clock per run and printed, and
//! `FLASHSALE_CHAOS_SEED` fixes it (surge `i` of a run plays seed + `i`). A seed fixes
//! the sequence of the mix's draws, not which request gets which: that is the order the
//! requests reach the proxy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_domain::OrderId;
use flashsale_domain::ports::OrderBook;
use flashsale_domain::testing::history;
use flashsale_e2e::Harness;
use flashsale_emulators::proxy::{Counts, FaultMix, Proxy};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

const STOCK: u32 = 30;
const SHARDS: u16 = 4;
/// Longer than any surge: a surge under every fault of the mix, beside a busy machine,
/// took 44 s, and holds that lapse mid-surge hand their units on through the release
/// (two writes, a take briefly without its hold), which checks 2 and 3 would then read
/// as broken.
const WINDOW_SECS: u32 = 120;
const BUYERS: usize = 150;
/// Buyers fetching their grab paths at once, before the surge.
const PREPARATION_CONCURRENCY: usize = 32;
/// The conflict mode's commit time, as in the drills.
const COMMIT_TIME: Duration = Duration::from_millis(15);
/// The longest wait a `Retry-After` gets.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(2);
/// How long one send may keep being answered 429/500/503 before the buyer gives up
/// (its last answer is then what it was told). Only a bound on a failure.
const PATIENCE: Duration = Duration::from_secs(120);

/// The gateway's throttles out of the surge's way (the surge is about what reaches
/// the grab), and the reconciler's take grace far beyond a surge: a take with no hold
/// stays where it is until it is looked at.
const PARAMETERS: [(&str, &str); 5] = [
    ("GrabThrottleRateLimit", "100000"),
    ("GrabThrottleBurstLimit", "100000"),
    ("TokenThrottleRateLimit", "100000"),
    ("TokenThrottleBurstLimit", "100000"),
    ("ReconcileTakeGraceSecs", "600"),
];

/// The fault kinds of the mix, as the proxy counts them.
const MIX_KINDS: [&str; 6] = [
    "server_error",
    "commit_then_server_error",
    "throttle",
    "connection_reset",
    "commit_then_drop",
    "delay",
];

/// The surge's mix: every kind at once, each at a rate drawn from the seed.
fn mix(seed: u64) -> FaultMix {
    use rand::{Rng as _, SeedableRng as _};
    let mut rates = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rate =
        |percent: std::ops::RangeInclusive<u32>| f64::from(rates.random_range(percent)) / 100.0;
    FaultMix {
        server_error: rate(5..=8),
        commit_then_server_error: rate(5..=8),
        throttle: rate(5..=8),
        connection_reset: rate(5..=8),
        commit_then_drop: rate(5..=8),
        delay: rate(10..=15),
        delay_ms: 100..=400,
        ..FaultMix::seeded(seed)
    }
}

fn surges_per_path() -> usize {
    std::env::var("FLASHSALE_CHAOS_SURGES")
        .ok()
        .map(|raw| {
            raw.trim()
                .parse()
                .expect("FLASHSALE_CHAOS_SURGES is a number")
        })
        .unwrap_or(1)
}

/// The run's seed: `FLASHSALE_CHAOS_SEED`, else the clock.
fn base_seed() -> u64 {
    match std::env::var("FLASHSALE_CHAOS_SEED") {
        Ok(raw) => raw.trim().parse().expect("FLASHSALE_CHAOS_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos() as u64)
            .unwrap_or(52),
    }
}

/// What one send was told in the end.
#[derive(Debug, Clone)]
struct Told {
    status: StatusCode,
    code: Option<String>,
    order_id: Option<String>,
    /// Since the surge started.
    at: Duration,
    /// Resends after 429/500/503 or a lost connection.
    retries: u32,
}

impl Told {
    fn label(&self) -> String {
        match &self.code {
            Some(code) => format!("{} {code}", self.status.as_u16()),
            None => self.status.as_u16().to_string(),
        }
    }

    fn is_sold_out(&self) -> bool {
        self.status == StatusCode::CONFLICT && self.code.as_deref() == Some("sold_out")
    }

    /// The answer as the history checks read it: a failure the buyer stopped retrying
    /// leaves them in doubt.
    fn as_history(&self) -> history::Told {
        match self.status {
            StatusCode::ACCEPTED => match self.order_id.as_deref().map(OrderId::parse) {
                Some(Ok(order_id)) => history::Told::Held(order_id),
                _ => history::Told::Refused("202 without an order id".to_owned()),
            },
            _ if self.is_sold_out() => history::Told::SoldOut,
            status if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS => {
                history::Told::Refused(self.label())
            }
            _ => history::Told::InDoubt,
        }
    }
}

/// Sends the grab on `path` until it is answered neither 429, 500 nor 503 (nor lost),
/// as the sale page does: the same request again, marked as a retry, after the
/// `Retry-After` it was given (capped), or a jittered backoff without one.
async fn send_until_told(
    http: &reqwest::Client,
    base_url: &str,
    token: &str,
    path: &str,
    started: Instant,
) -> Told {
    let first = Instant::now();
    let mut retries = 0_u32;
    loop {
        let mut request = http.post(format!("{base_url}{path}")).bearer_auth(token);
        if retries > 0 {
            request = request.header(flashsale_load::client::RETRY_ATTEMPT_HEADER, retries);
        }
        let (status, retry_after, body) = match request.send().await {
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.trim().parse::<f64>().ok())
                    .map(|secs| Duration::from_secs_f64(secs.max(0.0)));
                let body: Value = response.json().await.unwrap_or(Value::Null);
                (Some(status), retry_after, body)
            }
            Err(_) => (None, None, Value::Null),
        };
        let again = status.is_none_or(|status| {
            matches!(
                status,
                StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::INTERNAL_SERVER_ERROR
                    | StatusCode::SERVICE_UNAVAILABLE
            )
        });
        if !again || first.elapsed() > PATIENCE {
            let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
            return Told {
                status: status.unwrap_or(StatusCode::BAD_GATEWAY),
                code: field("error"),
                order_id: field("order_id"),
                at: started.elapsed(),
                retries,
            };
        }
        let wait = match retry_after {
            Some(asked) => asked.min(RETRY_AFTER_CAP),
            None => flashsale_load::surge::backoff(retries),
        };
        tokio::time::sleep(wait).await;
        retries += 1;
    }
}

/// One surge, measured.
struct Surge {
    path: &'static str,
    seed: u64,
    /// Answers by `status code`, both sends of every buyer.
    answers: BTreeMap<String, usize>,
    /// Distinct orders told 202.
    sold: usize,
    sold_out_told: usize,
    unavailable_told: usize,
    /// Buyers whose two clicks were told different things (a 202 and a 409, say).
    split_clicks: usize,
    /// `available` of each shard, read straight from the table.
    shards: Vec<i64>,
    /// Takes with no hold behind them, read straight from the table, right after the
    /// last answer, and again a few seconds later.
    takes_without_hold: usize,
    takes_without_hold_later: usize,
    stats: Value,
    faults: BTreeMap<String, u64>,
    conflicts: u64,
    took: Duration,
    /// What the surge broke of the four checks, in words.
    violations: Vec<String>,
}

impl Surge {
    fn available(&self) -> i64 {
        self.shards.iter().sum()
    }

    /// A buyer was told sold out while a unit was still unsold on a shard (by the time
    /// the answers were in; a unit back from a lapsed hold aside) or taken with no hold.
    fn undersold(&self) -> bool {
        let lapsed = self.stats["expired"].as_i64().unwrap_or(0);
        self.sold_out_told > 0 && (self.available() > lapsed || self.takes_without_hold > 0)
    }

    fn row(&self) -> String {
        let faults: Vec<String> = MIX_KINDS
            .iter()
            .map(|kind| format!("{kind}={}", self.faults.get(*kind).copied().unwrap_or(0)))
            .collect();
        format!(
            "| {} | {} | {} | {} | {} | {} | {} {:?} | {} (after 5 s: {}) | {}, conflicts={} | {:.1} s | {} |",
            self.path,
            self.seed,
            self.answers.get("202").copied().unwrap_or(0),
            self.sold_out_told,
            self.unavailable_told,
            self.split_clicks,
            self.available(),
            self.shards,
            self.takes_without_hold,
            self.takes_without_hold_later,
            faults.join(" "),
            self.conflicts,
            self.took.as_secs_f64(),
            if self.violations.is_empty() {
                "ok".to_owned()
            } else {
                self.violations.join("; ")
            },
        )
    }
}

const HEADER: &str = "| path | seed | 202s | 409 sold_out | 503s | split clicks | available [by shard] | takes without hold | faults injected | surge took | checks |\n|---|---|---|---|---|---|---|---|---|---|---|";

async fn surge(harness: &Harness, proxy: &Proxy, path: &'static str, n: usize, seed: u64) -> Surge {
    let sale_id = format!("chaos-{path}-{n}");
    harness
        .active_sale_with(
            &sale_id,
            STOCK,
            SHARDS,
            WINDOW_SECS,
            json!({ "reserve": path }),
        )
        .await;
    // Every buyer's grab path first, then every grab at once: a surge.
    let buyers: Vec<(String, String, String)> = futures::stream::iter(0..BUYERS)
        .map(|b| {
            let sale_id = &sale_id;
            async move {
                let user = format!("{sale_id}-b{b}");
                let token = harness.user(&user);
                let pass = harness
                    .api
                    .grab_pass_retrying(&token, sale_id)
                    .await
                    .expect("the token route answers");
                assert_eq!(pass.status, StatusCode::OK, "{}", pass.body);
                let grab_path = pass.str_field("grab_path").expect("a grab path").to_owned();
                (user, token, grab_path)
            }
        })
        .buffer_unordered(PREPARATION_CONCURRENCY)
        .collect()
        .await;

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .expect("a client");
    let base_url = harness.stack.api_url.trim_end_matches('/').to_owned();
    let before = proxy.counts();
    proxy
        .set_fault_mix(Some(mix(seed)))
        .expect("the mix is valid");
    let started = Instant::now();
    let told: Vec<(String, [Told; 2])> =
        futures::future::join_all(buyers.iter().map(|(user, token, grab_path)| {
            let (http, base_url) = (&http, &base_url);
            async move {
                let click = || send_until_told(http, base_url, token, grab_path, started);
                let (first, second) = tokio::join!(click(), click());
                (user.clone(), [first, second])
            }
        }))
        .await;
    let took = started.elapsed();

    // The truth, right after the last answer: straight from DynamoDB Local.
    let shards = harness.shard_availability(&sale_id, SHARDS).await;
    let stray = harness.stray_takes(&sale_id).await;
    let (store, sale) = harness.store_and_sale(&sale_id).await;
    let holds = store.open_holds(&sale).await.expect("the holds read");
    let ledger = history::Ledger::read(&store, &sale)
        .await
        .expect("the orders, shards and takes read");
    let faults_then = proxy.counts().since(&before);
    proxy.set_fault_mix(None).expect("no mix");
    let stats = harness.stats(&sale_id).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stray_later = harness.stray_takes(&sale_id).await;

    let all: Vec<&Told> = told.iter().flat_map(|(_, sends)| sends.iter()).collect();
    let answers = all.iter().fold(BTreeMap::new(), |mut tally, t| {
        *tally.entry(t.label()).or_insert(0) += 1;
        tally
    });
    let sold_orders: BTreeSet<&str> = all
        .iter()
        .filter(|t| t.status == StatusCode::ACCEPTED)
        .filter_map(|t| t.order_id.as_deref())
        .collect();
    let sold_out_told = all.iter().filter(|t| t.is_sold_out()).count();
    let unavailable_told = all
        .iter()
        .filter(|t| t.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    let split_clicks = told
        .iter()
        .filter(|(_, [first, second])| first.label() != second.label())
        .count();

    let mut violations = Vec::new();
    let available: i64 = shards.iter().sum();
    // 1. Sold out only when the stock says so. A unit back from a hold that lapsed
    // (its window is 120 s; a surge that long would see some) is not one the crowd was
    // refused: those are allowed for.
    let lapsed = stats["expired"].as_i64().unwrap_or(0);
    if sold_out_told > 0 && available > lapsed {
        let first_sold_out = all
            .iter()
            .filter(|t| t.is_sold_out())
            .map(|t| t.at)
            .min()
            .unwrap_or_default();
        violations.push(format!(
            "(1) {sold_out_told} answers sold_out (the first at {:.1} s) with {available} unit(s) on the shards {shards:?} ({lapsed} lapsed)",
            first_sold_out.as_secs_f64()
        ));
    }
    // 2. No take without its hold.
    if !stray.is_empty() {
        let of_whom: Vec<String> = stray
            .iter()
            .map(|take| {
                let user = take.user_id.to_string();
                let buyer_told = told
                    .iter()
                    .find(|(u, _)| *u == user)
                    .map(|(_, sends)| {
                        sends
                            .iter()
                            .map(|t| format!("{} after {} retries", t.label(), t.retries))
                            .collect::<Vec<_>>()
                            .join(" / ")
                    })
                    .unwrap_or_else(|| "not a buyer of the surge".to_owned());
                format!(
                    "order {} on shard {} taken at {} (its buyer was told {buyer_told})",
                    take.order_id, take.shard, take.taken_at
                )
            })
            .collect();
        violations.push(format!(
            "(2) {} take(s) without a hold: {}",
            stray.len(),
            of_whom.join("; ")
        ));
    }
    // 3. Every 202 is an open hold of its buyer's, and nobody holds two.
    let mut holds_per_buyer: BTreeMap<String, usize> = BTreeMap::new();
    for hold in &holds {
        *holds_per_buyer.entry(hold.user_id.to_string()).or_default() += 1;
    }
    for (user, sends) in &told {
        let orders: BTreeSet<&str> = sends
            .iter()
            .filter(|t| t.status == StatusCode::ACCEPTED)
            .filter_map(|t| t.order_id.as_deref())
            .collect();
        if orders.len() > 1 {
            violations.push(format!("(3) {user} was told two orders: {orders:?}"));
        }
        for order in orders {
            let held = holds.iter().any(|hold| {
                hold.order_id.to_string() == order && hold.user_id.to_string() == *user
            });
            if !held {
                violations.push(format!("(3) {user}'s order {order} (202) is not held"));
            }
        }
    }
    for (user, count) in &holds_per_buyer {
        if *count > 1 {
            violations.push(format!("(3) {user} holds {count} orders"));
        }
    }
    // 5. The simulation's history checks, on this history.
    let answered: Vec<(flashsale_domain::UserId, history::Told)> = told
        .iter()
        .flat_map(|(user, sends)| {
            let user = flashsale_domain::UserId::parse(user.as_str()).expect("a user id");
            sends.iter().map(move |t| (user.clone(), t.as_history()))
        })
        .collect();
    violations.extend(
        history::check(&sale, &answered, &ledger, history::Moment::AfterTheAnswers)
            .into_iter()
            .map(|found| format!("(5) {found}")),
    );
    // 4. The faults were there.
    let faults = faults_then.faults_by_kind();
    for kind in MIX_KINDS {
        if faults.get(kind).copied().unwrap_or(0) == 0 {
            violations.push(format!("(4) no {kind} was injected: {faults:?}"));
        }
    }
    let conflicts = flashsale_e2e::conflicts_by_operation(&faults_then)
        .values()
        .sum();
    eprintln!(
        "chaos {sale_id} (seed {seed}): answers {answers:?}; stats {stats}; DynamoDB requests {}",
        requests_line(&faults_then)
    );
    Surge {
        path,
        seed,
        answers,
        sold: sold_orders.len(),
        sold_out_told,
        unavailable_told,
        split_clicks,
        shards,
        takes_without_hold: stray.len(),
        takes_without_hold_later: stray_later.len(),
        stats,
        faults,
        conflicts,
        took,
        violations,
    }
}

/// Requests by operation and outcome, on one line.
fn requests_line(counts: &Counts) -> String {
    counts
        .operations
        .iter()
        .map(|(name, op)| {
            format!(
                "{}: {} {:?}",
                name.trim_start_matches("DynamoDB_20120810."),
                op.total,
                op.by_outcome
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every surge of one reserve path on one stack, then its checks.
async fn surges_on(path: &'static str) {
    let surges = surges_per_path();
    let base = base_seed();
    eprintln!(
        "chaos {path}: {surges} surge(s), seed {base} (FLASHSALE_CHAOS_SEED={base} replays the run's draws)"
    );
    let harness =
        Harness::start_contended(&format!("chaos-{path}"), &PARAMETERS, COMMIT_TIME).await;
    let proxy = Arc::clone(
        harness
            .dynamodb_proxy
            .as_ref()
            .expect("a contended stack has its DynamoDB proxy"),
    );
    let mut measured = Vec::new();
    println!("{HEADER}");
    for n in 0..surges {
        let seed = base.wrapping_add(n as u64);
        let one = surge(&harness, &proxy, path, n, seed).await;
        println!("{}", one.row());
        measured.push(one);
    }
    let undersold = measured.iter().filter(|s| s.undersold()).count();
    let takes: usize = measured.iter().map(|s| s.takes_without_hold).sum();
    let sold: usize = measured.iter().map(|s| s.sold).sum();
    println!(
        "total {path}: {surges} surge(s), {undersold} with an undersell (told sold_out with a unit unsold or taken without a hold), {takes} take(s) without a hold, {sold} of {} units sold",
        surges * STOCK as usize
    );
    let failed: Vec<String> = measured
        .iter()
        .filter(|s| !s.violations.is_empty())
        .map(|s| {
            format!(
                "{} seed {}: {} (stats {})",
                s.path,
                s.seed,
                s.violations.join("; "),
                s.stats
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {surges} surge(s) on {path} broke a check:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_says_sold_out_only_when_the_stock_is_gone_under_faults() {
    surges_on("adaptive").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn take_then_hold_says_sold_out_only_when_the_stock_is_gone_under_faults() {
    surges_on("take_then_hold").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_says_sold_out_only_when_the_stock_is_gone_under_faults() {
    surges_on("transaction").await;
}
