//! `oncebox relay` and `oncebox receive` on SQS (the local server of
//! `scripts/services.sh sqs`): a SQLite outbox → a FIFO queue named in `[topics]` → a
//! SQLite durable inbox, both processes real, every message stored once; and the
//! configuration's errors for `sqs://` URLs.

#![cfg(feature = "sqs")]

mod support;

use std::time::Duration;

use support::{Service, run, run_ok, wait_for, write_config};

const MESSAGES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_carries_relay_to_receive() {
    let dir = tempfile::tempdir().expect("a directory");
    let orders = support::SqsQueue::create("svc-orders").await;
    let (queue, url) = (&orders.name, &orders.url);
    let outbox_db = dir.path().join("shop.db");
    let inbox_db = dir.path().join("billing.db");
    let broker = format!(
        "[broker]\nurl = \"sqs://us-east-1?endpoint={}\"\n",
        support::sqs_endpoint()
    );
    let relay_config = write_config(
        dir.path(),
        "relay.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n{broker}\n[topics]\norders = \"{queue}\"\n",
            outbox_db.display()
        ),
    );
    // The receiver names the queue by its URL.
    let receive_config = write_config(
        dir.path(),
        "receive.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n{broker}\n[receive]\ntopic = \"{url}\"\nconsumer = \"billing\"\n",
            inbox_db.display()
        ),
    );
    run_ok(&relay_config, &["migrate"]);
    run_ok(&receive_config, &["migrate"]);
    let mut receiver = Service::start(dir.path(), "receive", &receive_config, &["receive"]);
    receiver.wait_ready(Duration::from_secs(60));
    let produced = std::process::Command::new("python3")
        .arg(support::example("place_order.py"))
        .arg(&outbox_db)
        .arg(MESSAGES.to_string())
        .arg("10")
        .status()
        .expect("python3 runs");
    assert!(produced.success());
    let mut relay = Service::start(dir.path(), "relay", &relay_config, &["relay"]);
    let stored = || {
        let text = receiver.metrics()?;
        support::sample(
            &text,
            "oncebox_consumer_messages_total",
            r#"consumer="billing",outcome="stored""#,
        )
    };
    wait_for("every message stored", Duration::from_secs(90), || {
        (stored()? >= MESSAGES as f64).then_some(())
    });
    relay.stop_cleanly(Duration::from_secs(10));
    receiver.stop_cleanly(Duration::from_secs(10));
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", inbox_db.display()))
        .await
        .expect("the inbox database opens");
    let (rows, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT message_id) FROM oncebox_durable_inbox WHERE consumer = 'billing'",
    )
    .fetch_one(&pool)
    .await
    .expect("counted");
    assert_eq!((rows, distinct), (MESSAGES as i64, MESSAGES as i64));
    orders.delete().await;
}

/// Bad `sqs://` settings stop `config check` with the key and the reason.
#[test]
fn bad_sqs_settings_are_named() {
    let dir = tempfile::tempdir().expect("a directory");
    for (broker, needle) in [
        (
            "url = \"sqs://eu-west-1/a/b\"",
            "a queue URL goes in [topics]",
        ),
        (
            "url = \"sqs://?endpoint=localhost:4566\"",
            "not an http:// or https:// URL",
        ),
        (
            "url = \"sqs://eu-west-1\"\npassword = \"x\"",
            "broker.password: not used by SQS",
        ),
        (
            "url = \"sqs://eu-west-1\"\n\n[topics]\norders = \"shop.orders\"",
            "topics.orders: \"shop.orders\" is neither",
        ),
    ] {
        let config = write_config(
            dir.path(),
            "bad.toml",
            &format!(
                "[store]\nurl = \"sqlite://{}\"\n\n[broker]\n{broker}\n",
                dir.path().join("x.db").display()
            ),
        );
        let out = run(&config, &["config", "check"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{broker}: {stderr}");
        assert!(stderr.contains(needle), "{broker}: {stderr}");
    }
}
