//! Interop with a client in another language: Python's redis-py (`interop/peer.py`),
//! both ways. Redis Streams has no CloudEvents binding, so the `ce_*` fields are checked
//! by name as `docs/cloudevents.md` describes them. The Python tools come from
//! `scripts/interop-tools.sh` (run by `scripts/test`), found through `ONCEBOX_PYTHON`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use oncebox_core::consumer::{Consumer, ConsumerOptions, Outcome, TransactionalInbox, TxHandler};
use oncebox_core::wire::parse_time;
use oncebox_core::{Message, Publisher, Received};
use oncebox_testkit::inbox::{InboxHarness, TxOf};
use oncebox_testkit::sqlite::SqliteHarness;
use serde_json::Value;
use support::{StreamsHarness, redis_url};
use tokio::process::Command;

/// Runs `interop/peer.py` with `args`; returns its stdout.
async fn peer(args: &[&str]) -> String {
    let python = std::env::var("ONCEBOX_PYTHON").unwrap_or_else(|_| {
        panic!(
            "ONCEBOX_PYTHON is not set: the interop tests need the Python clients; install \
             them with `export ONCEBOX_PYTHON=$(scripts/interop-tools.sh)` (scripts/test does)"
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../interop/peer.py");
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(&python).arg(script).args(args).output(),
    )
    .await
    .expect("peer.py finishes within a minute")
    .unwrap_or_else(|error| panic!("run {python}: {error}"));
    assert!(
        output.status.success(),
        "peer.py {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// What oncebox publishes reads by name as Kafka's binding would name it: every
/// required attribute as a `ce_` field, the content type as `content-type`, the payload
/// in `data`, the source configured once, `traceparent` passed through.
#[tokio::test(flavor = "multi_thread")]
async fn python_reads_what_oncebox_publishes() {
    let harness = StreamsHarness::with_options(|options| options.source("/orders-service")).await;
    let topic = harness.topic("interop-out");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::json(topic.clone(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_key("Zürich 42")
        .with_kind("order.placed")
        .with_header("traceparent", traceparent)
        .unwrap();
    harness.streams.publisher().publish(&message).await.unwrap();

    let stream = harness.streams.stream_key(&topic);
    let output = peer(&["redis-read", &redis_url(), &stream, "1"]).await;
    let fields: Value = serde_json::from_str(output.trim()).expect("one JSON line");
    assert_eq!(fields["ce_specversion"], "1.0");
    assert_eq!(fields["ce_id"], message.id.to_string());
    assert_eq!(fields["ce_source"], "/orders-service");
    assert_eq!(fields["ce_type"], "order.placed");
    assert_eq!(fields["ce_subject"], "Zürich 42");
    let time = fields["ce_time"].as_str().expect("ce_time");
    assert!(
        time.ends_with('Z') && parse_time(time).is_some(),
        "RFC 3339 in UTC: {time}"
    );
    assert_eq!(fields["content-type"], "application/json");
    assert_eq!(fields["traceparent"], traceparent);
    assert_eq!(fields["data"], r#"{"order":42}"#);
}

struct Effect;

impl TxHandler<TxOf<SqliteHarness>> for Effect {
    type Output = ();
    async fn handle(
        &self,
        message: &Received,
        tx: &mut TxOf<SqliteHarness>,
    ) -> oncebox_core::Result<()> {
        SqliteHarness::insert_effect(tx, &String::from_utf8_lossy(&message.payload)).await
    }
}

/// A Python producer's entries (redis-py, Kafka's naming) into a transactional inbox
/// run by a `Consumer`: UUID and other ids handled, a duplicate skipped, a missing and
/// an empty id dead-lettered saying so, and a field that is not UTF-8 (Redis values are
/// bytes) dead-lettered by the subscriber with its reason.
#[tokio::test(flavor = "multi_thread")]
async fn oncebox_receives_what_python_publishes() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("interop-in");
    let subscriber = harness.streams.subscribe(&topic, "billing").await.unwrap();
    let store = SqliteHarness::new().await;
    let inbox =
        TransactionalInbox::new(store.store(), Effect, ConsumerOptions::new("billing")).unwrap();
    let seen: Arc<Mutex<Vec<(Received, Outcome)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let consumer =
        Consumer::new(subscriber, inbox)
            .lanes(1)
            .on_outcome(move |received, outcome| {
                record
                    .lock()
                    .unwrap()
                    .push((received.clone(), outcome.clone()));
            });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(consumer.run_until(async {
        let _ = stopped.await;
    }));

    let stream = harness.streams.stream_key(&topic);
    peer(&["redis-write", &redis_url(), &stream]).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().len() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "5 outcomes within 20 s: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    running.await.unwrap().unwrap();

    let seen = seen.lock().unwrap().clone();
    let outcome = |payload: &str| {
        let found: Vec<_> = seen
            .iter()
            .filter(|(received, _)| &received.payload[..] == payload.as_bytes())
            .collect();
        assert_eq!(found.len(), 1, "{payload}: {seen:?}");
        found[0].clone()
    };
    // 2026-11-21T13:05:09.123Z, as the Python producer wrote it.
    let time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_266_309_123);
    for payload in ["uuid", "order-42-v1"] {
        let (received, handled) = outcome(payload);
        assert_eq!(handled, Outcome::Handled, "{payload}");
        assert_eq!(received.kind, "order.placed", "{payload}");
        assert_eq!(received.key.as_deref(), Some("order-42"), "{payload}");
        assert_eq!(received.created_at, Some(time), "{payload}");
        assert_eq!(
            received.headers.get("content-type"),
            Some("text/plain"),
            "{payload}"
        );
    }
    assert_eq!(outcome("duplicate").1, Outcome::Duplicate);
    let (_, missing) = outcome("missing");
    assert!(
        matches!(&missing, Outcome::DeadLettered { reason } if reason.contains("carries no CloudEvents id")),
        "missing id: {missing:?}"
    );
    let (_, empty) = outcome("empty");
    assert!(
        matches!(&empty, Outcome::DeadLettered { reason } if reason.contains("id attribute is empty")),
        "empty id: {empty:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(received, _)| &received.payload[..] == b"not-utf8"),
        "the undecodable one is not handed out"
    );
    for effect in ["uuid", "order-42-v1"] {
        assert_eq!(store.count_effects(effect).await.unwrap(), 1, "{effect}");
    }
    assert_eq!(store.count_effects("duplicate").await.unwrap(), 0);

    // Read by fields: the entry that is not UTF-8 has no `Received`.
    let dead = harness.streams.dead_letters(&topic, 10).await.unwrap();
    let reason_of = |payload: &str| {
        dead.iter()
            .find(|letter| {
                letter
                    .fields()
                    .any(|(name, value)| name == b"data" && value == payload.as_bytes())
            })
            .map(|letter| letter.reason().to_owned())
            .unwrap_or_else(|| panic!("{payload} is a dead letter"))
    };
    let reason = reason_of("not-utf8");
    assert!(
        reason.contains("x-note") && reason.contains("UTF-8"),
        "{reason}"
    );
    assert!(reason_of("missing").contains("carries no CloudEvents id"));
    assert!(reason_of("empty").contains("id attribute is empty"));
    assert_eq!(dead.len(), 3);
}
