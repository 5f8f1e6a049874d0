//! `oncebox relay` and `oncebox receive` on the brokers the other process tests do not
//! cover: a SQLite outbox → RabbitMQ or Kafka → a SQLite durable inbox, both processes
//! real, every message stored once.

#![cfg(all(feature = "rabbitmq", feature = "kafka"))]

mod support;

use std::path::Path;
use std::time::Duration;

use support::{Service, run_ok, wait_for, write_config};

const MESSAGES: usize = 200;

/// Places `MESSAGES` orders with the Python producer, relays them through `broker` (its
/// `[broker]` lines), receives them into the durable inbox of a second database, and
/// checks each arrived once.
async fn relay_then_receive(dir: &Path, broker: &str, topic: &str) {
    let outbox_db = dir.join("shop.db");
    let inbox_db = dir.join("billing.db");
    let relay_config = write_config(
        dir,
        "relay.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[broker]\n{broker}\n\n[topics]\norders = \"{topic}\"\n",
            outbox_db.display()
        ),
    );
    let receive_config = write_config(
        dir,
        "receive.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[broker]\n{broker}\n\n[receive]\ntopic = \"{topic}\"\nconsumer = \"billing\"\n",
            inbox_db.display()
        ),
    );
    run_ok(&relay_config, &["migrate"]);
    run_ok(&receive_config, &["migrate"]);
    // The receiver first: its subscription is in place before anything is published.
    let mut receiver = Service::start(dir, "receive", &receive_config, &["receive"]);
    receiver.wait_ready(Duration::from_secs(60));
    let produced = std::process::Command::new("python3")
        .arg(support::example("place_order.py"))
        .arg(&outbox_db)
        .arg(MESSAGES.to_string())
        .arg("10")
        .status()
        .expect("python3 runs");
    assert!(produced.success());
    let mut relay = Service::start(dir, "relay", &relay_config, &["relay"]);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_carries_relay_to_receive() {
    let dir = tempfile::tempdir().expect("a directory");
    let name = support::unique("svc");
    let url = std::env::var("ONCEBOX_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    // The password goes apart from the URL, as the configuration asks.
    let mut parsed = url::Url::parse(&url).expect("a URL");
    let password = parsed.password().unwrap_or_default().to_owned();
    parsed.set_password(None).expect("no password");
    let broker = format!("url = \"{parsed}\"\npassword = \"{password}\"\nexchange = \"{name}\"");
    relay_then_receive(dir.path(), &broker, &format!("{name}.orders")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_carries_relay_to_receive() {
    let dir = tempfile::tempdir().expect("a directory");
    let topic = support::unique("svc_orders");
    let brokers =
        std::env::var("ONCEBOX_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let admin = oncebox::kafka::KafkaAdmin::new(oncebox::kafka::KafkaOptions::new(&brokers))
        .expect("an admin client");
    admin
        .create_topic(&topic, 3, 1)
        .await
        .expect("the topic is created");
    let broker = format!("url = \"kafka://{brokers}\"");
    relay_then_receive(dir.path(), &broker, &topic).await;
    let _ = admin.delete_topics(&[topic.as_str()]).await;
}

/// `/readyz` of `oncebox receive` follows the broker even where the client keeps no
/// connection to ask (RabbitMQ): 503 naming the failing receives while a proxy between
/// them is cut, 200 again once the subscriber is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_readiness_follows_rabbitmq() {
    let dir = tempfile::tempdir().expect("a directory");
    let name = support::unique("svc_ready");
    let url = std::env::var("ONCEBOX_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let proxy = oncebox_testkit::proxy::Proxy::start(support::address(&url, 5672))
        .await
        .expect("the proxy listens");
    let mut parsed = url::Url::parse(&support::through(&url, proxy.port())).expect("a URL");
    let password = parsed.password().unwrap_or_default().to_owned();
    parsed.set_password(None).expect("no password");
    let db = dir.path().join("inbox.db");
    let config = write_config(
        dir.path(),
        "receive.toml",
        &format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[broker]\nurl = \"{parsed}\"\npassword = \"{password}\"\nexchange = \"{name}\"\n\n[receive]\ntopic = \"{name}.orders\"\nconsumer = \"billing\"\n",
            db.display()
        ),
    );
    run_ok(&config, &["migrate"]);
    let mut receiver = Service::start(dir.path(), "receive", &config, &["receive"]);
    receiver.wait_ready(Duration::from_secs(60));
    proxy.cut();
    let reason =
        wait_for(
            "/readyz to answer 503",
            Duration::from_secs(30),
            || match support::http_get(receiver.port, "/readyz") {
                Some((503, body)) => Some(body),
                _ => None,
            },
        );
    assert!(
        reason.contains("receiving from the broker fails"),
        "{reason}"
    );
    proxy.restore();
    receiver.wait_ready(Duration::from_secs(60));
    receiver.stop_cleanly(Duration::from_secs(10));
}
