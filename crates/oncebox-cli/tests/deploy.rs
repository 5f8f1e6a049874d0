//! The deployment files of `deploy/` against the binary they deploy: every metric the
//! alert rules and the dashboard query is one a live `oncebox relay` (polling and log
//! tailing) or `oncebox receive` exports, the rules follow their conventions and point
//! at runbooks that exist.

mod deploy_files;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use support::{Service, psql, run_ok, wait_for, write_config};

/// The extraction of metric names finds the metrics and nothing else: not functions,
/// keywords, labels, label values, ranges, numbers or Grafana's variables.
#[test]
fn metric_names_are_read_out_of_promql() {
    let names = |expr: &str| {
        deploy_files::metric_names(expr)
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (spool, le) (rate(oncebox_spool_lag_seconds_bucket{job=~"$job",a="x{y}"}[$__rate_interval])))"#
        ),
        ["oncebox_spool_lag_seconds_bucket"]
    );
    assert_eq!(
        names(
            "max by (job) (a_gauge) > 4 * 1024 and on (job) sum without (instance) (rate(b_total[5m] offset 1h)) == 0 or c:recorded unless d > 1e3"
        ),
        ["a_gauge", "b_total", "c:recorded", "d"]
    );
    assert_eq!(names(r#"up{job="x"} == bool 0"#), ["up"]);
}

/// A polling relay, a log-tailing relay and a receiver run on PostgreSQL and Redis
/// Streams; what their `/metrics` declare covers every metric the shipped rules and
/// dashboard query (a histogram's `_bucket`, `_sum` and `_count` belong to it), but for
/// the few the platform exports (`deploy_files::PLATFORM_METRICS`). A metric renamed in the
/// binary fails here, not in the operator's night.
#[test]
fn every_metric_the_rules_and_the_dashboard_query_is_exported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("deploy");
    let _cleanup =
        support::LogTailingCleanup::new(&schema).with_redis_key(format!("{schema}:orders"));
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"

[broker]
url = "{redis}"
key_prefix = "{schema}:"

[relay]
stats_interval = "100ms"
poll_max = "200ms"

[cdc]
slot = "{schema}"

[receive]
topic = "orders"
"#,
            pg = support::pg_url(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let cdc_config = write_config(
        dir.path(),
        "cdc.toml",
        &format!(
            "{}\n",
            std::fs::read_to_string(&config)
                .expect("the config")
                .replace("[relay]\n", "[relay]\nmode = \"cdc\"\n")
        ),
    );
    let mut services = vec![
        Service::start(dir.path(), "relay", &config, &["relay"]),
        Service::start(dir.path(), "cdc", &cdc_config, &["relay"]),
        Service::start(dir.path(), "receive", &config, &["receive"]),
    ];
    for service in &mut services {
        service.wait_ready(Duration::from_secs(60));
    }
    // The slot's gauges come with the first reading after the slot exists.
    wait_for("the slot's gauges", Duration::from_secs(30), || {
        services[1]
            .metrics()
            .filter(|text| text.contains("oncebox_cdc_slot_active{"))
    });
    let mut exported: BTreeMap<String, String> = BTreeMap::new();
    for service in &services {
        let text = service.metrics().expect("/metrics answers");
        exported.extend(deploy_files::families(&text));
    }
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{schema}'"
        ))
        .trim(),
        "1"
    );
    drop(services);

    let recorded: BTreeSet<String> = deploy_files::rules(deploy_files::RULES)
        .iter()
        .filter_map(|rule| rule["record"].as_str().map(str::to_owned))
        .collect();
    let platform: BTreeSet<&str> = deploy_files::PLATFORM_METRICS
        .iter()
        .map(|(name, _)| *name)
        .collect();
    let mut missing = Vec::new();
    let mut queried = BTreeSet::new();
    for (place, expr) in deploy_files::expressions() {
        let names = deploy_files::metric_names(&expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        for name in names {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = name.strip_suffix(suffix)?;
                    (exported.get(base).map(String::as_str) == Some("histogram"))
                        .then(|| base.to_owned())
                })
                .unwrap_or_else(|| name.clone());
            let known = exported.contains_key(&family)
                || recorded.contains(&family)
                || platform.contains(family.as_str());
            if !known {
                missing.push(format!("{place}: {name}"));
            }
            queried.insert(family);
        }
    }
    assert!(
        missing.is_empty(),
        "queried but not exported:\n{}\nexported: {:?}",
        missing.join("\n"),
        exported.keys().collect::<Vec<_>>()
    );
    // The board covers what the issue names.
    for name in [
        "oncebox_spool_pending_rows",
        "oncebox_spool_oldest_pending_age_seconds",
        "oncebox_spool_rows_total",
        "oncebox_spool_lag_seconds",
        "oncebox_cdc_slot_lag_bytes",
        "oncebox_consumer_messages_total",
        "oncebox_ready",
    ] {
        assert!(queried.contains(name), "nothing queries {name}");
    }
}

/// Every alert has a severity of kube-prometheus' (`warning`, `critical`), a summary, a
/// description and a runbook URL whose anchor is a heading of docs/operations.md (one
/// section per alert); every recording rule is named `level:metric:operations`.
#[test]
fn the_rules_follow_their_conventions_and_their_runbooks_exist() {
    let runbook = deploy_files::read("docs/operations.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|line| line.strip_prefix("### "))
        .map(|heading| {
            heading
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let mut alerts = 0;
    for rule in deploy_files::rules(deploy_files::RULES) {
        if let Some(record) = rule["record"].as_str() {
            assert_eq!(
                record.split(':').count(),
                3,
                "{record}: level:metric:operations"
            );
            continue;
        }
        let alert = rule["alert"].as_str().expect("an alert or a record");
        alerts += 1;
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{alert}: severity {severity:?}"
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|text| !text.is_empty()),
                "{alert}: no {key}"
            );
        }
        let url = rule["annotations"]["runbook_url"].as_str().expect("a URL");
        let (page, anchor) = url.split_once('#').expect("the URL names a section");
        assert!(page.ends_with("/docs/operations.md"), "{alert}: {url}");
        assert_eq!(anchor, alert.to_lowercase(), "{alert}: its own section");
        assert!(
            anchors.contains(anchor),
            "{alert}: docs/operations.md has no section `### {alert}`"
        );
    }
    assert!(alerts >= 9, "{alerts} alerts");
}
