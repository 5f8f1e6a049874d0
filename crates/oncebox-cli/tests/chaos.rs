//! `oncebox chaos`, the short run: real relay and payment processes on the local
//! PostgreSQL and a real broker, under SIGKILLs, a pause past the relays' lease, cut
//! database connections, one process's link to PostgreSQL or the broker cut, stalled
//! or slowed, a broker restart and (NATS) a PostgreSQL restart; the audit must
//! find every order charged exactly once and published in order.
//!
//! The restarts go through `scripts/services.sh restart`, and stop the shared services
//! for a second or two (Redis writes a snapshot at shutdown and loads it again): this
//! test binary holds the only tests that do it, and cargo runs test binaries one after
//! another.

#![cfg(all(feature = "nats", feature = "redis-streams"))]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

fn services() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    root.display().to_string()
}

/// One run at a time: a run's restarts would strike the other's services.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn chaos(args: &[&str]) -> Value {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("chaos")
        .args(args)
        .arg("--json")
        .output()
        .expect("the oncebox binary runs");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && report["passed"] == true,
        "the chaos run failed: {report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

fn count(report: &Value, section: &str, field: &str) -> u64 {
    report[section][field]
        .as_u64()
        .unwrap_or_else(|| panic!("{section}.{field} missing: {report}"))
}

/// The audit's figures agree with each other: every order committed, charged once and
/// found at the broker; the faults asked for were injected.
fn check(report: &Value, orders: u64, faults: &[(&str, u64)]) {
    assert_eq!(count(report, "ledger", "committed"), orders, "{report}");
    assert_eq!(count(report, "ledger", "charged_once"), orders, "{report}");
    for field in ["never_charged", "charged_twice", "phantom_charges"] {
        assert_eq!(count(report, "ledger", field), 0, "{report}");
    }
    assert_eq!(count(report, "published", "orders"), orders, "{report}");
    assert_eq!(count(report, "published", "missing"), 0, "{report}");
    assert_eq!(count(report, "published", "out_of_order"), 0, "{report}");
    let fault = |kind: &str| report["faults"][kind].as_u64().unwrap_or(0);
    for (kind, n) in faults {
        let injected = match *kind {
            "kill" => fault("kill_relay") + fault("kill_consumer"),
            "cut" | "stall" | "slow" => {
                fault(&format!("{kind}_database")) + fault(&format!("{kind}_broker"))
            }
            _ => fault(kind),
        };
        assert_eq!(injected, *n, "{kind}: {report}");
    }
}

/// A short run on `broker`: 3,000 orders at 300/s, 8 kills, a pause, a termination of
/// the relays' connections, two cuts, stalls and slowdowns of one process's link, plus
/// `extra` flags.
fn short_run(broker: &str, seed: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "--broker-url",
        broker,
        "--orders",
        "3000",
        "--rate",
        "300",
        "--kills",
        "8",
        "--pauses",
        "1",
        "--terminations",
        "1",
        "--cuts",
        "2",
        "--stalls",
        "2",
        "--slowdowns",
        "2",
        "--seed",
        seed,
    ];
    args.extend_from_slice(extra);
    chaos(&args)
}

#[test]
fn nats_survives_kills_pauses_cut_connections_and_restarts() {
    let services = services();
    let restart_nats = format!("{services} restart nats");
    let restart_postgres = format!("{services} restart postgres");
    let report = short_run(
        "nats://127.0.0.1:4222",
        "23",
        &[
            "--restart-broker",
            &restart_nats,
            "--broker-restarts",
            "1",
            "--restart-postgres",
            &restart_postgres,
            "--postgres-restarts",
            "1",
        ],
    );
    assert_eq!(report["broker"], "nats", "{report}");
    check(
        &report,
        3000,
        &[
            ("kill", 8),
            ("terminate_relay_connections", 1),
            ("cut", 2),
            ("stall", 2),
            ("slow", 2),
            ("restart_broker", 1),
            ("restart_postgres", 1),
        ],
    );
}

#[test]
fn redis_streams_survive_kills_pauses_cut_connections_and_a_restart() {
    let restart_redis = format!("{} restart redis", services());
    let report = short_run(
        "redis://127.0.0.1:6379",
        "24",
        &["--restart-broker", &restart_redis, "--broker-restarts", "1"],
    );
    assert_eq!(report["broker"], "redis", "{report}");
    check(
        &report,
        3000,
        &[
            ("kill", 8),
            ("terminate_relay_connections", 1),
            ("cut", 2),
            ("stall", 2),
            ("slow", 2),
            ("restart_broker", 1),
        ],
    );
}
