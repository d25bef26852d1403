//! The grab handler's own cost, with I/O faked by the domain's in-memory ports: the
//! token check, the blocklist and sale caches, the sold-out gate, the routing and the
//! JSON answer, for a sold-out rejection (a first attempt, as a surge's losers send
//! it) and for a success (reserve in memory, enqueue in memory).
//!
//! Each request is a real `lambda_http::Request` built from `events/grab.json` (API
//! Gateway's payload 2.0) outside the timed part; the `_from_event` case also times
//! turning the event's JSON into that request, as the Lambda runtime does. The
//! `grab_cpu` group is timed by this thread's CPU clock, on a current-thread runtime,
//! so its throughput reads as grabs per second on one core whatever else the machine
//! runs; `grab_wall` is the same on the wall clock.
//!
//! The `challenge_cpu` group times the proof-of-work challenge's server side on the CPU
//! clock: issuing one, verifying a solution as the token route does (two HMACs), and
//! one key derivation at the challenge's cost, which is what a verifier that re-derived
//! the key would pay and what a solver pays per counter.
//!
//! `cargo bench -p flashsale-grab --bench grab_handler`; compare with
//! `infra/bench/redis_seed.sh` (the seed's Redis Lua script) run alongside.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, TimeZone, Utc};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BatchSize, BenchmarkGroup, Criterion, Throughput};
use flashsale_domain::ports::SaleCatalog;
use flashsale_domain::sale::MAX_SHARDS;
use flashsale_domain::testing;
use flashsale_domain::testing::{InMemoryBlocklist, InMemoryStore, ManualClock, RecordingQueue};
use flashsale_domain::token::GrabTokenSigner;
use flashsale_domain::{SaleId, UserId};
use flashsale_grab::{Config, Deps, Ports, handler};
use flashsale_lambda::FromEnv as _;
use flashsale_lambda::testing::ApiEvent;
use lambda_http::Request;
use nix::time::{ClockId, clock_gettime};
use tokio::runtime::Runtime;

const SECRET: &str = "0123456789abcdef0123456789abcdef-bench-only";
const SECRET_ARN: &str = "arn:aws:secretsmanager:us-east-1:123456789012:secret:grab-token-AbCdEf";

/// CPU time consumed by the calling thread: what one core spent, not how long it took.
struct ThreadCpuTime {
    wall: WallTime,
}

fn thread_cpu() -> StdDuration {
    let now = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("a thread CPU clock");
    StdDuration::from(now)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = StdDuration;
    type Value = StdDuration;

    fn start(&self) -> StdDuration {
        thread_cpu()
    }

    fn end(&self, started: StdDuration) -> StdDuration {
        thread_cpu().saturating_sub(started)
    }

    fn add(&self, a: &StdDuration, b: &StdDuration) -> StdDuration {
        *a + *b
    }

    fn zero(&self) -> StdDuration {
        StdDuration::ZERO
    }

    fn to_f64(&self, value: &StdDuration) -> f64 {
        value.as_nanos() as f64
    }

    /// Nanoseconds, like the wall clock's, so the same units and throughputs apply.
    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

/// A grab process on in-memory ports, one minute into a running sale, with a clock
/// that stands still (so the gate's marks never go stale mid-bench).
struct Bench {
    runtime: Runtime,
    deps: Deps,
    /// The key the grab paths are signed with, as the deployed grab reads it at init.
    signer: GrabTokenSigner,
    sale_id: SaleId,
    now: DateTime<Utc>,
    buyers: AtomicU64,
}

impl Bench {
    fn new(stock: i64, shards: i64) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        let starts_at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = starts_at + Duration::minutes(1);
        let vars: HashMap<&str, &str> = [
            ("TABLE_NAME", "bench"),
            (
                "ORDERS_QUEUE_URL",
                "http://127.0.0.1:1/000000000000/bench.fifo",
            ),
            ("GRAB_TOKEN_SECRET_ARN", SECRET_ARN),
        ]
        .into_iter()
        .collect();
        let config = Config::from_lookup(|var| vars.get(var).map(|v| (*v).to_owned())).unwrap();
        let store = Arc::new(InMemoryStore::new());
        let sale = testing::sale(stock, shards)
            .id("bench-sale")
            .named("Bench")
            .starting_at(starts_at)
            .build();
        assert!(runtime.block_on(store.create_sale(&sale)).unwrap());
        let signer = GrabTokenSigner::new(SECRET).unwrap();
        let deps = Deps::from_ports(
            &config,
            signer.clone(),
            Ports {
                catalog: store.clone(),
                ledger: store.clone(),
                orders: store,
                queue: Arc::new(RecordingQueue::default()),
                clock: Arc::new(ManualClock::new(now)),
                blocklist: Arc::new(InMemoryBlocklist::new()),
                pause: Arc::new(flashsale_adapters::TokioPause),
            },
        );
        Self {
            runtime,
            deps,
            signer,
            sale_id: sale.sale_id,
            now,
            buyers: AtomicU64::new(0),
        }
    }

    /// A new buyer's grab event, with a valid grab path for them.
    fn event(&self) -> ApiEvent {
        let buyer = self.buyers.fetch_add(1, Ordering::Relaxed);
        let user = UserId::parse(format!("buyer-{buyer}")).unwrap();
        let token = self
            .signer
            .issue(&self.sale_id, &user, self.now + Duration::minutes(5));
        ApiEvent::fixture("grab.json")
            .path_param("sale_id", self.sale_id.as_str())
            .path_param("token", &token)
            .user(user.as_str())
    }

    fn grab(&self, request: Request) -> u16 {
        let response = self
            .runtime
            .block_on(handler(&self.deps, request))
            .expect("the handler never fails");
        black_box(response.body());
        response.status().as_u16()
    }

    /// A bench whose every grab must answer `expected` (or the numbers would measure
    /// another path than the one named).
    fn run<M: Measurement>(&self, group: &mut BenchmarkGroup<'_, M>, name: &str, expected: u16) {
        group.bench_function(name, |b| {
            b.iter_batched(
                || self.event().into_request(),
                |request| assert_eq!(self.grab(request), expected),
                BatchSize::SmallInput,
            );
        });
        group.bench_function(format!("{name}_from_event"), |b| {
            b.iter_batched(
                || self.event().to_value().to_string(),
                |event| {
                    let request = lambda_http::request::from_str(&event).expect("an event");
                    assert_eq!(self.grab(request), expected);
                },
                BatchSize::SmallInput,
            );
        });
    }
}

/// Sold out, and this process knows it: one loser's grab settles every shard's mark.
fn sold_out() -> Bench {
    let bench = Bench::new(1, 1);
    assert_eq!(bench.grab(bench.event().into_request()), 202);
    assert_eq!(bench.grab(bench.event().into_request()), 409);
    bench
}

/// Stock for every success the bench can make (criterion's runs stay far below it;
/// the status check would catch one that did not), on the shards such a sale has: a
/// shard holds at most 250 units, so a million needs all 4,000, and each grab's plan
/// walks them.
fn stocked() -> Bench {
    Bench::new(1_000_000, i64::from(MAX_SHARDS))
}

fn grab_paths<M: Measurement>(c: &mut Criterion<M>, group_name: &str) {
    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(1));
    sold_out().run(&mut group, "sold_out_rejection", 409);
    stocked().run(&mut group, "success", 202);
    group.finish();
}

fn challenge<M: Measurement>(c: &mut Criterion<M>) {
    use flashsale_adapters::proof_of_work::{AltchaChallenges, DERIVATION_COST, solve};
    use flashsale_domain::challenge::ChallengeWork;
    use flashsale_domain::ports::ProofOfWork;

    let signer = GrabTokenSigner::new(SECRET.as_bytes().to_vec()).expect("a long secret");
    let challenges = AltchaChallenges::new(&signer);
    let sale = SaleId::parse("bench").expect("valid");
    let user = UserId::parse("bench-user").expect("valid");
    let now = Utc::now();
    let expires = now + Duration::minutes(5);
    let work = ChallengeWork::of_setting("work", 1_000)
        .expect("in range")
        .expect("on");
    let issued = challenges.issue(&sale, &user, work, now, expires);
    let (solution, _) = solve(&issued).expect("solvable");
    assert!(challenges.verify(&solution, &sale, &user, now).is_ok());

    let mut group = c.benchmark_group("challenge_cpu");
    group.throughput(Throughput::Elements(1));
    group.bench_function("issue", |b| {
        b.iter(|| black_box(challenges.issue(&sale, &user, work, now, expires)));
    });
    group.bench_function("verify", |b| {
        b.iter(|| black_box(challenges.verify(black_box(&solution), &sale, &user, now)));
    });
    // One PBKDF2-SHA-256 derivation at the challenge's cost, as the crate runs it.
    let mut key = [0u8; 32];
    group.bench_function(format!("one_derivation_cost_{DERIVATION_COST}"), |b| {
        b.iter(|| {
            pbkdf2::pbkdf2_hmac::<sha2::Sha256>(
                black_box(b"0123456789abcdef\0\0\0\x2a"),
                black_box(b"salt-of-sixteen!"),
                DERIVATION_COST,
                &mut key,
            );
            black_box(key)
        });
    });
    group.finish();
}

fn settings<M: Measurement>(c: Criterion<M>) -> Criterion<M> {
    c.sample_size(30)
        .warm_up_time(StdDuration::from_secs(1))
        .measurement_time(StdDuration::from_secs(3))
        .configure_from_args()
}

fn main() {
    let mut cpu = settings(Criterion::default().with_measurement(ThreadCpuTime { wall: WallTime }));
    grab_paths(&mut cpu, "grab_cpu");
    challenge(&mut cpu);
    let mut wall = settings(Criterion::default());
    grab_paths(&mut wall, "grab_wall");
    Criterion::default().configure_from_args().final_summary();
}
