//! Runs the real `oncebox-bench` binary with small sizes and checks the shape and sanity
//! of its JSON reports: each benchmark at least once with its defaults but for its size.
//! Never asserts performance targets: figures depend on the machine.

mod support;

use serde_json::Value;
use support::{bench, number, oncebox_bench};

/// Checks the fields shared by the throughput benchmarks (relay, consumer): the relay's
/// rounds also run the engine with a Prometheus recorder (`metered`), after the engine,
/// and with `--mode cdc` the log-tailing relay last.
fn check_comparison(report: &Value, messages: u64, rounds: usize) {
    let mut sides = if report["bench"] == "relay" {
        vec!["baseline", "engine", "metered"]
    } else {
        vec!["baseline", "engine"]
    };
    // Builds with the feature otel run a traced side after them in each round.
    if cfg!(feature = "otel") {
        sides.push("traced");
    }
    if report.get("cdc").is_some() {
        sides.extend(["cdc", "cdc-table"]);
    }
    assert!(number(report, "msgs_per_s") > 0.0, "{report}");
    assert!(number(report, "baseline_msgs_per_s") > 0.0, "{report}");
    let ratio = number(report, "ratio");
    assert!(ratio > 0.0 && ratio.is_finite(), "{report}");
    let expected = number(report, "msgs_per_s") / number(report, "baseline_msgs_per_s");
    assert!((ratio - expected).abs() < 1e-9, "{report}");
    assert_eq!(report["messages"].as_u64(), Some(messages), "{report}");
    let runs = report["runs"].as_array().expect("runs is an array");
    assert_eq!(runs.len(), sides.len() * rounds, "{report}");
    for (i, run) in runs.iter().enumerate() {
        let side = sides[i % sides.len()];
        assert_eq!(
            run["side"], side,
            "runs alternate, baseline first: {report}"
        );
        assert_eq!(run["messages"].as_u64(), Some(messages), "{report}");
        assert!(number(run, "msgs_per_s") > 0.0, "{report}");
        assert!(number(run, "seconds") > 0.0, "{report}");
    }
    let best = |side: &str| {
        runs.iter()
            .filter(|run| run["side"] == side)
            .map(|run| number(run, "msgs_per_s"))
            .fold(0.0, f64::max)
    };
    assert_eq!(best("engine"), number(report, "msgs_per_s"), "{report}");
    assert_eq!(
        best("baseline"),
        number(report, "baseline_msgs_per_s"),
        "{report}"
    );
    if cfg!(feature = "otel") {
        let tracing = &report["tracing"];
        assert_eq!(
            best("traced"),
            number(tracing, "traced_msgs_per_s"),
            "{report}"
        );
        let expected = number(tracing, "traced_msgs_per_s") / number(report, "msgs_per_s");
        assert!(
            (number(tracing, "ratio") - expected).abs() < 1e-9,
            "{report}"
        );
    } else {
        assert!(report.get("tracing").is_none(), "{report}");
    }
    if report["bench"] == "relay" {
        assert_eq!(
            best("metered"),
            number(report, "metered_msgs_per_s"),
            "{report}"
        );
        let expected = number(report, "metered_msgs_per_s") / number(report, "msgs_per_s");
        assert!(
            (number(report, "metrics_ratio") - expected).abs() < 1e-9,
            "{report}"
        );
    }
}

/// Checks a latency report of one run measuring each of `wakes`, in that order.
fn check_latency(report: &Value, wakes: &[&str], rate: u64, seconds: u64) {
    assert_eq!(report["bench"], "latency", "{report}");
    assert_eq!(report["rate"].as_u64(), Some(rate), "{report}");
    assert_eq!(report["seconds"].as_u64(), Some(seconds), "{report}");
    let measured = report["wakes"].as_array().expect("wakes is an array");
    assert_eq!(measured.len(), wakes.len(), "{report}");
    for (wake, measured) in wakes.iter().zip(measured) {
        assert_eq!(measured["wake"], *wake, "{report}");
        // The warm-up second is not counted.
        assert_eq!(
            measured["messages"].as_u64(),
            Some(rate * seconds),
            "{report}"
        );
        let (p50, p99, max) = (
            number(measured, "p50_ms"),
            number(measured, "p99_ms"),
            number(measured, "max_ms"),
        );
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{report}");
        assert!(max.is_finite(), "{report}");
        assert!(number(measured, "achieved_rate") > 0.0, "{report}");
        let early = measured["early"].as_u64().expect("early is a count");
        assert!(early <= rate * seconds, "{report}");
    }
}

#[test]
fn relay_on_sqlite_reports_engine_baseline_and_ratio() {
    let report = bench(&["relay", "--store", "sqlite", "--messages", "2000"]);
    assert_eq!(report["bench"], "relay", "{report}");
    assert_eq!(report["store"], "sqlite", "{report}");
    assert_eq!(report["transport"], "memory", "{report}");
    assert_eq!(report["batch"].as_u64(), Some(256), "{report}");
    check_comparison(&report, 2000, 3);
}

#[test]
fn relay_takes_batch_and_rounds() {
    let report = bench(&[
        "relay",
        "--messages",
        "500",
        "--batch",
        "7",
        "--rounds",
        "1",
        "--keys",
        "3",
    ]);
    assert_eq!(report["batch"].as_u64(), Some(7), "{report}");
    assert_eq!(report["keys"].as_u64(), Some(3), "{report}");
    check_comparison(&report, 500, 1);
}

#[test]
fn latency_on_sqlite_reports_ordered_percentiles() {
    let report = bench(&[
        "latency",
        "--store",
        "sqlite",
        "--rate",
        "200",
        "--seconds",
        "2",
        "--wake",
        "notify,poll",
    ]);
    assert_eq!(report["store"], "sqlite", "{report}");
    check_latency(&report, &["notify", "poll"], 200, 2);
}

#[test]
fn consumer_on_sqlite_reports_engine_baseline_and_ratio() {
    let report = bench(&["consumer", "--store", "sqlite", "--messages", "1000"]);
    assert_eq!(report["bench"], "consumer", "{report}");
    assert_eq!(report["lanes"].as_u64(), Some(16), "{report}");
    assert_eq!(report["retries"].as_u64(), Some(0), "{report}");
    check_comparison(&report, 1000, 3);
}

// PostgreSQL: the server at `ONCEBOX_PG_URL` (default
// `postgres://postgres@127.0.0.1:5432/postgres`), which `scripts/test` starts. Each run
// works in a schema of its own and drops it.

#[test]
fn relay_on_postgres_reports_engine_baseline_and_ratio() {
    let report = bench(&["relay", "--store", "postgres", "--messages", "2000"]);
    assert_eq!(report["bench"], "relay", "{report}");
    assert_eq!(report["store"], "postgres", "{report}");
    check_comparison(&report, 2000, 3);
}

/// The log-tailing relay's benchmarks, in one test so that the check for slots left
/// behind sees no other benchmark's: latency beside notify and poll in one run, and
/// relay throughput with `--mode cdc`. Each run reads a slot of its own (named after its
/// schema, `bench_…`) and drops it, with its publication.
#[test]
fn log_tailing_on_postgres_is_measured_beside_polling() {
    let wakes = ["notify", "poll", "cdc", "cdc-table"];
    let report = bench(&[
        "latency",
        "--store",
        "postgres",
        "--rate",
        "200",
        "--seconds",
        "2",
        "--wake",
        &wakes.join(","),
    ]);
    assert_eq!(report["store"], "postgres", "{report}");
    check_latency(&report, &wakes, 200, 2);

    let report = bench(&[
        "relay",
        "--store",
        "postgres",
        "--mode",
        "cdc",
        "--messages",
        "3000",
        "--keys",
        "50",
        "--rounds",
        "1",
    ]);
    check_comparison(&report, 3000, 1);
    let cdc = &report["cdc"];
    let runs = report["runs"].as_array().expect("runs is an array");
    for (side, field, ratio) in [
        ("cdc", "msgs_per_s", "ratio"),
        ("cdc-table", "table_msgs_per_s", "table_ratio"),
    ] {
        let run = runs
            .iter()
            .find(|run| run["side"] == side)
            .expect("a run of each log-tailing side");
        assert_eq!(number(run, "msgs_per_s"), number(cdc, field), "{report}");
        let expected = number(cdc, field) / number(&report, "msgs_per_s");
        assert!((number(cdc, ratio) - expected).abs() < 1e-9, "{report}");
    }

    assert_eq!(slots_left(), 0, "slots or publications were left behind");
}

/// The replication slots and publications of the benchmarks (`bench_…`) on the
/// PostgreSQL server of the tests.
fn slots_left() -> i64 {
    let url = std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .expect("PostgreSQL answers");
        sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'bench\\_%')
                  + (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'bench\\_%')",
        )
        .fetch_one(&pool)
        .await
        .expect("the count")
    })
}

#[test]
fn enqueue_compares_an_outbox_row_with_a_logical_message() {
    let report = bench(&[
        "enqueue",
        "--messages",
        "600",
        "--producers",
        "3",
        "--rounds",
        "2",
    ]);
    assert_eq!(report["bench"], "enqueue", "{report}");
    assert_eq!(report["producers"].as_u64(), Some(3), "{report}");
    let runs = report["runs"].as_array().expect("runs is an array");
    let sides: Vec<&str> = runs.iter().filter_map(|run| run["side"].as_str()).collect();
    assert_eq!(
        sides,
        ["bare", "row", "message", "bare", "row", "message"],
        "{report}"
    );
    for run in runs {
        assert_eq!(run["messages"].as_u64(), Some(600), "{report}");
        assert!(number(run, "msgs_per_s") > 0.0, "{report}");
    }
    let ratio = number(&report, "message_tx_per_s") / number(&report, "row_tx_per_s");
    assert!((number(&report, "ratio") - ratio).abs() < 1e-9, "{report}");
    assert!(number(&report, "bare_tx_per_s") > 0.0, "{report}");
}

#[test]
fn batch_on_sqlite_compares_one_by_one_with_one_batch() {
    let report = bench(&["batch", "--transactions", "20", "--rounds", "2"]);
    assert_eq!(report["bench"], "batch", "{report}");
    assert_eq!(report["store"], "sqlite", "{report}");
    assert_eq!(report["messages"].as_u64(), Some(100), "{report}");
    let runs = report["runs"].as_array().expect("runs is an array");
    let sides: Vec<&str> = runs.iter().filter_map(|run| run["side"].as_str()).collect();
    // Which side goes first alternates from round to round.
    assert_eq!(
        sides,
        ["one-by-one", "batched", "batched", "one-by-one"],
        "{report}"
    );
    for run in runs {
        assert_eq!(run["messages"].as_u64(), Some(20 * 100), "{report}");
        assert!(number(run, "msgs_per_s") > 0.0, "{report}");
    }
    let ratio = number(&report, "batched_tx_per_s") / number(&report, "one_by_one_tx_per_s");
    assert!((number(&report, "ratio") - ratio).abs() < 1e-9, "{report}");
}

#[test]
fn admin_times_the_dashboards_reads_of_a_filled_outbox() {
    let report = bench(&["admin", "--rows", "20000", "--runs", "2"]);
    assert_eq!(report["bench"], "admin", "{report}");
    assert_eq!(report["rows"].as_u64(), Some(20_000), "{report}");
    assert_eq!(report["pending"].as_u64(), Some(100), "{report}");
    let cases = report["cases"].as_array().expect("cases is an array");
    assert!(cases.len() > 10, "{report}");
    for case in cases {
        let name = case["case"].as_str().expect("a case name");
        let returned = case["returned"].as_u64().expect("rows returned");
        if name.contains("page") {
            assert!(returned <= 50, "{name}: {returned} rows");
        }
        if name.starts_with("no filter") {
            assert_eq!(returned, 50, "{name}");
        }
        assert!(number(case, "median_ms") > 0.0, "{report}");
    }
    let plan = report["deepest_plan"]
        .as_str()
        .expect("the deepest page's plan");
    assert!(
        plan.contains("Index Scan Backward using outbox_pkey"),
        "the deepest page reads the primary key from its start: {plan}"
    );
}

#[test]
fn consumer_on_postgres_reports_engine_baseline_and_ratio() {
    let report = bench(&["consumer", "--store", "postgres", "--messages", "1000"]);
    assert_eq!(report["store"], "postgres", "{report}");
    assert_eq!(report["retries"].as_u64(), Some(0), "{report}");
    check_comparison(&report, 1000, 3);
}

#[test]
fn a_bad_database_url_is_reported_without_its_password() {
    let out = oncebox_bench()
        .args(["relay", "--store", "postgres", "--json"])
        .args([
            "--database-url",
            "postgres://nobody:secret@127.0.0.1:1/none",
        ])
        .output()
        .expect("the oncebox-bench binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("connecting to PostgreSQL"), "{stderr}");
    assert!(
        !stderr.contains("secret"),
        "the password is shown: {stderr}"
    );
    assert!(out.stdout.is_empty(), "a failed run prints no report");
}

#[test]
fn human_output_is_a_table_and_bad_flags_are_refused() {
    let out = oncebox_bench()
        .args(["relay", "--messages", "300", "--rounds", "1"])
        .output()
        .expect("the oncebox-bench binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("baseline") && stdout.contains("ratio"),
        "{stdout}"
    );

    for bad in [
        &["relay", "--messages", "0"][..],
        &["relay", "--store", "oracle"],
        &["relay", "--transport", "carrier-pigeon"],
        &["latency", "--wake", "sometimes"],
        &["latency", "--wake", "notify,sometimes"],
        &["latency", "--rate", "0"],
        // The log-tailing relay reads PostgreSQL only.
        &[
            "latency",
            "--store",
            "sqlite",
            "--wake",
            "cdc",
            "--seconds",
            "1",
        ],
        &[
            "relay",
            "--store",
            "sqlite",
            "--mode",
            "cdc",
            "--messages",
            "10",
        ],
        &["enqueue", "--producers", "0"],
        &["consumer", "--lanes", "0"],
    ] {
        let out = oncebox_bench()
            .args(bad)
            .output()
            .expect("the oncebox-bench binary runs");
        assert!(!out.status.success(), "{bad:?} was accepted");
    }
}

/// `bench relay` through each real broker the cli was built with: the relay and the
/// raw client both publish every message (the run checks the broker's count) and the
/// report compares them.
#[cfg(any(
    feature = "nats",
    feature = "rabbitmq",
    feature = "kafka",
    feature = "redis-streams",
    feature = "sqs"
))]
fn relay_through(transport: &str) {
    let report = bench(&[
        "relay",
        "--store",
        "sqlite",
        "--transport",
        transport,
        "--messages",
        "2000",
        "--rounds",
        "1",
    ]);
    assert_eq!(report["transport"], transport, "{report}");
    check_comparison(&report, 2000, 1);
}

#[cfg(feature = "nats")]
#[test]
fn relay_through_nats() {
    relay_through("nats");
}

/// `relay --processes`: real `oncebox relay` processes over one PostgreSQL outbox into
/// the local three-node NATS cluster's R3 stream (`scripts/services.sh nats-cluster`),
/// each count timed and compared with the first.
#[cfg(feature = "nats")]
#[test]
fn relay_processes_drain_one_outbox_into_the_nats_cluster() {
    let report = bench(&[
        "relay",
        "--store",
        "postgres",
        "--transport",
        "nats",
        "--broker-url",
        "nats://127.0.0.1:4251,nats://127.0.0.1:4252,nats://127.0.0.1:4253",
        "--stream-replicas",
        "3",
        "--processes",
        "1,2",
        "--messages",
        "3000",
        "--rounds",
        "1",
    ]);
    assert_eq!(report["bench"], "relay-processes", "{report}");
    let counts = report["counts"].as_array().expect("counts");
    let processes: Vec<u64> = counts
        .iter()
        .filter_map(|c| c["processes"].as_u64())
        .collect();
    assert_eq!(processes, [1, 2], "{report}");
    assert_eq!(number(&counts[0], "ratio"), 1.0, "{report}");
    assert!(number(&counts[1], "msgs_per_s") > 0.0, "{report}");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report}");
    for run in runs {
        assert!(number(run, "seconds") > 0.0, "{run}");
        assert!(number(run, "start_s") > 0.0, "{run}");
        // Counted after the first look at the broker that found messages.
        let counted = run["messages"].as_u64().expect("messages");
        assert!((1..3000).contains(&counted), "{run}");
    }
}

/// `--processes` starts `oncebox relay` processes, which read a PostgreSQL outbox and
/// publish to NATS: other stores and brokers are refused, with the reason.
#[test]
fn relay_processes_elsewhere_are_refused_with_the_reason() {
    let out = oncebox_bench()
        .args([
            "relay",
            "--store",
            "sqlite",
            "--processes",
            "1,2",
            "--messages",
            "10",
        ])
        .output()
        .expect("the oncebox-bench binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--store postgres"), "{stderr}");
    let out = oncebox_bench()
        .args([
            "relay",
            "--store",
            "postgres",
            "--processes",
            "1",
            "--messages",
            "10",
        ])
        .output()
        .expect("the oncebox-bench binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--transport nats"), "{stderr}");
}

#[cfg(feature = "rabbitmq")]
#[test]
fn relay_through_rabbitmq() {
    relay_through("rabbitmq");
}

#[cfg(feature = "kafka")]
#[test]
fn relay_through_kafka() {
    relay_through("kafka");
}

#[cfg(feature = "redis-streams")]
#[test]
fn relay_through_redis_streams() {
    relay_through("redis");
}

/// Into a FIFO queue of the local SQS-compatible server (`scripts/services.sh sqs`),
/// against `SendMessageBatch` requests of ten from the raw SDK client.
#[cfg(feature = "sqs")]
#[test]
fn relay_through_sqs() {
    relay_through("sqs");
}

#[cfg(feature = "mysql")]
#[test]
fn relay_on_mysql_reports_engine_baseline_and_ratio() {
    let report = bench(&[
        "relay",
        "--store",
        "mysql",
        "--messages",
        "2000",
        "--rounds",
        "1",
    ]);
    assert_eq!(report["store"], "mysql", "{report}");
    check_comparison(&report, 2000, 1);
}
