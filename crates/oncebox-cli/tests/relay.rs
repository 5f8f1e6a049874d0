//! `oncebox relay` as a process: orders written by producers outside Rust while it runs,
//! stopped by SIGTERM and killed by SIGKILL at mid-drain, restarted, and what reached
//! the broker read back with the broker's own client.

#![cfg(feature = "nats")]

mod support;

use std::process::Command;
use std::time::Duration;

use oncebox::nats::async_nats;
use oncebox::redis::redis;
use support::{Seen, Service, audit, psql, run_ok, sample, wait_for, write_config};

/// Orders placed by the producers of these tests, and their customers (the keys).
const ORDERS: usize = 20_000;
const CUSTOMERS: usize = 200;
/// Rows per claim: the most a killed relay can have published and not marked, twice
/// (a batch in flight and one claimed ahead).
const BATCH: usize = 100;

/// How long a SIGTERM'd relay may take to exit.
const STOP: Duration = Duration::from_secs(10);

/// PostgreSQL → NATS JetStream: the psql producer of `examples/sql-producer` places
/// 20,000 orders while the relay is stopped by SIGTERM at mid-drain (exit 0 within 10 s),
/// restarted, killed by SIGKILL at mid-drain, and restarted. Every order reaches the
/// stream once (JetStream drops the killed batch's copies by `Nats-Msg-Id`), each
/// customer's orders in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_to_nats_survives_sigterm_and_sigkill() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("relay_nats");
    let subject_prefix = format!("{schema}.");
    let stream = schema.to_uppercase();
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
subject_prefix = "{subject_prefix}"
stream = "{stream}"

[relay]
batch_size = {BATCH}
stats_interval = "200ms"
"#,
            pg = support::pg_url(),
            nats = support::nats_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let script = support::psql_orders(dir.path(), &schema, ORDERS, CUSTOMERS);

    let nats = async_nats::connect(support::nats_url())
        .await
        .expect("NATS answers");
    let jetstream = async_nats::jetstream::new(nats);
    let in_stream = || {
        let jetstream = jetstream.clone();
        let stream = stream.clone();
        async move {
            let mut stream = jetstream.get_stream(&stream).await.ok()?;
            Some(stream.info().await.ok()?.state.messages)
        }
    };

    let mut producer = support::spawn_psql(&script, &schema);
    let mut relay = Service::start(dir.path(), "relay-1", &config, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    wait_until(
        || async { in_stream().await.filter(|&n| n >= 3_000) },
        "3,000 published",
    )
    .await;
    relay.stop_cleanly(STOP);

    let before = in_stream().await.unwrap_or(0);
    let mut relay = Service::start(dir.path(), "relay-2", &config, &["relay"]);
    wait_until(
        || async { in_stream().await.filter(|&n| n >= before + 3_000) },
        "3,000 more",
    )
    .await;
    relay.kill();

    let mut relay = Service::start(dir.path(), "relay-3", &config, &["relay"]);
    let produced = tokio::task::spawn_blocking(move || producer.wait())
        .await
        .expect("the producer is waited for")
        .expect("psql ran");
    assert!(produced.success(), "the psql producer failed");
    wait_until(
        || async { in_stream().await.filter(|&n| n >= ORDERS as u64) },
        "every order published",
    )
    .await;
    wait_for("the outbox drained", Duration::from_secs(30), || {
        let pending = psql(&format!(
            "SELECT count(*) FROM {schema}.outbox WHERE status = 'pending'"
        ));
        (pending == "0").then_some(())
    });
    relay.stop_cleanly(STOP);

    // Read back with the broker's client: every order once, per-key order kept.
    let mut handle = jetstream
        .get_stream(&stream)
        .await
        .expect("the stream exists");
    let last = handle
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut seen = Vec::with_capacity(ORDERS);
    for sequence in 1..=last {
        let message = handle
            .get_raw_message(sequence)
            .await
            .expect("a stored message");
        let id = message
            .headers
            .get("ce-id")
            .expect("every message carries ce-id")
            .to_string();
        seen.push(Seen {
            id,
            order_id: support::order_id(&message.payload),
        });
    }
    let duplicates = audit(&seen, ORDERS, CUSTOMERS);
    assert_eq!(
        duplicates, 0,
        "JetStream's Nats-Msg-Id window drops every republished copy"
    );
    assert_eq!(seen.len(), ORDERS);

    let _ = jetstream.delete_stream(&stream).await;
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// SQLite → Redis Streams: the Python producer of `examples/sql-producer` places 20,000
/// orders while the relay is stopped by SIGTERM at mid-drain (exit 0 within 10 s, and
/// nothing published twice), restarted, killed at mid-drain, restarted. Every order is
/// in the stream, each customer's in order; the only copies are the killed batches'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_to_redis_streams_survives_sigterm_and_sigkill() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("shop.db");
    let prefix = format!("{}:", support::unique("relay_redis"));
    let key = format!("{prefix}orders");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "sqlite://{db}"

[broker]
url = "{redis}"
key_prefix = "{prefix}"

[relay]
batch_size = {BATCH}
stats_interval = "200ms"
"#,
            db = db.display(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let mut redis = support::redis().await;
    let length = {
        let key = key.clone();
        let redis = redis.clone();
        move || {
            let key = key.clone();
            let mut redis = redis.clone();
            async move {
                redis::cmd("XLEN")
                    .arg(&key)
                    .query_async::<u64>(&mut redis)
                    .await
                    .ok()
            }
        }
    };

    let mut producer = Command::new("python3")
        .arg(support::example("place_order.py"))
        .arg(&db)
        .arg(ORDERS.to_string())
        .arg(CUSTOMERS.to_string())
        .spawn()
        .expect("python3 starts");
    let mut relay = Service::start(dir.path(), "relay-1", &config, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    wait_until(
        || async { length().await.filter(|&n| n >= 3_000) },
        "3,000 published",
    )
    .await;
    relay.stop_cleanly(STOP);

    let before = length().await.unwrap_or(0);
    let mut relay = Service::start(dir.path(), "relay-2", &config, &["relay"]);
    wait_until(
        || async { length().await.filter(|&n| n >= before + 3_000) },
        "3,000 more",
    )
    .await;
    // Up to here every stop was clean: nothing was published twice.
    let clean = read_stream(&mut redis, &key).await;
    let clean_copies = clean.len() - distinct(&clean);
    relay.kill();
    assert_eq!(
        clean_copies, 0,
        "a clean stop published {clean_copies} message(s) twice"
    );

    let mut relay = Service::start(dir.path(), "relay-3", &config, &["relay"]);
    let produced = tokio::task::spawn_blocking(move || producer.wait())
        .await
        .expect("the producer is waited for")
        .expect("python3 ran");
    assert!(produced.success(), "the Python producer failed");
    wait_for("the outbox drained", Duration::from_secs(60), || {
        let text = relay.metrics()?;
        let pending = sample(&text, "oncebox_spool_pending_rows", r#"spool="outbox""#)?;
        (pending == 0.0
            && sample(
                &text,
                "oncebox_spool_rows_total",
                r#"spool="outbox",outcome="done""#,
            )? > 0.0)
            .then_some(())
    });
    let stats = run_ok(&config, &["outbox", "stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON stats");
    assert_eq!(stats["pending"], 0, "{stats}");
    assert_eq!(stats["published"], ORDERS, "{stats}");
    relay.stop_cleanly(STOP);

    let seen = read_stream(&mut redis, &key).await;
    let duplicates = audit(&seen, ORDERS, CUSTOMERS);
    assert!(
        duplicates <= 2 * BATCH,
        "{duplicates} copies: more than the killed relay's batches could hold"
    );
    let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
}

/// Several relay processes over one outbox are the way to scale out: three relays on one
/// PostgreSQL outbox publish 6,000 orders of 60 customers to Redis Streams, each order
/// exactly once and each customer's in commit order, and every relay takes a share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_share_one_outbox_in_per_key_order() {
    const ORDERS: usize = 6_000;
    const CUSTOMERS: usize = 60;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("relay_scale");
    let prefix = format!("{schema}:");
    let key = format!("{prefix}orders");
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
key_prefix = "{prefix}"

[relay]
batch_size = 50
"#,
            pg = support::pg_url(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let mut relays: Vec<Service> = (1..=3)
        .map(|n| Service::start(dir.path(), &format!("relay-{n}"), &config, &["relay"]))
        .collect();
    for relay in &mut relays {
        relay.wait_ready(Duration::from_secs(30));
    }
    let script = support::psql_orders(dir.path(), &schema, ORDERS, CUSTOMERS);
    let produced = support::spawn_psql(&script, &schema)
        .wait()
        .expect("psql ran");
    assert!(produced.success(), "the psql producer failed");
    wait_for("the outbox drained", Duration::from_secs(60), || {
        let pending = psql(&format!(
            "SELECT count(*) FROM {schema}.outbox WHERE status = 'pending'"
        ));
        (pending == "0").then_some(())
    });
    let shares: Vec<f64> = relays
        .iter()
        .map(|relay| {
            let text = relay.metrics().expect("the relay serves /metrics");
            sample(
                &text,
                "oncebox_spool_rows_total",
                r#"spool="outbox",outcome="done""#,
            )
            .unwrap_or(0.0)
        })
        .collect();
    for relay in &mut relays {
        relay.stop_cleanly(STOP);
    }
    let mut redis = support::redis().await;
    let seen = read_stream(&mut redis, &key).await;
    assert_eq!(
        audit(&seen, ORDERS, CUSTOMERS),
        0,
        "no copies without a crash"
    );
    assert_eq!(
        shares.iter().sum::<f64>(),
        ORDERS as f64,
        "published per relay: {shares:?}"
    );
    assert!(
        shares.iter().all(|&share| share > 0.0),
        "a relay took no share: {shares:?}"
    );
    let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// Calls `probe` every 50 ms until it returns `Some`, for at most a minute.
async fn wait_until<F, Fut, T>(mut probe: F, what: &str) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every entry of the Redis stream `key`, read with XRANGE: its `ce_id` and order id.
async fn read_stream(redis: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<Seen> {
    type Entry = (String, Vec<Vec<u8>>);
    let mut seen = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let entries: Vec<Entry> = redis::cmd("XRANGE")
            .arg(key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await
            .expect("XRANGE answers");
        let Some((last, _)) = entries.last() else {
            break;
        };
        start = format!("({last}");
        for (_, fields) in &entries {
            let field = |name: &[u8]| {
                fields
                    .chunks(2)
                    .find(|pair| pair[0] == name)
                    .map(|pair| pair[1].clone())
                    .unwrap_or_else(|| panic!("an entry without {}", String::from_utf8_lossy(name)))
            };
            seen.push(Seen {
                id: String::from_utf8(field(b"ce_id")).expect("a UTF-8 id"),
                order_id: support::order_id(&field(b"data")),
            });
        }
    }
    seen
}

fn distinct(seen: &[Seen]) -> usize {
    seen.iter()
        .map(|message| message.id.as_str())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// `/metrics` follows a drain (the backlog gauge falls from 20,000 to 0, the published
/// counter reaches 20,000), and `/readyz` follows the database: 503 with the reason while
/// PostgreSQL is unreachable (a proxy between them cut), 200 again once it is back; the
/// gauge `oncebox_ready` says the same on each scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_drain_and_readiness_follows_the_database() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("relay_health");
    let proxy = oncebox_testkit::proxy::Proxy::start(support::address(&support::pg_url(), 5432))
        .await
        .expect("the proxy listens");
    let prefix = format!("{schema}:");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"
connect_timeout = "2s"

[broker]
url = "{redis}"
key_prefix = "{prefix}"

[relay]
stats_interval = "100ms"
poll_max = "200ms"
"#,
            pg = support::through(&support::pg_url(), proxy.port()),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    // A backlog written by plain SQL in one transaction (no key locks: one transaction
    // allocates its rows' seq in order anyway).
    psql(&format!(
        "INSERT INTO {schema}.outbox (id, topic, key, kind, payload)
         SELECT gen_random_uuid(), 'orders', 'c' || (n % {CUSTOMERS}), 'OrderPlaced',
                convert_to(json_build_object('order_id', 'c' || (n % {CUSTOMERS}) || '-' || (n / {CUSTOMERS} + 1))::text, 'UTF8')
         FROM generate_series(0, {ORDERS} - 1) AS n ORDER BY n"
    ));

    let mut relay = Service::start(dir.path(), "relay", &config, &["relay"]);
    let mut most_pending = 0.0f64;
    let (pending, published) = wait_for("the drain in /metrics", Duration::from_secs(60), || {
        let text = relay.metrics()?;
        let pending = sample(&text, "oncebox_spool_pending_rows", r#"spool="outbox""#)?;
        let published = sample(
            &text,
            "oncebox_spool_rows_total",
            r#"spool="outbox",outcome="done""#,
        )?;
        most_pending = most_pending.max(pending);
        (pending == 0.0 && published >= ORDERS as f64).then_some((pending, published))
    });
    assert!(
        most_pending > 0.0,
        "a reading saw the backlog before it fell to 0"
    );
    assert_eq!((pending, published), (0.0, ORDERS as f64));
    let text = relay.metrics().expect("/metrics answers");
    for family in [
        "oncebox_spool_claim_duration_seconds_bucket",
        "oncebox_spool_delivery_duration_seconds_bucket",
        "oncebox_spool_lag_seconds_bucket",
        "oncebox_spool_oldest_pending_age_seconds",
        "oncebox_spool_dead_rows",
    ] {
        assert!(text.contains(family), "/metrics has no {family}:\n{text}");
    }
    assert!(!text.contains("127.0.0.1"), "/metrics shows no address");
    assert_eq!(
        support::http_get(relay.port, "/healthz").map(|(status, _)| status),
        Some(200)
    );
    relay.wait_ready(Duration::from_secs(10));

    proxy.cut();
    let reason =
        wait_for(
            "/readyz to answer 503",
            Duration::from_secs(20),
            || match support::http_get(relay.port, "/readyz") {
                Some((503, body)) => Some(body),
                _ => None,
            },
        );
    assert!(
        reason.contains("store"),
        "the reason names the store: {reason}"
    );
    let ready = |relay: &Service| {
        relay
            .metrics()
            .and_then(|text| sample(&text, "oncebox_ready", r#"service="relay""#))
    };
    assert_eq!(
        ready(&relay),
        Some(0.0),
        "a scrape sees the relay not ready"
    );
    assert_eq!(
        support::http_get(relay.port, "/healthz").map(|(status, _)| status),
        Some(200),
        "the process is alive all the same"
    );
    proxy.restore();
    relay.wait_ready(Duration::from_secs(30));
    assert_eq!(ready(&relay), Some(1.0), "and ready again");
    relay.stop_cleanly(STOP);
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
    let mut redis = support::redis().await;
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(format!("{prefix}orders"))
        .query_async(&mut redis)
        .await;
}

/// Enqueues `count` messages on `topic` with key `key` in the SQLite outbox at `db`,
/// with the library.
async fn enqueue_sqlite(db: &std::path::Path, topic: &str, key: &str, count: usize) -> Vec<String> {
    let store = oncebox::sqlite::SqliteStore::connect(db)
        .await
        .expect("the database opens");
    let mut tx = store.pool().begin().await.expect("a transaction");
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let message = oncebox::Message::new(topic, format!(r#"{{"order_id":"{key}-{}"}}"#, n + 1))
            .with_key(key);
        store
            .outbox()
            .enqueue(&mut tx, &message)
            .await
            .expect("enqueued");
        ids.push(message.id.to_string());
    }
    tx.commit().await.expect("committed");
    store.pool().close().await;
    ids
}

async fn stream_length(key: &str) -> u64 {
    let mut redis = support::redis().await;
    redis::cmd("XLEN")
        .arg(key)
        .query_async(&mut redis)
        .await
        .expect("XLEN")
}

async fn delete_streams(keys: &[String]) {
    let mut redis = support::redis().await;
    let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut redis).await;
}

/// `[topics]` sends an outbox topic to the destination it names; other topics keep
/// their name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_go_to_the_destinations_the_configuration_names() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("shop.db");
    let prefix = format!("{}:", support::unique("relay_topics"));
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"sqlite://{db}\"\n\n[broker]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\n[topics]\norders = \"shop-orders-v1\"\n",
            db = db.display(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    enqueue_sqlite(&db, "orders", "c0", 10).await;
    enqueue_sqlite(&db, "payments", "c0", 1).await;
    let mut relay = Service::start(dir.path(), "relay", &config, &["relay"]);
    wait_for("11 published", Duration::from_secs(30), || {
        (published(&config) == 11).then_some(())
    });
    relay.stop_cleanly(STOP);
    let keys = ["shop-orders-v1", "orders", "payments"].map(|topic| format!("{prefix}{topic}"));
    let lengths = [
        stream_length(&keys[0]).await,
        stream_length(&keys[1]).await,
        stream_length(&keys[2]).await,
    ];
    assert_eq!(
        lengths,
        [10, 0, 1],
        "mapped, not under its own name, unmapped"
    );
    delete_streams(&keys).await;
}

/// A stop that cannot finish (the broker stopped answering in the middle of a publish)
/// ends at `stop_timeout` with status 3, and a second signal ends a stop at once, also
/// with status 3; what they left unsettled is published after its lease by the next
/// relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_at_its_deadline_or_at_a_second_signal() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("shop.db");
    let prefix = format!("{}:", support::unique("relay_stop"));
    let proxy = oncebox_testkit::proxy::Proxy::start(support::address(&support::redis_url(), 6379))
        .await
        .expect("the proxy listens");
    let config_with = |stop: &str| {
        write_config(
            dir.path(),
            &format!("oncebox-{stop}.toml"),
            &format!(
                "[store]\nurl = \"sqlite://{db}\"\n\n[broker]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\n\
                 [relay]\nstop_timeout = \"{stop}\"\nlease = \"8s\"\npublish_timeout = \"6s\"\npoll_max = \"100ms\"\n",
                db = db.display(),
                redis = support::through(&support::redis_url(), proxy.port()),
            ),
        )
    };
    let short = config_with("1s");
    let long = config_with("60s");
    run_ok(&short, &["migrate"]);

    // The deadline.
    let mut relay = Service::start(dir.path(), "relay-1", &short, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    proxy.stall();
    let ids = enqueue_sqlite(&db, "orders", "c0", 5).await;
    wait_until_claimed(&short, &ids[0]);
    let signalled = std::time::Instant::now();
    relay.terminate();
    let status = relay.wait(Duration::from_secs(4)).expect("the relay exits");
    assert_eq!(
        status.code(),
        Some(3),
        "cut short at the deadline:\n{}",
        relay.log()
    );
    assert!(
        signalled.elapsed() >= Duration::from_secs(1),
        "not before the deadline"
    );
    proxy.restore();

    // The second signal.
    let mut relay = Service::start(dir.path(), "relay-2", &long, &["relay"]);
    relay.wait_ready(Duration::from_secs(30));
    proxy.stall();
    // Another key: c0's rows wait behind the first relay's lease.
    let ids = enqueue_sqlite(&db, "orders", "c1", 5).await;
    wait_until_claimed(&long, &ids[0]);
    relay.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        relay.wait(Duration::ZERO).is_none(),
        "the first signal waits for the publish"
    );
    let signalled = std::time::Instant::now();
    relay.terminate();
    let status = relay
        .wait(Duration::from_secs(2))
        .expect("the relay exits at once");
    assert_eq!(status.code(), Some(3), "{}", relay.log());
    assert!(signalled.elapsed() < Duration::from_secs(2));
    proxy.restore();

    // Nothing was lost: the next relay publishes all ten after their leases.
    let mut relay = Service::start(dir.path(), "relay-3", &long, &["relay"]);
    wait_for("all ten published", Duration::from_secs(30), || {
        (published(&long) == 10).then_some(())
    });
    relay.stop_cleanly(STOP);
    delete_streams(&[format!("{prefix}orders")]).await;
}

/// Rows published, by `oncebox outbox stats`.
fn published(config: &std::path::Path) -> u64 {
    let stats: serde_json::Value =
        serde_json::from_str(&run_ok(config, &["outbox", "stats", "--json"])).expect("JSON stats");
    stats["published"].as_u64().expect("a count")
}

/// Waits until a relay has claimed the row of message `id` (its publish is then under
/// way), by `oncebox outbox show`.
fn wait_until_claimed(config: &std::path::Path, id: &str) {
    wait_for("the row claimed", Duration::from_secs(10), || {
        let row: serde_json::Value =
            serde_json::from_str(&run_ok(config, &["outbox", "show", id, "--json"])).ok()?;
        (!row["leased_until"].is_null()).then_some(())
    });
}

/// `outbox.layout = "debezium"`: producers that insert Debezium's outbox columns, and
/// nothing else, are relayed by `oncebox relay` (after `oncebox migrate` adds the
/// relay's columns), aggregate type → topic after the prefix, each aggregate's events in
/// order; the admin commands read the same table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_producers_are_relayed_by_the_service() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("relay_dbz");
    let prefix = format!("{schema}:");
    psql(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.outbox_events (id uuid PRIMARY KEY, aggregatetype text NOT NULL,
             aggregateid text NOT NULL, type text NOT NULL, payload jsonb NOT NULL)"
    ));
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\nschema = \"{schema}\"\n\n[outbox]\nlayout = \"debezium\"\n\
             table = \"{schema}.outbox_events\"\ntopic_prefix = \"evt.\"\n\n\
             [broker]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n",
            pg = support::pg_url(),
            redis = support::redis_url(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let refused = support::run(&config, &["migrate", "--print"]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "--print covers oncebox's own tables only"
    );
    psql(&format!(
        "INSERT INTO {schema}.outbox_events (id, aggregatetype, aggregateid, type, payload)
         SELECT gen_random_uuid(), 'order', 'c' || (n % 5), 'OrderPlaced',
                json_build_object('order_id', 'c' || (n % 5) || '-' || (n / 5 + 1))
         FROM generate_series(0, 49) AS n ORDER BY n"
    ));
    let mut relay = Service::start(dir.path(), "relay", &config, &["relay"]);
    wait_for("50 published", Duration::from_secs(30), || {
        (published(&config) == 50).then_some(())
    });
    relay.stop_cleanly(STOP);
    let mut redis = support::redis().await;
    let key = format!("{prefix}evt.order");
    let seen = read_stream(&mut redis, &key).await;
    assert_eq!(audit(&seen, 50, 5), 0);
    delete_streams(&[key]).await;
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// `otel.endpoint` makes `oncebox relay` and `oncebox receive` export their spans over
/// OTLP/HTTP. A producer outside Rust wrote a `traceparent` into the row's headers: the
/// relay's `send` span links to it, and the receiver's `process` span continues its
/// trace as its child, in a stand-in collector that decodes what it is sent.
#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_and_receive_export_their_spans_over_otlp() {
    let collector = support::Collector::start().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("shop.db");
    let prefix = format!("{}:", support::unique("relay_otel"));
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"sqlite://{db}\"\n\n[broker]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\n\
             [receive]\ntopic = \"orders\"\nconsumer = \"billing\"\n\n[otel]\nendpoint = \"{otlp}\"\n",
            db = db.display(),
            redis = support::redis_url(),
            otlp = collector.endpoint(),
        ),
    );
    run_ok(&config, &["migrate"]);
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let store = oncebox::sqlite::SqliteStore::connect(&db)
        .await
        .expect("the database opens");
    let message = oncebox::Message::new("orders", r#"{"order_id":"o-1"}"#)
        .with_key("c-1")
        .with_header("traceparent", format!("00-{trace}-{parent}-01"))
        .expect("a valid header");
    let mut tx = store.pool().begin().await.expect("a transaction");
    store
        .outbox()
        .enqueue(&mut tx, &message)
        .await
        .expect("enqueued");
    tx.commit().await.expect("committed");
    store.pool().close().await;

    let mut receive = Service::start(dir.path(), "receive", &config, &["receive"]);
    receive.wait_ready(Duration::from_secs(30));
    let mut relay = Service::start(dir.path(), "relay", &config, &["relay"]);
    wait_for("the message stored", Duration::from_secs(30), || {
        let metrics = receive.metrics()?;
        let stored = sample(
            &metrics,
            "oncebox_consumer_messages_total",
            r#"consumer="billing",outcome="stored""#,
        )?;
        (stored >= 1.0).then_some(())
    });
    relay.stop_cleanly(STOP);
    receive.stop_cleanly(STOP);

    let spans = collector.spans();
    let send = spans
        .iter()
        .find(|span| span.name == "send orders")
        .unwrap_or_else(|| panic!("no send span exported: {spans:?}"));
    assert_eq!(send.service, "oncebox-relay");
    assert_eq!(send.kind, "client");
    assert!(
        send.links.contains(&(trace.to_owned(), parent.to_owned())),
        "{send:?}"
    );
    assert_eq!(
        send.attributes.get("messaging.system").map(String::as_str),
        Some("redis")
    );
    let process = spans
        .iter()
        .find(|span| span.name == "process orders")
        .unwrap_or_else(|| panic!("no process span exported: {spans:?}"));
    assert_eq!(process.service, "oncebox-receive");
    assert_eq!(
        (process.trace_id.as_str(), process.parent_span_id.as_str()),
        (trace, parent)
    );
    assert_eq!(process.kind, "consumer");
    assert_eq!(
        process
            .attributes
            .get("oncebox.outcome")
            .map(String::as_str),
        Some("stored")
    );
    assert_eq!(
        process
            .attributes
            .get("messaging.consumer.group.name")
            .map(String::as_str),
        Some("billing")
    );
    delete_streams(&[format!("{prefix}orders")]).await;
}
