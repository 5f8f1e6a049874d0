//! The shipped alert rules in a real Prometheus server (Debian's `prometheus`, on a port
//! and in a data directory of the test's own) scraping a real `oncebox relay`: the relay
//! stopped while producers keep writing, the backlog alert fires; the relay started
//! again, it resolves. The rules are the shipped file with its `for:` durations cut to
//! seconds, evaluated every second, so that the test takes seconds, not minutes.

mod deploy_files;
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{Service, psql, run_ok, wait_for, write_config};

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// Starts one over `dir`, scraping `target` every second as job `oncebox-relay`,
    /// with the rules of `rules`.
    fn start(dir: &Path, target: u16, rules: &Path) -> Self {
        let port = support::free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: oncebox-relay\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
                rules = rules.display()
            ),
        )
        .expect("the config is written");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("a log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts (scripts/services.sh ops-tools installs it)");
        Self { child, port }
    }

    /// The state of alert `name` (`pending`, `firing`), if it is active.
    fn alert(&self, name: &str) -> Option<String> {
        let (status, body) = support::http_get(self.port, "/api/v1/alerts")?;
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        answer["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|alert| alert["labels"]["alertname"] == name)
            .map(|alert| alert["state"].as_str().unwrap_or_default().to_owned())
    }

    /// Whether the scrape of the relay works now.
    fn target_up(&self) -> bool {
        support::http_get(
            self.port,
            "/api/v1/query?query=up%7Bjob%3D%22oncebox-relay%22%7D",
        )
        .is_some_and(|(_, body)| body.contains(r#""value":["#) && body.contains(r#","1"]"#))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped rules with every `for:` cut to `held`.
fn quick_rules(dir: &Path, held: &str) -> std::path::PathBuf {
    let shipped = deploy_files::read(deploy_files::RULES);
    let held_for = regex::Regex::new(r"(?m)^(\s+)for: \d+[smh]$").expect("a regex");
    let quick = held_for.replace_all(&shipped, format!("${{1}}for: {held}"));
    assert_ne!(quick, shipped, "the rules hold alerts with for:");
    let path = dir.join("rules.yml");
    std::fs::write(&path, quick.as_bytes()).expect("the rules are written");
    path
}

#[test]
fn the_backlog_alert_fires_while_the_relay_is_stopped_and_resolves_when_it_is_back() {
    const ALERT: &str = "OnceboxOutboxBacklogOld";
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("alerting");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\nschema = \"{schema}\"\n\n[broker]\nurl = \"{redis}\"\nkey_prefix = \"{schema}:\"\n\n\
             [relay]\nstats_interval = \"200ms\"\npoll_max = \"200ms\"\n",
            pg = support::pg_url(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let port = support::free_port();
    let mut relay = Service::start_on(port, dir.path(), "relay-1", &config, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    let prometheus = Prometheus::start(dir.path(), port, &quick_rules(dir.path(), "3s"));

    // Producers write an order every 100 ms from now on.
    let writing = Arc::new(AtomicBool::new(true));
    let producer = {
        let writing = Arc::clone(&writing);
        let schema = schema.clone();
        std::thread::spawn(move || {
            let mut written = 0u64;
            while writing.load(Ordering::Relaxed) {
                psql(&format!(
                    "INSERT INTO {schema}.outbox (id, topic, key, kind, payload) \
                     VALUES (gen_random_uuid(), 'orders', 'c{}', 'OrderPlaced', '\\x7b7d')",
                    written % 10
                ));
                written += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            written
        })
    };

    wait_for(
        "Prometheus to scrape the relay",
        Duration::from_secs(60),
        || prometheus.target_up().then_some(()),
    );
    // Held for longer than `for:` with the relay draining: no alert.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        prometheus.alert(ALERT),
        None,
        "no alert while the relay drains"
    );

    relay.stop_cleanly(Duration::from_secs(30));
    let fired = wait_for("the backlog alert to fire", Duration::from_secs(60), || {
        prometheus.alert(ALERT).filter(|state| state == "firing")
    });
    assert_eq!(fired, "firing");
    let pending: u64 = psql(&format!(
        "SELECT count(*) FROM {schema}.outbox WHERE status = 'pending'"
    ))
    .trim()
    .parse()
    .unwrap_or(0);
    assert!(pending > 0, "rows waited while the relay was stopped");

    let mut relay = Service::start_on(port, dir.path(), "relay-2", &config, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    wait_for(
        "the backlog alert to resolve",
        Duration::from_secs(60),
        || prometheus.alert(ALERT).is_none().then_some(()),
    );
    writing.store(false, Ordering::Relaxed);
    let written = producer.join().expect("the producer");
    assert!(written > 0);
    relay.stop_cleanly(Duration::from_secs(30));
    drop(prometheus);
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
    let _ = Command::new("redis-cli")
        .args([
            "-u",
            &support::redis_url(),
            "DEL",
            &format!("{schema}:orders"),
        ])
        .output();
}
