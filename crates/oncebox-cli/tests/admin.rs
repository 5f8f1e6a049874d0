//! The admin commands on real databases: dead letters listed, replayed (by topic, after
//! a confirmation) and purged, then re-published by `oncebox relay`; rows shown.

#![cfg(feature = "mysql")]

mod support;

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use oncebox::redis::redis;
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::{Message, Publisher};
use serde_json::Value;
use support::{Service, run, run_ok, wait_for, write_config};

/// A broker that refuses every message for good: the relay dead-letters each at once.
struct Refusing;

impl Publisher for Refusing {
    async fn publish(&self, _: &Message) -> oncebox::Result<()> {
        Err(oncebox::Error::transport_permanent(
            "the broker refused the message",
        ))
    }
}

/// Three messages: two on `orders` (keys k1, k2), one on `payments`.
fn messages() -> Vec<Message> {
    vec![
        Message::new("orders", "first").with_key("k1"),
        Message::new("orders", "second").with_key("k2"),
        Message::new("payments", "third").with_key("k1"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_on_postgres() {
    let dir = tempfile::tempdir().expect("a directory");
    let schema = support::unique("admin");
    let config = config(
        dir.path(),
        &support::pg_url(),
        &format!("schema = \"{schema}\""),
        &schema,
    );
    run_ok(&config, &["migrate"]);
    let store = oncebox::postgres::PgStore::connect(&support::pg_url())
        .await
        .expect("PostgreSQL answers")
        .with_schema(&schema)
        .expect("a schema name");
    let outbox = store.outbox();
    let mut tx = store.pool().begin().await.expect("a transaction");
    for message in messages() {
        outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    }
    tx.commit().await.expect("committed");
    let relay = Relay::new(outbox, Refusing, SpoolOptions::new()).expect("a relay");
    assert_eq!(relay.drain().await.expect("drained").dead, 3);

    replay_purge_and_publish(dir.path(), &config, &schema).await;
    support::psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_on_mysql() {
    let dir = tempfile::tempdir().expect("a directory");
    let database = support::unique("admin");
    let server = support::mysql_url();
    let admin = sqlx::MySqlPool::connect(&server)
        .await
        .expect("MySQL answers");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&admin)
        .await
        .expect("a database");
    let url = {
        let mut url = url::Url::parse(&server).expect("a URL");
        url.set_path(&database);
        url.to_string()
    };
    let config = config(dir.path(), &url, "", &database);
    run_ok(&config, &["migrate"]);
    let store = oncebox::mysql::MySqlStore::connect(&url)
        .await
        .expect("MySQL answers");
    let outbox = store.outbox();
    let mut tx = store.pool().begin().await.expect("a transaction");
    for message in messages() {
        outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    }
    tx.commit().await.expect("committed");
    let relay = Relay::new(outbox, Refusing, SpoolOptions::new()).expect("a relay");
    assert_eq!(relay.drain().await.expect("drained").dead, 3);

    replay_purge_and_publish(dir.path(), &config, &database).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&admin)
        .await
        .expect("dropped");
}

fn config(dir: &Path, url: &str, store_extra: &str, prefix: &str) -> std::path::PathBuf {
    write_config(
        dir,
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"{url}\"\n{store_extra}\n\n[broker]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}:\"\n",
            redis = support::redis_url()
        ),
    )
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|error| panic!("not JSON ({error}): {out}"))
}

/// With three dead letters in the outbox: list them, refuse a replay at the prompt,
/// replay the topic `orders` with `--yes`, purge the rest, and let `oncebox relay`
/// publish the replayed two to Redis Streams.
async fn replay_purge_and_publish(dir: &Path, config: &Path, prefix: &str) {
    let listed = json(&run_ok(config, &["dead-letters", "list", "--json"]));
    let letters = listed["dead_letters"].as_array().expect("a list");
    assert_eq!(letters.len(), 3, "{listed}");
    assert!(
        letters
            .iter()
            .all(|letter| letter["reason"].as_str().unwrap_or("").contains("refused")),
        "each names why: {listed}"
    );
    let only_orders = json(&run_ok(
        config,
        &["dead-letters", "list", "--topic", "orders", "--json"],
    ));
    assert_eq!(
        only_orders["dead_letters"].as_array().map(Vec::len),
        Some(2)
    );

    // Without --yes the count is confirmed first; "n" does nothing.
    let mut child = support::oncebox()
        .arg("--config")
        .arg(config)
        .args(["dead-letters", "replay", "--topic", "orders"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"n\n")
        .expect("answered");
    let out = child.wait_with_output().expect("ran");
    let prompt = String::from_utf8_lossy(&out.stderr);
    assert!(
        prompt.contains("replay 2 dead letter(s) (topic orders)?"),
        "{prompt}"
    );
    assert_eq!(out.status.code(), Some(1), "{prompt}");
    assert_eq!(
        json(&run_ok(config, &["outbox", "stats", "--json"]))["dead"],
        3
    );

    let replayed = json(&run_ok(
        config,
        &[
            "dead-letters",
            "replay",
            "--topic",
            "orders",
            "--yes",
            "--json",
        ],
    ));
    assert_eq!(replayed["count"], 2, "{replayed}");
    let purged = json(&run_ok(
        config,
        &["dead-letters", "purge", "--all", "--yes", "--json"],
    ));
    assert_eq!(
        purged["count"], 1,
        "only the payment was still dead: {purged}"
    );
    let stats = json(&run_ok(config, &["outbox", "stats", "--json"]));
    assert_eq!(
        (stats["pending"].as_u64(), stats["dead"].as_u64()),
        (Some(2), Some(0)),
        "{stats}"
    );

    let mut relay = Service::start(dir, "relay", config, &["relay"]);
    wait_for(
        "the replayed messages published",
        Duration::from_secs(30),
        || {
            let stats = json(&run_ok(config, &["outbox", "stats", "--json"]));
            (stats["published"] == 2).then_some(())
        },
    );
    relay.stop_cleanly(Duration::from_secs(10));

    let mut redis = support::redis().await;
    let key = format!("{prefix}:orders");
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .expect("XRANGE");
    let ids: Vec<String> = replayed["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|id| id.as_str().expect("an id").to_owned())
        .collect();
    let published: Vec<String> = entries
        .iter()
        .map(|(_, fields)| {
            let id = fields
                .chunks(2)
                .find(|pair| pair[0] == b"ce_id")
                .expect("ce_id");
            String::from_utf8(id[1].clone()).expect("UTF-8")
        })
        .collect();
    assert_eq!(published, ids, "the replayed messages, in their order");

    let shown = json(&run_ok(config, &["outbox", "show", &ids[0], "--json"]));
    assert_eq!(shown["status"], "published", "{shown}");
    assert_eq!(shown["message"]["payload"], "first", "{shown}");
    assert!(
        shown["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("refused"),
        "the last error is kept: {shown}"
    );
    let missing = run(
        config,
        &["outbox", "show", "01936f1e-8a5c-7d2e-9b1a-3f4e5d6c7b8a"],
    );
    assert_eq!(missing.status.code(), Some(1));
    let bad = run(config, &["outbox", "show", "not-an-id"]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
}

/// `migrate --print` gives the SQL for a team's own migration tool (applied here with
/// psql, after which the admin commands work on the schema), and `inbox purge` deletes a
/// consumer's records older than the duration, never inside the dedup window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_migrations_apply_and_inbox_purge_keeps_the_dedup_window() {
    let dir = tempfile::tempdir().expect("a directory");
    let schema = support::unique("admin_print");
    let config = config(
        dir.path(),
        &support::pg_url(),
        &format!("schema = \"{schema}\""),
        &schema,
    );
    let sql = run_ok(&config, &["migrate", "--print"]);
    assert!(
        sql.contains(&format!("CREATE TABLE IF NOT EXISTS \"{schema}\".outbox")),
        "{sql}"
    );
    let script = dir.path().join("schema.sql");
    std::fs::write(&script, &sql).expect("written");
    let applied = std::process::Command::new("psql")
        .arg(support::pg_url())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&script)
        .output()
        .expect("psql runs");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(
        json(&run_ok(&config, &["outbox", "stats", "--json"]))["pending"],
        0
    );

    // Records of `billing`: three old and two young transactional-inbox records; two
    // old and one young processed durable-inbox rows, and an old one still pending;
    // and an old record of another consumer.
    support::psql(&format!(
        "INSERT INTO {schema}.inbox (consumer, message_id, processed_at)
         SELECT 'billing', 'old-' || n, now() - interval '40 days' FROM generate_series(1, 3) AS n
         UNION ALL SELECT 'billing', 'young-' || n, now() FROM generate_series(1, 2) AS n
         UNION ALL SELECT 'shipping', 'old', now() - interval '40 days';
         INSERT INTO {schema}.durable_inbox (consumer, dedup_id, topic, payload, source, position, status, done_at, received_at)
         SELECT 'billing', 'd' || n, 'orders', '\\x00', 'test', n::text,
                CASE WHEN n = 4 THEN 'pending' ELSE 'done' END,
                CASE WHEN n = 4 THEN NULL WHEN n = 3 THEN now() ELSE now() - interval '40 days' END,
                now() - interval '40 days'
         FROM generate_series(1, 4) AS n"
    ));
    let inside = run(
        &config,
        &[
            "inbox",
            "purge",
            "--older-than",
            "1d",
            "--consumer",
            "billing",
        ],
    );
    let stderr = String::from_utf8_lossy(&inside.stderr);
    assert_eq!(inside.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("dedup window"), "{stderr}");

    let purged = json(&run_ok(
        &config,
        &[
            "inbox",
            "purge",
            "--older-than",
            "30d",
            "--consumer",
            "billing",
            "--json",
        ],
    ));
    assert_eq!(purged["deleted"], 5, "{purged}");
    let left = support::psql(&format!(
        "SELECT (SELECT count(*) FROM {schema}.inbox) || ' ' || (SELECT count(*) FROM {schema}.durable_inbox)"
    ));
    assert_eq!(
        left, "3 2",
        "the young records, the other consumer's and the pending row stay"
    );
    support::psql(&format!("DROP SCHEMA {schema} CASCADE"));
}
