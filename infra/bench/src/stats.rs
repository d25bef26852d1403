//! Percentiles of measured durations.

use std::time::Duration;

use serde::Serialize;

/// Nearest-rank percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// `None` for an empty sample.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        sorted.sort_by(f64::total_cmp);
        let max = *sorted.last()?;
        let rank = |p: f64| {
            // Nearest rank: the smallest value with at least p of the sample at or below it.
            let index = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[index]
        };
        Some(Self {
            count: sorted.len(),
            p50_ms: rank(0.50),
            p90_ms: rank(0.90),
            p95_ms: rank(0.95),
            p99_ms: rank(0.99),
            max_ms: max,
        })
    }
}

/// Per-second rate of `count` events over `elapsed` (0 when nothing elapsed).
pub fn per_second(count: usize, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_one_to_a_hundred_ms() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples).expect("non-empty");
        assert_eq!(p.count, 100);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p95_ms, 95.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
    }

    #[test]
    fn an_empty_sample_has_no_percentiles_and_a_single_one_is_every_percentile() {
        assert_eq!(Percentiles::of(&[]), None);
        let one = Percentiles::of(&[Duration::from_millis(7)]).expect("one");
        assert_eq!((one.p50_ms, one.p99_ms, one.max_ms), (7.0, 7.0, 7.0));
    }
}
