//! The load tool's JSON report: what was asked, what every answer was, how fast, and
//! what the audit found.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::surge::{GrabAnswer, Outcome, Solve, SurgeReport};

use crate::audit::Check;

/// What a run was asked to do (echoed in the report, so a report stands alone).
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    pub api_url: String,
    pub sale_id: String,
    pub stock: u32,
    pub shards: u16,
    pub per_user_limit: u32,
    pub buyers: usize,
    pub attempts: usize,
    pub retries: u32,
    pub payment_timeout_secs: u32,
    pub pay_ratio: f64,
    /// Stripe's API, where the run confirms its card payments.
    pub stripe_api: String,
    pub await_expiry: bool,
    pub token_source: String,
    /// The sale's challenge (derivations at most), solved by the tool before every
    /// token request; `None`: the sale asks none.
    pub challenge_work: Option<u32>,
}

/// Latency percentiles of one route, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (any order).
    pub fn of(samples: &[Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        sorted.sort_by(f64::total_cmp);
        #[allow(clippy::cast_precision_loss)]
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Self {
            count: sorted.len(),
            p50_ms: nearest_rank(&sorted, 50.0),
            p90_ms: nearest_rank(&sorted, 90.0),
            p99_ms: nearest_rank(&sorted, 99.0),
            max_ms: sorted[sorted.len() - 1],
            mean_ms: mean,
        }
    }
}

/// The smallest sample with at least `percentile`% of the samples at or below it.
fn nearest_rank(sorted: &[f64], percentile: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((percentile / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Answers of one second after the release, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Second {
    pub second: u64,
    pub answers: BTreeMap<String, usize>,
}

/// Answers per whole second after the release, every second present (empty ones too,
/// so a plot's x axis is time).
pub fn timeline(answers: &[GrabAnswer]) -> Vec<Second> {
    let Some(last) = answers.iter().map(|answer| answer.at.as_secs()).max() else {
        return Vec::new();
    };
    let mut seconds: Vec<Second> = (0..=last)
        .map(|second| Second {
            second,
            answers: BTreeMap::new(),
        })
        .collect();
    for answer in answers {
        let second = usize::try_from(answer.at.as_secs()).expect("a second fits usize");
        *seconds[second]
            .answers
            .entry(answer.kind.clone())
            .or_default() += 1;
    }
    seconds
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    pub surge_secs: f64,
    /// Grab attempts answered per second (the answer that ended each attempt).
    pub attempts_per_sec: f64,
    /// Every grab answer per second, retried ones included.
    pub answers_per_sec: f64,
    pub reservations_per_sec: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Routes {
    /// `POST /sales/{id}/token`.
    pub token: Percentiles,
    /// `POST /sales/{id}/grab/{token}`, each request on its own.
    pub grab: Percentiles,
    /// A grab attempt from its first request to its final answer, retries included.
    pub grab_attempt: Percentiles,
    /// A card payment, when the run pays: `POST /orders/{id}/payment`, Stripe's
    /// confirm, then `POST /orders/{id}/payment/confirm`.
    pub pay: Percentiles,
}

/// The whole report (`--report out.json`).
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub config: RunConfig,
    /// The answer that ended each attempt, by kind.
    pub outcomes: BTreeMap<String, usize>,
    /// Every grab answer, retried ones included, by kind.
    pub answers: BTreeMap<String, usize>,
    pub reserved: usize,
    pub buyers_with_orders: usize,
    pub paid: usize,
    /// Orders the run tried to pay after their window had closed.
    pub lapsed_before_payment: usize,
    pub routes: Routes,
    pub throughput: Throughput,
    pub timeline: Vec<Second>,
    pub stats_after_surge: serde_json::Value,
    pub stats_final: serde_json::Value,
    pub audit: Vec<Check>,
    pub audit_passed: bool,
    /// What solving the sale's challenges cost this tool, as they cost a scripted buyer.
    pub challenge: Option<ChallengeCost>,
    /// Each grab request's latency, for the histogram (the JSON keeps percentiles).
    #[serde(skip)]
    pub grab_latencies: Vec<Duration>,
}

/// The challenges one run solved in Rust: what a buyer scripted in native code pays for
/// a grab path, per solve and per core.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChallengeCost {
    pub solves: usize,
    /// Derivations (hashes) per solve: the search stops at the secret number, which is
    /// uniform up to the work, so about half of it on average.
    pub derivations_mean: f64,
    pub derivations_p50: f64,
    pub derivations_p90: f64,
    /// CPU time per solve on the solving thread.
    pub cpu_ms: Percentiles,
    /// Solves per second of one core: solves over the CPU time they took.
    pub solves_per_core_second: f64,
    pub derivations_per_core_second: f64,
}

impl ChallengeCost {
    /// `None` for a run that solved nothing.
    pub fn of(solves: &[Solve]) -> Option<Self> {
        if solves.is_empty() {
            return None;
        }
        let mut derivations: Vec<f64> = solves.iter().map(|s| f64::from(s.derivations)).collect();
        derivations.sort_by(f64::total_cmp);
        let total_derivations: f64 = derivations.iter().sum();
        let cpu: Vec<Duration> = solves.iter().map(|s| s.cpu).collect();
        let cpu_secs: f64 = cpu.iter().map(Duration::as_secs_f64).sum::<f64>().max(1e-9);
        #[allow(clippy::cast_precision_loss)]
        let count = solves.len() as f64;
        Some(Self {
            solves: solves.len(),
            derivations_mean: total_derivations / count,
            derivations_p50: nearest_rank(&derivations, 50.0),
            derivations_p90: nearest_rank(&derivations, 90.0),
            cpu_ms: Percentiles::of(&cpu),
            solves_per_core_second: count / cpu_secs,
            derivations_per_core_second: total_derivations / cpu_secs,
        })
    }
}

/// The kind of each attempt's final outcome.
pub fn outcome_kinds(surge: &SurgeReport) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let reserved = surge.reserved_count();
    if reserved > 0 {
        kinds.insert("reserved".to_owned(), reserved);
    }
    for (refusal, count) in &surge.refused {
        let (status, code) = refusal.split_once(' ').unwrap_or((refusal, "none"));
        let kind = crate::surge::answer_kind(status.parse().unwrap_or(0), Some(code));
        *kinds.entry(kind).or_default() += count;
    }
    kinds
}

/// Counts of answers by kind.
pub fn answer_kinds(answers: &[GrabAnswer]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for answer in answers {
        *kinds.entry(answer.kind.clone()).or_default() += 1;
    }
    kinds
}

pub fn throughput(surge: &SurgeReport) -> Throughput {
    let secs = surge.duration.as_secs_f64();
    let per_sec = |n: usize| {
        #[allow(clippy::cast_precision_loss)]
        let n = n as f64;
        if secs > 0.0 { n / secs } else { 0.0 }
    };
    Throughput {
        surge_secs: secs,
        attempts_per_sec: per_sec(surge.attempts),
        answers_per_sec: per_sec(surge.grab_answers.len()),
        reservations_per_sec: per_sec(surge.reserved_count()),
    }
}

/// Whether an outcome counts as a reservation (for progress displays).
pub fn is_reserved(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Reserved { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let p = Percentiles::of(&samples);
        assert_eq!(p.count, 100);
        assert!((p.p50_ms - 50.0).abs() < 1e-9, "{p:?}");
        assert!((p.p90_ms - 90.0).abs() < 1e-9, "{p:?}");
        assert!((p.p99_ms - 99.0).abs() < 1e-9, "{p:?}");
        assert!((p.max_ms - 100.0).abs() < 1e-9, "{p:?}");
        assert!((p.mean_ms - 50.5).abs() < 1e-9, "{p:?}");
        let one = Percentiles::of(&[ms(7)]);
        assert!((one.p50_ms - 7.0).abs() < 1e-9 && (one.p99_ms - 7.0).abs() < 1e-9);
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn the_timeline_has_every_second_even_empty_ones() {
        let answer = |at_ms: u64, kind: &str| GrabAnswer {
            at: ms(at_ms),
            latency: ms(1),
            kind: kind.to_owned(),
        };
        let seconds = timeline(&[
            answer(10, "reserved"),
            answer(900, "throttled"),
            answer(950, "reserved"),
            answer(2_100, "sold_out"),
        ]);
        assert_eq!(seconds.len(), 3);
        assert_eq!(seconds[0].answers["reserved"], 2);
        assert_eq!(seconds[0].answers["throttled"], 1);
        assert!(seconds[1].answers.is_empty());
        assert_eq!(seconds[2].answers["sold_out"], 1);
        assert!(timeline(&[]).is_empty());
    }

    #[test]
    fn outcomes_are_named_like_answers() {
        let mut surge = SurgeReport::default();
        surge.reserved.insert("a".into(), vec!["o1".into()]);
        surge.refused.insert("409 sold_out".into(), 3);
        surge.refused.insert("429 none".into(), 1);
        surge.refused.insert("403 blocked".into(), 2);
        let kinds = outcome_kinds(&surge);
        assert_eq!(kinds["reserved"], 1);
        assert_eq!(kinds["sold_out"], 3);
        assert_eq!(kinds["throttled"], 1);
        assert_eq!(kinds["403 blocked"], 2);
    }
}
