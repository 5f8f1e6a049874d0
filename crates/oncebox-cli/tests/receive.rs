//! `oncebox receive` as a process: NATS JetStream → the durable inbox on PostgreSQL,
//! drained by a worker outside Rust with the documented statements.

#![cfg(feature = "nats")]

mod support;

use std::process::Command;
use std::time::Duration;

use oncebox::nats::async_nats::{self, HeaderMap};
use support::{Service, psql, run_ok, wait_for, write_config};

const MESSAGES: usize = 10_000;
const COPIES: usize = 3;
const KEYS: usize = 100;

/// 10,000 messages, each sent three times back to back (without `Nats-Msg-Id`, so the
/// stream keeps every copy), received concurrently by two `oncebox receive` processes
/// of one consumer group: 10,000 inbox rows, every delivery acked. Two psql workers
/// (`examples/sql-inbox-worker`) then drain the rows at once: each processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_store_each_message_once_and_sql_workers_process_each_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("receive");
    let stream = schema.to_uppercase();
    let subject = format!("{schema}.orders");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"

[broker]
url = "{nats}"
subject_prefix = "{schema}."
stream = "{stream}"

[receive]
topic = "orders"
consumer = "workers"
"#,
            pg = support::pg_url(),
            nats = support::nats_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let mut receivers: Vec<Service> = (1..=2)
        .map(|n| Service::start(dir.path(), &format!("receive-{n}"), &config, &["receive"]))
        .collect();
    for receiver in &mut receivers {
        receiver.wait_ready(Duration::from_secs(30));
    }

    let nats = async_nats::connect(support::nats_url())
        .await
        .expect("NATS answers");
    let jetstream = async_nats::jetstream::new(nats);
    // The client holds a bounded number of unconfirmed publishes: confirm by chunks.
    let mut acks = Vec::with_capacity(1000);
    for n in 0..MESSAGES {
        let id = uuid::Uuid::new_v4().to_string();
        let key = format!("c{}", n % KEYS);
        for _ in 0..COPIES {
            let mut headers = HeaderMap::new();
            headers.insert("ce-specversion", "1.0");
            headers.insert("ce-id", id.as_str());
            headers.insert("ce-source", "a-python-service");
            headers.insert("ce-type", "OrderPlaced");
            headers.insert("ce-subject", key.as_str());
            let payload = format!(r#"{{"order_id":"{key}-{n}"}}"#);
            acks.push(
                jetstream
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await
                    .expect("published"),
            );
        }
        if acks.len() >= 900 || n + 1 == MESSAGES {
            for ack in acks.drain(..) {
                ack.await.expect("JetStream stored the copy");
            }
        }
    }

    let rows = || {
        psql(&format!(
            "SELECT count(*) FROM {schema}.durable_inbox WHERE consumer = 'workers'"
        ))
    };
    let handle = jetstream
        .get_stream(&stream)
        .await
        .expect("the stream exists");
    let consumer = "workers_orders";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let info = handle
            .consumer_info(consumer)
            .await
            .expect("the group's consumer");
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deliveries still unacked: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rows(), MESSAGES.to_string(), "one row per message id");
    let per_receiver: Vec<String> = receivers
        .iter()
        .map(|receiver| receiver.metrics().expect("/metrics answers"))
        .collect();
    let stored: f64 = per_receiver
        .iter()
        .filter_map(|text| {
            support::sample(
                text,
                "oncebox_consumer_messages_total",
                r#"consumer="workers",outcome="stored""#,
            )
        })
        .sum();
    let duplicates: f64 = per_receiver
        .iter()
        .filter_map(|text| {
            support::sample(
                text,
                "oncebox_consumer_messages_total",
                r#"consumer="workers",outcome="duplicate""#,
            )
        })
        .sum();
    assert_eq!(stored, MESSAGES as f64, "stored, counted by both receivers");
    // Every copy beyond the first was recognised (a redelivery after an ack timeout on
    // a loaded host would add more).
    assert!(
        duplicates >= (MESSAGES * (COPIES - 1)) as f64,
        "duplicates recognised: {duplicates}"
    );
    for receiver in &mut receivers {
        receiver.stop_cleanly(Duration::from_secs(10));
    }

    // Workers in another language take, process and mark rows with plain SQL.
    psql(&format!(
        "CREATE TABLE {schema}.shop_events (message_id uuid, key text, payload bytea, processed_at timestamptz DEFAULT clock_timestamp())"
    ));
    let worker = support::example_of("sql-inbox-worker", "worker.sh");
    let url = format!("{}?options=-csearch_path%3D{schema}", support::pg_url());
    let workers: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&worker)
                .args([url.as_str(), schema.as_str(), "workers"])
                .spawn()
                .expect("the worker starts")
        })
        .collect();
    for mut worker in workers {
        assert!(
            worker.wait().expect("the worker ran").success(),
            "a worker failed"
        );
    }
    let processed = psql(&format!(
        "SELECT count(*) || ' ' || count(DISTINCT message_id) FROM {schema}.shop_events"
    ));
    assert_eq!(
        processed,
        format!("{MESSAGES} {MESSAGES}"),
        "each row processed once"
    );
    wait_for("every row done", Duration::from_secs(5), || {
        let left = psql(&format!(
            "SELECT count(*) FROM {schema}.durable_inbox WHERE consumer = 'workers' AND status <> 'done'"
        ));
        (left == "0").then_some(())
    });
    // Each key's rows were processed in the order they were received.
    let out_of_order = psql(&format!(
        "SELECT count(*) FROM (
           SELECT d.seq, lag(d.seq) OVER (PARTITION BY e.key ORDER BY e.processed_at, d.seq) AS before
           FROM {schema}.shop_events AS e JOIN {schema}.durable_inbox AS d USING (message_id)
         ) AS t WHERE before > seq"
    ));
    assert_eq!(out_of_order, "0", "a key's rows processed out of order");

    let _ = jetstream.delete_stream(&stream).await;
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}
