//! Running the real `oncebox-bench` binary and reading its JSON reports.

#![allow(dead_code, unreachable_pub)]

use std::process::Command;

use serde_json::Value;

/// The `oncebox-bench` binary.
pub fn oncebox_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oncebox-bench"))
}

/// Runs `oncebox-bench ARGS --json`, fails the test unless it succeeded, and returns its
/// report.
pub fn bench(args: &[&str]) -> Value {
    let out = oncebox_bench()
        .args(args)
        .arg("--json")
        .output()
        .expect("the oncebox-bench binary runs");
    assert!(
        out.status.success(),
        "oncebox-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout of {args:?} is not one JSON object ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `field` of `report`, a number.
pub fn number(report: &Value, field: &str) -> f64 {
    report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing or not a number: {report}"))
}
