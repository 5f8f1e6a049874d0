//! `oncebox relay` in `mode = "cdc"` as processes: four psql producers place 20,000
//! orders of 200 customers while relays reading PostgreSQL's log are SIGKILLed three
//! times (the first by its standby taking over), then what reached NATS JetStream or
//! Kafka is read back with the broker's own client: every order, each customer's in
//! order, copies only of what was in flight.

#![cfg(all(feature = "nats", feature = "kafka"))]

mod support;

use std::collections::HashSet;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use oncebox::kafka::rdkafka;
use oncebox::nats::async_nats;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers as _, Message as _};
use support::{Seen, Service, audit, psql, run_ok, sample, wait_for, write_config};

const ORDERS: usize = 20_000;
const CUSTOMERS: usize = 200;
const PRODUCERS: usize = 4;
/// Messages a relay publishes at once: with a status interval of 100 ms, what a killed
/// relay may leave unconfirmed.
const IN_FLIGHT: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Source {
    Messages,
    Table,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Broker {
    Nats,
    Kafka,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_to_nats_survive_three_kills() {
    survive_kills(Broker::Nats, Source::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_to_nats_survives_three_kills() {
    survive_kills(Broker::Nats, Source::Table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_to_kafka_survive_three_kills() {
    survive_kills(Broker::Kafka, Source::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_to_kafka_survives_three_kills() {
    survive_kills(Broker::Kafka, Source::Table).await;
}

async fn survive_kills(broker: Broker, source: Source) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("cdc");
    let slot = schema.clone();
    let _cleanup = support::LogTailingCleanup::new(&schema);
    let (broker_toml, topic) = match broker {
        Broker::Nats => (
            format!(
                "url = \"{}\"\nsubject_prefix = \"{schema}.\"\nstream = \"{}\"",
                support::nats_url(),
                schema.to_uppercase()
            ),
            format!("{schema}.orders"),
        ),
        Broker::Kafka => {
            let topic = support::unique("cdc_orders");
            let admin = oncebox::kafka::KafkaAdmin::new(oncebox::kafka::KafkaOptions::new(
                support::kafka_brokers(),
            ))
            .expect("an admin client");
            admin
                .create_topic(&topic, 3, 1)
                .await
                .expect("the topic is created");
            (
                format!("url = \"kafka://{}\"", support::kafka_brokers()),
                topic,
            )
        }
    };
    let topics = match broker {
        Broker::Kafka => format!("[topics]\norders = \"{topic}\"\n"),
        Broker::Nats => String::new(),
    };
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"

[broker]
{broker_toml}

{topics}
[relay]
mode = "cdc"
stats_interval = "200ms"

[cdc]
source = "{source}"
slot = "{slot}"
max_in_flight = {IN_FLIGHT}
status_interval = "100ms"
"#,
            pg = support::pg_url(),
            source = if source == Source::Table {
                "table"
            } else {
                "messages"
            },
        ),
    );
    run_ok(&config, &["migrate"]);
    psql(&format!(
        "CREATE TABLE {schema}.shop_orders (id text PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL)"
    ));

    // The first relay creates the slot; its standby waits for the slot's lock.
    let published = |relay: &Service| {
        relay.metrics().and_then(|text| {
            sample(
                &text,
                "oncebox_cdc_messages_total",
                &format!("outcome=\"published\",slot=\"{slot}\""),
            )
        })
    };
    let mut first = Service::start(dir.path(), "relay-1", &config, &["relay"]);
    first.wait_ready(Duration::from_secs(30));
    wait_for("the slot", Duration::from_secs(30), || {
        (psql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )) == "1")
            .then_some(())
    });
    let mut standby = Service::start(dir.path(), "relay-2", &config, &["relay"]);
    standby.wait_ready(Duration::from_secs(30));

    let script = if source == Source::Table {
        "place_order.sql"
    } else {
        "emit_order.sql"
    };
    let producers: Vec<Child> = (0..PRODUCERS)
        .map(|producer| support::spawn_psql(&orders(dir.path(), producer, script), &schema))
        .collect();

    // Kill the reader at mid-stream three times: the standby takes over from the
    // first, fresh relays from the others.
    wait_for("3,000 published", Duration::from_secs(120), || {
        published(&first).filter(|&n| n >= 3_000.0)
    });
    first.kill();
    wait_for("the standby took over", Duration::from_secs(120), || {
        published(&standby).filter(|&n| n >= 3_000.0)
    });
    standby.kill();
    for round in 3..=4 {
        let mut relay = Service::start(dir.path(), &format!("relay-{round}"), &config, &["relay"]);
        wait_for("3,000 more", Duration::from_secs(120), || {
            published(&relay).filter(|&n| n >= 3_000.0)
        });
        relay.kill();
    }
    let last = Service::start(dir.path(), "relay-5", &config, &["relay"]);
    let producers = tokio::task::spawn_blocking(move || {
        producers
            .into_iter()
            .map(|mut producer| producer.wait().expect("psql ran").success())
            .collect::<Vec<_>>()
    })
    .await
    .expect("the producers are waited for");
    assert!(producers.iter().all(|ok| *ok), "a psql producer failed");

    let seen = match broker {
        Broker::Nats => read_nats(&schema).await,
        Broker::Kafka => read_kafka(&topic).await,
    };
    let duplicates = audit(&seen, ORDERS, CUSTOMERS);
    eprintln!(
        "{broker:?} {source:?}: {} read, {duplicates} copies",
        seen.len()
    );
    // What each of the four kills left unconfirmed: the messages in flight and those
    // confirmed by the broker within the last status interval (a few hundred here: a
    // whole run copies 300 to 400 on Kafka). A takeover that held confirmations back
    // while it replayed made each kill copy nearly all its reader had published.
    assert!(duplicates <= 4 * (IN_FLIGHT + 500), "{duplicates} copies");
    if source == Source::Table {
        wait_for("published rows deleted", Duration::from_secs(30), || {
            (psql(&format!("SELECT count(*) FROM {schema}.outbox")) == "0").then_some(())
        });
    }

    // The slot is listed with the WAL it keeps, in the stats and the metrics, and the
    // command drops it once its reader stopped.
    let metrics = last.metrics().unwrap_or_default();
    assert!(
        sample(
            &metrics,
            "oncebox_cdc_slot_retained_wal_bytes",
            &format!("slot=\"{slot}\"")
        )
        .is_some(),
        "the slot's retained WAL is a metric"
    );
    let mut last = last;
    last.stop_cleanly(Duration::from_secs(10));
    let stats = support::run(&config, &["outbox", "stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("JSON stats");
    let listed = stats["replication_slots"]
        .as_array()
        .expect("the slots are listed")
        .iter()
        .find(|found| found["name"] == slot.as_str())
        .expect("this slot is listed")
        .clone();
    assert_eq!(listed["active"], false, "{listed}");
    run_ok(&config, &["outbox", "drop-slot"]);
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )),
        "0"
    );
    // The store remembers the dropped slot (a relay started on it refuses) until it is
    // retired with --forget.
    let remembered = || {
        psql(&format!(
            "SELECT count(*) FROM {schema}.cdc_slots WHERE slot = '{slot}'"
        ))
    };
    assert_eq!(remembered(), "1");
    run_ok(&config, &["outbox", "drop-slot", "--forget"]);
    assert_eq!(remembered(), "0");

    match broker {
        Broker::Nats => {
            let jetstream = async_nats::jetstream::new(
                async_nats::connect(support::nats_url())
                    .await
                    .expect("NATS answers"),
            );
            let _ = jetstream.delete_stream(schema.to_uppercase()).await;
        }
        Broker::Kafka => {
            let admin = oncebox::kafka::KafkaAdmin::new(oncebox::kafka::KafkaOptions::new(
                support::kafka_brokers(),
            ))
            .expect("an admin client");
            let _ = admin.delete_topics(&[topic.as_str()]).await;
        }
    }
}

/// Producer `producer`'s psql script: the orders of its customers (every
/// `PRODUCERS`-th), interleaved, each in a transaction of its own.
fn orders(dir: &Path, producer: usize, example: &str) -> std::path::PathBuf {
    let example = support::example(example);
    let mut script = String::from("\\set ON_ERROR_STOP on\n\\set QUIET on\n");
    script.push_str("SET search_path = :\"schema\", public;\n");
    let per_customer = ORDERS / CUSTOMERS;
    for n in 1..=per_customer {
        for customer in (producer..CUSTOMERS).step_by(PRODUCERS) {
            script.push_str(&format!(
                "\\set order_id c{customer}-{n}\n\\set customer c{customer}\n\\set amount {n}\n\\i {}\n",
                example.display()
            ));
        }
    }
    let path = dir.join(format!("producer-{producer}.psql"));
    std::fs::write(&path, script).expect("the script is written");
    path
}

/// Every message of the stream, in stream order, once all orders arrived.
async fn read_nats(schema: &str) -> Vec<Seen> {
    let jetstream = async_nats::jetstream::new(
        async_nats::connect(support::nats_url())
            .await
            .expect("NATS answers"),
    );
    let name = schema.to_uppercase();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let mut stream = jetstream
            .get_stream(&name)
            .await
            .expect("the stream exists");
        let state = stream.info().await.expect("stream info").state.clone();
        if state.messages >= ORDERS as u64 {
            let mut seen = Vec::with_capacity(ORDERS);
            for sequence in 1..=state.last_sequence {
                let message = stream
                    .get_raw_message(sequence)
                    .await
                    .expect("a stored message");
                seen.push(Seen {
                    id: message.headers.get("ce-id").expect("ce-id").to_string(),
                    order_id: support::order_id(&message.payload),
                });
            }
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {ORDERS} in the stream",
            state.messages
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every record of the topic, in each partition's order, once all orders arrived.
async fn read_kafka(topic: &str) -> Vec<Seen> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", support::kafka_brokers())
            .set("group.id", support::unique("cdc_reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        consumer.subscribe(&[&topic]).expect("subscribed");
        let mut seen = Vec::new();
        let mut distinct = HashSet::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while distinct.len() < ORDERS {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {ORDERS} read",
                distinct.len()
            );
            let Some(record) = consumer.poll(Duration::from_millis(500)) else {
                continue;
            };
            let record = record.expect("a record");
            let id = record
                .headers()
                .and_then(|headers| {
                    headers
                        .iter()
                        .find(|header| header.key == "ce_id")
                        .and_then(|header| header.value)
                        .map(|value| String::from_utf8_lossy(value).into_owned())
                })
                .expect("every record carries ce_id");
            distinct.insert(id.clone());
            seen.push(Seen {
                id,
                order_id: support::order_id(record.payload().expect("a payload")),
            });
        }
        seen
    })
    .await
    .expect("the reader ran")
}
