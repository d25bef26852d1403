//! `docs/benchmarks.md`: every number of one run, with the machine and the command.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use crate::contention::{self, ContentionReport, ContentionRun, RawRun};
use crate::external::{CriterionResult, Measured, PipelineRun};
use crate::fulfilment::ExportReport;
use crate::init::FunctionInit;
use crate::pause::PauseReport;
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
    pub contention: ContentionReport,
    pub pause: PauseReport,
    pub export: ExportReport,
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

fn opt_u64(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn opt_f64(value: Option<f64>, places: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.places$}"))
}

fn opt_ms(value: Option<std::time::Duration>) -> String {
    value.map_or_else(
        || "- (not sold out)".to_owned(),
        |d| format!("{:.0}", d.as_secs_f64() * 1e3),
    )
}

fn opt_ms_fine(value: Option<std::time::Duration>) -> String {
    value.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.2}", d.as_secs_f64() * 1e3),
    )
}

/// A row of the contention table: its name, each run's cell, and the goal.
type RowWriter<'a> = dyn Fn(&mut String, &str, &dyn Fn(&ContentionRun) -> String, &str) + 'a;
/// A goal's cell: the target, and whether each run met it.
type Verdicts<'a> = dyn Fn(&str, &dyn Fn(&ContentionRun) -> Option<bool>) -> String + 'a;

/// `TransactWriteItems` · plain writes · cancelled transactions, per unit of `units`.
fn write_shape(counts: &crate::proxy::Counts, units: usize) -> String {
    let (seen, conflicts) = contention::transactions(counts);
    let plain = contention::writes(counts).saturating_sub(seen);
    let per_unit = |n: u64| opt_f64((units > 0).then(|| n as f64 / units as f64), 2);
    format!(
        "{} · {} · {}",
        per_unit(seen),
        per_unit(plain),
        per_unit(conflicts)
    )
}

/// A sell-out in ms, and its ratio to the run's textbook client's.
fn beside_textbook(own: Option<std::time::Duration>, run: &ContentionRun) -> String {
    let times = own
        .zip(run.textbook.target_reached_after)
        .and_then(|(own, textbook)| {
            (textbook.as_secs_f64() > 0.0).then(|| own.as_secs_f64() / textbook.as_secs_f64())
        });
    format!("{} · {}", opt_ms(own), opt_f64(times, 2))
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        String::new()
    } else {
        format!(" ({:.0} %)", part as f64 * 100.0 / whole as f64)
    }
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
        self.contention_section(&mut out);
        self.pause_section(&mut out);
        self.export_section(&mut out);
        out
    }

    fn export_section(&self, out: &mut String) {
        let e = &self.export;
        let _ = writeln!(
            out,
            "## 9. The fulfilment export at size\n\nA sale of {} paid orders ({} shards, so {} \
             stats buckets), each seeded as the grab and the settlement write it, then exported \
             as the console does: `GET /admin/sales/{{id}}/orders.csv?status=paid`, {} buyers a \
             page, page after page, the CSV joined and checked against the stats.\n",
            e.orders, e.shards, e.shards, e.page
        );
        let per_second = |n: usize| {
            let secs = e.exported_in.as_secs_f64();
            if secs > 0.0 {
                format!("{:.0}", n as f64 / secs)
            } else {
                "-".to_owned()
            }
        };
        let rows = [
            (
                "seeded in (s)".to_owned(),
                format!("{:.1}", e.seeded_in.as_secs_f64()),
            ),
            (
                "exported in (s)".to_owned(),
                format!("{:.1}", e.exported_in.as_secs_f64()),
            ),
            (
                "pages · rows per second".to_owned(),
                format!("{} · {}", e.pages, per_second(e.rows)),
            ),
            (
                "rows · distinct orders · not paid".to_owned(),
                format!("{} · {} · {}", e.rows, e.distinct, e.not_paid),
            ),
            (
                "the stats' paid · consistent".to_owned(),
                format!("{} · {}", e.stats_paid, e.stats_consistent),
            ),
            (
                "DynamoDB calls during the export: `Query` · `Scan` · all".to_owned(),
                format!("{} · {} · {}", e.queries(), e.scans(), e.dynamodb.total()),
            ),
        ];
        out.push_str("| measure | value |\n|---|---:|\n");
        for (measure, value) in rows {
            let _ = writeln!(out, "| {measure} | {value} |");
        }
        out.push('\n');
    }

    fn pause_section(&self, out: &mut String) {
        let p = &self.pause;
        let bound_ms = p.sale_refresh.as_millis();
        let _ = writeln!(
            out,
            "## 8. Pause under a surge\n\n{} buyers at a time on a sale with stock to spare: half \
             of them new buyers (a token, a grab path, a grab), half buyers who got their grab \
             path before the surge and grab with it now. An admin pauses the sale mid-surge and \
             the surge goes on past the bound, then the sale is resumed. The bound: every process \
             rereads a sale once its copy is `SaleRefreshMs` ({bound_ms} ms) old, so a grab that \
             starts that long after the pause's 200 is refused, but for a reread then in flight \
             (one read) in its process; a grab already past its check may still finish its \
             reserve.\n",
            p.concurrency
        );
        let yes = |b: bool| if b { "yes" } else { "**no**" }.to_owned();
        let rows = [
            (
                "reservations answered before the pause's 200 · after it".to_owned(),
                format!("{} · {}", p.admitted_before, p.admitted_after),
            ),
            (
                "pause's 200 → the last admitted grab answered (ms)".to_owned(),
                opt_ms_fine(p.last_admitted_after),
            ),
            (
                "pause's 200 → the first `sale_paused` answered (ms)".to_owned(),
                opt_ms_fine(p.first_refused_after),
            ),
            (
                format!("grabs sent {bound_ms} ms or more after the 200 · of them admitted"),
                format!("{} · {}", p.sent_past_the_bound, p.admitted_past_the_bound),
            ),
            (
                "a buyer bought once resumed".to_owned(),
                yes(p.sold_after_resume),
            ),
            ("the stock reconciles (stats)".to_owned(), yes(p.consistent)),
        ];
        out.push_str("| measure | value |\n|---|---:|\n");
        for (measure, value) in rows {
            let _ = writeln!(out, "| {measure} | {value} |");
        }
        let _ = writeln!(out, "\nAnswers: {}.\n", outcomes(&p.outcomes));
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
            "From `flashsale-pipeline` (flashsale-load), as it printed it. Goal: `ratio` ≥ 0.9 \
             with zero 503s at concurrency 8 and 32. `raw_reserve_open_per_s` runs, per unit, \
             the grab's reserve and then the consumer's read of the hold (`OrderBook::find`) \
             straight to DynamoDB Local: the database work every unit sold through the \
             pipeline costs. DynamoDB Local serves one request at a time, so \
             `ratio_to_reserve_open` near 1 means the gateway, the functions and the queue add \
             little beyond that work.\n\n",
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
                    "Redis Lua deduction (`infra/bench/redis_seed.sh`, redis-benchmark): **{ops:.0}/s**.\n"
                );
                if let Some(results) = self.handler.done() {
                    // The seed's Lua script does the grab's job; the challenge's
                    // benchmarks do another, so no ratio to it means anything.
                    for r in results.iter().filter(|r| r.id.starts_with("grab_")) {
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
             AWS Lambda Runtime Interface Emulator (`aws-lambda-rie`, as the aws-sam-cli wheel \
             bundles it) with the template's environment: the RIE's `INIT REPORT`, from the \
             process's start to its first request for an event. Goals: grab ≤ 8 MB, init ≤ \
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
             the sale page, fetch a grab path, grab, read their order (awaiting payment from the grab on), \
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

    fn contention_section(&self, out: &mut String) {
        let c = &self.contention;
        let retry = &c.textbook_retry;
        let _ = writeln!(
            out,
            "## 7. Contention under the conflict mode (issue 14 §3)\n\n\
             DynamoDB Local runs one transaction at a time and never answers \
             `TransactionConflict`; AWS does. Here the DynamoDB proxy plays AWS's rule \
             (`ConflictMode`, one commit time per column): a `TransactWriteItems` holds its \
             items for its round trip plus the commit time, any other transaction touching a \
             held item is cancelled (`TransactionConflict` at that item) and a plain write of \
             one is refused. Both clients below run on the same proxy, mode and table, one \
             after the other, {rounds} pair(s) in each order at each commit time, after {warm} \
             surges of the same size and one textbook run that are not reported: DynamoDB \
             Local is a JVM, and in its first seconds of load plain writes time out before its \
             hot paths are compiled, which AWS's service does not do. With one warm-up surge \
             only, the first measured surge sold out in 850 to 890 ms and the next in 530 to \
             620 ms. {quiet}\n\n\
             - **The surge through the gateway**: a sale of {stock} units on {shards} shards, \
             set to reserve `{flash}` as a flash sale is (docs/capacity.md); \
             {buyers} buyers each fetch a grab path, then all grab at concurrency {conc}, \
             retrying 429, 503 and no answer on the same path with `X-Retry-Attempt: n` after \
             `Retry-After` plus full jitter (flashsale-load's `retry_delay`), up to {attempts} \
             requests a buyer, as the sale page does. DynamoDB requests are counted from the \
             release of the grabs until the order consumer had set the release timer of \
             every unit taken (it reads the hold and writes nothing to the table), so every \
             write a unit costs until it is paid or released is in. The same surge then runs \
             on a sale left at the default, `adaptive` (the rows \"sale left adaptive\").\n\
             - **The textbook client**: a second sale of {stock} units on {shards} shards, \
             bought by raw buyers at concurrency {conc} reserving in one `TransactWriteItems` \
             (`DynamoStore::reserve_in_one_transaction`) through the proxy: the buyer's shards in \
             `Sale::shard_order`, the next one on `ShardEmpty`, the same one again on \
             `Contended` after a pause uniform in [0, min({cap} ms, {base} ms · 2^(n−1))], \
             {tries} tries of a shard, then the buyer gives up as a 503 would. No consumer runs \
             behind it, and no new buyer starts once the stock is reserved (of up to {buyers}): \
             its measure is the sell-out.\n",
            stock = c.stock,
            shards = c.shards,
            flash = contention::FLASH_SALE_RESERVE.name(),
            buyers = c.buyers,
            conc = c.concurrency,
            attempts = c.grab_attempts,
            cap = retry.cap.as_millis(),
            base = retry.base.as_millis(),
            tries = retry.attempts,
            warm = c.warm_up_surges,
            rounds = c.rounds,
            quiet = c.quiet.map_or_else(
                || "Each run starts at once, without waiting for the machine to go quiet."
                    .to_owned(),
                |q| format!(
                    "Each timed run starts once the whole machine is quiet (busy below {:.0} % \
                     of its cores over {} ms, read from `/proc/stat`): every emulator shares \
                     these cores, and a run leaves work behind it (the local stack fetching a \
                     surge's new timers from moto, the JVM collecting). Without the wait, \
                     whichever client ran second paid for the other's tail: a textbook run \
                     right after a surge sold out in 760 to 1,130 ms, and in 500 to 730 ms \
                     when it ran first.",
                    q.max_busy * 100.0,
                    q.window.as_millis()
                ),
            ),
        );
        if c.runs.is_empty() {
            out.push_str("No commit time was measured.\n\n");
        } else {
            self.contention_table(out);
        }
        self.curve_section(out);
    }

    fn contention_table(&self, out: &mut String) {
        let c = &self.contention;
        let runs = &c.runs;
        let header: String = runs.iter().map(|r| format!(" {} |", r.label())).collect();
        let _ = writeln!(
            out,
            "| measure |{header} goal |\n|---|{}---|",
            "---:|".repeat(runs.len())
        );
        let row =
            |out: &mut String, name: &str, value: &dyn Fn(&ContentionRun) -> String, goal: &str| {
                let cells: String = runs.iter().map(|r| format!(" {} |", value(r))).collect();
                let _ = writeln!(out, "| {name} |{cells} {goal} |");
            };
        let verdicts = |target: &str, met: &dyn Fn(&ContentionRun) -> Option<bool>| {
            let each: Vec<&str> = runs
                .iter()
                .map(|r| match met(r) {
                    Some(met) => goal(met),
                    None => "not measured",
                })
                .collect();
            format!("{target}: {}", each.join(" · "))
        };
        let stock = c.stock as usize;
        row(
            out,
            "units sold (202s with distinct order ids)",
            &|r| r.gateway.sold.to_string(),
            &verdicts(&format!("exactly {stock}"), &|r| {
                Some(r.gateway.sold == stock)
            }),
        );
        row(
            out,
            "units left afterwards (stats `available`)",
            &|r| opt_u64(r.gateway.left),
            "",
        );
        row(
            out,
            "units taken for which no buyer was answered 202",
            &|r| opt_u64(r.gateway.taken_without_202(c.stock)),
            "",
        );
        row(
            out,
            "buyers told `sold_out` while units were left",
            &|r| r.gateway.sold_out_while_left().to_string(),
            &verdicts("0", &|r| {
                r.gateway.left.map(|_| r.gateway.sold_out_while_left() == 0)
            }),
        );
        row(
            out,
            "stats `consistent` (once every timer was set)",
            &|r| {
                let drained = if r.gateway.drained {
                    ""
                } else {
                    " (not drained)"
                };
                format!(
                    "{}{drained}",
                    r.gateway
                        .consistent
                        .map_or("-".to_owned(), |b| b.to_string())
                )
            },
            &verdicts("true", &|r| r.gateway.consistent),
        );
        row(
            out,
            "buyers holding two orders",
            &|r| r.gateway.buyers_with_two_orders.to_string(),
            "",
        );
        row(
            out,
            "grab answers (retries included)",
            &|r| r.gateway.answers.to_string(),
            "",
        );
        row(
            out,
            "503 answers (share of grab answers)",
            &|r| {
                format!(
                    "{} ({:.2} %)",
                    r.gateway.unavailable,
                    r.gateway.unavailable_share() * 100.0
                )
            },
            &verdicts("≤ 0.5 %", &|r| {
                Some(r.gateway.unavailable_share() <= 0.005)
            }),
        );
        row(
            out,
            "other 5xx answers",
            &|r| r.gateway.other_5xx.to_string(),
            &verdicts("0", &|r| Some(r.gateway.other_5xx == 0)),
        );
        row(
            out,
            "429 answers / requests with no answer",
            &|r| format!("{} / {}", r.gateway.throttled, r.gateway.no_answer),
            "",
        );
        row(
            out,
            "`TransactWriteItems` during the surge: conflicts / seen",
            &|r| {
                let (seen, conflicts) = contention::transactions(&r.gateway.surge_dynamodb);
                format!("{conflicts} / {seen}{}", percent(conflicts, seen))
            },
            "",
        );
        row(
            out,
            "reserve conflicts as the grab counted them (`/local/metrics`)",
            &|r| {
                r.gateway
                    .hand_over
                    .map_or("-".to_owned(), |m| m.reserve_conflicts.to_string())
            },
            "",
        );
        row(
            out,
            "DynamoDB write requests, release → every timer set",
            &|r| contention::writes(&r.gateway.through_drain_dynamodb).to_string(),
            "",
        );
        row(
            out,
            "**all DynamoDB writes per unit sold**",
            &|r| opt_f64(r.gateway.writes_per_unit(), 2),
            &verdicts("≤ 3", &|r| r.gateway.writes_per_unit().map(|w| w <= 3.0)),
        );
        row(
            out,
            "release timers the consumer set (it writes nothing to the table)",
            &|r| {
                r.gateway
                    .hand_over
                    .map_or("-".to_owned(), |m| m.orders_opened.to_string())
            },
            "",
        );
        row(
            out,
            &format!("**gateway sell-out** (ms, release → the {stock}th unit's 202)"),
            &|r| opt_ms(r.gateway.sell_out),
            "",
        );
        row(
            out,
            &format!("**textbook sell-out** (ms, start → the {stock}th reservation)"),
            &|r| opt_ms(r.textbook.target_reached_after),
            "",
        );
        row(
            out,
            "**gateway / textbook sell-out**",
            &|r| {
                r.sell_out_ratio()
                    .map_or("-".to_owned(), |x| format!("{x:.2}×"))
            },
            &verdicts("≤ 1.0×", &|r| r.sell_out_ratio().map(|x| x <= 1.0)),
        );
        row(
            out,
            "**every run of the commit time: mean gateway / mean textbook sell-out**",
            &|r| {
                c.pooled_sell_out_ratio(r.commit_time_ms)
                    .map_or("-".to_owned(), |x| format!("{x:.2}×"))
            },
            &verdicts("≤ 1.0×", &|r| {
                c.pooled_sell_out_ratio(r.commit_time_ms).map(|x| x <= 1.0)
            }),
        );
        self.adaptive_rows(out, &row, &verdicts);
        let marks = |marks: &[std::time::Duration]| {
            marks
                .iter()
                .map(|at| format!("{:.0}", at.as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(" · ")
        };
        row(
            out,
            "gateway: the first, 25th, 50th, 75th and last unit's 202 (ms)",
            &|r| marks(&r.gateway.milestones),
            "",
        );
        row(
            out,
            "textbook: the same reservations (ms)",
            &|r| marks(&r.textbook.milestones),
            "",
        );
        row(
            out,
            "gateway: round trip of a 202, p50 · p90 (ms)",
            &|r| marks(&r.gateway.reserved_round_trip),
            "",
        );
        row(
            out,
            "machine busy at the start, gateway · textbook",
            &|r| {
                format!(
                    "{} · {}",
                    r.gateway.settled.describe(),
                    r.textbook.settled.describe()
                )
            },
            "",
        );
        row(
            out,
            "gateway: surge / through the drain (s)",
            &|r| {
                format!(
                    "{:.2} / {:.2}",
                    r.gateway.surge.as_secs_f64(),
                    r.gateway.through_drain.as_secs_f64()
                )
            },
            "",
        );
        row(
            out,
            "textbook: `TransactWriteItems` conflicts / seen",
            &|r| {
                let (seen, conflicts) = contention::transactions(&r.textbook.dynamodb);
                format!("{conflicts} / {seen}{}", percent(conflicts, seen))
            },
            "",
        );
        row(
            out,
            "textbook: units reserved / buyers started / gave up / failed",
            &|r| {
                let t = &r.textbook;
                format!(
                    "{} / {} / {} / {}",
                    t.reserved, t.buyers_started, t.gave_up, t.failed
                )
            },
            "",
        );
        row(
            out,
            "textbook: mean round trip of a committed reserve (ms)",
            &|r| opt_ms_fine(r.textbook.committed_round_trip),
            "",
        );
        // The reserve's paths side by side, under the textbook client's buyers and retry.
        row(
            out,
            "gateway: `TransactWriteItems` · plain writes · cancelled transactions per unit sold (the surge)",
            &|r| write_shape(&r.gateway.surge_dynamodb, r.gateway.sold),
            "",
        );
        for (label, run) in [
            (
                "textbook",
                (|r: &ContentionRun| &r.textbook) as fn(&ContentionRun) -> &RawRun,
            ),
            ("same client, always take then hold (issue 14)", |r| {
                &r.take_then_hold
            }),
            ("same client, the grab's reserve (adaptive)", |r| {
                &r.adaptive
            }),
        ] {
            row(
                out,
                &format!("{label}: sell-out (ms) · × textbook"),
                &|r| beside_textbook(run(r).target_reached_after, r),
                "",
            );
            row(
                out,
                &format!(
                    "{label}: `TransactWriteItems` · plain writes · cancelled transactions per unit"
                ),
                &|r| write_shape(&run(r).dynamodb, run(r).reserved),
                "",
            );
            row(
                out,
                &format!("{label}: units reserved / gave up / failed"),
                &|r| {
                    let t = run(r);
                    format!("{} / {} / {}", t.reserved, t.gave_up, t.failed)
                },
                "",
            );
        }
        out.push('\n');
        for r in runs {
            let _ = writeln!(
                out,
                "At {}, the buyers' last answers: {}.{}",
                r.label(),
                outcomes(&r.gateway.final_outcomes),
                r.textbook
                    .first_failure
                    .as_ref()
                    .map_or(String::new(), |why| format!(
                        " The textbook client's first failure: {why}."
                    ))
            );
        }
        out.push_str(
            "\nThe proxy sees every DynamoDB request but not who sent it; the timers set come \
             from the local stack's own metrics (`orders_opened` of the sale). Write requests are `TransactWriteItems`, `PutItem`, \
             `UpdateItem`, `DeleteItem` and `BatchWriteItem`, cancelled and refused ones \
             included: every one is a request the table answers. No sale here has a payment \
             window shorter than the run, so no release writes in a window.\n\n\
             DynamoDB requests from the release until every sold unit's timer was set, by operation \
             (seen, of which conflicts):\n\n",
        );
        let mut operations: BTreeSet<&str> = BTreeSet::new();
        for r in runs {
            operations.extend(
                r.gateway
                    .through_drain_dynamodb
                    .operations
                    .keys()
                    .map(String::as_str),
            );
        }
        let _ = writeln!(
            out,
            "| operation |{header}\n|---|{}",
            "---:|".repeat(runs.len())
        );
        for operation in operations {
            let cells: String = runs
                .iter()
                .map(|r| {
                    let op = r.gateway.through_drain_dynamodb.operations.get(operation);
                    let (total, conflicts) = op.map_or((0, 0), |op| (op.total, op.conflicts));
                    format!(" {total} ({conflicts}) |")
                })
                .collect();
            let _ = writeln!(out, "| `{operation}` |{cells}");
        }
        out.push('\n');
    }

    /// The surge on a sale left adaptive, against the same goals.
    fn adaptive_rows(&self, out: &mut String, row: &RowWriter<'_>, verdicts: &Verdicts<'_>) {
        let c = &self.contention;
        let stock = c.stock as usize;
        row(
            out,
            "sale left adaptive: units sold · 503 answers · other 5xx · stats consistent",
            &|r| {
                let g = &r.gateway_adaptive;
                format!(
                    "{} · {} · {} · {}",
                    g.sold,
                    g.unavailable,
                    g.other_5xx,
                    g.consistent.map_or("-".to_owned(), |c| c.to_string())
                )
            },
            &verdicts("all, 0, 0, true", &|r| {
                let g = &r.gateway_adaptive;
                Some(
                    g.sold == stock
                        && g.unavailable == 0
                        && g.other_5xx == 0
                        && g.consistent == Some(true),
                )
            }),
        );
        row(
            out,
            "sale left adaptive: `TransactWriteItems` · plain writes · cancelled transactions per unit sold (the surge)",
            &|r| write_shape(&r.gateway_adaptive.surge_dynamodb, r.gateway_adaptive.sold),
            "",
        );
        row(
            out,
            "sale left adaptive: all DynamoDB writes per unit sold",
            &|r| opt_f64(r.gateway_adaptive.writes_per_unit(), 2),
            &verdicts("≤ 3", &|r| {
                r.gateway_adaptive.writes_per_unit().map(|w| w <= 3.0)
            }),
        );
        row(
            out,
            "sale left adaptive: sell-out (ms) · × textbook",
            &|r| beside_textbook(r.gateway_adaptive.sell_out, r),
            "",
        );
        row(
            out,
            "sale left adaptive: every run of the commit time, mean sell-out / mean textbook",
            &|r| {
                c.pooled_adaptive_sell_out_ratio(r.commit_time_ms)
                    .map_or("-".to_owned(), |x| format!("{x:.2}×"))
            },
            &verdicts("≤ 1.0×", &|r| {
                c.pooled_adaptive_sell_out_ratio(r.commit_time_ms)
                    .map(|x| x <= 1.0)
            }),
        );
    }

    fn curve_section(&self, out: &mut String) {
        let c = &self.contention;
        let _ = writeln!(
            out,
            "### The per-shard curve\n\n\
             One shard with {} units; {} raw reservers, each reservation by a new buyer, with \
             the textbook retry above, until {} reservations (buyers in flight then still \
             finish, so a few more may be reserved). The round trip is the client's, of the \
             reserves that committed; the proxy answers a transaction only once its commit time \
             has passed, so it includes the commit time, and one shard admitting one \
             transaction at a time takes about `1 / round trip` a second (a little more: the \
             hold starts and ends inside the client's round trip). The service time \
             is that round trip less the commit time (DynamoDB Local, the proxy and the \
             client). The capacity model ([docs/capacity.md](capacity.md)) takes these \
             numbers.\n",
            c.curve_stock, c.curve_reservers, c.curve_reservations
        );
        out.push_str(
            "| commit ms | reserved | until the target s | reservations/s | conflicts per reservation | gave up | mean committed round trip ms | of which service time ms | mean attempt round trip ms | 1 / round trip per s |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for point in &c.curve {
            let r = &point.run;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                point.commit_time_ms,
                r.reserved,
                r.target_reached_after
                    .map_or("-".to_owned(), |d| format!("{:.2}", d.as_secs_f64())),
                opt_f64(r.reservations_per_sec(), 1),
                opt_f64(r.conflicts_per_reservation(), 2),
                r.gave_up,
                opt_ms_fine(r.committed_round_trip),
                opt_ms_fine(point.service_time()),
                opt_ms_fine(r.attempt_round_trip),
                opt_f64(point.bound_per_sec(), 1),
            );
        }
        let _ = writeln!(
            out,
            "\nThe same shard, buyers and retry, with the grab's reserves: always a plain \
             conditional take on the shard, then the hold on the buyer's item (issue 14's), \
             and the deployed one (`DynamoStore::reserve`, adaptive): the transaction, and \
             take-then-hold on the shard for a while after a conflict there. Plain writes to \
             one item queue instead of cancelling each other, so nothing plain is `Contended` \
             unless a transaction held the item; the ratio is to the transactional row of the \
             same commit time above.\n"
        );
        out.push_str(
            "| commit ms | reserve | reserved | until the target s | reservations/s | × the transactional | conflicts per reservation | DynamoDB writes per reservation | failed | mean committed round trip ms |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (point, how) in c
            .curve
            .iter()
            .flat_map(|point| [(point, "take then hold"), (point, "adaptive")])
        {
            let r = if how == "adaptive" {
                &point.adaptive
            } else {
                &point.plain
            };
            let times = r
                .reservations_per_sec()
                .zip(point.run.reservations_per_sec())
                .map(|(plain, transactional)| plain / transactional);
            let _ = writeln!(
                out,
                "| {} | {how} | {} | {} | {} | {} | {} | {} | {} | {} |",
                point.commit_time_ms,
                r.reserved,
                r.target_reached_after
                    .map_or("-".to_owned(), |d| format!("{:.2}", d.as_secs_f64())),
                opt_f64(r.reservations_per_sec(), 1),
                opt_f64(times, 2),
                opt_f64(r.conflicts_per_reservation(), 2),
                opt_f64(r.writes_per_reservation(), 2),
                r.failed,
                opt_ms_fine(r.committed_round_trip),
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
        // The marked retries each read the table (by design), so the proxies count
        // something there whatever the timing; the first attempts cost no call, and a 1 s
        // idle window may end before the poller's long poll answers (a fresh CI run's
        // did), so those two alone prove nothing.
        let retry_calls: u64 = r
            .retry_cost
            .operations
            .values()
            .map(|(calls, _)| calls)
            .sum();
        if r.window.dynamodb.total() + r.idle.dynamodb.total() + r.idle.sqs.total() + retry_calls
            == 0
        {
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
        let e = &self.export;
        if e.rows != e.orders
            || e.distinct != e.orders
            || e.not_paid != 0
            || e.stats_paid != e.orders as u64
            || !e.stats_consistent
            || e.scans() != 0
        {
            problems.push(format!(
                "the export: {} rows, {} distinct, {} not paid of {} orders (stats: {} paid, \
                 consistent {}), {} scans",
                e.rows,
                e.distinct,
                e.not_paid,
                e.orders,
                e.stats_paid,
                e.stats_consistent,
                e.scans()
            ));
        }
        let p = &self.pause;
        if p.first_refused_after.is_none() || !p.sold_after_resume || !p.consistent {
            problems.push(format!(
                "the pause: refused {:?} after, sold once resumed {}, consistent {}",
                p.first_refused_after, p.sold_after_resume, p.consistent
            ));
        }
        problems.extend(self.contention_problems());
        problems
    }

    /// Correctness under contention: what the smoke fails on (the goals on rates and
    /// costs are stated in the report, not enforced).
    pub fn contention_problems(&self) -> Vec<String> {
        let c = &self.contention;
        let stock = c.stock as usize;
        let mut problems = Vec::new();
        if c.runs.is_empty() {
            problems.push("the contention scenario measured no commit time".to_owned());
        }
        for (r, g, which) in c.runs.iter().flat_map(|r| {
            [
                (r, &r.gateway, "the flash sale"),
                (r, &r.gateway_adaptive, "the sale left adaptive"),
            ]
        }) {
            let at = format!("contention at {}, {which}", r.label());
            if g.sold > stock || g.buyers_with_two_orders > 0 {
                problems.push(format!(
                    "{at}: oversold: {} units sold of {stock}, {} buyers with two orders",
                    g.sold, g.buyers_with_two_orders
                ));
            }
            if g.sold == 0 {
                problems.push(format!("{at}: the surge sold nothing"));
            }
            if g.other_5xx > 0 {
                problems.push(format!("{at}: {} answers 5xx other than 503", g.other_5xx));
            }
            if g.consistent != Some(true) {
                problems.push(format!(
                    "{at}: the stats are not consistent: {}",
                    g.final_stats
                ));
            }
        }
        for r in &c.runs {
            if r.textbook.reserved > stock {
                problems.push(format!(
                    "contention at {}: the textbook client reserved {} of {stock}",
                    r.label(),
                    r.textbook.reserved
                ));
            }
        }
        for point in &c.curve {
            for (how, run) in [
                ("in one transaction", &point.run),
                ("with plain writes", &point.plain),
            ] {
                if run.reserved > c.curve_stock as usize {
                    problems.push(format!(
                        "the shard at {} ms reserved {} of {} {how}",
                        point.commit_time_ms, run.reserved, c.curve_stock
                    ));
                }
            }
        }
        problems
    }
}
