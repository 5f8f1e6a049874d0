//! Bad configurations of `oncebox relay`: each is refused with one line naming the key
//! or the cause, exit status 2, no password shown, and nothing written.

mod support;

use std::path::Path;
use std::process::Stdio;

use support::write_config;

/// A configuration on a SQLite file that must not be created, with `extra` appended and
/// `broker` as the broker URL.
fn config(dir: &Path, broker: &str, extra: &str) -> std::path::PathBuf {
    let toml = format!(
        "[store]\nurl = \"sqlite://{db}\"\n\n[broker]\nurl = \"{broker}\"\n\n{extra}\n",
        db = dir.join("never.db").display()
    );
    write_config(dir, "oncebox.toml", &toml)
}

/// Runs `oncebox relay` on `config` (plus `env`) and checks it is refused: status 2, one
/// line on stderr containing `needle`, nothing on stdout, no database file created.
fn refused(dir: &Path, config: &Path, env: &[(&str, &str)], needle: &str) -> String {
    let out = support::oncebox()
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .arg("--config")
        .arg(config)
        .args(["--listen", "off", "relay"])
        .stdin(Stdio::null())
        .output()
        .expect("the oncebox binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{needle}: status {:?}, stderr: {stderr}",
        out.status
    );
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{needle}: one line, not: {stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{needle}: the line names it: {stderr}"
    );
    assert!(out.stdout.is_empty(), "{needle}: nothing on stdout");
    assert!(
        !dir.join("never.db").exists(),
        "{needle}: no database file created"
    );
    stderr
}

#[test]
fn an_unknown_key_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config(
        dir.path(),
        "redis://127.0.0.1:6379",
        "[relay]\nbatchsize = 10",
    );
    let line = refused(dir.path(), &config, &[], "relay.batchsize");
    assert!(line.contains("unknown field"), "{line}");
}

#[test]
fn a_value_of_the_wrong_type_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config(
        dir.path(),
        "redis://127.0.0.1:6379",
        "[relay]\nbatch_size = \"many\"",
    );
    refused(dir.path(), &config, &[], "relay.batch_size");
    let config = support::write_config(
        dir.path(),
        "oncebox.toml",
        "[store]\nurl = \"sqlite://x\"\n[relay]\nlease = \"30 parsecs\"\n",
    );
    refused(dir.path(), &config, &[], "relay.lease");
}

#[test]
fn a_missing_store_url_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        "[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
    );
    refused(dir.path(), &config, &[], "store.url: missing");
}

#[test]
fn a_missing_broker_url_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!("[store]\nurl = \"{}\"\n", support::pg_url()),
    );
    refused(dir.path(), &config, &[], "broker.url: missing");
}

#[test]
fn an_unknown_transport_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config(dir.path(), "mqtt://127.0.0.1:1883", "");
    refused(dir.path(), &config, &[], "unknown broker");
}

/// Every transport is in the test build, so this case runs the check the build uses on
/// a transport it leaves out; the binary's own `--version` lists what it has.
#[test]
fn a_transport_not_in_the_build_names_its_feature() {
    let out = support::oncebox().arg("--version").output().expect("runs");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.contains("stores: sqlite, postgres"), "{version}");
    assert!(version.contains("brokers:"), "{version}");
    if !version.contains("kafka") {
        let dir = tempfile::tempdir().expect("a directory");
        let config = config(dir.path(), "kafka://127.0.0.1:9092", "");
        let line = refused(dir.path(), &config, &[], "not in this build");
        assert!(line.contains("--features kafka"), "{line}");
    }
}

#[test]
fn an_unreachable_store_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let toml = "[store]\nurl = \"postgres://postgres@127.0.0.1:1/postgres\"\nconnect_timeout = \"2s\"\n\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n";
    let config = write_config(dir.path(), "oncebox.toml", toml);
    refused(dir.path(), &config, &[], "store.url: cannot connect");
    // A SQLite file that does not exist is not created by the relay.
    let config = config_on_missing_sqlite(dir.path());
    refused(dir.path(), &config, &[], "store.url: cannot connect");
}

/// A database unreachable for a moment at start (a failover in progress, a restart) is
/// waited for: `oncebox migrate` through an address that refuses connections for 1.5 s
/// succeeds once it answers, within `store.connect_timeout`.
#[test]
fn a_store_back_within_the_connect_timeout_is_waited_for() {
    use oncebox_testkit::proxy::Proxy;

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = support::address(&support::pg_url(), 5432);
    let address = runtime.block_on(Proxy::start(server)).expect("a proxy");
    address.cut();
    let dir = tempfile::tempdir().expect("a directory");
    let schema = support::unique("wait_store");
    let toml = format!(
        "[store]\nurl = \"{}\"\nschema = \"{schema}\"\nconnect_timeout = \"20s\"\n\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
        support::through(&support::pg_url(), address.port())
    );
    let config = write_config(dir.path(), "oncebox.toml", &toml);
    let started = std::time::Instant::now();
    let migrate = std::thread::spawn({
        let config = config.clone();
        move || {
            support::oncebox()
                .arg("--config")
                .arg(&config)
                .arg("migrate")
                .output()
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    address.restore();
    let out = migrate
        .join()
        .expect("joined")
        .expect("the oncebox binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "migrated once the database answered: {stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "not the whole timeout: {stderr}"
    );
    support::psql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
}

fn config_on_missing_sqlite(dir: &Path) -> std::path::PathBuf {
    config(dir, "redis://127.0.0.1:6379", "")
}

#[test]
fn an_unreachable_broker_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let db = dir.path().join("shop.db");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[broker]\nurl = \"redis://127.0.0.1:1\"\nconnect_timeout = \"2s\"\n",
            db.display()
        ),
    );
    support::run_ok(&config, &["migrate"]);
    let out = support::oncebox()
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(&config)
        .args(["--listen", "off", "relay"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("broker.url: cannot connect"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

fn config_with(dir: &Path, extra: &str) -> std::path::PathBuf {
    config(dir, "redis://127.0.0.1:6379", extra)
}

#[test]
fn an_unusable_listen_address_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = taken.local_addr().expect("an address");
    let config = config(
        dir.path(),
        "redis://127.0.0.1:6379",
        &format!("[http]\nlisten = \"{address}\""),
    );
    let out = support::oncebox()
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(&config)
        .arg("relay")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("http.listen: cannot listen on"), "{stderr}");
    assert!(!dir.path().join("never.db").exists());
    let out = support::oncebox()
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(&config)
        .args(["--listen", "not an address", "relay"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("http.listen"), "{stderr}");
}

#[test]
fn zero_and_negative_limits_are_named() {
    let dir = tempfile::tempdir().expect("a directory");
    for (extra, key) in [
        (
            "[relay]\nbatch_size = 0",
            "relay.batch_size: must be at least 1",
        ),
        ("[relay]\nworkers = -2", "relay.workers: must be at least 1"),
        ("[relay]\nmax_attempts = 0", "relay.max_attempts"),
        ("[relay]\nlease = \"0s\"", "relay.lease: must be above zero"),
        ("[receive]\nlanes = -1", "receive.lanes"),
        (
            "[relay]\npublish_timeout = \"40s\"\nlease = \"30s\"",
            "relay.publish_timeout",
        ),
    ] {
        let config = config_with(dir.path(), extra);
        refused(dir.path(), &config, &[], key);
    }
    // The environment is checked the same way, and named by its key.
    let config = config_with(dir.path(), "");
    refused(
        dir.path(),
        &config,
        &[("ONCEBOX_RELAY__CONCURRENCY", "0")],
        "relay.concurrency",
    );
}

/// A duration too long for any use (`dashboard.session_ttl = "500000000000y"` panicked
/// at every login) is refused when the configuration loads, by every command, `config
/// check` included, with the key and the bound named.
#[test]
fn a_duration_past_the_bound_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config_with(dir.path(), "[dashboard]\nsession_ttl = \"500000000000y\"");
    let line = refused(dir.path(), &config, &[], "dashboard.session_ttl");
    assert!(line.contains("100years"), "the bound is named: {line}");
    let config = config_with(dir.path(), "");
    refused(
        dir.path(),
        &config,
        &[("ONCEBOX_RELAY__RETENTION", "500000000000y")],
        "relay.retention",
    );
    let out = support::oncebox()
        .env_remove("RUST_LOG")
        .env("ONCEBOX_DASHBOARD__SESSION_TTL", "101years")
        .arg("--config")
        .arg(&config)
        .args(["config", "check"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("dashboard.session_ttl"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed as checked");
}

#[test]
fn a_password_in_a_url_is_refused_without_being_shown() {
    let dir = tempfile::tempdir().expect("a directory");
    let toml = "[store]\nurl = \"postgres://app:hunter2secret@127.0.0.1:5432/app\"\n\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n";
    let config = write_config(dir.path(), "oncebox.toml", toml);
    let line = refused(dir.path(), &config, &[], "holds a password");
    assert!(!line.contains("hunter2secret"), "{line}");
    let config = config_with(dir.path(), "");
    let line = refused(
        dir.path(),
        &config,
        &[(
            "ONCEBOX_BROKER__URL",
            "amqp://guest:hunter2secret@127.0.0.1:5672/%2f",
        )],
        "broker.url",
    );
    assert!(!line.contains("hunter2secret"), "{line}");
}

/// `otel.endpoint`: plain HTTP to a collector, no credentials in the URL (and none
/// shown); in a build without the feature `otel`, refused with the feature named.
#[test]
fn an_unusable_otel_endpoint_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    if cfg!(feature = "otel") {
        for (endpoint, needle) in [
            ("https://collector:4318", "must be http://"),
            ("http://user:hunter2secret@collector:4318", "no credentials"),
            ("collector:4318", "must be http://"),
            ("127.0.0.1:4318", "is not a URL"),
        ] {
            let config = config_with(dir.path(), &format!("[otel]\nendpoint = \"{endpoint}\"\n"));
            let line = refused(dir.path(), &config, &[], needle);
            assert!(!line.contains("hunter2secret"), "{line}");
        }
    } else {
        let config = config_with(dir.path(), "[otel]\nendpoint = \"http://127.0.0.1:4318\"\n");
        refused(dir.path(), &config, &[], "feature otel");
    }
}

#[test]
fn a_nats_stream_needs_a_subject_prefix() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config(dir.path(), "nats://127.0.0.1:4222", "stream = \"ALL\"");
    // `stream` lands in the [broker] table written last by `config`.
    refused(dir.path(), &config, &[], "broker.stream");
}

/// `config check` prints the merged configuration (file < environment < flags), and
/// secrets, from the environment or from a `_FILE`, never.
#[test]
fn config_check_merges_sources_and_hides_secrets() {
    let dir = tempfile::tempdir().expect("a directory");
    let secret = dir.path().join("db-password");
    std::fs::write(&secret, "s3cret-from-file\n").expect("written");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        "[store]\nurl = \"postgres://app@db/app\"\n[relay]\nbatch_size = 10\nworkers = 2\n[topics]\norders = \"shop.orders.v1\"\n",
    );
    let out = support::oncebox()
        .arg("--config")
        .arg(&config)
        .env("ONCEBOX_RELAY__BATCH_SIZE", "20")
        .env("ONCEBOX_STORE__PASSWORD_FILE", &secret)
        .env("ONCEBOX_BROKER__PASSWORD", "12345")
        .args(["--broker-url", "nats://nats:4222", "config", "check"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged: toml::Table = stdout.parse().expect("TOML");
    assert_eq!(
        merged["relay"]["batch_size"].as_integer(),
        Some(20),
        "the environment wins over the file"
    );
    assert_eq!(merged["relay"]["workers"].as_integer(), Some(2));
    assert_eq!(
        merged["broker"]["url"].as_str(),
        Some("nats://nats:4222"),
        "flags win"
    );
    assert_eq!(merged["topics"]["orders"].as_str(), Some("shop.orders.v1"));
    assert_eq!(merged["store"]["password"].as_str(), Some("<hidden>"));
    assert_eq!(merged["broker"]["password"].as_str(), Some("<hidden>"));
    assert!(
        !stdout.contains("s3cret") && !stdout.contains("12345"),
        "{stdout}"
    );
}

#[test]
fn settings_that_contradict_each_other_are_named() {
    let dir = tempfile::tempdir().expect("a directory");
    for (extra, key) in [
        (
            "[relay]\nretry_initial = \"10s\"\nretry_max = \"1s\"",
            "relay.retry_max",
        ),
        ("[relay]\nworkers = 8", "store.pool_size"),
    ] {
        let config = config_with(dir.path(), extra);
        refused(dir.path(), &config, &[], key);
    }
}

/// Values from the environment stay text where a key wants text, secrets are read from
/// `_FILE` variables only, and a key set twice is refused.
#[test]
fn the_environment_is_read_as_each_key_wants() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = config_with(dir.path(), "");
    let out = support::oncebox()
        .arg("--config")
        .arg(&config)
        .env("ONCEBOX_RECEIVE__CONSUMER", "42")
        .env("ONCEBOX_RELAY__BATCH_SIZE", "64")
        .args(["config", "check"])
        .output()
        .expect("runs");
    let merged: toml::Table = String::from_utf8_lossy(&out.stdout).parse().expect("TOML");
    assert_eq!(merged["receive"]["consumer"].as_str(), Some("42"));
    assert_eq!(merged["relay"]["batch_size"].as_integer(), Some(64));

    let line = refused(
        dir.path(),
        &config,
        &[("ONCEBOX_RELAY__BATCH_SIZE", "many")],
        "relay.batch_size",
    );
    assert!(
        line.contains("ONCEBOX_RELAY__BATCH_SIZE"),
        "names the variable: {line}"
    );
    let file = dir.path().join("name");
    std::fs::write(&file, "outbox-2").expect("written");
    let file = file.to_str().expect("a UTF-8 path");
    refused(
        dir.path(),
        &config,
        &[("ONCEBOX_RELAY__NAME_FILE", file)],
        "only secrets",
    );
    refused(
        dir.path(),
        &config,
        &[
            ("ONCEBOX_STORE__PASSWORD", "a"),
            ("ONCEBOX_STORE__PASSWORD_FILE", file),
        ],
        "set twice",
    );
    refused(
        dir.path(),
        &config,
        &[("ONCEBOX_STORE__PASSWORD_FILE", "/nonexistent/secret")],
        "cannot read",
    );
}

/// Identifiers in the configuration that try SQL injection (the schema, the
/// Debezium-style table, the replication slot) are refused with the key named before
/// any SQL is built from them: the table they try to drop is still there.
#[test]
fn identifiers_that_try_sql_injection_are_refused() {
    let dir = tempfile::tempdir().expect("a directory");
    let canary = support::unique("canary");
    support::psql(&format!("CREATE TABLE public.{canary} (x int)"));
    let drop = format!("DROP TABLE public.{canary}; --");
    let attacks = [
        (
            format!("[store]\nschema = \"oncebox\\\"; {drop}\""),
            "store.schema",
        ),
        (
            format!("[outbox]\nlayout = \"debezium\"\ntable = \"public.outbox; {drop}\""),
            "outbox.table",
        ),
        (
            format!("[relay]\nmode = \"cdc\"\n\n[cdc]\nslot = \"s'; {drop}\""),
            "cdc",
        ),
    ];
    for (section, key) in attacks {
        let toml = format!("[broker]\nurl = \"redis://127.0.0.1:6379\"\n\n{section}\n",);
        let config = write_config(dir.path(), "oncebox.toml", &toml);
        let env = [("ONCEBOX_STORE__URL", support::pg_url())];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        refused(dir.path(), &config, &env, &format!("{key}:"));
    }
    assert_eq!(
        support::psql(&format!("SELECT count(*) FROM public.{canary}")),
        "0",
        "the canary table survived"
    );
    support::psql(&format!("DROP TABLE public.{canary}"));
}
