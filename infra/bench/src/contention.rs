//! Issue 14 §3: the grab under contention, measured under the proxy's conflict mode.
//!
//! DynamoDB Local runs one transaction at a time and never answers `TransactionConflict`;
//! AWS does. With [`ConflictMode`] on, the DynamoDB proxy holds a `TransactWriteItems`'
//! items for its round trip plus a commit time and cancels any other transaction that
//! touches them, so the local stack meets the contention AWS would answer. For each
//! commit time, in the same run, on the same proxy and table:
//!
//! 1. **The surge through the gateway**: a sale on a few shards, every buyer fetches a
//!    grab path, then all grab at a fixed concurrency, retrying 429/503 on the same path
//!    with `X-Retry-Attempt` and jittered backoff honouring `Retry-After`, as the sale
//!    page does.
//! 2. **The textbook client**: a second, identical sale, bought by raw buyers reserving
//!    in one transaction on the shard and the buyer's item
//!    (`DynamoStore::reserve_in_one_transaction`, the design before issue 14) through the
//!    proxy, walking the buyer's shards on `ShardEmpty` and retrying `Contended` on the
//!    same shard with full jitter, so the gateway's sell-out can be set beside it.
//!
//! and, for its own commit times, **the per-shard curve**: one shard, a fixed number of
//! raw reservers with the textbook retry, reservations/s and conflicts per reservation,
//! with the transaction round trip the capacity model needs; once reserving in one
//! transaction, once with the grab's own plain-write reserve (`DynamoStore::reserve`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use chrono::Utc;
use flashsale_adapters::{DynamoStore, ReserveMode};
use flashsale_domain::ports::{ReserveRefusal, SaleCatalog, StockLedger};
use flashsale_domain::{
    OrderId, Reservation, ReservePath, Sale, SaleId, StoreError, UserId, ValidationError,
};
use flashsale_load::client::{ClientError, expect_status};
use flashsale_load::surge::retry_delay;
use flashsale_local::metrics::Summary;
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;

use crate::proxy::{ConflictMode, Counts, Proxy};
use crate::quiet::{Quiet, Settled};
use crate::scenarios::{RETRY_HEADER, ScenarioError, Session};
use crate::stack::BenchStack;

#[derive(Debug, thiserror::Error)]
pub enum ContentionError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the textbook client's store")]
    Store(#[from] StoreError),
    #[error("a name the bench made is not a valid id")]
    InvalidId(#[from] ValidationError),
    #[error("listing DynamoDB Local's tables")]
    ListTables(#[source] Box<aws_sdk_dynamodb::Error>),
    #[error("no table of the stack {stack} among {tables:?}")]
    NoTable { stack: String, tables: Vec<String> },
    #[error("the sale {0} was created but is not in the table")]
    SaleMissing(String),
}

/// The sizes of one run of the scenario.
#[derive(Debug, Clone, Copy)]
pub struct ContentionSizes {
    /// Commit times of the surge and the textbook client, side by side.
    pub commit_times_ms: &'static [u64],
    /// Gateway surges run, unreported, before the measured ones (one textbook run too).
    pub warm_up_surges: usize,
    /// Rounds per commit time, each a pair of runs (a surge and a textbook run) in
    /// either order: one pair's ratio ranged from 0.5 to 1.1 from one to the next
    /// (measured), so the ratio is pooled over every pair of the commit time.
    pub rounds: usize,
    pub stock: u32,
    pub shards: u16,
    pub buyers: usize,
    /// Buyers in flight at once, in the surge and in the textbook client.
    pub concurrency: usize,
    /// Requests per buyer on its one grab path, as the sale page (`MAX_GRAB_ATTEMPTS`).
    pub grab_attempts: u32,
    pub curve_commit_times_ms: &'static [u64],
    pub curve_stock: u32,
    pub curve_reservers: usize,
    pub curve_reservations: usize,
    /// How long the order consumer gets to open every unit the surge sold.
    pub drain_timeout: Duration,
    /// When a timed run may start; `None`: at once (the smoke's figures are no record).
    pub quiet: Option<Quiet>,
}

/// The textbook answer to `Contended`: try the same shard again after a pause drawn
/// uniformly in `[0, min(cap, base · 2^(n-1))]`, `attempts` times in all.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TextbookRetry {
    pub base: Duration,
    pub cap: Duration,
    pub attempts: u32,
}

pub const TEXTBOOK_RETRY: TextbookRetry = TextbookRetry {
    base: Duration::from_millis(5),
    cap: Duration::from_millis(200),
    attempts: 10,
};

impl TextbookRetry {
    /// The pause before retry `retry` (1 for the first).
    fn pause(&self, retry: u32) -> Duration {
        let factor = 1_u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let ceiling = self.base.saturating_mul(factor).min(self.cap);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::random_range(0..=micros))
    }
}

/// The payment window of every sale here: longer than any run, so no release timer
/// fires (and writes) while a later window is counting.
const PAYMENT_WINDOW_SECS: u32 = 3600;

const DYNAMODB: &str = "DynamoDB_20120810.";
/// The operations counted as DynamoDB write requests.
pub const WRITE_OPERATIONS: [&str; 5] = [
    "TransactWriteItems",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "BatchWriteItem",
];
const TRANSACT_WRITE: &str = "DynamoDB_20120810.TransactWriteItems";

/// DynamoDB write requests in `counts`, refused ones included: a cancelled transaction
/// is a request the table had to answer.
pub fn writes(counts: &Counts) -> u64 {
    WRITE_OPERATIONS
        .iter()
        .map(|operation| counts.of(&format!("{DYNAMODB}{operation}")))
        .sum()
}

/// `TransactWriteItems` seen, and how many the conflict mode cancelled.
pub fn transactions(counts: &Counts) -> (u64, u64) {
    counts
        .operations
        .get(TRANSACT_WRITE)
        .map_or((0, 0), |op| (op.total, op.conflicts))
}

fn ratio(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

/// Everything the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionReport {
    pub warm_up_surges: usize,
    pub rounds: usize,
    /// When a timed run may start.
    pub quiet: Option<Quiet>,
    pub stock: u32,
    pub shards: u16,
    pub buyers: usize,
    pub concurrency: usize,
    pub grab_attempts: u32,
    pub textbook_retry: TextbookRetry,
    pub runs: Vec<ContentionRun>,
    pub curve_stock: u32,
    pub curve_reservers: usize,
    pub curve_reservations: usize,
    pub curve: Vec<ShardPoint>,
}

/// Which client of a pair ran first: whatever the warm-up leaves, each commit time runs
/// both orders, so neither client is always the one on a warmer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOrder {
    GatewayFirst,
    TextbookFirst,
}

impl RunOrder {
    pub fn label(self) -> &'static str {
        match self {
            Self::GatewayFirst => "gateway first",
            Self::TextbookFirst => "textbook first",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::GatewayFirst => "g",
            Self::TextbookFirst => "t",
        }
    }
}

/// How the gateway surge's sale reserves: a flash sale, whose surge at the start
/// instant is known, as docs/capacity.md tells operators to set it.
pub const FLASH_SALE_RESERVE: ReservePath = ReservePath::TakeThenHold;

impl ContentionReport {
    /// At `commit_time_ms`, the mean gateway sell-out over the mean textbook one, over
    /// every round in both orders; `None` unless every run there sold out.
    pub fn pooled_sell_out_ratio(&self, commit_time_ms: u64) -> Option<f64> {
        self.pooled_ratio_of(commit_time_ms, |run| &run.gateway)
    }

    /// [`Self::pooled_sell_out_ratio`] for the sale left adaptive.
    pub fn pooled_adaptive_sell_out_ratio(&self, commit_time_ms: u64) -> Option<f64> {
        self.pooled_ratio_of(commit_time_ms, |run| &run.gateway_adaptive)
    }

    fn pooled_ratio_of(
        &self,
        commit_time_ms: u64,
        surge: fn(&ContentionRun) -> &GatewaySurge,
    ) -> Option<f64> {
        let runs: Vec<&ContentionRun> = self
            .runs
            .iter()
            .filter(|r| r.commit_time_ms == commit_time_ms)
            .collect();
        let mut gateway = 0.0;
        let mut textbook = 0.0;
        for run in &runs {
            gateway += surge(run).sell_out?.as_secs_f64();
            textbook += run.textbook.target_reached_after?.as_secs_f64();
        }
        if runs.is_empty() {
            return None;
        }
        ratio(gateway, textbook)
    }
}

/// The surge and the textbook client at one commit time, in one order.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionRun {
    pub commit_time_ms: u64,
    /// Which round of this commit time (from 1); each round runs both orders.
    pub round: usize,
    pub order: RunOrder,
    /// The surge on a sale set as its operator sets a flash sale
    /// ([`FLASH_SALE_RESERVE`]), beside the textbook client in this run's order...
    pub gateway: GatewaySurge,
    /// ...and the same surge on a sale left at the default, adaptive, right after.
    pub gateway_adaptive: GatewaySurge,
    pub textbook: RawRun,
    /// The textbook client's buyers and retry, on a sale of the same size, reserving
    /// with the grab's reserve of issue 14 (always take then hold)...
    pub take_then_hold: RawRun,
    /// ...and with the grab's reserve as deployed (the transaction, take-then-hold on a
    /// shard for a while after a conflict there).
    pub adaptive: RawRun,
}

impl ContentionRun {
    /// "15 ms, gateway first, 1": the commit time, the order and the round.
    pub fn label(&self) -> String {
        format!(
            "{} ms, {}, {}",
            self.commit_time_ms,
            self.order.label(),
            self.round
        )
    }

    /// Gateway sell-out over the textbook client's; `None` unless both sold out.
    pub fn sell_out_ratio(&self) -> Option<f64> {
        let gateway = self.gateway.sell_out?.as_secs_f64();
        let textbook = self.textbook.target_reached_after?.as_secs_f64();
        ratio(gateway, textbook)
    }
}

/// The hand-over to the consumer, from the local stack's own metrics
/// (`GET /local/metrics`): the proxy sees every request but not who sent it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HandOver {
    /// `orders_opened` of the sale: release timers the consumer set (a redelivered
    /// record counts again). The consumer reads the hold and writes nothing to the table.
    pub orders_opened: u64,
    /// `transaction_conflicts_retried{operation="dynamodb.reserve"}`: the grab's reserves
    /// cancelled, as the grab itself counted them (a check on the proxy's count).
    pub reserve_conflicts: u64,
}

/// The surge through the gateway.
#[derive(Debug, Clone, Serialize)]
pub struct GatewaySurge {
    pub sale_id: String,
    pub buyers: usize,
    /// Units sold: 202 answers with distinct order ids.
    pub sold: usize,
    pub buyers_with_two_orders: usize,
    /// `available` in the stats once the consumer drained; `None` if they could not be read.
    pub left: Option<u64>,
    pub consistent: Option<bool>,
    pub final_stats: Value,
    /// Every answer of the grab route, retried ones included.
    pub answers: usize,
    pub unavailable: usize,
    pub throttled: usize,
    /// 5xx answers other than 503.
    pub other_5xx: usize,
    /// Requests that got no answer (sent again, as a 503 would be).
    pub no_answer: usize,
    /// Buyers whose last answer was `sold_out`.
    pub told_sold_out: usize,
    /// Each buyer's last answer.
    pub final_outcomes: BTreeMap<String, usize>,
    /// How the machine was when the grabs were released (see [`crate::quiet`]).
    pub settled: Settled,
    /// From the release of the grabs to the `stock`-th unit's 202.
    pub sell_out: Option<Duration>,
    /// From the release to the first, the quarter's, the half's, the three quarters'
    /// and the last unit's first 202: where the sell-out time goes.
    pub milestones: Vec<Duration>,
    /// The median and the 90th percentile of the round trips that were answered 202.
    pub reserved_round_trip: Vec<Duration>,
    /// From the release to the last buyer's last answer.
    pub surge: Duration,
    pub surge_dynamodb: Counts,
    /// From the release until the consumer had set every sold unit's timer.
    pub through_drain: Duration,
    pub drained: bool,
    pub through_drain_dynamodb: Counts,
    pub hand_over: Option<HandOver>,
}

impl GatewaySurge {
    pub fn unavailable_share(&self) -> f64 {
        ratio(self.unavailable as f64, self.answers as f64).unwrap_or(0.0)
    }

    /// Units taken from the shards (stock less `available`) for which no buyer was
    /// answered 202: their holders were told something else (the reconciler sends such
    /// a hold on to the consumer a minute later).
    pub fn taken_without_202(&self, stock: u32) -> Option<u64> {
        let taken = u64::from(stock).saturating_sub(self.left?);
        Some(taken.saturating_sub(self.sold as u64))
    }

    /// Buyers told `sold_out` although units were still there at the end.
    pub fn sold_out_while_left(&self) -> usize {
        match self.left {
            Some(left) if left > 0 => self.told_sold_out,
            _ => 0,
        }
    }

    /// Every DynamoDB write request from the release until the consumer drained, per
    /// unit sold.
    pub fn writes_per_unit(&self) -> Option<f64> {
        ratio(
            writes(&self.through_drain_dynamodb) as f64,
            self.sold as f64,
        )
    }
}

/// Raw buyers on the grab's store, with the textbook retry.
#[derive(Debug, Clone, Serialize)]
pub struct RawRun {
    pub sale_id: String,
    pub stock: u32,
    pub shards: u16,
    pub workers: usize,
    /// Units to reserve before no new buyer starts: the stock for the textbook client.
    pub target: usize,
    pub buyers_started: usize,
    pub reserved: usize,
    pub sold_out: usize,
    /// Buyers whose shard stayed contended for every attempt (a 503, for a grab).
    pub gave_up: usize,
    /// Buyers whose reserve failed otherwise.
    pub failed: usize,
    pub first_failure: Option<String>,
    /// How the machine was when the buyers started (see [`crate::quiet`]).
    pub settled: Settled,
    /// From the start to the `target`-th reservation.
    pub target_reached_after: Option<Duration>,
    /// As [`GatewaySurge::milestones`], from the start.
    pub milestones: Vec<Duration>,
    pub elapsed: Duration,
    /// Reserve calls, and how many answered `Contended`.
    pub attempts: u64,
    pub contended: u64,
    /// Mean client-side round trip of the reserves that committed (under the conflict
    /// mode it includes the commit time: the proxy answers after it).
    pub committed_round_trip: Option<Duration>,
    /// ... and of every reserve, conflicted ones (answered by the proxy) included.
    pub attempt_round_trip: Option<Duration>,
    pub dynamodb: Counts,
}

impl RawRun {
    /// Reservations per second until the target was reached.
    pub fn reservations_per_sec(&self) -> Option<f64> {
        let reached = self.target_reached_after?;
        ratio(self.target as f64, reached.as_secs_f64())
    }

    pub fn conflicts_per_reservation(&self) -> Option<f64> {
        ratio(self.contended as f64, self.reserved as f64)
    }

    /// DynamoDB write requests per reservation, refused and cancelled ones included.
    pub fn writes_per_reservation(&self) -> Option<f64> {
        ratio(writes(&self.dynamodb) as f64, self.reserved as f64)
    }
}

/// One point of the per-shard curve.
#[derive(Debug, Clone, Serialize)]
pub struct ShardPoint {
    pub commit_time_ms: u64,
    /// Reserving in one transaction on the shard and the buyer's item.
    pub run: RawRun,
    /// The same, always a plain take on the shard, then the hold (issue 14's reserve).
    pub plain: RawRun,
    /// The same, with the grab's reserve as deployed (the transaction, plain writes on
    /// the shard for a while after a conflict).
    pub adaptive: RawRun,
}

impl ShardPoint {
    /// One shard admits one transaction at a time, each holding it for about its round
    /// trip (the proxy answers a transaction only once its commit time has passed, so the
    /// client's round trip includes it): about the rate the measured round trip allows.
    pub fn bound_per_sec(&self) -> Option<f64> {
        let round_trip = self.run.committed_round_trip?.as_secs_f64();
        ratio(1.0, round_trip)
    }

    /// The committed round trip less the commit time: what the table (DynamoDB Local
    /// behind the proxy) and the client took.
    pub fn service_time(&self) -> Option<Duration> {
        let round_trip = self.run.committed_round_trip?;
        Some(round_trip.saturating_sub(Duration::from_millis(self.commit_time_ms)))
    }
}

/// The conflict mode, on for as long as this lives: an early return cannot leave the
/// later scenarios under it.
struct ConflictsOn<'a> {
    proxy: &'a Proxy,
}

impl<'a> ConflictsOn<'a> {
    fn new(proxy: &'a Proxy, commit_time_ms: u64) -> Self {
        proxy.set_conflict_mode(Some(ConflictMode::with_commit_time(Duration::from_millis(
            commit_time_ms,
        ))));
        Self { proxy }
    }
}

impl Drop for ConflictsOn<'_> {
    fn drop(&mut self) {
        self.proxy.set_conflict_mode(None);
    }
}

/// The raw client's view of the stack: the grab's store on the DynamoDB proxy.
pub(crate) struct RawTarget {
    store: Arc<DynamoStore>,
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl RawTarget {
    pub(crate) async fn new(stack: &BenchStack) -> Result<Self, ContentionError> {
        let sdk = |dynamodb: String| {
            flashsale_emulators::sdk_config_for(flashsale_emulators::LocalEndpoints {
                dynamodb,
                sqs: String::new(),
                moto: String::new(),
            })
        };
        // The table is found on DynamoDB Local itself, so the listing is not counted.
        let direct = aws_sdk_dynamodb::Client::new(&sdk(stack.dynamodb_endpoint.clone()).await);
        let listed = direct
            .list_tables()
            .send()
            .await
            .map_err(|error| ContentionError::ListTables(Box::new(error.into())))?;
        let prefix = format!("{}-", stack.stack_name);
        let tables = listed.table_names().to_vec();
        let mine: Vec<&String> = tables.iter().filter(|t| t.starts_with(&prefix)).collect();
        let [table] = mine.as_slice() else {
            return Err(ContentionError::NoTable {
                stack: stack.stack_name.clone(),
                tables,
            });
        };
        let counted = aws_sdk_dynamodb::Client::new(&sdk(stack.dynamodb.url()).await);
        Ok(Self {
            store: Arc::new(DynamoStore::new(counted.clone(), (*table).clone())),
            client: counted,
            table: (*table).clone(),
        })
    }

    /// A store for one raw run reserving as `reserve` says: a new one, so an adaptive
    /// run starts with no shard known hot, as a new container does.
    pub(crate) fn store_for(&self, reserve: RawReserve) -> Arc<DynamoStore> {
        let store = DynamoStore::new(self.client.clone(), self.table.clone());
        Arc::new(match reserve {
            RawReserve::OneTransaction | RawReserve::Adaptive => store,
            RawReserve::TakeThenHold => store.with_reserve_mode(ReserveMode::TakeThenHold),
        })
    }

    pub(crate) async fn sale(&self, sale_id: &str) -> Result<Sale, ContentionError> {
        self.store
            .find_sale(&SaleId::parse(sale_id)?)
            .await?
            .ok_or_else(|| ContentionError::SaleMissing(sale_id.to_owned()))
    }
}

/// Runs the whole scenario; the conflict mode is off again when it returns.
pub async fn contention(
    session: &Session,
    stack: &BenchStack,
    sizes: &ContentionSizes,
) -> Result<ContentionReport, ContentionError> {
    let started = Instant::now();
    let raw = RawTarget::new(stack).await?;
    // DynamoDB Local is a JVM: under its first seconds of load its hot paths are still
    // interpreted, and plain writes then time out at the SDK's 500 ms attempt timeout.
    // AWS's service has no such phase. One surge was not enough: the first measured one
    // after it sold out in 850 to 890 ms, the next in 530 to 620 (measured). So both
    // clients warm up first, unreported, and each commit time runs them in both orders.
    if let Some(&first) = sizes.commit_times_ms.first() {
        let warm = sizes.warm_up_surges;
        eprintln!("bench: 7. warming up: {warm} surges and one textbook run, not reported");
        let _conflicts = ConflictsOn::new(&stack.dynamodb, first);
        for surge in 0..sizes.warm_up_surges {
            gateway_surge(
                session,
                stack,
                sizes,
                &format!("warmup{surge}"),
                FLASH_SALE_RESERVE,
            )
            .await?;
        }
        textbook_run(session, &raw, stack, sizes, "warmup").await?;
    }
    let mut runs = Vec::new();
    let orders = [RunOrder::GatewayFirst, RunOrder::TextbookFirst];
    for &commit_time_ms in sizes.commit_times_ms {
        for (round, order) in (0..sizes.rounds.max(1)).flat_map(|round| orders.map(|o| (round, o)))
        {
            let conflicts = ConflictsOn::new(&stack.dynamodb, commit_time_ms);
            let tag = format!("{commit_time_ms}{}{round}", order.tag());
            let surge_name = format!("surge{tag}");
            eprintln!(
                "bench: 7. contention at {commit_time_ms} ms, {}, round {}: the surge through the gateway ({} buyers, {} units on {} shards) and the textbook client",
                order.label(),
                round + 1,
                sizes.buyers,
                sizes.stock,
                sizes.shards
            );
            let flash_sale =
                || gateway_surge(session, stack, sizes, &surge_name, FLASH_SALE_RESERVE);
            let (gateway, textbook) = match order {
                RunOrder::GatewayFirst => {
                    let gateway = flash_sale().await?;
                    let textbook = textbook_run(session, &raw, stack, sizes, &tag).await?;
                    (gateway, textbook)
                }
                RunOrder::TextbookFirst => {
                    let textbook = textbook_run(session, &raw, stack, sizes, &tag).await?;
                    let gateway = flash_sale().await?;
                    (gateway, textbook)
                }
            };
            let gateway_adaptive = gateway_surge(
                session,
                stack,
                sizes,
                &format!("surgeadaptive{tag}"),
                ReservePath::Adaptive,
            )
            .await?;
            let take_then_hold =
                same_client_run(session, &raw, stack, sizes, &tag, RawReserve::TakeThenHold)
                    .await?;
            let adaptive =
                same_client_run(session, &raw, stack, sizes, &tag, RawReserve::Adaptive).await?;
            drop(conflicts);
            runs.push(ContentionRun {
                commit_time_ms,
                round: round + 1,
                order,
                gateway,
                gateway_adaptive,
                textbook,
                take_then_hold,
                adaptive,
            });
        }
    }
    let mut curve = Vec::new();
    for &commit_time_ms in sizes.curve_commit_times_ms {
        eprintln!(
            "bench: 7. per-shard curve at {commit_time_ms} ms ({} reservers, {} reservations)",
            sizes.curve_reservers, sizes.curve_reservations
        );
        let run = shard_run(
            session,
            &raw,
            stack,
            sizes,
            commit_time_ms,
            RawReserve::OneTransaction,
        )
        .await?;
        let plain = shard_run(
            session,
            &raw,
            stack,
            sizes,
            commit_time_ms,
            RawReserve::TakeThenHold,
        )
        .await?;
        let adaptive = shard_run(
            session,
            &raw,
            stack,
            sizes,
            commit_time_ms,
            RawReserve::Adaptive,
        )
        .await?;
        for (how, run) in [
            ("in one transaction", &run),
            ("with plain writes", &plain),
            ("adaptive", &adaptive),
        ] {
            if let Some(round_trip) = run.committed_round_trip {
                eprintln!(
                    "bench: 7. one shard at {commit_time_ms} ms, {how}: {:.1} reservations/s, mean committed round trip {:.2} ms",
                    run.reservations_per_sec().unwrap_or(0.0),
                    round_trip.as_secs_f64() * 1e3
                );
            }
        }
        curve.push(ShardPoint {
            commit_time_ms,
            run,
            plain,
            adaptive,
        });
    }
    eprintln!(
        "bench: 7. contention measured in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(ContentionReport {
        warm_up_surges: sizes.warm_up_surges,
        rounds: sizes.rounds.max(1),
        quiet: sizes.quiet,
        stock: sizes.stock,
        shards: sizes.shards,
        buyers: sizes.buyers,
        concurrency: sizes.concurrency,
        grab_attempts: sizes.grab_attempts,
        textbook_retry: TEXTBOOK_RETRY,
        runs,
        curve_stock: sizes.curve_stock,
        curve_reservers: sizes.curve_reservers,
        curve_reservations: sizes.curve_reservations,
        curve,
    })
}

/// The textbook client on a new sale of the surge's size.
async fn textbook_run(
    session: &Session,
    raw: &RawTarget,
    stack: &BenchStack,
    sizes: &ContentionSizes,
    tag: &str,
) -> Result<RawRun, ContentionError> {
    same_client_run(session, raw, stack, sizes, tag, RawReserve::OneTransaction).await
}

/// The textbook client's buyers, on a new sale of the surge's size, reserving as
/// `reserve` says: the reserve's paths side by side, under the same client.
async fn same_client_run(
    session: &Session,
    raw: &RawTarget,
    stack: &BenchStack,
    sizes: &ContentionSizes,
    tag: &str,
    reserve: RawReserve,
) -> Result<RawRun, ContentionError> {
    let name = match reserve {
        RawReserve::OneTransaction => "textbook",
        RawReserve::TakeThenHold => "takethenhold",
        RawReserve::Adaptive => "adaptive",
    };
    let sale_id = session
        .create_sale_on_shards(
            &format!("{name}{tag}"),
            sizes.stock,
            PAYMENT_WINDOW_SECS,
            Some(sizes.shards),
            ReservePath::Adaptive,
        )
        .await?;
    let sale = raw.sale(&sale_id).await?;
    Ok(raw_run(
        raw,
        &stack.dynamodb,
        sale,
        RawPlan {
            workers: sizes.concurrency,
            max_buyers: sizes.buyers,
            target: sizes.stock as usize,
            tag: format!("{name}{tag}-{}", session.run),
            reserve,
            quiet: sizes.quiet,
        },
    )
    .await)
}

/// One answer of the grab route.
#[derive(Debug, Clone)]
struct GrabAnswer {
    /// Since the release of the grabs.
    at: Duration,
    /// The request's round trip.
    took: Duration,
    /// 0: no answer.
    status: u16,
    code: Option<String>,
    order_id: Option<String>,
}

impl GrabAnswer {
    fn outcome(&self) -> String {
        match (&self.code, self.status) {
            (_, 0) => "no answer".to_owned(),
            (Some(code), status) => format!("{status} {code}"),
            (None, status) => status.to_string(),
        }
    }
}

/// One buyer's grabs on its path, until an answer that retrying cannot change, or
/// `attempts` requests: a 429, a 503 or no answer is sent again after `Retry-After`
/// plus jitter, marked `X-Retry-Attempt: n`, as the sale page does.
async fn grab_until_answered(
    http: &reqwest::Client,
    url: String,
    token: &str,
    attempts: u32,
    released: Instant,
) -> Vec<GrabAnswer> {
    let mut answers = Vec::new();
    for retry in 0..attempts.max(1) {
        let mut request = http.post(&url).bearer_auth(token);
        if retry > 0 {
            request = request.header(RETRY_HEADER, retry.to_string());
        }
        let sent = Instant::now();
        let (status, retry_after, body) = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let body = response.json::<Value>().await.unwrap_or(Value::Null);
                (status, retry_after, body)
            }
            Err(_) => (0, None, Value::Null),
        };
        let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
        answers.push(GrabAnswer {
            at: released.elapsed(),
            took: sent.elapsed(),
            status,
            code: field("error"),
            order_id: field("order_id"),
        });
        if !matches!(status, 0 | 429 | 503) {
            break;
        }
        if retry + 1 < attempts {
            tokio::time::sleep(retry_delay(retry, retry_after)).await;
        }
    }
    answers
}

/// The functions' metrics as the local stack serves them.
async fn local_metrics(session: &Session) -> Option<Summary> {
    let url = format!("{}/local/metrics", session.api.base_url());
    let response = session.http.get(url).send().await.ok()?;
    response.json::<Summary>().await.ok()
}

/// The metrics once the consumer has set `opened` more timers of the sale than
/// `before` counted (nothing in the table says so: the consumer writes nothing there),
/// or after `within`; and whether it had.
async fn metrics_once_opened(
    session: &Session,
    before: &Summary,
    sale_id: &str,
    opened: u64,
    within: Duration,
) -> Option<(Summary, bool)> {
    let deadline = Instant::now() + within;
    let counted = |summary: &Summary| summary.counter("orders_opened", &[("sale_id", sale_id)]);
    loop {
        let summary = local_metrics(session).await?;
        if counted(&summary) - counted(before) >= opened as f64 {
            return Some((summary, true));
        }
        if Instant::now() > deadline {
            return Some((summary, false));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn hand_over(before: &Summary, after: &Summary, sale_id: &str) -> HandOver {
    let delta = |name: &str, labels: &[(&str, &str)]| {
        let grown = after.counter(name, labels) - before.counter(name, labels);
        // Counters, read as floats: whole and never negative.
        grown.max(0.0).round() as u64
    };
    let conflicts = "transaction_conflicts_retried";
    HandOver {
        orders_opened: delta("orders_opened", &[("sale_id", sale_id)]),
        reserve_conflicts: delta(conflicts, &[("operation", "dynamodb.reserve")]),
    }
}

async fn gateway_surge(
    session: &Session,
    stack: &BenchStack,
    sizes: &ContentionSizes,
    name: &str,
    reserve: ReservePath,
) -> Result<GatewaySurge, ContentionError> {
    let sale_id = session
        .create_sale_on_shards(
            name,
            sizes.stock,
            PAYMENT_WINDOW_SECS,
            Some(sizes.shards),
            reserve,
        )
        .await?;
    let buyers = session
        .buyers_with_paths(&sale_id, name, sizes.buyers)
        .await?;
    let metrics_before = local_metrics(session).await;
    let settled = Settled::after(sizes.quiet).await;
    let counts_before = stack.dynamodb.counts();
    let released = Instant::now();
    let base_url = session.api.base_url();
    let per_buyer: Vec<Vec<GrabAnswer>> = stream::iter(&buyers)
        .map(|(token, path)| {
            grab_until_answered(
                &session.http,
                format!("{base_url}{path}"),
                token,
                sizes.grab_attempts,
                released,
            )
        })
        .buffer_unordered(sizes.concurrency.max(1))
        .collect()
        .await;
    let surge = released.elapsed();
    let surge_dynamodb = stack.dynamodb.counts().since(&counts_before);

    let mut orders_by_buyer = Vec::new();
    let mut reserved_at: Vec<(Duration, &str)> = Vec::new();
    let mut final_outcomes = BTreeMap::new();
    for answers in &per_buyer {
        let orders: BTreeSet<&str> = answers
            .iter()
            .filter(|a| a.status == 202)
            .filter_map(|a| a.order_id.as_deref())
            .collect();
        orders_by_buyer.push(orders.len());
        for answer in answers.iter().filter(|a| a.status == 202) {
            if let Some(order) = answer.order_id.as_deref() {
                reserved_at.push((answer.at, order));
            }
        }
        if let Some(last) = answers.last() {
            *final_outcomes.entry(last.outcome()).or_default() += 1;
        }
    }
    // Each order at its first 202 (a retry may answer it again).
    reserved_at.sort();
    let mut seen = BTreeSet::new();
    reserved_at.retain(|(_, order)| seen.insert(*order));
    let sold = reserved_at.len();
    let milestones = milestones(&reserved_at.iter().map(|(at, _)| *at).collect::<Vec<_>>());
    let sell_out = reserved_at
        .get((sizes.stock as usize).saturating_sub(1))
        .filter(|_| sizes.stock > 0)
        .map(|(at, _)| *at);
    let all: Vec<&GrabAnswer> = per_buyer.iter().flatten().collect();
    let mut reserved_round_trip: Vec<Duration> = all
        .iter()
        .filter(|a| a.status == 202)
        .map(|a| a.took)
        .collect();
    reserved_round_trip.sort();
    let reserved_round_trip = [50, 90]
        .into_iter()
        .filter_map(|p| {
            let last = reserved_round_trip.len().checked_sub(1)?;
            Some(reserved_round_trip[last * p / 100])
        })
        .collect();
    let is_sold_out = |a: &&GrabAnswer| a.code.as_deref() == Some("sold_out");
    let count = |keep: &dyn Fn(&&GrabAnswer) -> bool| all.iter().filter(|a| keep(a)).count();

    // Every unit the surge took, by the stats, has had its timer set.
    let taken = final_stats(session, &sale_id)
        .await?
        .get("reserved")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let (metrics_after, drained) = match &metrics_before {
        Some(before) => {
            match metrics_once_opened(session, before, &sale_id, taken, sizes.drain_timeout).await {
                Some((after, drained)) => (Some(after), drained),
                None => (None, false),
            }
        }
        None => (None, false),
    };
    let through_drain = released.elapsed();
    let through_drain_dynamodb = stack.dynamodb.counts().since(&counts_before);
    let final_stats = final_stats(session, &sale_id).await?;
    let hand_over = metrics_before
        .zip(metrics_after)
        .map(|(before, after)| hand_over(&before, &after, &sale_id));
    Ok(GatewaySurge {
        sale_id,
        buyers: buyers.len(),
        sold,
        buyers_with_two_orders: orders_by_buyer.iter().filter(|n| **n > 1).count(),
        left: final_stats.get("available").and_then(Value::as_u64),
        consistent: final_stats.get("consistent").and_then(Value::as_bool),
        final_stats,
        answers: all.len(),
        unavailable: count(&|a| a.status == 503),
        throttled: count(&|a| a.status == 429),
        other_5xx: count(&|a| (500..600).contains(&a.status) && a.status != 503),
        no_answer: count(&|a| a.status == 0),
        told_sold_out: per_buyer
            .iter()
            .filter_map(|answers| answers.last())
            .filter(|a| is_sold_out(a))
            .count(),
        final_outcomes,
        settled,
        sell_out,
        milestones,
        reserved_round_trip,
        surge,
        surge_dynamodb,
        through_drain,
        drained,
        through_drain_dynamodb,
        hand_over,
    })
}

/// The sale's stats, as the admin reads them.
async fn final_stats(session: &Session, sale_id: &str) -> Result<Value, ContentionError> {
    let stats = session.api.stats(&session.admin, sale_id).await?;
    expect_status(&stats, StatusCode::OK, "stats")?;
    Ok(stats.body)
}

/// How a raw run goes.
struct RawPlan {
    workers: usize,
    max_buyers: usize,
    target: usize,
    /// In every buyer's name.
    tag: String,
    reserve: RawReserve,
    quiet: Option<Quiet>,
}

/// How a raw buyer reserves on a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawReserve {
    /// One transaction on the shard and the buyer's item, tried again on a conflict:
    /// the textbook client.
    OneTransaction,
    /// Always a plain conditional take, then the hold: the grab's reserve of issue 14.
    TakeThenHold,
    /// The grab's reserve (`DynamoStore::reserve` as deployed): the transaction, and
    /// take-then-hold on a shard for a while after a conflict there.
    Adaptive,
}

impl RawReserve {
    fn tag(self) -> &'static str {
        match self {
            Self::OneTransaction => "shard",
            Self::TakeThenHold => "plain",
            Self::Adaptive => "adaptive",
        }
    }
}

/// What one raw buyer got.
enum RawOutcome {
    Reserved,
    SoldOut,
    GaveUp,
    Failed(String),
}

/// One point of the per-shard curve for one way of reserving: a sale on one shard,
/// bought by raw reservers under the conflict mode until the target.
async fn shard_run(
    session: &Session,
    raw: &RawTarget,
    stack: &BenchStack,
    sizes: &ContentionSizes,
    commit_time_ms: u64,
    reserve: RawReserve,
) -> Result<RawRun, ContentionError> {
    let name = format!("{}{commit_time_ms}", reserve.tag());
    let conflicts = ConflictsOn::new(&stack.dynamodb, commit_time_ms);
    let sale_id = session
        .create_sale_on_shards(
            &name,
            sizes.curve_stock,
            PAYMENT_WINDOW_SECS,
            Some(1),
            ReservePath::Adaptive,
        )
        .await?;
    let sale = raw.sale(&sale_id).await?;
    let run = raw_run(
        raw,
        &stack.dynamodb,
        sale,
        RawPlan {
            workers: sizes.curve_reservers,
            // Give-ups take no unit; enough buyers that the target is reached.
            max_buyers: sizes.curve_reservations * 20,
            target: sizes.curve_reservations,
            tag: format!("{name}-{}", session.run),
            reserve,
            quiet: sizes.quiet,
        },
    )
    .await;
    drop(conflicts);
    Ok(run)
}

/// Reserve calls of a raw run, and their round trips.
#[derive(Debug, Default)]
struct RawTally {
    attempts: u64,
    contended: u64,
    committed: u32,
    committed_time: Duration,
    attempt_time: Duration,
}

impl RawTally {
    fn record(&mut self, round_trip: Duration, committed: bool, contended: bool) {
        self.attempts += 1;
        self.attempt_time += round_trip;
        if committed {
            self.committed += 1;
            self.committed_time += round_trip;
        }
        if contended {
            self.contended += 1;
        }
    }
}

/// The first, quarter, half, three-quarter and last of `sorted`.
fn milestones(sorted: &[Duration]) -> Vec<Duration> {
    let Some(last) = sorted.len().checked_sub(1) else {
        return Vec::new();
    };
    [0, last / 4, last / 2, last * 3 / 4, last]
        .into_iter()
        .map(|index| sorted[index])
        .collect()
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The textbook buyer: the shards in the buyer's order, the next one on `ShardEmpty`,
/// the same one again on `Contended` after a full-jitter pause, giving up after
/// `TEXTBOOK_RETRY.attempts` tries of one shard.
async fn textbook_buyer(
    store: &DynamoStore,
    sale: &Sale,
    user: UserId,
    tally: &Mutex<RawTally>,
    reserve: RawReserve,
) -> RawOutcome {
    let now = Utc::now();
    let mut reservation = Reservation {
        order_id: OrderId::new(sale.sale_id.clone()),
        sale_id: sale.sale_id.clone(),
        user_id: user,
        shard: 0,
        created_at: now,
        expires_at: sale.payment_deadline(now),
        price: sale.price,
    };
    let shards: Vec<u16> = sale.shard_order(&reservation.user_id).collect();
    for shard in shards {
        reservation.shard = shard;
        let mut attempt = 1;
        loop {
            let sent = Instant::now();
            let answer = match reserve {
                RawReserve::OneTransaction => {
                    store
                        .reserve_in_one_transaction(sale, shard, &reservation)
                        .await
                }
                RawReserve::TakeThenHold | RawReserve::Adaptive => {
                    store.reserve(sale, shard, &reservation).await
                }
            };
            let round_trip = sent.elapsed();
            let contended = matches!(answer, Ok(Err(ReserveRefusal::Contended)));
            locked(tally).record(round_trip, matches!(answer, Ok(Ok(()))), contended);
            match answer {
                Ok(Ok(())) => return RawOutcome::Reserved,
                Ok(Err(ReserveRefusal::ShardEmpty(_))) => break,
                Ok(Err(ReserveRefusal::Contended)) if attempt < TEXTBOOK_RETRY.attempts => {
                    tokio::time::sleep(TEXTBOOK_RETRY.pause(attempt)).await;
                    attempt += 1;
                }
                Ok(Err(ReserveRefusal::Contended)) => return RawOutcome::GaveUp,
                Ok(Err(refusal)) => return RawOutcome::Failed(format!("{refusal:?}")),
                Err(error) => return RawOutcome::Failed(error.to_string()),
            }
        }
    }
    RawOutcome::SoldOut
}

/// Raw buyers on `workers` tasks, each a new user, until `target` units are reserved
/// (no new buyer starts after that: the measure is the time to the target) or
/// `max_buyers` have tried. Their holds stay `reserved`, timer-less, as a lost hand-over
/// leaves them: every sale here has a payment window longer than the run, so the
/// reconciler does not release them while a later window counts.
async fn raw_run(raw: &RawTarget, proxy: &Proxy, sale: Sale, plan: RawPlan) -> RawRun {
    #[derive(Default)]
    struct Shared {
        next: AtomicUsize,
        reserved: AtomicUsize,
        reached: OnceLock<Duration>,
        reserved_at: Mutex<Vec<Duration>>,
        tally: Mutex<RawTally>,
        sold_out: AtomicUsize,
        gave_up: AtomicUsize,
        failed: AtomicUsize,
        first_failure: OnceLock<String>,
    }
    let shared = Arc::new(Shared::default());
    let sale = Arc::new(sale);
    let plan = Arc::new(plan);
    let store = raw.store_for(plan.reserve);
    let settled = Settled::after(plan.quiet).await;
    let counts_before = proxy.counts();
    let started = Instant::now();
    let workers: Vec<_> = (0..plan.workers.max(1))
        .map(|_| {
            let (shared, sale, plan) = (shared.clone(), sale.clone(), plan.clone());
            let store = store.clone();
            tokio::spawn(async move {
                while shared.reserved.load(Ordering::SeqCst) < plan.target {
                    let index = shared.next.fetch_add(1, Ordering::SeqCst);
                    if index >= plan.max_buyers {
                        break;
                    }
                    let user = match UserId::parse(format!("bench-{}-{index}", plan.tag)) {
                        Ok(user) => user,
                        Err(error) => {
                            shared.failed.fetch_add(1, Ordering::SeqCst);
                            let _ = shared.first_failure.set(error.to_string());
                            continue;
                        }
                    };
                    match textbook_buyer(&store, &sale, user, &shared.tally, plan.reserve).await {
                        RawOutcome::Reserved => {
                            let reserved = shared.reserved.fetch_add(1, Ordering::SeqCst) + 1;
                            locked(&shared.reserved_at).push(started.elapsed());
                            if reserved == plan.target {
                                let _ = shared.reached.set(started.elapsed());
                            }
                        }
                        RawOutcome::SoldOut => {
                            shared.sold_out.fetch_add(1, Ordering::SeqCst);
                        }
                        RawOutcome::GaveUp => {
                            shared.gave_up.fetch_add(1, Ordering::SeqCst);
                        }
                        RawOutcome::Failed(why) => {
                            shared.failed.fetch_add(1, Ordering::SeqCst);
                            let _ = shared.first_failure.set(why);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        if let Err(error) = worker.await {
            shared.failed.fetch_add(1, Ordering::SeqCst);
            let _ = shared
                .first_failure
                .set(format!("a raw buyer's task: {error}"));
        }
    }
    let elapsed = started.elapsed();
    let dynamodb = proxy.counts().since(&counts_before);
    let tally = std::mem::take(&mut *locked(&shared.tally));
    let mean = |total: Duration, n: u64| (n > 0).then(|| total.div_f64(n as f64));
    RawRun {
        sale_id: sale.sale_id.to_string(),
        stock: sale.stock_total,
        shards: sale.shards,
        workers: plan.workers,
        target: plan.target,
        buyers_started: shared.next.load(Ordering::SeqCst).min(plan.max_buyers),
        reserved: shared.reserved.load(Ordering::SeqCst),
        sold_out: shared.sold_out.load(Ordering::SeqCst),
        gave_up: shared.gave_up.load(Ordering::SeqCst),
        failed: shared.failed.load(Ordering::SeqCst),
        first_failure: shared.first_failure.get().cloned(),
        settled,
        target_reached_after: shared.reached.get().copied(),
        milestones: {
            let mut reserved_at = std::mem::take(&mut *locked(&shared.reserved_at));
            reserved_at.sort();
            milestones(&reserved_at)
        },
        elapsed,
        attempts: tally.attempts,
        contended: tally.contended,
        committed_round_trip: mean(tally.committed_time, u64::from(tally.committed)),
        attempt_round_trip: mean(tally.attempt_time, tally.attempts),
        dynamodb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textbook_pauses_stay_under_a_doubling_ceiling_capped_at_200_ms() {
        for retry in 1..12 {
            let ceiling = Duration::from_millis(5 * (1 << (retry - 1))).min(TEXTBOOK_RETRY.cap);
            for _ in 0..50 {
                assert!(TEXTBOOK_RETRY.pause(retry) <= ceiling);
            }
        }
    }

    fn counts(pairs: &[(&str, u64, u64)]) -> Counts {
        let mut counts = Counts::default();
        for (operation, total, conflicts) in pairs {
            let entry = counts
                .operations
                .entry(format!("{DYNAMODB}{operation}"))
                .or_default();
            entry.total = *total;
            entry.conflicts = *conflicts;
        }
        counts
    }

    #[test]
    fn writes_count_every_write_operation_refused_or_not_and_no_read() {
        let counts = counts(&[
            ("TransactWriteItems", 250, 40),
            ("PutItem", 3, 0),
            ("UpdateItem", 2, 1),
            ("GetItem", 900, 0),
            ("Query", 12, 0),
        ]);
        assert_eq!(writes(&counts), 255);
        assert_eq!(transactions(&counts), (250, 40));
    }
}
