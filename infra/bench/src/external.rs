//! Measurements made by other tools of the project, run from here so their numbers land
//! in the same report as the rest: the pipeline ratio (`flashsale-pipeline`), the grab
//! handler's criterion benchmark, and the seed's Redis Lua script. A tool that is not in
//! the tree is reported as not available, never guessed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::process::Command;

/// What running one tool gave.
#[derive(Debug, Clone, Serialize)]
pub enum Measured<T> {
    Done(T),
    NotAvailable(String),
    Failed(String),
}

impl<T> Measured<T> {
    pub fn done(&self) -> Option<&T> {
        match self {
            Self::Done(value) => Some(value),
            _ => None,
        }
    }
}

/// Runs `program args` in `dir` with `env`, at most `limit`; answers its stdout.
async fn run_bounded(
    dir: &Path,
    program: &str,
    args: &[String],
    env: &[(String, String)],
    limit: Duration,
) -> Result<String, String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let shown = format!("{program} {}", args.join(" "));
    let child = command
        .spawn()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "`{shown}` did not finish within {}s",
            limit.as_secs()
        )),
        Ok(Err(e)) => Err(format!("`{shown}`: {e}")),
        Ok(Ok(output)) if !output.status.success() => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            Err(format!(
                "`{shown}` failed ({}): {}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ))
        }
        Ok(Ok(output)) => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
    }
}

/// The pipeline tool's verdict at one concurrency: its JSON line, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineRun {
    pub concurrency: usize,
    pub result: BTreeMap<String, Value>,
}

/// The last stdout line that is a JSON object.
fn last_json_object(stdout: &str) -> Option<BTreeMap<String, Value>> {
    stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<BTreeMap<String, Value>>(line.trim()).ok())
}

/// `cargo run -p flashsale-load [--release] --bin flashsale-pipeline -- --concurrency N
/// <extra>`, when the tree has that bin (before `flashsale-load` was its own crate, the
/// bin was flashsale-e2e's).
pub async fn pipeline(
    workspace: &Path,
    release: bool,
    concurrency: usize,
    extra_args: &[String],
    env: &[(String, String)],
    limit: Duration,
) -> Measured<PipelineRun> {
    let homes = [
        ("infra/load/src/bin/flashsale-pipeline.rs", "flashsale-load"),
        ("tests/src/bin/flashsale-pipeline.rs", "flashsale-e2e"),
    ];
    let Some((_, package)) = homes
        .iter()
        .find(|(source, _)| workspace.join(source).is_file())
    else {
        return Measured::NotAvailable(format!(
            "{} is not in this tree",
            workspace.join(homes[0].0).display()
        ));
    };
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    let mut args: Vec<String> = ["run", "-q", "-p", package]
        .iter()
        .chain(profile)
        .chain(&["--bin", "flashsale-pipeline", "--", "--concurrency"])
        .map(|s| (*s).to_owned())
        .collect();
    args.push(concurrency.to_string());
    args.extend(extra_args.iter().cloned());
    match run_bounded(workspace, "cargo", &args, env, limit).await {
        Ok(stdout) => match last_json_object(&stdout) {
            Some(result) => Measured::Done(PipelineRun {
                concurrency,
                result,
            }),
            None => Measured::Failed(format!("no JSON line in its output: {stdout:?}")),
        },
        Err(why) => Measured::Failed(why),
    }
}

/// One criterion benchmark's mean time per iteration.
#[derive(Debug, Clone, Serialize)]
pub struct CriterionResult {
    pub id: String,
    pub mean_ns: f64,
}

impl CriterionResult {
    pub fn per_second(&self) -> f64 {
        if self.mean_ns > 0.0 {
            1e9 / self.mean_ns
        } else {
            0.0
        }
    }
}

/// Every `new/estimates.json` under `criterion_dir`, by benchmark id (its folder path).
pub fn criterion_estimates(criterion_dir: &Path) -> Vec<CriterionResult> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<CriterionResult>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            let estimates = path.join("new/estimates.json");
            let mean = std::fs::read_to_string(&estimates)
                .ok()
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .and_then(|value| value["mean"]["point_estimate"].as_f64());
            match mean {
                Some(mean_ns) => out.push(CriterionResult {
                    id: path
                        .strip_prefix(root)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                    mean_ns,
                }),
                None => walk(&path, root, out),
            }
        }
    }
    let mut out = Vec::new();
    walk(criterion_dir, criterion_dir, &mut out);
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// `cargo bench -p flashsale-grab --bench grab_handler`, then its estimates.
pub async fn grab_handler_bench(
    workspace: &Path,
    target_dir: &Path,
    limit: Duration,
) -> Measured<Vec<CriterionResult>> {
    let source = workspace.join("functions/grab/benches/grab_handler.rs");
    if !source.is_file() {
        return Measured::NotAvailable(format!("{} is not in this tree", source.display()));
    }
    let args: Vec<String> = [
        "bench",
        "-q",
        "-p",
        "flashsale-grab",
        "--bench",
        "grab_handler",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Err(why) = run_bounded(workspace, "cargo", &args, &[], limit).await {
        return Measured::Failed(why);
    }
    let results = criterion_estimates(&target_dir.join("criterion"));
    if results.is_empty() {
        Measured::Failed("criterion wrote no new/estimates.json".to_owned())
    } else {
        Measured::Done(results)
    }
}

/// `infra/bench/redis_seed.sh`: the seed's Redis Lua deduction under redis-benchmark.
pub async fn redis_seed(
    workspace: &Path,
    env: &[(String, String)],
    limit: Duration,
) -> Measured<f64> {
    let script: PathBuf = workspace.join("infra/bench/redis_seed.sh");
    if !script.is_file() {
        return Measured::NotAvailable(format!("{} is not in this tree", script.display()));
    }
    let script = script.display().to_string();
    match run_bounded(workspace, "bash", &[script], env, limit).await {
        Ok(stdout) => match parse_redis_ops(&stdout) {
            Some(ops) => Measured::Done(ops),
            None => Measured::Failed(format!("no redis_lua_ops_per_sec=<n> line: {stdout:?}")),
        },
        Err(why) => Measured::Failed(why),
    }
}

fn parse_redis_ops(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix("redis_lua_ops_per_sec="))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_json_object_line_wins_over_logs() {
        let out = "building...\n{\"ratio\": 0.5}\nnoise\n{\"ratio\": 0.93, \"503s\": 0}\ndone\n";
        let parsed = last_json_object(out).expect("a JSON line");
        assert_eq!(parsed["ratio"], serde_json::json!(0.93));
        assert_eq!(last_json_object("no json here\n[1,2]\n"), None);
    }

    #[test]
    fn redis_ops_are_read_from_their_line() {
        assert_eq!(
            parse_redis_ops("PING ok\nredis_lua_ops_per_sec=98765.4\n"),
            Some(98765.4)
        );
        assert_eq!(parse_redis_ops("redis_lua_ops_per_sec=\n"), None);
    }

    #[test]
    fn criterion_estimates_are_found_at_any_depth() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (id, mean) in [("grab/reject", 1500.0), ("grab/success/8", 4000.0)] {
            let new = dir.path().join(id).join("new");
            std::fs::create_dir_all(&new).expect("mkdir");
            std::fs::write(
                new.join("estimates.json"),
                serde_json::json!({"mean": {"point_estimate": mean}}).to_string(),
            )
            .expect("write");
        }
        // criterion's report folder has no estimates and is skipped.
        std::fs::create_dir_all(dir.path().join("report")).expect("mkdir");
        let found = criterion_estimates(dir.path());
        let ids: Vec<_> = found.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["grab/reject", "grab/success/8"]);
        assert!((found[0].per_second() - 666_666.67).abs() < 1.0);
    }
}
