//! The `flashsale-local` binary as `make run` runs it: starts its own emulators, serves
//! the API, and on SIGTERM stops every process it started.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Parent pid of `pid`, from /proc (field 4 of stat, after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = stat[stat.rfind(')')? + 2..].to_owned();
            after_name
                .split_whitespace()
                .next()
                .map(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// Every live descendant of `root`.
fn descendants(root: u32) -> BTreeSet<u32> {
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = BTreeSet::from([root]);
    loop {
        let before = found.len();
        for &pid in &pids {
            if parent_of(pid).is_some_and(|parent| found.contains(&parent)) {
                found.insert(pid);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.remove(&root);
    found
}

#[tokio::test]
async fn make_run_serves_the_api_and_leaves_no_process_after_sigterm() {
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flashsale-local"))
        .args([
            "--api-port",
            "0",
            "--dynamodb-port",
            "0",
            "--moto-port",
            "0",
            "--sqs-port",
            "0",
        ])
        .arg("--stack-name")
        .arg(format!("smoke-{}", flashsale_emulators::unique_suffix()))
        .arg("--template")
        .arg(&template)
        // Start its own emulators, as `make run` on a fresh machine does.
        .env_remove("FLASHSALE_DYNAMODB_ENDPOINT")
        .env_remove("FLASHSALE_MOTO_ENDPOINT")
        .env_remove("FLASHSALE_SQS_ENDPOINT")
        .env_remove("FLASHSALE_STRIPE_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let api_url = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let url = lines.by_ref().map_while(Result::ok).find_map(|line| {
            line.trim()
                .strip_prefix("HTTP API")
                .map(|rest| rest.trim().to_owned())
        });
        // Keep draining so the binary never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        url
    })
    .await
    .expect("reader")
    .expect("the binary printed its API URL");

    let response = reqwest::get(format!("{api_url}/sales/no-such-sale"))
        .await
        .expect("GET");
    assert_eq!(response.status(), reqwest::StatusCode::NOT_FOUND);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(
        body["error"], "sale_not_found",
        "the real api function answered"
    );
    let token: serde_json::Value = reqwest::Client::new()
        .post(format!("{api_url}/local/token"))
        .json(&serde_json::json!({"user_id": "smoke"}))
        .send()
        .await
        .expect("POST /local/token")
        .json()
        .await
        .expect("json");
    assert!(token["token"].is_string());

    let started = descendants(pid);
    assert!(
        started.len() >= 2,
        "the emulators run as its children: {started:?}"
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "flashsale-local did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "exit status {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<u32> = started.iter().copied().filter(|p| is_alive(*p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reqwest::get(format!("{api_url}/sales/x")).await.is_err(),
        "the API stopped listening"
    );
}
