//! A counting pass-through for the AWS emulators, on loopback.
//!
//! Every request is forwarded to one upstream (DynamoDB Local, or the SQS/Scheduler
//! emulator) and counted by operation and by the status it got. The operation is the
//! `X-Amz-Target` header of the JSON protocols (`DynamoDB_20120810.TransactWriteItems`,
//! `AmazonSQS.SendMessage`), else `METHOD /first-segment` for REST protocols
//! (Scheduler's `POST /schedules`). The counts are the project's own evidence of what
//! the functions called, independent of their code's claims.
//!
//! Faults: a rule per operation makes the proxy answer a throttle or a 500 instead of
//! forwarding, reset the connection before forwarding, or forward (the upstream commits)
//! and then drop the connection, so the caller cannot know it committed. A rule says
//! how often: a window (`skip`, `times`) and a rate within it (`every` n-th request),
//! so a drill can state the rate it ran at. `make bench` counts through it, and the
//! e2e fault drills (tests/tests/drills.rs) inject through it.
//!
//! A fault mix ([`FaultMix`], off by default) draws faults at random instead, from a
//! seeded generator: each request of its operation filter draws once, and is answered
//! a 500 before forwarding, forwarded and then answered a 500 (the upstream applied
//! it), throttled, or delayed by a uniform time before being forwarded as usual, each
//! with the probability the mix gives it. The same seed gives the same sequence of
//! draws ([`FaultMix::draws`]); which request gets which draw is the order the requests
//! reach the proxy. A rule that faults a request takes precedence over the mix's draw
//! for it (the draw is still used up, so the mix's sequence does not depend on the
//! rules). Every fault is counted by kind ([`OperationCounts::by_fault`]).
//!
//! Transaction conflicts (off by default; `proxy/conflicts.rs` has the rule): DynamoDB
//! Local runs one transaction at a time and never answers `TransactionConflict`; with a
//! [`ConflictMode`] the proxy plays DynamoDB's rule. A `TransactWriteItems` holds its
//! items from its arrival until its answer is back plus the mode's commit time; another
//! transaction touching a held item is cancelled (`TransactionCanceledException`,
//! `TransactionConflict` at that item), a `PutItem`/`UpdateItem`/`DeleteItem` of one
//! refused (`TransactionConflictException`), neither forwarded. Fault rules decide
//! first; the conflicts are counted by operation, under outcome `"400"`. A `Put` is
//! keyed through its table's key schema, which the proxy asks its upstream for once.
//!
//! Control routes, on the same port: `GET /__counts` (JSON [`Counts`]), `POST /__reset`
//! (zero the counts), `PUT /__faults` (a JSON list of [`FaultRule`]), `DELETE /__faults`,
//! `PUT /__conflicts` (a JSON [`ConflictMode`]: `{"commit_time_ms": 15}`),
//! `DELETE /__conflicts`, `GET /__conflicts` (the mode and how many items are held),
//! `PUT /__mix` (a JSON [`FaultMix`]), `DELETE /__mix`, `GET /__mix` (the mix and how
//! many requests it has drawn for).

mod conflicts;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

pub use conflicts::ConflictMode;
use conflicts::{Admission, Conflicts, Refusal, Rule};

/// Requests and statuses seen for one operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationCounts {
    pub total: u64,
    /// By outcome: the HTTP status (`"200"`, `"400"`), or `"reset"` (the connection was
    /// cut before forwarding), `"dropped_after_commit"`, `"upstream_error"` (the
    /// upstream did not answer), `"body_unreadable"` (the caller's body broke off),
    /// `"caller_gone"` (the caller hung up before its answer).
    pub by_outcome: BTreeMap<String, u64>,
    /// How many of `total` a fault rule or the fault mix answered or cut. A delayed
    /// request is not among them: its answer is the upstream's (see `by_fault`).
    pub faults: u64,
    /// Faults injected, by kind: a [`Fault`]'s name (`"server_error"`, `"throttle"`,
    /// `"commit_then_server_error"`, ...), from a rule or the mix, and `"delay"` for a
    /// request the mix delayed before forwarding it (counted under its upstream
    /// outcome, and not in `faults`).
    #[serde(default)]
    pub by_fault: BTreeMap<String, u64>,
    /// How many of `total` the conflict mode answered with a transaction conflict
    /// (also counted under outcome `"400"`).
    #[serde(default)]
    pub conflicts: u64,
}

/// Everything the proxy counted since its start or last reset, by operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub operations: BTreeMap<String, OperationCounts>,
}

impl Counts {
    /// Requests of every operation.
    pub fn total(&self) -> u64 {
        self.operations.values().map(|op| op.total).sum()
    }

    /// Requests of one operation (0 if never seen).
    pub fn of(&self, operation: &str) -> u64 {
        self.operations.get(operation).map_or(0, |op| op.total)
    }

    /// Per operation, `self` minus `earlier` (a snapshot taken before).
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut operations = BTreeMap::new();
        for (name, now) in &self.operations {
            let before = earlier.operations.get(name).cloned().unwrap_or_default();
            let by_outcome: BTreeMap<String, u64> = now
                .by_outcome
                .iter()
                .map(|(k, v)| {
                    let was = before.by_outcome.get(k).copied().unwrap_or(0);
                    (k.clone(), v.saturating_sub(was))
                })
                .filter(|(_, v)| *v > 0)
                .collect();
            let by_fault: BTreeMap<String, u64> = now
                .by_fault
                .iter()
                .map(|(k, v)| {
                    let was = before.by_fault.get(k).copied().unwrap_or(0);
                    (k.clone(), v.saturating_sub(was))
                })
                .filter(|(_, v)| *v > 0)
                .collect();
            let total = now.total.saturating_sub(before.total);
            if total > 0 {
                operations.insert(
                    name.clone(),
                    OperationCounts {
                        total,
                        by_outcome,
                        faults: now.faults.saturating_sub(before.faults),
                        by_fault,
                        conflicts: now.conflicts.saturating_sub(before.conflicts),
                    },
                );
            }
        }
        Counts { operations }
    }

    /// Faults injected into every operation, by kind (see [`OperationCounts::by_fault`]).
    pub fn faults_by_kind(&self) -> BTreeMap<String, u64> {
        let mut kinds = BTreeMap::new();
        for op in self.operations.values() {
            for (kind, count) in &op.by_fault {
                *kinds.entry(kind.clone()).or_default() += count;
            }
        }
        kinds
    }

    fn record(&mut self, operation: &str, outcome: &str, cause: Cause, fault: Option<&str>) {
        let entry = self.operations.entry(operation.to_owned()).or_default();
        entry.total += 1;
        *entry.by_outcome.entry(outcome.to_owned()).or_default() += 1;
        if let Some(kind) = fault {
            *entry.by_fault.entry(kind.to_owned()).or_default() += 1;
        }
        match cause {
            Cause::Upstream => {}
            Cause::Fault => entry.faults += 1,
            Cause::Conflict => entry.conflicts += 1,
        }
    }
}

/// Who decided a request's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The upstream answered (or failed to), or the caller broke off.
    Upstream,
    /// A fault rule or the fault mix.
    Fault,
    /// The conflict mode.
    Conflict,
}

/// What a fault rule does to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Fault {
    /// Answer 400 with the service's throttling error, without forwarding.
    Throttle,
    /// Answer 500 `InternalServerError`, without forwarding.
    ServerError,
    /// Close the connection without an answer, without forwarding.
    ConnectionReset,
    /// Forward (the upstream acts on it), then close the connection without the answer.
    CommitThenDrop,
    /// Forward (the upstream acts on it), then answer 500 `InternalServerError` instead
    /// of the upstream's answer: the write applied, and its caller is told it failed.
    CommitThenServerError,
    /// Refuse as a transaction in flight on the items would, without forwarding: a plain
    /// write gets `TransactionConflictException`, a `TransactWriteItems` is cancelled
    /// with `TransactionConflict` on every item. Other operations pass.
    TransactionConflict,
}

impl Fault {
    /// Its name in the counts ([`OperationCounts::by_fault`]), as it is spelled in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Throttle => "throttle",
            Self::ServerError => "server_error",
            Self::ConnectionReset => "connection_reset",
            Self::CommitThenDrop => "commit_then_drop",
            Self::CommitThenServerError => "commit_then_server_error",
            Self::TransactionConflict => "transaction_conflict",
        }
    }
}

/// Applies `fault` to requests of `operation` (`"*"`: every operation): the first
/// `skip` matching requests pass; after them, every `every`-th matching request (each
/// one when `None` or 1) faults, up to `times` faults (no limit when `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    pub operation: String,
    pub fault: Fault,
    #[serde(default)]
    pub skip: u64,
    #[serde(default)]
    pub times: Option<u64>,
    #[serde(default)]
    pub every: Option<u64>,
}

impl FaultRule {
    pub fn always(operation: impl Into<String>, fault: Fault) -> Self {
        Self {
            operation: operation.into(),
            fault,
            skip: 0,
            times: None,
            every: None,
        }
    }

    /// Faults every `n`-th matching request (the `n`-th, the `2n`-th, ...): a rate of
    /// 1/`n`, deterministic, so a drill's rate is what it says.
    pub fn every(operation: impl Into<String>, fault: Fault, n: u64) -> Self {
        Self {
            every: Some(n),
            ..Self::always(operation, fault)
        }
    }
}

/// A rule in force: how many requests it has matched and how many it has faulted.
#[derive(Debug)]
struct ActiveRule {
    rule: FaultRule,
    matched: u64,
    faulted: u64,
}

impl ActiveRule {
    fn new(rule: FaultRule) -> Self {
        Self {
            rule,
            matched: 0,
            faulted: 0,
        }
    }

    /// Whether it has faulted as many times as it may.
    fn spent(&self) -> bool {
        self.rule.times.is_some_and(|times| self.faulted >= times)
    }

    /// Counts one matching request; whether it faults.
    fn strikes(&mut self) -> bool {
        self.matched += 1;
        let Some(past_skip) = self.matched.checked_sub(self.rule.skip + 1) else {
            return false;
        };
        let every = self.rule.every.unwrap_or(1).max(1);
        let on_rate = (past_skip + 1) % every == 0;
        let under_limit = self.rule.times.is_none_or(|times| self.faulted < times);
        let strikes = on_rate && under_limit;
        if strikes {
            self.faulted += 1;
        }
        strikes
    }
}

/// Faults drawn at random, per request, from a seeded generator: each request of
/// `operation` (`"*"`: every operation) draws once, and gets a 500 before forwarding
/// with probability `server_error`, a 500 after the upstream applied it with
/// `commit_then_server_error`, a throttle with `throttle`, its connection closed before
/// forwarding with `connection_reset` or after the upstream applied it with
/// `commit_then_drop`, or a delay drawn uniformly
/// from `delay_ms` (milliseconds) before being forwarded as usual with `delay`; else it
/// passes. The probabilities are each within 0..=1 and add up to at most 1.
///
/// The same seed gives the same sequence of draws ([`FaultMix::draws`]), one per
/// matching request in the order they reach the proxy. The generator is SplitMix64
/// (Steele, Lea and Flood, 2014), so a seed means the same sequence on every machine
/// and version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultMix {
    pub seed: u64,
    #[serde(default = "every_operation")]
    pub operation: String,
    #[serde(default)]
    pub server_error: f64,
    #[serde(default)]
    pub commit_then_server_error: f64,
    #[serde(default)]
    pub throttle: f64,
    /// The connection closed without an answer, nothing forwarded.
    #[serde(default)]
    pub connection_reset: f64,
    /// Forwarded (the upstream acts on it), then the connection closed without the
    /// answer: a write that applied, whose caller hears nothing.
    #[serde(default)]
    pub commit_then_drop: f64,
    #[serde(default)]
    pub delay: f64,
    /// JSON: `{"start": 100, "end": 400}`.
    #[serde(default = "no_delay")]
    pub delay_ms: RangeInclusive<u64>,
}

fn every_operation() -> String {
    "*".to_owned()
}

fn no_delay() -> RangeInclusive<u64> {
    0..=0
}

/// Why a [`FaultMix`] cannot be played.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidMix {
    #[error("the probability of {0} is {1}, not within 0..=1")]
    Probability(&'static str, f64),
    #[error("the probabilities add up to {0}, more than 1")]
    Sum(f64),
    #[error("the delay range {0:?} is empty")]
    DelayRange(RangeInclusive<u64>),
}

/// What the mix drew for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixDraw {
    Pass,
    ServerError,
    CommitThenServerError,
    Throttle,
    ConnectionReset,
    CommitThenDrop,
    /// Forwarded as usual after this long.
    Delay(Duration),
}

impl FaultMix {
    /// A mix of `seed` on every operation that injects nothing yet: set its
    /// probabilities.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            operation: every_operation(),
            server_error: 0.0,
            commit_then_server_error: 0.0,
            throttle: 0.0,
            connection_reset: 0.0,
            commit_then_drop: 0.0,
            delay: 0.0,
            delay_ms: no_delay(),
        }
    }

    /// Whether the mix can be played.
    pub fn validate(&self) -> Result<(), InvalidMix> {
        let named = [
            ("server_error", self.server_error),
            ("commit_then_server_error", self.commit_then_server_error),
            ("throttle", self.throttle),
            ("connection_reset", self.connection_reset),
            ("commit_then_drop", self.commit_then_drop),
            ("delay", self.delay),
        ];
        for (name, p) in named {
            if !(0.0..=1.0).contains(&p) {
                return Err(InvalidMix::Probability(name, p));
            }
        }
        let sum: f64 = named.iter().map(|(_, p)| p).sum();
        // Room for the rounding of decimal fractions (0.3 + 0.7).
        if sum > 1.0 + 1e-9 {
            return Err(InvalidMix::Sum(sum));
        }
        if self.delay_ms.is_empty() {
            return Err(InvalidMix::DelayRange(self.delay_ms.clone()));
        }
        Ok(())
    }

    /// The draws this mix makes, in order: the `n`-th is the one the `n`-th matching
    /// request gets.
    pub fn draws(&self) -> impl Iterator<Item = MixDraw> + use<> {
        let mix = self.clone();
        let mut generator = SplitMix64(self.seed);
        std::iter::repeat_with(move || mix.draw(generator.next()))
    }

    /// The draw for one 64-bit number: its top 53 bits are a uniform fraction in 0..1,
    /// which falls in one kind's band; within the delay's band, where it falls is the
    /// delay (one number per request, so the sequence of draws is the generator's).
    fn draw(&self, number: u64) -> MixDraw {
        let u = (number >> 11) as f64 / (1_u64 << 53) as f64;
        let bands = [
            (self.server_error, MixDraw::ServerError),
            (
                self.commit_then_server_error,
                MixDraw::CommitThenServerError,
            ),
            (self.throttle, MixDraw::Throttle),
            (self.connection_reset, MixDraw::ConnectionReset),
            (self.commit_then_drop, MixDraw::CommitThenDrop),
        ];
        let mut floor = 0.0;
        for (p, drawn) in bands {
            if u < floor + p {
                return drawn;
            }
            floor += p;
        }
        if u < floor + self.delay {
            let within = ((u - floor) / self.delay).clamp(0.0, 1.0);
            let (low, high) = (*self.delay_ms.start(), *self.delay_ms.end());
            let span = high.saturating_sub(low);
            let ms = low + ((within * (span as f64 + 1.0)) as u64).min(span);
            return MixDraw::Delay(Duration::from_millis(ms));
        }
        MixDraw::Pass
    }

    fn applies_to(&self, operation: &str) -> bool {
        self.operation == "*" || self.operation == operation
    }
}

/// SplitMix64: a tiny, well-known generator, good enough to spread faults and stable
/// across versions (no crate's algorithm can change under a seed).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The mix in force, with its generator's state.
#[derive(Debug)]
struct ActiveMix {
    mix: FaultMix,
    generator: SplitMix64,
    drawn: u64,
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Pass,
    Fault(Fault),
    Delay(Duration),
}

/// The rules and the mix in force.
#[derive(Debug, Default)]
struct FaultBook {
    rules: Vec<ActiveRule>,
    mix: Option<ActiveMix>,
}

impl FaultBook {
    fn replace(&mut self, rules: Vec<FaultRule>) {
        self.rules = rules.into_iter().map(ActiveRule::new).collect();
    }

    /// Plays `mix` from the start of its sequence (`None`: no mix).
    fn set_mix(&mut self, mix: Option<FaultMix>) {
        self.mix = mix.map(|mix| ActiveMix {
            generator: SplitMix64(mix.seed),
            mix,
            drawn: 0,
        });
    }

    /// What happens to this request. The mix draws for every request it applies to,
    /// whatever the rules do, so its sequence is its seed's. Then the rules: the first
    /// matching rule that has faults left decides (and counts the request) even when
    /// it lets it pass; a fault of a rule replaces the mix's draw. A spent rule steps
    /// aside, so rules for one operation play in turn: a lost answer, then a conflict
    /// on the SDK's resend.
    fn decide(&mut self, operation: &str) -> Decision {
        let drawn = match self.mix.as_mut() {
            Some(active) if active.mix.applies_to(operation) => {
                active.drawn += 1;
                active.mix.draw(active.generator.next())
            }
            _ => MixDraw::Pass,
        };
        let ruled = self
            .rules
            .iter_mut()
            .find(|active| {
                (active.rule.operation == "*" || active.rule.operation == operation)
                    && !active.spent()
            })
            .and_then(|active| active.strikes().then_some(active.rule.fault));
        match (ruled, drawn) {
            (Some(fault), _) => Decision::Fault(fault),
            (None, MixDraw::Pass) => Decision::Pass,
            (None, MixDraw::ServerError) => Decision::Fault(Fault::ServerError),
            (None, MixDraw::CommitThenServerError) => Decision::Fault(Fault::CommitThenServerError),
            (None, MixDraw::Throttle) => Decision::Fault(Fault::Throttle),
            (None, MixDraw::ConnectionReset) => Decision::Fault(Fault::ConnectionReset),
            (None, MixDraw::CommitThenDrop) => Decision::Fault(Fault::CommitThenDrop),
            (None, MixDraw::Delay(delay)) => Decision::Delay(delay),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("could not listen on loopback")]
    Bind(#[source] std::io::Error),
    #[error("the upstream {0:?} is not an http://host:port URL")]
    Upstream(String),
}

struct Shared {
    upstream: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    counts: Mutex<Counts>,
    faults: Mutex<FaultBook>,
    conflicts: Conflicts,
}

/// How a proxy starts; the default forwards everything.
#[derive(Debug, Clone, Default)]
pub struct ProxyOptions {
    /// Play DynamoDB's transaction conflicts from the start.
    pub conflicts: Option<ConflictMode>,
}

/// A running proxy. Stops (with every connection it holds) when dropped.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Why a request got no answer: hyper closes the connection when the service fails.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("fault: connection reset before forwarding")]
    Reset,
    #[error("fault: connection dropped after the upstream answered")]
    DroppedAfterCommit,
    #[error("the request's body could not be read")]
    Body(#[source] hyper::Error),
}

/// Why the upstream gave no answer.
#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("the upstream URL cannot take the path {0:?}")]
    Uri(String),
    #[error("the upstream did not answer")]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error("the upstream's answer could not be read")]
    Body(#[from] hyper::Error),
}

impl Proxy {
    /// Listens on 127.0.0.1:`port` (0: a free port) and forwards to `upstream`
    /// (`http://127.0.0.1:8000`).
    pub async fn start(upstream: &str, port: u16) -> Result<Self, ProxyError> {
        Self::start_with(upstream, port, ProxyOptions::default()).await
    }

    /// [`Proxy::start`] with options (the conflict mode on from the start).
    pub async fn start_with(
        upstream: &str,
        port: u16,
        options: ProxyOptions,
    ) -> Result<Self, ProxyError> {
        let upstream_uri: Uri = upstream
            .parse()
            .map_err(|_| ProxyError::Upstream(upstream.to_owned()))?;
        if upstream_uri.scheme_str() != Some("http") || upstream_uri.authority().is_none() {
            return Err(ProxyError::Upstream(upstream.to_owned()));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(ProxyError::Bind)?;
        let address = listener.local_addr().map_err(ProxyError::Bind)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let shared = Arc::new(Shared {
            upstream: upstream_uri,
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(1024)
                .build(connector),
            counts: Mutex::new(Counts::default()),
            faults: Mutex::new(FaultBook::default()),
            conflicts: Conflicts::new(options.conflicts),
        });
        let server = tokio::spawn(serve(listener, Arc::clone(&shared)));
        Ok(Self {
            address,
            shared,
            server,
        })
    }

    /// `http://127.0.0.1:port`, the endpoint to give the clients instead of the upstream.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn counts(&self) -> Counts {
        lock(&self.shared.counts).clone()
    }

    pub fn reset(&self) {
        *lock(&self.shared.counts) = Counts::default();
    }

    /// Replaces the fault rules (an empty list: forward everything).
    pub fn set_faults(&self, rules: Vec<FaultRule>) {
        lock(&self.shared.faults).replace(rules);
    }

    /// Plays `mix` (`Some`) from the start of its seed's sequence, or stops the mix
    /// (`None`). The rules stay as they are.
    pub fn set_fault_mix(&self, mix: Option<FaultMix>) -> Result<(), InvalidMix> {
        if let Some(mix) = &mix {
            mix.validate()?;
        }
        lock(&self.shared.faults).set_mix(mix);
        Ok(())
    }

    /// The mix in force, and how many requests it has drawn for.
    pub fn fault_mix(&self) -> Option<(FaultMix, u64)> {
        lock(&self.shared.faults)
            .mix
            .as_ref()
            .map(|active| (active.mix.clone(), active.drawn))
    }

    /// Turns DynamoDB's transaction conflicts on (`Some`) or off. Items already held
    /// stay held until their transactions are answered.
    pub fn set_conflict_mode(&self, mode: Option<ConflictMode>) {
        self.shared.conflicts.set_mode(mode);
    }

    pub fn conflict_mode(&self) -> Option<ConflictMode> {
        self.shared.conflicts.mode()
    }

    /// How many items in-flight transactions hold now: lets a test start a second
    /// request only once the first one holds its items.
    pub fn held_items(&self) -> usize {
        self.shared.conflicts.held_items()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Dropping the set (when the proxy's task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "proxy accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&shared), request));
            // A cut connection ends here with the service's error: that is the fault.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

type ProxyResponse = Response<Full<Bytes>>;

/// A request's one record. If its handler is dropped before it recorded an outcome, the
/// caller hung up (its SDK attempt timed out) while the request was on its way or being
/// executed: it is recorded as `"caller_gone"`, since the table may have applied it and
/// it is a call all the same. A request the mix delayed is counted under `"delay"` too,
/// whatever its outcome.
struct RecordedOnce<'a> {
    shared: &'a Shared,
    operation: &'a str,
    done: AtomicBool,
    delayed: AtomicBool,
}

impl RecordedOnce<'_> {
    /// `fault`: the fault that answered or cut the request (`cause` is then
    /// [`Cause::Fault`]).
    fn record(&self, outcome: &str, cause: Cause, fault: Option<Fault>) {
        self.done.store(true, Ordering::Relaxed);
        lock(&self.shared.counts).record(self.operation, outcome, cause, self.kind(fault));
    }

    fn kind(&self, fault: Option<Fault>) -> Option<&'static str> {
        fault
            .map(Fault::name)
            .or_else(|| self.delayed.load(Ordering::Relaxed).then_some("delay"))
    }
}

impl Drop for RecordedOnce<'_> {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            lock(&self.shared.counts).record(
                self.operation,
                "caller_gone",
                Cause::Upstream,
                self.kind(None),
            );
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<ProxyResponse, Cut> {
    if request.uri().path().starts_with("/__") {
        return Ok(control(&shared, request).await);
    }
    let operation = operation_of(&request);
    let once = RecordedOnce {
        shared: &shared,
        operation: &operation,
        done: AtomicBool::new(false),
        delayed: AtomicBool::new(false),
    };
    let record = |outcome: &str, cause: Cause| once.record(outcome, cause, None);
    let faulted = |outcome: &str, fault: Fault| once.record(outcome, Cause::Fault, Some(fault));
    // Whole before anything is decided: the conflict rule reads the items in it.
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            record("body_unreadable", Cause::Upstream);
            return Err(Cut::Body(error));
        }
    };
    let decision = lock(&shared.faults).decide(&operation);
    let fault = match decision {
        Decision::Fault(fault) => Some(fault),
        Decision::Pass | Decision::Delay(_) => None,
    };
    match fault {
        Some(Fault::Throttle) => {
            faulted("400", Fault::Throttle);
            return Ok(error_answer(
                StatusCode::BAD_REQUEST,
                &throttle_code(&operation),
                "Rate exceeded (injected by the fault proxy)",
            ));
        }
        Some(Fault::ServerError) => {
            faulted("500", Fault::ServerError);
            return Ok(error_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "Internal server error (injected by the fault proxy)",
            ));
        }
        Some(Fault::ConnectionReset) => {
            faulted("reset", Fault::ConnectionReset);
            return Err(Cut::Reset);
        }
        Some(Fault::TransactionConflict) => {
            if let Some(refusal) = conflict_refusal(&operation, &body) {
                faulted("400", Fault::TransactionConflict);
                return Ok(refusal_answer(&refusal));
            }
        }
        Some(Fault::CommitThenDrop | Fault::CommitThenServerError) | None => {}
    }
    if let Decision::Delay(delay) = decision {
        // On its way to the upstream: before the conflict mode sees it, so the delay
        // holds no items.
        once.delayed.store(true, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
    }
    let hold = match admit(&shared, &operation, &parts.headers, &body).await {
        Admission::Free => None,
        Admission::Held(hold) => Some(hold),
        Admission::Refused(refusal) => {
            record("400", Cause::Conflict);
            return Ok(refusal_answer(&refusal));
        }
    };
    let answer = forward(&shared, parts, body).await;
    if let Some(hold) = hold {
        // The commit time is added to the transaction's own round trip, its items
        // held all along; dropping the hold releases them.
        tokio::time::sleep(hold.commit_time()).await;
        drop(hold);
    }
    match (answer, fault) {
        (Ok(_), Some(Fault::CommitThenDrop)) => {
            faulted("dropped_after_commit", Fault::CommitThenDrop);
            Err(Cut::DroppedAfterCommit)
        }
        (Ok(_), Some(Fault::CommitThenServerError)) => {
            faulted("500_after_commit", Fault::CommitThenServerError);
            Ok(error_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "Internal server error after the write applied (injected by the fault proxy)",
            ))
        }
        (Ok(response), _) => {
            record(response.status().as_str(), Cause::Upstream);
            Ok(response)
        }
        (Err(error), _) => {
            tracing::warn!(error = %error_chain(&error), %operation, "upstream did not answer");
            record("upstream_error", Cause::Upstream);
            Ok(error_answer(
                StatusCode::BAD_GATEWAY,
                "UpstreamUnavailable",
                &error_chain(&error),
            ))
        }
    }
}

/// What the conflict mode makes of a request: `Free` when it is off, or the request is
/// none of its business.
async fn admit(
    shared: &Shared,
    operation: &str,
    headers: &http::HeaderMap,
    body: &Bytes,
) -> Admission {
    if shared.conflicts.mode().is_none() {
        return Admission::Free;
    }
    let Some(rule) = Rule::of(operation) else {
        return Admission::Free;
    };
    // A body that is not JSON is the upstream's to refuse.
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Admission::Free;
    };
    for table in conflicts::tables_needing_key_schema(rule, &request) {
        if shared.conflicts.knows_key_schema(&table) {
            continue;
        }
        // Not cached on failure: a table that does not exist yet may later.
        match describe_key_schema(shared, headers, &table).await {
            Some(key_attributes) => shared.conflicts.remember_key_schema(&table, key_attributes),
            None => tracing::warn!(%table, "no key schema: its Put items cannot conflict"),
        }
    }
    shared.conflicts.admit(rule, &request)
}

/// The table's key attribute names, from a `DescribeTable` sent to the upstream. It
/// carries the caller's credentials: DynamoDB Local keeps a database per access key and
/// region (it reads them from the Authorization header and checks no signature).
async fn describe_key_schema(
    shared: &Shared,
    headers: &http::HeaderMap,
    table: &str,
) -> Option<Vec<String>> {
    let mut request = Request::new(Full::new(Bytes::from(conflicts::describe_table_request(
        table,
    ))));
    *request.method_mut() = Method::POST;
    let copied = request.headers_mut();
    for name in ["authorization", "x-amz-date", "x-amz-security-token"] {
        if let Some(value) = headers.get(name) {
            copied.insert(name, value.clone());
        }
    }
    copied.insert(
        "x-amz-target",
        HeaderValue::from_static("DynamoDB_20120810.DescribeTable"),
    );
    copied.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    let (parts, body) = request.into_parts();
    let response = match send_upstream(shared, parts, body).await {
        Ok(response) => response,
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), %table, "DescribeTable failed");
            return None;
        }
    };
    let (parts, body) = response.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    if !parts.status.is_success() {
        tracing::warn!(%table, status = %parts.status, "DescribeTable refused");
        return None;
    }
    conflicts::key_schema_of(&serde_json::from_slice(&body).ok()?)
}

async fn forward(
    shared: &Shared,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<ProxyResponse, UpstreamError> {
    send_upstream(shared, parts, Full::new(body)).await
}

/// Sends a request to the upstream under its own path, and reads the whole answer.
async fn send_upstream(
    shared: &Shared,
    mut parts: http::request::Parts,
    body: Full<Bytes>,
) -> Result<ProxyResponse, UpstreamError> {
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut uri = shared.upstream.clone().into_parts();
    uri.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|_| UpstreamError::Uri(path_and_query.clone()))?,
    );
    parts.uri = Uri::from_parts(uri).map_err(|_| UpstreamError::Uri(path_and_query))?;
    // The Host header stays the proxy's: moto builds queue URLs from it, so the URLs
    // it hands out lead back through the proxy (and match what the stack resolved).
    let response = shared
        .client
        .request(Request::from_parts(parts, body))
        .await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// An error and its sources, one after another.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, String> {
    let bytes = body
        .collect()
        .await
        .map_err(|error| error.to_string())?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|error| error.to_string())
}

async fn control(shared: &Shared, request: Request<Incoming>) -> ProxyResponse {
    let (parts, body) = request.into_parts();
    let refused = |error: &str, message: String| {
        json_answer(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": error, "message": message}),
        )
    };
    match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/__counts") => json_answer(StatusCode::OK, &*lock(&shared.counts)),
        (&Method::POST, "/__reset") => {
            *lock(&shared.counts) = Counts::default();
            json_answer(StatusCode::OK, &serde_json::json!({"reset": true}))
        }
        (&Method::PUT, "/__faults") => match read_json::<Vec<FaultRule>>(body).await {
            Ok(rules) => {
                let count = rules.len();
                lock(&shared.faults).replace(rules);
                json_answer(StatusCode::OK, &serde_json::json!({"rules": count}))
            }
            Err(message) => refused("bad_rules", message),
        },
        (&Method::DELETE, "/__faults") => {
            lock(&shared.faults).rules.clear();
            json_answer(StatusCode::OK, &serde_json::json!({"rules": 0}))
        }
        (&Method::PUT, "/__conflicts") => match read_json::<ConflictMode>(body).await {
            Ok(mode) => {
                shared.conflicts.set_mode(Some(mode));
                conflicts_answer(shared)
            }
            Err(message) => refused("bad_conflict_mode", message),
        },
        (&Method::DELETE, "/__conflicts") => {
            shared.conflicts.set_mode(None);
            conflicts_answer(shared)
        }
        (&Method::GET, "/__conflicts") => conflicts_answer(shared),
        (&Method::PUT, "/__mix") => match read_json::<FaultMix>(body).await {
            Ok(mix) => match mix.validate() {
                Ok(()) => {
                    lock(&shared.faults).set_mix(Some(mix));
                    mix_answer(shared)
                }
                Err(invalid) => refused("bad_mix", invalid.to_string()),
            },
            Err(message) => refused("bad_mix", message),
        },
        (&Method::DELETE, "/__mix") => {
            lock(&shared.faults).set_mix(None);
            mix_answer(shared)
        }
        (&Method::GET, "/__mix") => mix_answer(shared),
        _ => json_answer(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "error": "not_found",
                "message": "control routes: GET /__counts, POST /__reset, PUT|DELETE /__faults, \
                            GET|PUT|DELETE /__conflicts, GET|PUT|DELETE /__mix"
            }),
        ),
    }
}

fn mix_answer(shared: &Shared) -> ProxyResponse {
    let faults = lock(&shared.faults);
    let mix = faults.mix.as_ref();
    json_answer(
        StatusCode::OK,
        &serde_json::json!({
            "mix": mix.map(|active| &active.mix),
            "drawn": mix.map_or(0, |active| active.drawn),
        }),
    )
}

fn conflicts_answer(shared: &Shared) -> ProxyResponse {
    json_answer(
        StatusCode::OK,
        &serde_json::json!({
            "mode": shared.conflicts.mode(),
            "held_items": shared.conflicts.held_items(),
        }),
    )
}

fn operation_of<B>(request: &Request<B>) -> String {
    if let Some(target) = request
        .headers()
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok())
    {
        return target.to_owned();
    }
    let first_segment = request
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    format!("{} /{first_segment}", request.method())
}

/// The error code each service answers a throttled request with (each is on the SDK's
/// list of throttling errors): DynamoDB's provisioned-capacity refusal, SQS's and
/// Scheduler's request throttles.
fn throttle_code(operation: &str) -> String {
    if operation.starts_with("DynamoDB_") {
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException".to_owned()
    } else if operation.starts_with("AmazonSQS.") {
        "com.amazonaws.sqs#RequestThrottled".to_owned()
    } else {
        "ThrottlingException".to_owned()
    }
}

/// The refusal a transaction in flight on every item of `body` would cause, if
/// `operation` is a DynamoDB write that such a transaction can refuse.
fn conflict_refusal(operation: &str, body: &Bytes) -> Option<Refusal> {
    match operation.strip_prefix("DynamoDB_20120810.")? {
        "PutItem" | "UpdateItem" | "DeleteItem" => Some(Refusal::conflict()),
        "TransactWriteItems" => {
            let request: serde_json::Value = serde_json::from_slice(body).ok()?;
            let items = request.get("TransactItems")?.as_array()?.len();
            Some(Refusal::cancelled(&vec![true; items]))
        }
        _ => None,
    }
}

fn error_answer(status: StatusCode, code: &str, message: &str) -> ProxyResponse {
    let body = serde_json::json!({ "__type": code, "message": message });
    aws_json_answer(status, code, &body)
}

/// The conflict mode's refusal, as DynamoDB answers it: always a 400.
fn refusal_answer(refusal: &Refusal) -> ProxyResponse {
    aws_json_answer(StatusCode::BAD_REQUEST, refusal.error_type, &refusal.body)
}

/// An error in the JSON protocols' form: the body, and the code again in
/// `x-amzn-errortype`.
fn aws_json_answer(status: StatusCode, code: &str, body: &serde_json::Value) -> ProxyResponse {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    if let Ok(value) = HeaderValue::from_str(code.rsplit('#').next().unwrap_or(code)) {
        headers.insert("x-amzn-errortype", value);
    }
    response
}

fn json_answer(status: StatusCode, value: &impl Serialize) -> ProxyResponse {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
