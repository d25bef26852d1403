//! The functions' business metrics, locally. On AWS they are EMF lines that CloudWatch
//! turns into metrics; here the functions run in-process, so the same `metrics` calls
//! land in this recorder instead, which keeps every series since the stack started:
//! `GET /local/metrics` answers a JSON summary, and `make run` prints a live line.
//!
//! The series are keyed by name and labels exactly as on AWS, minus the `function`
//! dimension, which the EMF collector adds per process (every metric name belongs to
//! one function anyway).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use ::metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use axum::Json;
use metrics_util::registry::{AtomicStorage, Registry};
use serde::{Deserialize, Serialize};

/// The process's recorder of every metric the functions record.
pub struct LocalMetrics {
    registry: Registry<Key, AtomicStorage>,
}

/// One counter or gauge series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One histogram series, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// What `GET /local/metrics` answers, sorted by name then labels.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub counters: Vec<Series>,
    pub gauges: Vec<Series>,
    pub histograms: Vec<Distribution>,
}

impl Summary {
    /// The value of the counter `name` whose labels include every pair of `labels`,
    /// summed over the series that match (0 when none does).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.counters
            .iter()
            .filter(|series| series.name == name && has_labels(&series.labels, labels))
            .map(|series| series.value)
            .sum()
    }
}

fn has_labels(have: &BTreeMap<String, String>, want: &[(&str, &str)]) -> bool {
    want.iter()
        .all(|(key, value)| have.get(*key).is_some_and(|v| v == value))
}

fn labels_of(key: &Key) -> BTreeMap<String, String> {
    key.labels()
        .map(|label| (label.key().to_owned(), label.value().to_owned()))
        .collect()
}

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl LocalMetrics {
    /// Installs the recorder for this process, once; later calls (a second stack in
    /// the same test process) get the same one. `None` if another recorder was
    /// installed first, in which case the metrics go there.
    pub fn install() -> Option<&'static Self> {
        static INSTALLED: OnceLock<Option<&'static LocalMetrics>> = OnceLock::new();
        *INSTALLED.get_or_init(|| {
            let local: &'static Self = Box::leak(Box::new(Self {
                registry: Registry::atomic(),
            }));
            match ::metrics::set_global_recorder(Installed(local)) {
                Ok(()) => Some(local),
                Err(error) => {
                    tracing::warn!(%error, "another metrics recorder is installed; /local/metrics stays empty");
                    None
                }
            }
        })
    }

    pub fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        self.registry.visit_counters(|key, counter| {
            summary.counters.push(Series {
                name: key.name().to_owned(),
                labels: labels_of(key),
                value: counter.load(Ordering::Relaxed) as f64,
            });
        });
        self.registry.visit_gauges(|key, gauge| {
            summary.gauges.push(Series {
                name: key.name().to_owned(),
                labels: labels_of(key),
                value: f64::from_bits(gauge.load(Ordering::Relaxed)),
            });
        });
        self.registry.visit_histograms(|key, histogram| {
            let mut values = histogram.data();
            values.sort_by(f64::total_cmp);
            summary.histograms.push(Distribution {
                name: key.name().to_owned(),
                labels: labels_of(key),
                count: values.len(),
                p50: quantile(&values, 0.5),
                p99: quantile(&values, 0.99),
                max: values.last().copied().unwrap_or(0.0),
            });
        });
        let order = |a: &Series, b: &Series| (&a.name, &a.labels).cmp(&(&b.name, &b.labels));
        summary.counters.sort_by(order);
        summary.gauges.sort_by(order);
        summary
            .histograms
            .sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        summary
    }

    /// The terminal's live line: the funnel and the order flow, summed over sales.
    pub fn live_line(&self) -> String {
        let summary = self.summary();
        let grabs = |reason| summary.counter("grab_outcome", &[("reason", reason)]);
        let total = |name| summary.counter(name, &[]);
        let refused: f64 = summary
            .counters
            .iter()
            .filter(|series| series.name == "grab_outcome")
            .filter(|series| {
                !matches!(
                    series.labels.get("reason").map(String::as_str),
                    Some("reserved" | "resumed" | "sold_out_gate" | "sold_out_database")
                )
            })
            .map(|series| series.value)
            .sum();
        let lag_p99 = summary
            .histograms
            .iter()
            .filter(|h| h.name == "release_lag_seconds")
            .map(|h| h.p99)
            .fold(0.0, f64::max);
        format!(
            "metrics | grabs: reserved {} resumed {} sold_out gate {} db {} refused {} | reached db {} conflicts retried {} | orders: opened {} paid {} cancelled {} expired {} (lag p99 {lag_p99:.1}s) | repairs {} | dlq {}",
            grabs("reserved"),
            grabs("resumed"),
            grabs("sold_out_gate"),
            grabs("sold_out_database"),
            refused,
            total("grab_reached_database"),
            total("transaction_conflicts_retried"),
            total("orders_opened"),
            total("orders_paid"),
            total("orders_cancelled"),
            total("orders_expired"),
            total("reconciler_released"),
            total("dlq_parked"),
        )
    }

    /// Prints [`Self::live_line`] every `every` while it changes: quiet when no
    /// traffic flows, one line per interval during a surge.
    pub fn print_while_changing(&'static self, every: std::time::Duration) {
        tokio::spawn(async move {
            let mut last = String::new();
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let line = self.live_line();
                if line != last {
                    println!("{line}");
                    last = line;
                }
            }
        });
    }
}

/// `GET /local/metrics`.
pub async fn serve() -> Json<Summary> {
    Json(
        LocalMetrics::install()
            .map(LocalMetrics::summary)
            .unwrap_or_default(),
    )
}

/// The global recorder: a handle on the one [`LocalMetrics`].
struct Installed(&'static LocalMetrics);

impl Recorder for Installed {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .registry
            .get_or_create_counter(key, |counter| Counter::from_arc(counter.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .registry
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(gauge.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .registry
            .get_or_create_histogram(key, |histogram| Histogram::from_arc(histogram.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
