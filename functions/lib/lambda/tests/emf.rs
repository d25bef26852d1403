//! The metrics as CloudWatch reads them: Embedded Metric Format documents on stdout.
//! One test function, because the collector is the process's global recorder.

use flashsale_domain::SaleId;
use flashsale_lambda::metrics::{self, GrabOutcome};
use serde_json::Value;

fn documents(telemetry: flashsale_lambda::telemetry::Telemetry) -> Vec<Value> {
    let mut out = Vec::new();
    telemetry.flush_to(&mut out).expect("flush to memory");
    String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON document"))
        .collect()
}

/// The one document whose dimension values match `dims`.
fn find<'a>(docs: &'a [Value], dims: &[(&str, &str)]) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|doc| dims.iter().all(|(name, value)| doc[*name] == *value))
        .collect();
    assert_eq!(found.len(), 1, "one document with {dims:?} in {docs:#?}");
    found[0]
}

#[test]
fn grab_outcomes_are_emf_documents_with_the_namespace_dimensions_and_counts() {
    let telemetry = flashsale_lambda::telemetry::install_metrics("stack-GrabFunction-AbC")
        .expect("the only recorder of this process");
    let phone = SaleId::parse("phone").unwrap();

    metrics::grab(Some(&phone), GrabOutcome::Reserved, true);
    metrics::grab(Some(&phone), GrabOutcome::Reserved, true);
    metrics::grab(Some(&phone), GrabOutcome::SoldOutGate, false);
    metrics::grab(Some(&phone), GrabOutcome::Refused("blocked"), false);
    metrics::release_lag(&phone, 42.5);
    let docs = documents(telemetry);

    let reserved = find(&docs, &[("sale_id", "phone"), ("reason", "reserved")]);
    let aws = &reserved["_aws"];
    assert!(aws["Timestamp"].as_u64().is_some_and(|ms| ms > 0));
    let directive = &aws["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "flashsale");
    let mut dimensions: Vec<&str> = directive["Dimensions"][0]
        .as_array()
        .expect("one dimension set")
        .iter()
        .map(|d| d.as_str().expect("dimension name"))
        .collect();
    dimensions.sort_unstable();
    assert_eq!(dimensions, ["function", "reason", "sale_id"]);
    assert_eq!(
        directive["Metrics"],
        serde_json::json!([{ "Name": "grab_outcome", "Unit": "Count" }])
    );
    assert_eq!(reserved["function"], "stack-GrabFunction-AbC");
    assert_eq!(reserved["grab_outcome"], 2);

    let gate = find(&docs, &[("sale_id", "phone"), ("reason", "sold_out_gate")]);
    assert_eq!(gate["grab_outcome"], 1);

    // A blocked user's sale id is the caller's word only: not a dimension value.
    let blocked = find(&docs, &[("reason", "blocked")]);
    assert_eq!(blocked["sale_id"], "unknown");

    // Reaching the database is its own metric, under the sale alone.
    let database = docs
        .iter()
        .find(|doc| doc.get("grab_reached_database").is_some())
        .expect("a grab_reached_database document");
    assert_eq!(database["grab_reached_database"], 2);
    assert_eq!(database["sale_id"], "phone");

    let lag = docs
        .iter()
        .find(|doc| doc.get("release_lag_seconds").is_some())
        .expect("a release lag document");
    assert_eq!(lag["release_lag_seconds"], serde_json::json!([42.5]));
    // Same dimensions, same document: each metric keeps its own unit.
    let units: Vec<(&str, &str)> = lag["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .expect("metric definitions")
        .iter()
        .map(|m| (m["Name"].as_str().unwrap(), m["Unit"].as_str().unwrap()))
        .collect();
    assert!(
        units.contains(&("release_lag_seconds", "Seconds")),
        "{units:?}"
    );
    assert!(
        units.contains(&("grab_reached_database", "Count")),
        "{units:?}"
    );

    // A flush writes what was recorded since the last one: nothing new, nothing out.
    assert!(documents(telemetry).is_empty());
}
