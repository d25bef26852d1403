//! `docs/benchmarks.md`: every number of one run, with the machine and the command.

use std::fmt::Write as _;

use serde::Serialize;

use crate::external::{CriterionResult, Measured, PipelineRun};
use crate::init::FunctionInit;
use crate::scenarios::{CallCost, LatenessReport, RejectionReport, SurgeLatencyReport};
use crate::stats::Percentiles;

/// Where and how the run happened.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub date: String,
    pub commit: String,
    pub command: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub memory: String,
    pub kernel: String,
}

impl Machine {
    pub fn probe(command: &str) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = read("/proc/meminfo");
        let memory = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or_else(
                || "unknown".to_owned(),
                |kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0),
            );
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let dirty = std::process::Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .output()
            .ok()
            .is_some_and(|out| !out.stdout.is_empty());
        Self {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            commit: if dirty {
                format!("{commit} (with uncommitted changes)")
            } else {
                commit
            },
            command: command.to_owned(),
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            memory,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub machine: Machine,
    pub smoke: bool,
    pub rejection: RejectionReport,
    pub pipeline: Vec<Measured<PipelineRun>>,
    pub handler: Measured<Vec<CriterionResult>>,
    pub redis_ops_per_sec: Measured<f64>,
    pub lateness: LatenessReport,
    /// Host-architecture binaries, with init times.
    pub bootstraps: Vec<FunctionInit>,
    pub bootstraps_built_as: String,
    /// cargo-lambda's deploy artifacts (arm64), sizes only, when built.
    pub deployed: Vec<FunctionInit>,
    pub deployed_arch: Option<String>,
    pub surge: SurgeLatencyReport,
}

fn ms(p: Option<&Percentiles>, pick: fn(&Percentiles) -> f64) -> String {
    p.map_or_else(|| "-".to_owned(), |p| format!("{:.1}", pick(p)))
}

fn outcomes(map: &std::collections::BTreeMap<String, usize>) -> String {
    map.iter()
        .map(|(k, v)| format!("{v} × {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn goal(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

fn mb(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / 1_000_000.0)
}

fn calls_table(out: &mut String, cost: &CallCost) {
    out.push_str(
        "| operation | calls in the window | idle background expected |\n|---|---:|---:|\n",
    );
    for (name, (seen, background)) in &cost.operations {
        let _ = writeln!(out, "| `{name}` | {seen} | {background:.1} |");
    }
    out.push('\n');
}

fn not_measured<T>(measured: &Measured<T>) -> Option<String> {
    match measured {
        Measured::Done(_) => None,
        Measured::NotAvailable(why) => Some(format!("not available: {why}")),
        Measured::Failed(why) => Some(format!("failed: {why}")),
    }
}

impl BenchReport {
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Benchmarks\n\nWritten by `{}` in one run{}. Every number below is from that run; \
             rerun it to refresh them.\n",
            m.command,
            if self.smoke {
                " (**smoke sizes**: it proves the steps work; the numbers mean little)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "| | |\n|---|---|\n| date | {} |\n| commit | `{}` |\n| command | `{}` |\n\
             | cores (`nproc`) | {} |\n| CPU | {} |\n| memory | {} |\n| kernel | {} |\n",
            m.date, m.commit, m.command, m.nproc, m.cpu_model, m.memory, m.kernel
        );
        out.push_str(
            "Calls are counted at the HTTP level by `flashsale-bench`'s pass-through proxies in \
             front of DynamoDB Local and the SQS/Scheduler emulator (by `X-Amz-Target`), not by \
             our code. The local stack runs as `flashsale-local` (release) with the gateway \
             throttles lifted. The idle background (the event source mapping's polls, the \
             Scheduler delivery, the reconciler, the blocklist refresh) is measured over an idle \
             window right after and subtracted, scaled to the window's length.\n\n",
        );
        self.rejection_section(&mut out);
        self.pipeline_section(&mut out);
        self.handler_section(&mut out);
        self.lateness_section(&mut out);
        self.bootstrap_section(&mut out);
        self.surge_section(&mut out);
        out
    }

    fn rejection_section(&self, out: &mut String) {
        let r = &self.rejection;
        let _ = writeln!(
            out,
            "## 1. Rejections after sell-out\n\nA sale of {} units sold out ({} reserved), then \
             {} first attempts (no `X-Retry-Attempt`) by new buyers at concurrency {}, then {} \
             marked retries (`X-Retry-Attempt: 1`).\n",
            r.stock, r.sold, r.first_attempts, r.concurrency, r.retries
        );
        let _ = writeln!(
            out,
            "| measure | value | goal |\n|---|---:|---|\n\
             | DynamoDB calls per rejected first attempt | {:.3} | 0.00: {} |\n\
             | SQS calls per rejected first attempt | {:.3} | 0.00: {} |\n\
             | DynamoDB reads per marked retry | {:.3} | ≤ 1: {} |\n\
             | DynamoDB calls per marked retry | {:.3} | |\n\
             | sold-out rejections/s through the local gateway | {:.0} | |\n\
             | rejection latency p50 / p99 (ms) | {} / {} | |\n",
            r.first_cost.dynamodb_per_request,
            goal(r.first_cost.dynamodb_per_request < 0.005),
            r.first_cost.sqs_per_request,
            goal(r.first_cost.sqs_per_request < 0.005),
            r.retry_cost.dynamodb_reads_per_request,
            goal(r.retry_cost.dynamodb_reads_per_request <= 1.0),
            r.retry_cost.dynamodb_per_request,
            r.rejections_per_sec,
            ms(r.first_latency.as_ref(), |p| p.p50_ms),
            ms(r.first_latency.as_ref(), |p| p.p99_ms),
        );
        let _ = writeln!(
            out,
            "First attempts answered: {}. Retries answered: {}.\n",
            outcomes(&r.first_outcomes),
            outcomes(&r.retry_outcomes)
        );
        let _ = writeln!(
            out,
            "Calls during the first attempts ({:.2} s; idle window {:.2} s):\n",
            r.window.elapsed.as_secs_f64(),
            r.idle.elapsed.as_secs_f64()
        );
        calls_table(out, &r.first_cost);
        out.push_str("Calls during the marked retries:\n\n");
        calls_table(out, &r.retry_cost);
    }

    fn pipeline_section(&self, out: &mut String) {
        out.push_str("## 2. Pipeline: grab successes/s against raw `TransactWriteItems`/s\n\n");
        out.push_str(
            "From `flashsale-pipeline` (flashsale-e2e), as it printed it. Goal: `ratio` ≥ 0.9 \
             with zero 503s at concurrency 8 and 32. `raw_reserve_open_per_s` runs, per unit, \
             the grab's transaction and then the consumer's (`OrderBook::open`) straight to \
             DynamoDB Local: the database work every unit sold through the pipeline costs. \
             DynamoDB Local runs one transaction at a time, so `ratio_to_reserve_open` near 1 \
             means the gateway, the functions and the queue add little beyond that work.\n\n",
        );
        for run in &self.pipeline {
            match run {
                Measured::Done(run) => {
                    let fields = run
                        .result
                        .iter()
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let _ = writeln!(out, "- concurrency {}: {fields}", run.concurrency);
                }
                other => {
                    let _ = writeln!(out, "- {}", not_measured(other).unwrap_or_default());
                }
            }
        }
        out.push('\n');
    }

    fn handler_section(&self, out: &mut String) {
        out.push_str("## 3. The grab handler against the seed's Redis Lua script\n\n");
        match &self.handler {
            Measured::Done(results) => {
                out.push_str("`cargo bench -p flashsale-grab --bench grab_handler` (criterion, I/O faked, one core):\n\n| benchmark | mean µs | per second |\n|---|---:|---:|\n");
                for r in results {
                    let _ = writeln!(
                        out,
                        "| `{}` | {:.2} | {:.0} |",
                        r.id,
                        r.mean_ns / 1e3,
                        r.per_second()
                    );
                }
                out.push('\n');
            }
            other => {
                let _ = writeln!(
                    out,
                    "Handler benchmark {}.\n",
                    not_measured(other).unwrap_or_default()
                );
            }
        }
        match &self.redis_ops_per_sec {
            Measured::Done(ops) => {
                let _ = writeln!(
                    out,
                    "Redis Lua deduction (`bench/redis_seed.sh`, redis-benchmark): **{ops:.0}/s**.\n"
                );
                if let Some(results) = self.handler.done() {
                    for r in results {
                        let _ = writeln!(
                            out,
                            "- `{}` / Redis: **{:.2}×**",
                            r.id,
                            r.per_second() / ops
                        );
                    }
                    out.push('\n');
                }
            }
            other => {
                let _ = writeln!(
                    out,
                    "Redis seed script {}.\n",
                    not_measured(other).unwrap_or_default()
                );
            }
        }
    }

    fn lateness_section(&self, out: &mut String) {
        let l = &self.lateness;
        let _ = writeln!(
            out,
            "## 4. Release lateness\n\n{} orders left unpaid with a payment window of {} s; {} \
             lapsed within the wait. Goal: p99 ≤ 5 s.\n",
            l.orders, l.payment_timeout_secs, l.lapsed
        );
        out.push_str("| measure | p50 s | p99 s | max s |\n|---|---:|---:|---:|\n");
        let row = |name: &str, p: Option<&Percentiles>| {
            format!(
                "| {name} | {} | {} | {} |\n",
                p.map_or("-".to_owned(), |p| format!("{:.1}", p.p50_ms / 1e3)),
                p.map_or("-".to_owned(), |p| format!("{:.1}", p.p99_ms / 1e3)),
                p.map_or("-".to_owned(), |p| format!("{:.1}", p.max_ms / 1e3)),
            )
        };
        out.push_str(&row("`expired_at` − `expires_at`", l.lateness.as_ref()));
        out.push_str(&row(
            "first 1 s poll that saw it expired − `expires_at` (upper bound)",
            l.observed.as_ref(),
        ));
        if let Some(note) = &l.note {
            let _ = writeln!(out, "\nNote: {note}.");
        }
        out.push('\n');
    }

    fn bootstrap_section(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## 5. Bootstraps: size and init\n\nInit: from spawning the binary ({}) under the \
             Runtime API emulator (`flashsale-runtime-emulator`) with the template's environment \
             to its first `GET /2018-06-01/runtime/invocation/next`. Goals: grab ≤ 8 MB, init ≤ \
             20 ms.\n",
            self.bootstraps_built_as
        );
        out.push_str("| function | bin | host MB | init runs | init p50 ms | init p95 ms | deployed MB |\n|---|---|---:|---:|---:|---:|---:|\n");
        for f in &self.bootstraps {
            let deployed = self
                .deployed
                .iter()
                .find(|d| d.bin == f.bin)
                .map_or_else(|| "-".to_owned(), |d| mb(d.bytes));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                f.function,
                f.bin,
                mb(f.bytes),
                f.init.map_or(0, |p| p.count),
                ms(f.init.as_ref(), |p| p.p50_ms),
                ms(f.init.as_ref(), |p| p.p95_ms),
                deployed
            );
        }
        let _ = writeln!(
            out,
            "\nDeployed: {}.\n",
            self.deployed_arch.as_deref().map_or_else(
                || "not built in this tree (`make build-lambdas`)".to_owned(),
                |arch| format!("`target/lambda/*/bootstrap` from `make build-lambdas` ({arch})")
            )
        );
    }

    fn surge_section(&self, out: &mut String) {
        let s = &self.surge;
        let _ = writeln!(
            out,
            "## 6. Latency per route, moderate surge\n\n{} buyers at concurrency {} each load \
             the sale page, fetch a grab path, grab, read their order until it awaits payment, \
             and pay ({:.1} s in all).\n",
            s.buyers,
            s.concurrency,
            s.elapsed.as_secs_f64()
        );
        out.push_str("| route | requests | p50 ms | p90 ms | p99 ms | max ms | answers |\n|---|---:|---:|---:|---:|---:|---|\n");
        for r in &s.routes {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} | {} |",
                r.route,
                r.latency.map_or(0, |p| p.count),
                ms(r.latency.as_ref(), |p| p.p50_ms),
                ms(r.latency.as_ref(), |p| p.p90_ms),
                ms(r.latency.as_ref(), |p| p.p99_ms),
                ms(r.latency.as_ref(), |p| p.max_ms),
                outcomes(&r.outcomes)
            );
        }
        out.push('\n');
    }

    /// What the smoke asserts: every step produced numbers, and they agree.
    pub fn inconsistencies(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let r = &self.rejection;
        if r.sold != r.stock as usize {
            problems.push(format!("sold {} of a stock of {}", r.sold, r.stock));
        }
        if r.first_outcomes.values().sum::<usize>() != r.first_attempts || r.first_attempts == 0 {
            problems.push(format!(
                "first attempts {} vs outcomes {:?}",
                r.first_attempts, r.first_outcomes
            ));
        }
        // Nothing is left to sell: a reservation here would be an oversell.
        if r.first_outcomes.keys().any(|k| k.starts_with('2')) {
            problems.push(format!(
                "a first attempt after sell-out was reserved: {:?}",
                r.first_outcomes
            ));
        }
        if r.retry_outcomes.values().sum::<usize>() != r.retries || r.retries == 0 {
            problems.push(format!(
                "retries {} vs outcomes {:?}",
                r.retries, r.retry_outcomes
            ));
        }
        if r.window.dynamodb.total() + r.idle.dynamodb.total() + r.idle.sqs.total() == 0 {
            problems.push("the proxies counted nothing at all".to_owned());
        }
        if self.surge.routes.is_empty() {
            problems.push("the surge measured no route".to_owned());
        }
        let grabbed = self
            .surge
            .routes
            .iter()
            .find(|route| route.route.contains("/grab/"))
            .map_or(0, |route| route.outcomes.get("202").copied().unwrap_or(0));
        if grabbed == 0 || grabbed > self.surge.buyers {
            problems.push(format!(
                "the surge reserved {grabbed} for {} buyers",
                self.surge.buyers
            ));
        }
        if self.bootstraps.is_empty()
            || self
                .bootstraps
                .iter()
                .any(|f| f.bytes == 0 || f.init.is_none())
        {
            problems.push("a bootstrap has no size or init time".to_owned());
        }
        if self.lateness.orders == 0 {
            problems.push("the lateness step placed no order".to_owned());
        }
        problems
    }
}
