//! Runs the real `oncebox demo` binary and checks its audit.

use std::process::Command;

fn demo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("demo")
        .args(args)
        .output()
        .expect("the oncebox binary runs")
}

#[test]
fn chaos_run_charges_every_order_exactly_once() {
    for seed in ["1", "42"] {
        let out = demo(&["--json", "--orders", "1500", "--seed", seed]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "seed {seed}: demo failed: {stderr}");
        let report: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
        let n = |field: &str| {
            report[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{field} missing"))
        };
        assert!(
            n("orders") > 1300,
            "seed {seed}: few orders committed: {report}"
        );
        assert_eq!(n("charged_once"), n("orders"), "seed {seed}: {report}");
        assert_eq!(n("charged_more_than_once"), 0, "seed {seed}: {report}");
        assert_eq!(n("never_charged"), 0, "seed {seed}: {report}");
        assert_eq!(n("charges_without_order"), 0, "seed {seed}: {report}");
        assert!(
            n("rolled_back_checkouts") > 0,
            "seed {seed}: no rollback exercised: {report}"
        );
        // The chaos really happened, and the inbox absorbed it.
        assert!(n("duplicate_deliveries") > 0, "seed {seed}: {report}");
        assert!(n("faults_injected") > 0, "seed {seed}: {report}");
        assert!(
            report["faults"]["relay_crashes"].as_u64() > Some(0),
            "seed {seed}: {report}"
        );
        assert!(
            report["faults"]["consumer_crashes"].as_u64() > Some(0),
            "seed {seed}: {report}"
        );
    }
}

#[test]
fn human_report_names_the_verdict() {
    let out = demo(&["--orders", "200", "--seed", "7"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("charged exactly once"), "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
}

#[test]
fn refuses_an_existing_database_and_bad_flags() {
    let dir = tempfile::tempdir().expect("temp dir");
    let existing = dir.path().join("taken.db");
    std::fs::write(&existing, b"").expect("write");
    let out = demo(&["--db", existing.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));

    let out = demo(&["--orders", "0"]);
    assert!(!out.status.success());
    let out = demo(&["--orders", "many"]);
    assert!(!out.status.success());
}
