//! The load tool end to end: the binary, aimed at a local stack as at a deployed one
//! (tokens from a file, no `/local/token`), writes its report and plots and passes its
//! audit.

use std::fmt::Write as _;
use std::process::Stdio;

use flashsale_e2e::Harness;
use serde_json::Value;

const STOCK: u64 = 5;
const BUYERS: usize = 12;

/// Writes a token file for `buyers` buyers and the admin `ops`, runs the load tool on
/// `sale_id` with `args`, and answers its stdout and JSON report.
async fn load_tool(
    harness: &Harness,
    sale_id: &str,
    buyers: usize,
    args: &[&str],
) -> (String, Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut tokens = format!("ops\t{}\n", harness.admin);
    for n in 0..buyers {
        let buyer = format!("{sale_id}-buyer-{n}");
        writeln!(tokens, "{buyer}\t{}", harness.user(&buyer)).unwrap();
    }
    let tokens_file = dir.path().join("tokens.tsv");
    std::fs::write(&tokens_file, tokens).unwrap();
    let report_path = dir.path().join("report.json");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale-load"))
        .args(["--api", harness.api.base_url()])
        .arg("--tokens-file")
        .arg(&tokens_file)
        .args(["--admin-user", "ops", "--sale-id", sale_id])
        .args(["--buyers", &buyers.to_string()])
        .args(args)
        .arg("--report")
        .arg(&report_path)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the load tool runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(&report_path).expect("the report")).unwrap();
    (stdout, report, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tool_reports_plots_and_passes_its_audit() {
    let harness = Harness::start("load-tool").await;
    let (stdout, report, dir) = load_tool(
        &harness,
        "load-tool",
        BUYERS,
        &[
            "--stock",
            &STOCK.to_string(),
            "--shards",
            "2",
            "--attempts",
            "16",
            "--pay-ratio",
            "0.4",
            "--stripe-api",
            harness
                .stack
                .stripe_endpoint
                .as_deref()
                .expect("the local stack's Stripe"),
        ],
    )
    .await;
    assert!(
        stdout.contains("orders_within_stock"),
        "the audit table: {stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(report["challenge"], Value::Null, "the sale asked none");
    assert_eq!(report["audit_passed"], true, "{report:#}");
    assert_eq!(report["reserved"], STOCK, "{report:#}");
    assert_eq!(report["paid"], 2, "40% of 5 orders: {report:#}");
    assert_eq!(
        report["config"]["token_source"]
            .as_str()
            .map(|s| s.starts_with("file")),
        Some(true)
    );
    let outcomes = report["outcomes"].as_object().expect("outcomes by kind");
    let settled: u64 = outcomes.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(settled, 16, "every attempt has an outcome: {report:#}");
    assert_eq!(
        report["routes"]["token"]["count"].as_u64().map(|n| n >= 16),
        Some(true)
    );
    assert_eq!(report["routes"]["pay"]["count"], 2);
    assert!(report["timeline"].as_array().is_some_and(|s| !s.is_empty()));
    let names: Vec<&str> = report["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|check| check["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"stats_consistent") && names.contains(&"per_user_limit"));
    let stats = harness.stats("load-tool").await;
    assert_eq!(stats["paid"], 2, "{stats}");
    for png in ["report-latency.png", "report-timeline.png"] {
        let bytes = std::fs::read(dir.path().join(png)).expect(png);
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
}

/// `--challenge`: the sale asks for a solved challenge, and the tool pays for each in
/// Rust, as a scripted buyer would, and says what that cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_challenge_the_load_tool_solves_one_per_attempt_and_reports_its_cost() {
    const WORK: u64 = 1_000;
    let harness = Harness::start("load-tool-challenge").await;
    let (stdout, report, _dir) = load_tool(
        &harness,
        "load-pow",
        4,
        &[
            "--stock",
            "2",
            "--shards",
            "1",
            "--attempts",
            "4",
            "--challenge",
            &WORK.to_string(),
        ],
    )
    .await;
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(report["audit_passed"], true, "{report:#}");
    assert_eq!(report["reserved"], 2, "{report:#}");
    assert_eq!(report["config"]["challenge_work"], WORK);
    let cost = &report["challenge"];
    assert_eq!(cost["solves"], 4, "one per attempt: {report:#}");
    let mean = cost["derivations_mean"].as_f64().unwrap();
    assert!(
        (1.0..=WORK as f64 + 1.0).contains(&mean),
        "a search stops at most at the work: {cost}"
    );
    assert!(
        cost["solves_per_core_second"].as_f64().unwrap() > 0.0,
        "{cost}"
    );
    assert!(stdout.contains("solves and"), "{stdout}");
    let sale = harness.api.sale("load-pow").await.unwrap();
    assert_eq!(sale.body["challenge_work"], WORK, "{}", sale.body);
}
