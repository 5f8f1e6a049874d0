//! Runs the real `oncebox-peer-bench` with its defaults but for the backlog's size, on
//! the local PostgreSQL, and checks its report and that it leaves nothing behind. Never
//! asserts performance: figures depend on the machine.

use std::process::Command;

use serde_json::Value;

fn url() -> String {
    std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

fn number(value: &Value, field: &str) -> f64 {
    value[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {value}"))
}

/// The JSON report of a run with `args` on the local server; the run must succeed.
fn report(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_oncebox-peer-bench"))
        .args(args)
        .arg("--json")
        .env("ONCEBOX_PG_URL", url())
        .output()
        .expect("running oncebox-peer-bench");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

/// Whether `schema` exists.
async fn exists(schema: &str) -> bool {
    let pool = sqlx::PgPool::connect(&url()).await.expect("connecting");
    let found: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&pool)
            .await
            .expect("looking the schema up");
    pool.close().await;
    found
}

#[tokio::test]
async fn both_relays_drain_the_backlog_in_alternating_rounds() {
    let report = report(&["--messages", "2000"]);
    assert_eq!(report["bench"], "peer", "{report}");
    assert_eq!(report["messages"], 2000, "{report}");
    assert_eq!(report["batch"], 256, "{report}");
    assert_eq!(report["keys"], 1000, "{report}");

    assert_eq!(report["delete_on_publish"], false, "{report}");
    assert_eq!(report["peer_async_commit"], false, "{report}");

    let runs = report["runs"].as_array().expect("runs is an array");
    assert_eq!(runs.len(), 6, "three rounds of two sides: {report}");
    let order = ["oncebox", "peer", "peer", "oncebox", "oncebox", "peer"];
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run["side"], order[i], "the first side alternates: {report}");
        assert_eq!(run["round"].as_u64(), Some(i as u64 / 2 + 1), "{report}");
        assert_eq!(run["messages"], 2000, "{report}");
        assert!(number(run, "msgs_per_s") > 0.0, "{report}");
    }
    let rates = |side: &str| {
        let mut rates: Vec<f64> = runs
            .iter()
            .filter(|run| run["side"] == side)
            .map(|run| number(run, "msgs_per_s"))
            .collect();
        rates.sort_by(f64::total_cmp);
        rates
    };
    let (ours, peer) = (rates("oncebox"), rates("peer"));
    for (field, expected) in [
        ("msgs_per_s", ours[2]),
        ("peer_msgs_per_s", peer[2]),
        ("ratio", ours[2] / peer[2]),
        ("median_msgs_per_s", ours[1]),
        ("peer_median_msgs_per_s", peer[1]),
        ("median_ratio", ours[1] / peer[1]),
    ] {
        assert!(
            (number(&report, field) - expected).abs() < 1e-9,
            "{field}: {report}"
        );
    }

    let schema = report["schema"].as_str().expect("the run's schema");
    assert!(schema.starts_with("peer_bench_"), "{report}");
    assert!(!exists(schema).await, "the run left {schema} behind");
}

#[test]
fn a_server_that_cannot_be_reached_is_an_error_that_says_so() {
    let output = Command::new(env!("CARGO_BIN_EXE_oncebox-peer-bench"))
        .args([
            "--messages",
            "10",
            "--url",
            "postgres://postgres@127.0.0.1:1/postgres",
        ])
        .output()
        .expect("running oncebox-peer-bench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("connecting to PostgreSQL"), "{stderr}");
}

#[test]
fn the_variants_run_and_say_so() {
    let report = report(&[
        "--messages",
        "500",
        "--rounds",
        "1",
        "--delete-on-publish",
        "--peer-async-commit",
    ]);
    assert_eq!(report["delete_on_publish"], true, "{report}");
    assert_eq!(report["peer_async_commit"], true, "{report}");
    let runs = report["runs"].as_array().expect("runs is an array");
    assert_eq!(runs.len(), 2, "{report}");
    assert!(runs.iter().all(|run| run["messages"] == 500), "{report}");
}
