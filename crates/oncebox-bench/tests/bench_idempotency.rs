//! Runs `oncebox-bench http` and `oncebox-bench dedup` with small sizes, on memory and on
//! Redis, and checks the shape of their JSON reports. Never asserts performance targets:
//! figures depend on the machine.

mod support;

use serde_json::Value;
use support::bench;

fn positive(report: &Value, field: &str) -> f64 {
    let value = report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing or not a number: {report}"));
    assert!(value > 0.0 && value.is_finite(), "{field}: {report}");
    value
}

fn check_http(report: &Value, store: &str, rounds: usize) {
    assert_eq!(report["bench"], "http");
    assert_eq!(report["store"], store);
    let bare = positive(report, "bare_requests_per_s");
    let first = positive(report, "requests_per_s");
    let replay = positive(report, "replay_requests_per_s");
    assert!(
        (positive(report, "ratio") - first / bare).abs() < 1e-9,
        "{report}"
    );
    assert!(
        (positive(report, "replay_ratio") - replay / bare).abs() < 1e-9,
        "{report}"
    );
    // One run of each variant per round.
    assert_eq!(
        report["runs"].as_array().map(Vec::len),
        Some(3 * rounds),
        "{report}"
    );
}

/// With its documented defaults but the size: three rounds, and the memory a key costs.
#[test]
fn bench_http_memory() {
    let report = bench(&["http", "--store", "memory", "--requests", "300"]);
    check_http(&report, "memory", 3);
    // The warm-up's keys and each round's: a first request and its replay share one.
    assert_eq!(report["keys_held"], 4 * 300, "{report}");
    assert!(report["bytes_per_key"].as_f64().is_some(), "{report}");
}

#[test]
fn bench_http_redis_layered() {
    let report = bench(&[
        "http",
        "--store",
        "redis",
        "--layered",
        "--requests",
        "300",
        "--rounds",
        "1",
    ]);
    check_http(&report, "redis", 1);
    assert_eq!(report["layered"], true);
}

#[test]
fn bench_dedup_memory_reports_ns_per_check() {
    let report = bench(&[
        "dedup", "--store", "memory", "--ops", "2000", "--rounds", "1",
    ]);
    assert_eq!(report["bench"], "dedup");
    positive(&report, "cycles_per_s");
    let checks = positive(&report, "checks_per_s");
    positive(&report, "layered_checks_per_s");
    positive(&report, "baseline_per_s");
    positive(&report, "ratio");
    let ns = positive(&report, "ns_per_check");
    assert!((ns - 1e9 / checks).abs() < 1e-6, "{report}");
}

/// With its default rounds (three), as the README runs it: every round keeps its ids in
/// the store, so a store sized for fewer refuses new ids at capacity from the third
/// round on.
#[test]
fn bench_dedup_memory_runs_its_default_rounds() {
    let report = bench(&["dedup", "--store", "memory", "--ops", "2000"]);
    assert_eq!(report["bench"], "dedup");
    let rounds = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| run["round"].as_u64().expect("a round"))
        .max();
    assert_eq!(rounds, Some(3), "{report}");
}

#[test]
fn bench_dedup_redis() {
    let report = bench(&["dedup", "--store", "redis", "--ops", "500", "--rounds", "1"]);
    assert_eq!(report["store"], "redis");
    positive(&report, "cycles_per_s");
    positive(&report, "checks_per_s");
    assert!(report.get("ns_per_check").is_none(), "{report}");
}
