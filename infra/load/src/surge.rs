//! A surge of buyers on one sale: every buyer fetches a grab path, then all grabs are
//! released at once. The report counts what each attempt got, so a test can assert the
//! invariant (exactly the stock reserved, nobody twice) and the load tool can print it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use tokio::sync::Barrier;

use flashsale_domain::challenge::IssuedChallenge;
use nix::time::{ClockId, clock_gettime};

use crate::client::{ApiClient, ApiResponse, ClientError, expect_status};

/// Who grabs, and how often.
#[derive(Debug, Clone)]
pub struct SurgePlan {
    pub sale_id: String,
    /// Distinct buyers.
    pub buyers: usize,
    /// Grab attempts in all; attempts beyond `buyers` are second tries by the first
    /// buyers, fired at the same moment, to test the per-user limit under contention.
    pub attempts: usize,
    /// Buyers' names are `{user_prefix}-{n}`, so runs on one stack do not share buyers.
    pub user_prefix: String,
    /// How often a buyer repeats an attempt answered 429 (the gateway's throttle) or
    /// 503 (a backend over budget), with jittered backoff, as a well-behaved client
    /// honouring `Retry-After` would. The answer that ends the attempt is counted.
    pub retries_when_unavailable: u32,
    /// How many token and grab-path requests are in flight while preparing.
    pub preparation_concurrency: usize,
    /// The sale asks for a solved challenge: each attempt fetches one and solves it in
    /// Rust before its token request, paying the CPU a scripted buyer pays.
    pub challenge: bool,
}

/// One challenge solved before a token request: the derivations the search made, and
/// the CPU time it took on its thread (its share of a core, whatever else runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Solve {
    pub derivations: u32,
    pub cpu: Duration,
}

/// What one grab attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Reserved { order_id: String },
    Refused { status: u16, code: String },
}

/// Everything a surge observed.
#[derive(Debug, Clone, Default)]
pub struct SurgeReport {
    pub attempts: usize,
    /// Order ids reserved, by buyer.
    pub reserved: BTreeMap<String, Vec<String>>,
    /// Refusals by `"{status} {code}"`.
    pub refused: BTreeMap<String, usize>,
    /// From the release of the first grab to the answer of the last.
    pub duration: Duration,
    /// Latency of each attempt, retries included, sorted.
    pub latencies: Vec<Duration>,
    /// Answers that were retried: 429 from the gateway's throttle, 503 from the grab.
    pub throttled: usize,
    pub unavailable: usize,
    /// Requests that never got an answer (a reset connection) and were sent again.
    pub transport_errors: usize,
    /// Every answer of the grab route, retried ones included, in arrival order.
    pub grab_answers: Vec<GrabAnswer>,
    /// Latency of each grab-path request (`POST /sales/{id}/token`), retries apart.
    pub token_latencies: Vec<Duration>,
    /// The challenges solved, one per attempt, when the sale asks for them.
    pub solves: Vec<Solve>,
}

/// One answer of the grab route: when it came (from the release of the grabs), how
/// long its request took, and what it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrabAnswer {
    pub at: Duration,
    pub latency: Duration,
    pub kind: String,
}

/// The name of an answer in reports: `reserved`, `sold_out`, `limit_reached`,
/// `throttled` (429), `unavailable` (503), `transport_error`, or `"{status} {code}"`.
pub fn answer_kind(status: u16, code: Option<&str>) -> String {
    match (status, code) {
        (202, _) => "reserved".to_owned(),
        (429, _) => "throttled".to_owned(),
        (503, _) => "unavailable".to_owned(),
        (0, _) => "transport_error".to_owned(),
        (_, Some(code @ ("sold_out" | "limit_reached"))) => code.to_owned(),
        (status, code) => format!("{status} {}", code.unwrap_or("none")),
    }
}

impl SurgeReport {
    pub fn reserved_count(&self) -> usize {
        self.reserved.values().map(Vec::len).sum()
    }

    pub fn refused_with(&self, code: &str) -> usize {
        self.refused
            .iter()
            .filter(|(key, _)| key.ends_with(&format!(" {code}")))
            .map(|(_, count)| count)
            .sum()
    }

    /// Buyers holding more than one unit.
    pub fn buyers_with_more_than_one(&self) -> Vec<&str> {
        self.reserved
            .iter()
            .filter(|(_, orders)| orders.len() > 1)
            .map(|(buyer, _)| buyer.as_str())
            .collect()
    }

    pub fn latency_percentile(&self, percentile: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let last = self.latencies.len() - 1;
        // Nearest rank: truncation is the intent.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((percentile / 100.0) * last as f64).round() as usize;
        self.latencies[rank.min(last)]
    }
}

impl std::fmt::Display for SurgeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seconds = self.duration.as_secs_f64().max(f64::EPSILON);
        #[allow(clippy::cast_precision_loss)]
        let rate = self.attempts as f64 / seconds;
        writeln!(
            f,
            "{} attempts in {:.2} s ({rate:.0}/s): {} reserved",
            self.attempts,
            self.duration.as_secs_f64(),
            self.reserved_count()
        )?;
        for (refusal, count) in &self.refused {
            writeln!(f, "  {count:>6}  {refusal}")?;
        }
        writeln!(
            f,
            "  retried: {} throttled (429), {} unavailable (503), {} connection errors",
            self.throttled, self.unavailable, self.transport_errors
        )?;
        write!(
            f,
            "latency p50 {:?}  p99 {:?}  max {:?}",
            self.latency_percentile(50.0),
            self.latency_percentile(99.0),
            self.latency_percentile(100.0)
        )
    }
}

/// One grab attempt, ready to fire: a buyer and a grab path of their own. A buyer's
/// second attempt has a second path: a path names one order, so reusing it would be
/// a retry of the first attempt, not a second try at the limit.
struct Attempt {
    buyer: String,
    token: String,
    grab_path: String,
}

/// Prepares every buyer (a local token, a grab path), releases all grabs at once, and
/// reports. `on_answer` is called after each attempt, e.g. to move a progress bar.
pub async fn run(
    client: &ApiClient,
    plan: &SurgePlan,
    on_answer: impl Fn(&Outcome) + Send + Sync,
) -> Result<SurgeReport, ClientError> {
    let concurrency = plan.preparation_concurrency.max(1);
    let tokens: Vec<(String, String)> = stream::iter(0..plan.buyers)
        .map(|n| async move {
            let buyer = format!("{}-{n}", plan.user_prefix);
            let token = client.local_token(&buyer, false).await?;
            Ok::<_, ClientError>((buyer, token))
        })
        .buffered(concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    run_prepared(client, plan, &tokens, on_answer).await
}

/// The surge with buyers' tokens already in hand (`(buyer, token)`, one per buyer):
/// attempt `n` is made by buyer `n mod buyers`.
pub async fn run_prepared(
    client: &ApiClient,
    plan: &SurgePlan,
    tokens: &[(String, String)],
    on_answer: impl Fn(&Outcome) + Send + Sync,
) -> Result<SurgeReport, ClientError> {
    let concurrency = plan.preparation_concurrency.max(1);
    let prepared: Vec<Prepared> = stream::iter(0..plan.attempts)
        .map(|attempt| {
            let (buyer, token) = tokens[attempt % tokens.len().max(1)].clone();
            prepare_attempt(client, plan, buyer, token)
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;

    let mut token_latencies = Vec::with_capacity(plan.attempts);
    let mut solves = Vec::new();
    let prepared: Vec<Attempt> = prepared
        .into_iter()
        .map(|prepared| {
            token_latencies.extend(prepared.token_latencies);
            solves.extend(prepared.solve);
            prepared.attempt
        })
        .collect();

    let grabber = Grabber::new(client.base_url());
    let barrier = Arc::new(Barrier::new(plan.attempts + 1));
    // Every task reads the release instant the main task sets after the barrier opens.
    let released_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut attempts = Vec::with_capacity(plan.attempts);
    for attempt in prepared {
        let grabber = grabber.clone();
        let barrier = Arc::clone(&barrier);
        let released_at = Arc::clone(&released_at);
        let retries = plan.retries_when_unavailable;
        attempts.push(tokio::spawn(async move {
            barrier.wait().await;
            let started = Instant::now();
            let released = *released_at.get_or_init(Instant::now);
            let outcome = grabber.grab(&attempt, retries, released).await;
            (attempt.buyer, outcome, started.elapsed())
        }));
    }
    barrier.wait().await;
    let released = *released_at.get_or_init(Instant::now);

    let mut report = SurgeReport {
        attempts: plan.attempts,
        token_latencies,
        solves,
        ..SurgeReport::default()
    };
    for attempt in attempts {
        let (buyer, answer, latency) = attempt.await.expect("a grab task panicked");
        let Answer {
            outcome,
            throttled,
            unavailable,
            transport_errors,
            answers,
        } = answer?;
        report.grab_answers.extend(answers);
        report.throttled += throttled;
        report.unavailable += unavailable;
        report.transport_errors += transport_errors;
        on_answer(&outcome);
        report.latencies.push(latency);
        match outcome {
            Outcome::Reserved { order_id } => {
                report.reserved.entry(buyer).or_default().push(order_id);
            }
            Outcome::Refused { status, code } => {
                *report
                    .refused
                    .entry(format!("{status} {code}"))
                    .or_default() += 1;
            }
        }
    }
    report.duration = released.elapsed();
    report.latencies.sort();
    report.grab_answers.sort_by_key(|answer| answer.at);
    Ok(report)
}

/// An attempt made ready: its grab path, what the token requests took, and the
/// challenge solved for it.
struct Prepared {
    attempt: Attempt,
    token_latencies: Vec<Duration>,
    solve: Option<Solve>,
}

/// Fetches a grab path for one attempt, solving the sale's challenge first if it asks
/// for one.
async fn prepare_attempt(
    client: &ApiClient,
    plan: &SurgePlan,
    buyer: String,
    token: String,
) -> Result<Prepared, ClientError> {
    let (solution, solve) = if plan.challenge {
        let path = format!("/sales/{}/challenge", plan.sale_id);
        let (issued, _) = retrying_busy(plan, || {
            client.send(reqwest::Method::GET, &path, Some(&token), None)
        })
        .await?;
        expect_status(&issued, StatusCode::OK, "/sales/{sale_id}/challenge")?;
        let (solution, solve) = solved(issued.body).await?;
        (Some(solution), Some(solve))
    } else {
        (None, None)
    };
    let path = format!("/sales/{}/token", plan.sale_id);
    let (pass, token_latencies) = retrying_busy(plan, || {
        client.send(
            reqwest::Method::POST,
            &path,
            Some(&token),
            solution.as_ref(),
        )
    })
    .await?;
    expect_status(&pass, StatusCode::OK, "/sales/{sale_id}/token")?;
    let grab_path = pass
        .str_field("grab_path")
        .expect("a 200 token answer carries a grab path")
        .to_owned();
    Ok(Prepared {
        attempt: Attempt {
            buyer,
            token,
            grab_path,
        },
        token_latencies,
        solve,
    })
}

/// Sends a preparation request until it is not throttled (429) or busy (503), or the
/// plan's retries are spent, with the latency of each request sent.
async fn retrying_busy<F, Fut>(
    plan: &SurgePlan,
    mut send: F,
) -> Result<(ApiResponse, Vec<Duration>), ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<ApiResponse, ClientError>>,
{
    let mut retry = 0;
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        let sent = send().await;
        latencies.push(started.elapsed());
        let answer = match sent {
            Ok(answer) => answer,
            Err(ClientError::Http { .. }) if retry < plan.retries_when_unavailable => {
                tokio::time::sleep(backoff(retry)).await;
                retry += 1;
                continue;
            }
            Err(error) => return Err(error),
        };
        // Each preparation route has its own throttle: come back later.
        let transient = matches!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        if transient && retry < plan.retries_when_unavailable {
            tokio::time::sleep(backoff(retry)).await;
            retry += 1;
            continue;
        }
        return Ok((answer, latencies));
    }
}

/// Solves an issued challenge off the async threads, timing it on the solving thread's
/// CPU clock: with more solves than cores, wall time would count the waits for a core.
async fn solved(issued: serde_json::Value) -> Result<(serde_json::Value, Solve), ClientError> {
    tokio::task::spawn_blocking(move || {
        let issued = IssuedChallenge(issued);
        let started = thread_cpu();
        let solved = flashsale_adapters::proof_of_work::solve(&issued);
        let cpu = thread_cpu().saturating_sub(started);
        let (solution, derivations) = solved.ok_or(ClientError::Unsolvable {
            challenge: issued.0,
        })?;
        Ok((solution, Solve { derivations, cpu }))
    })
    .await
    .expect("a solve panicked")
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let now = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("a thread CPU clock");
    Duration::from(now)
}

/// The final outcome of one attempt and the retried answers on the way.
struct Answer {
    outcome: Outcome,
    throttled: usize,
    unavailable: usize,
    transport_errors: usize,
    answers: Vec<GrabAnswer>,
}

/// The header that tells the grab function a request is a retry of the same grab path
/// (its value counts the retries, from 1), so only a retry pays for looking up an order
/// an earlier, unanswered attempt may have made.
pub const RETRY_ATTEMPT_HEADER: &str = "x-retry-attempt";

/// Sends grabs itself rather than through [`ApiClient`]: a retry must carry
/// [`RETRY_ATTEMPT_HEADER`], and a 429 or 503 its `Retry-After`, which the plain
/// client neither sends nor shows.
#[derive(Clone)]
struct Grabber {
    http: reqwest::Client,
    base_url: String,
}

/// One answer of the grab route as the wire gave it.
struct WireAnswer {
    status: StatusCode,
    body: serde_json::Value,
    retry_after: Option<Duration>,
}

impl Grabber {
    fn new(base_url: &str) -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .build()
            .expect("a client with default TLS settings builds");
        Self {
            http,
            base_url: base_url.to_owned(),
        }
    }

    async fn send(&self, attempt: &Attempt, retry: u32) -> Result<WireAnswer, ClientError> {
        let path = &attempt.grab_path;
        let mut request = self
            .http
            .post(format!("{}{path}", self.base_url))
            .bearer_auth(&attempt.token);
        if retry > 0 {
            request = request.header(RETRY_ATTEMPT_HEADER, retry.to_string());
        }
        let http_error = |source| ClientError::Http {
            path: path.clone(),
            source,
        };
        let response = request.send().await.map_err(http_error)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_retry_after);
        let bytes = response.bytes().await.map_err(http_error)?;
        let body = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|_| ClientError::NotJson {
                path: path.clone(),
                status,
                body: String::from_utf8_lossy(&bytes).into_owned(),
            })?
        };
        Ok(WireAnswer {
            status,
            body,
            retry_after,
        })
    }

    async fn grab(
        &self,
        attempt: &Attempt,
        retries: u32,
        released: Instant,
    ) -> Result<Answer, ClientError> {
        let mut answer = Answer {
            outcome: Outcome::Refused {
                status: 0,
                code: String::new(),
            },
            throttled: 0,
            unavailable: 0,
            transport_errors: 0,
            answers: Vec::new(),
        };
        for retry in 0..=retries {
            let started = Instant::now();
            let sent = self.send(attempt, retry).await;
            let record = |kind: String| GrabAnswer {
                at: released.elapsed(),
                latency: started.elapsed(),
                kind,
            };
            let response = match sent {
                Ok(response) => response,
                // A connection reset under the surge: the path names one order, so
                // sending it again is safe whether or not the first one arrived.
                Err(ClientError::Http { .. }) if retry < retries => {
                    answer.transport_errors += 1;
                    answer.answers.push(record(answer_kind(0, None)));
                    tokio::time::sleep(retry_delay(retry, None)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let code = response
                .body
                .get("error")
                .and_then(serde_json::Value::as_str);
            answer
                .answers
                .push(record(answer_kind(response.status.as_u16(), code)));
            let retryable = match response.status {
                StatusCode::TOO_MANY_REQUESTS => {
                    answer.throttled += 1;
                    true
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    answer.unavailable += 1;
                    true
                }
                _ => false,
            };
            let order_id = response
                .body
                .get("order_id")
                .and_then(serde_json::Value::as_str);
            answer.outcome = match order_id {
                Some(order_id) if response.status == StatusCode::ACCEPTED => Outcome::Reserved {
                    order_id: order_id.to_owned(),
                },
                _ => Outcome::Refused {
                    status: response.status.as_u16(),
                    code: code.unwrap_or("none").to_owned(),
                },
            };
            if !retryable || retry == retries {
                break;
            }
            tokio::time::sleep(retry_delay(retry, response.retry_after)).await;
        }
        Ok(answer)
    }
}

/// `Retry-After` in delay-seconds. (An HTTP date is allowed too, but neither API
/// Gateway nor the functions send one.)
fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The pause before retry `retry + 1`: what the server asked for, if it did, plus
/// jitter so that buyers told the same second do not all return in it; else the
/// jittered backoff.
pub fn retry_delay(retry: u32, retry_after: Option<Duration>) -> Duration {
    match retry_after {
        Some(asked) => asked + backoff(retry),
        None => backoff(retry),
    }
}

/// Full jitter, doubling from 20 ms up to 2 s: retries spread out instead of
/// returning to the gateway in step.
pub fn backoff(retry: u32) -> Duration {
    use rand::Rng as _;
    let ceiling = 20_u64.saturating_mul(1 << retry.min(7)).min(2000);
    Duration::from_millis(rand::rng().random_range(0..=ceiling))
}

/// Buyers by how many orders they reserved, for quick assertions.
pub fn reservations_per_buyer(report: &SurgeReport) -> HashMap<usize, usize> {
    let mut histogram = HashMap::new();
    for orders in report.reserved.values() {
        *histogram.entry(orders.len()).or_default() += 1;
    }
    histogram
}
