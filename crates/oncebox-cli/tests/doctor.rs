//! `oncebox doctor` against real services: a good setup passes every check (status 0);
//! each failure it names is produced here on a setup broken that way (status 1), with
//! the line saying what to do.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::{psql, run_ok, write_config};

/// The PostgreSQL server without log tailing's settings (`scripts/services.sh
/// postgres-plain`).
fn plain_pg_url() -> String {
    std::env::var("ONCEBOX_PG_PLAIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5436/postgres".to_owned())
}

/// `oncebox doctor --json ARGS` with `config` and extra variables.
fn doctor(config: &Path, env: &[(&str, &str)], args: &[&str]) -> (Output, Value) {
    let out = support::oncebox()
        .arg("--config")
        .arg(config)
        .arg("doctor")
        .arg("--json")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("oncebox runs");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|error| {
        panic!(
            "doctor --json printed no JSON ({error}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

/// The checks of a report that failed, by name, with their detail.
fn failed(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|check| check["ok"] == false)
        .map(|check| {
            assert!(
                check["fix"].as_str().is_some_and(|fix| !fix.is_empty()),
                "a failure says what to do: {check}"
            );
            (
                check["check"].as_str().expect("a name").to_owned(),
                check["detail"].as_str().expect("a detail").to_owned(),
            )
        })
        .collect()
}

/// Asserts that the report failed exactly `names`, exit status 1.
fn assert_failed(out: &Output, report: &Value, names: &[&str]) -> Vec<(String, String)> {
    let failures = failed(report);
    let found: Vec<&str> = failures.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(found, names, "{report:#}");
    assert_eq!(report["ok"], false);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    failures
}

fn config(dir: &Path, name: &str, store: &str, schema: &str, extra: &str) -> std::path::PathBuf {
    write_config(
        dir,
        name,
        &format!(
            "[store]\nurl = \"{store}\"\nschema = \"{schema}\"\nconnect_timeout = \"1s\"\n\n\
             [broker]\nurl = \"{redis}\"\nkey_prefix = \"{schema}:\"\nconnect_timeout = \"1s\"\n\n{extra}",
            redis = support::redis_url(),
        ),
    )
}

/// A good polling setup and a good log-tailing one pass every check; the text report
/// has one `ok` line per check.
#[test]
fn a_good_setup_passes_every_check() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_good");
    let token = dir.path().join("token");
    std::fs::write(&token, "a-token-of-twenty-chars").expect("the token");
    let poll = config(dir.path(), "poll.toml", &support::pg_url(), &schema, "");
    run_ok(&poll, &["migrate"]);
    let env = [(
        "ONCEBOX_DASHBOARD__TOKEN_FILE",
        token.to_str().expect("a path"),
    )];
    let (out, report) = doctor(&poll, &env, &[]);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    let names: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|check| check["check"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "store",
            "migrations",
            "rights",
            "clock",
            "broker",
            "dashboard token"
        ]
    );

    let cdc = config(
        dir.path(),
        "cdc.toml",
        &support::pg_url(),
        &schema,
        &format!("[relay]\nmode = \"cdc\"\n\n[cdc]\nslot = \"{schema}\"\n"),
    );
    let (out, report) = doctor(&cdc, &[], &[]);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    for name in [
        "wal_level",
        "max_replication_slots",
        "max_slot_wal_keep_size",
        "replication role",
        "slot",
    ] {
        assert!(
            report["checks"]
                .as_array()
                .expect("checks")
                .iter()
                .any(|check| check["check"] == name),
            "no {name} check: {report:#}"
        );
    }

    let text = support::oncebox()
        .arg("--config")
        .arg(&poll)
        .arg("doctor")
        .envs(env)
        .output()
        .expect("oncebox runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        text.lines().filter(|line| line.starts_with("ok ")).count(),
        6,
        "{text}"
    );
    assert!(text.ends_with("all 6 checks passed\n"), "{text}");
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// Nothing answers: the store, then the broker, each named with what to do.
#[test]
fn an_unreachable_store_or_broker_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let closed = support::free_port();
    let store = config(
        dir.path(),
        "store.toml",
        &format!("postgres://postgres@127.0.0.1:{closed}/postgres"),
        "doctor_nowhere",
        "",
    );
    let (out, report) = doctor(&store, &[], &[]);
    assert_failed(&out, &report, &["store"]);

    let schema = support::unique("doctor_broker");
    let broker = config(dir.path(), "broker.toml", &support::pg_url(), &schema, "");
    run_ok(&broker, &["migrate"]);
    let url = format!("redis://127.0.0.1:{closed}");
    let (out, report) = doctor(&broker, &[("ONCEBOX_BROKER__URL", &url)], &[]);
    assert_failed(&out, &report, &["broker"]);
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// Migrations behind, a clock beyond the allowed difference, a short dashboard token,
/// and a slot the store's relays read that is gone.
#[test]
fn migrations_clock_token_and_a_lost_slot_fail() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_broken");
    let cdc = config(
        dir.path(),
        "cdc.toml",
        &support::pg_url(),
        &schema,
        &format!("[relay]\nmode = \"cdc\"\n\n[cdc]\nslot = \"{schema}\"\n"),
    );
    run_ok(&cdc, &["migrate"]);
    psql(&format!(
        "DELETE FROM {schema}._oncebox_migrations WHERE version = (SELECT max(version) FROM {schema}._oncebox_migrations);
         INSERT INTO {schema}.cdc_slots (slot, confirmed_lsn) VALUES ('{schema}', '0/1000')"
    ));
    let token = dir.path().join("token");
    std::fs::write(&token, "short").expect("the token");
    let (out, report) = doctor(
        &cdc,
        &[(
            "ONCEBOX_DASHBOARD__TOKEN_FILE",
            token.to_str().expect("a path"),
        )],
        &["--max-clock-difference", "0s"],
    );
    let failures = assert_failed(
        &out,
        &report,
        &["migrations", "clock", "slot", "dashboard token"],
    );
    assert!(failures[0].1.contains("missing version"), "{failures:?}");
    assert!(failures[2].1.contains("is gone"), "{failures:?}");
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// A role without rights on the schema's tables, nor the REPLICATION attribute.
#[test]
fn a_role_without_rights_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_rights");
    let role = format!("{schema}_role");
    let owner = config(dir.path(), "owner.toml", &support::pg_url(), &schema, "");
    run_ok(&owner, &["migrate"]);
    psql(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {schema} TO {role}; \
         GRANT SELECT ON {schema}.outbox, {schema}._oncebox_migrations TO {role}"
    ));
    let url = support::pg_url().replacen("postgres@", &format!("{role}@"), 1);
    let cdc = config(
        dir.path(),
        "cdc.toml",
        &url,
        &schema,
        &format!("[relay]\nmode = \"cdc\"\n\n[cdc]\nslot = \"{schema}\"\n"),
    );
    let (out, report) = doctor(&cdc, &[], &[]);
    let failures = assert_failed(&out, &report, &["rights", "replication role"]);
    assert!(
        failures[0].1.contains("outbox (INSERT, UPDATE, DELETE)"),
        "{failures:?}"
    );
    psql(&format!(
        "DROP SCHEMA {schema} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"
    ));
}

/// A server with PostgreSQL's defaults for log tailing: wal_level replica, no free
/// replication slot, max_slot_wal_keep_size unlimited.
#[test]
fn a_server_not_set_up_for_log_tailing_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_plain");
    let cdc = config(
        dir.path(),
        "cdc.toml",
        &plain_pg_url(),
        &schema,
        &format!("[relay]\nmode = \"cdc\"\n\n[cdc]\nslot = \"{schema}\"\n"),
    );
    run_ok(&cdc, &["migrate"]);
    let (out, report) = doctor(&cdc, &[], &[]);
    assert_failed(
        &out,
        &report,
        &[
            "wal_level",
            "max_replication_slots",
            "max_slot_wal_keep_size",
        ],
    );
    let _ = std::process::Command::new("psql")
        .arg(plain_pg_url())
        .args(["-X", "-q", "-c"])
        .arg(format!("DROP SCHEMA {schema} CASCADE"))
        .output();
}

/// NATS: no stream captures the receiver's subject (and none is named to create).
#[cfg(feature = "nats")]
#[test]
fn a_subject_no_stream_captures_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_nats");
    let poll = write_config(
        dir.path(),
        "nats.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\nschema = \"{schema}\"\n\n[broker]\nurl = \"{nats}\"\nsubject_prefix = \"{schema}.\"\n\n\
             [receive]\ntopic = \"orders\"\n",
            pg = support::pg_url(),
            nats = support::nats_url(),
        ),
    );
    run_ok(&poll, &["migrate"]);
    let (out, report) = doctor(&poll, &[], &[]);
    let failures = assert_failed(&out, &report, &["stream"]);
    assert!(
        failures[0].1.contains(&format!("{schema}.orders")),
        "{failures:?}"
    );
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// The names of a report's checks, in order.
fn names(report: &Value) -> Vec<&str> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|check| check["check"].as_str().expect("a name"))
        .collect()
}

/// SQLite has no roles and runs on this host: the store, its migrations and the broker
/// are what is checked, and a database migrated behind fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_setup_is_checked_without_rights_or_clock() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_sqlite");
    let url = format!("sqlite://{}", dir.path().join("oncebox.db").display());
    let sqlite = config(dir.path(), "sqlite.toml", &url, &schema, "");
    run_ok(&sqlite, &["migrate"]);
    let (out, report) = doctor(&sqlite, &[], &[]);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(names(&report), ["store", "migrations", "broker"]);

    let pool = sqlx::SqlitePool::connect(&url).await.expect("the database");
    sqlx::query(
        "DELETE FROM _oncebox_migrations WHERE version = (SELECT max(version) FROM _oncebox_migrations)",
    )
    .execute(&pool)
    .await
    .expect("a migration forgotten");
    pool.close().await;
    let (out, report) = doctor(&sqlite, &[], &[]);
    assert_failed(&out, &report, &["migrations"]);
}

/// MySQL / MariaDB: a good setup passes, with the rights and the clock checked; a user
/// granted reading alone on most tables fails the rights check, which names what each
/// table lacks (the rights are tried, so the server's own rules decide).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_setup_is_checked_and_a_user_without_rights_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let database = support::unique("doctor_mysql");
    let user = format!("{database}_u");
    let server = support::mysql_url();
    let admin = sqlx::MySqlPool::connect(&server)
        .await
        .expect("MySQL answers");
    let admin_run = async |sql: String| {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("an administrator's statement");
    };
    admin_run(format!("CREATE DATABASE {database}")).await;
    let mut url = url::Url::parse(&server).expect("a URL");
    url.set_path(&database);
    let good = config(dir.path(), "good.toml", url.as_str(), &database, "");
    run_ok(&good, &["migrate"]);
    let (out, report) = doctor(&good, &[], &[]);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        names(&report),
        ["store", "migrations", "rights", "clock", "broker"]
    );

    admin_run(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'doctor'")).await;
    admin_run(format!("GRANT SELECT ON {database}.* TO '{user}'@'%'")).await;
    admin_run(format!(
        "GRANT INSERT, UPDATE, DELETE ON {database}.oncebox_outbox TO '{user}'@'%'"
    ))
    .await;
    url.set_username(&user).expect("a user name");
    let reader = config(dir.path(), "reader.toml", url.as_str(), &database, "");
    let (out, report) = doctor(&reader, &[("ONCEBOX_STORE__PASSWORD", "doctor")], &[]);
    let failures = assert_failed(&out, &report, &["rights"]);
    let detail = &failures[0].1;
    assert!(!detail.contains("oncebox_outbox"), "{detail}");
    for table in oncebox::mysql::TABLES
        .iter()
        .filter(|t| **t != "oncebox_outbox")
    {
        assert!(
            detail.contains(&format!("{table} (INSERT, UPDATE, DELETE)")),
            "{table}: {detail}"
        );
    }
    // Nothing was written: the statements that were allowed touched no row.
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {database}.oncebox_outbox"
    )))
    .fetch_one(&admin)
    .await
    .expect("a count");
    assert_eq!(rows, 0);

    admin_run(format!("DROP USER '{user}'@'%'")).await;
    admin_run(format!("DROP DATABASE {database}")).await;
}

/// Kafka: the receiver's topic and its dead-letter topic are missing, each named; once
/// created, both pass.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_topic_that_does_not_exist_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("doctor_kafka");
    let brokers = support::kafka_brokers();
    let kafka = write_config(
        dir.path(),
        "kafka.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\nschema = \"{schema}\"\n\n[broker]\nurl = \"kafka://{brokers}\"\n\n\
             [receive]\ntopic = \"{schema}\"\n",
            pg = support::pg_url(),
        ),
    );
    run_ok(&kafka, &["migrate"]);
    let options = oncebox::kafka::KafkaOptions::new(&brokers);
    let dead = options.dead_letter_topic_for(&schema);
    let (out, report) = doctor(&kafka, &[], &[]);
    let failures = assert_failed(&out, &report, &["topic", "topic"]);
    assert!(
        failures[0].1.contains(&format!("topic {schema} ")),
        "{failures:?}"
    );
    assert!(
        failures[1].1.contains(&format!("topic {dead} ")),
        "{failures:?}"
    );

    let admin = oncebox::kafka::KafkaAdmin::new(options).expect("an admin client");
    for topic in [&schema, &dead] {
        admin.create_topic(topic, 1, 1).await.expect("a topic");
    }
    let (out, report) = doctor(&kafka, &[], &[]);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        names(&report),
        [
            "store",
            "migrations",
            "rights",
            "clock",
            "broker",
            "topic",
            "topic"
        ]
    );
    admin
        .delete_topics(&[&schema, &dead])
        .await
        .expect("the topics deleted");
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// SQS: a topic's queue that does not exist is named, by name and by URL; once created,
/// it passes.
#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_queue_that_does_not_exist_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let endpoint = support::sqs_endpoint();
    // A queue that does not exist.
    let queue = format!("{}.fifo", support::unique("doctor-sqs").replace('_', "-"));
    let sqlite = dir.path().join("oncebox.db");
    let sqs_config = |name: &str, destination: &str| {
        write_config(
            dir.path(),
            name,
            &format!(
                "[store]\nurl = \"sqlite://{}\"\n\n[broker]\nurl = \"sqs://us-east-1?endpoint={endpoint}\"\n\n\
                 [topics]\norders = \"{destination}\"\n",
                sqlite.display()
            ),
        )
    };
    let by_name = sqs_config("by-name.toml", &queue);
    run_ok(&by_name, &["migrate"]);
    let (out, report) = doctor(&by_name, &[], &[]);
    let failures = assert_failed(&out, &report, &["queue"]);
    assert!(failures[0].1.contains(&queue), "{failures:?}");

    let orders = support::SqsQueue::create("doctor-sqs").await;
    let by_name = sqs_config("by-name.toml", &orders.name);
    let url = orders.url.clone();
    let by_url = sqs_config("by-url.toml", &url);
    for config in [&by_name, &by_url] {
        let (out, report) = doctor(config, &[], &[]);
        assert_eq!(report["ok"], true, "{report:#}");
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(names(&report), ["store", "migrations", "broker", "queue"]);
    }
    orders.delete().await;
    let missing_url = url.replace(&orders.name, &format!("gone-{}", orders.name));
    let gone = sqs_config("gone.toml", &missing_url);
    let (out, report) = doctor(&gone, &[], &[]);
    assert_failed(&out, &report, &["queue"]);
}
