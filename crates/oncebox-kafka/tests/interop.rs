//! Interop with a client in another language: Python's confluent-kafka and the
//! CloudEvents SDK (`interop/peer.py`), both ways. The Python tools come from
//! `scripts/interop-tools.sh` (run by `scripts/test`), found through `ONCEBOX_PYTHON`.

mod common;

use std::time::{Duration, SystemTime};

use common::{KafkaHarness, options, unique};
use oncebox_core::consumer::Outcome;
use oncebox_core::{Message, Publisher};
use oncebox_kafka::{BROKERS_ENV, DEFAULT_BROKERS, KafkaPublisher};
use oncebox_testkit::inbox::InboxHarness;
use oncebox_testkit::interop::{inbox_outcomes, outcome_of, peer};
use oncebox_testkit::transport::TransportHarness;
use serde_json::Value;

fn brokers() -> String {
    std::env::var(BROKERS_ENV).unwrap_or_else(|_| DEFAULT_BROKERS.to_owned())
}

/// What oncebox publishes reads as a valid CloudEvent with the SDK's Kafka binding:
/// every required attribute, the content type as the `content-type` header, the key as
/// the record's key and `subject`, the source configured once, `traceparent` passed
/// through.
#[tokio::test(flavor = "multi_thread")]
async fn python_reads_what_oncebox_publishes() {
    let harness = KafkaHarness::new();
    let topic = unique("interop-out");
    harness.create(&topic).await.unwrap();
    let publisher = KafkaPublisher::connect(options().source("/orders-service"))
        .await
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::json(topic.clone(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_key("Zürich 42")
        .with_kind("order.placed")
        .with_header("traceparent", traceparent)
        .unwrap();
    publisher.publish(&message).await.unwrap();

    let output = peer(&["kafka-read", &brokers(), &topic, "1"]).await;
    let event: Value = serde_json::from_str(output.trim()).expect("one JSON line");
    let attributes = &event["attributes"];
    assert_eq!(attributes["specversion"], "1.0");
    assert_eq!(attributes["id"], message.id.to_string());
    assert_eq!(attributes["source"], "/orders-service");
    assert_eq!(attributes["type"], "order.placed");
    assert_eq!(attributes["subject"], "Zürich 42");
    assert_eq!(attributes["datacontenttype"], "application/json");
    assert!(
        attributes["time"]
            .as_str()
            .is_some_and(|t| t.starts_with("20")),
        "{attributes}"
    );
    assert_eq!(event["key"], "Zürich 42");
    let headers = &event["headers"];
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["traceparent"], traceparent);
    drop(publisher);
    harness.cleanup().await;
}

/// A Python producer's records (confluent-kafka, the SDK's Kafka binding) into a
/// transactional inbox run by a `Consumer`: UUID and other ids handled, a duplicate
/// skipped, a missing and an empty id dead-lettered saying so, and a header value that
/// is not UTF-8 (Kafka header values are bytes) dead-lettered by the subscriber with its
/// reason.
#[tokio::test(flavor = "multi_thread")]
async fn oncebox_receives_what_python_publishes() {
    let harness = KafkaHarness::new();
    let topic = unique("interop-in");
    harness.create(&topic).await.unwrap();
    let subscriber = harness
        .subscriber(&topic, &unique("billing"))
        .await
        .unwrap();
    let (store, seen) =
        inbox_outcomes(subscriber, peer(&["kafka-write", &brokers(), &topic]), 5).await;
    let outcome = |payload: &str| outcome_of(&seen, payload);
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

    let dead = harness.dead_letters(&topic).await.unwrap();
    let reason_of = |payload: &str| {
        dead.iter()
            .find(|(received, _)| &received.payload[..] == payload.as_bytes())
            .map(|(_, reason)| reason.clone())
            .unwrap_or_else(|| panic!("{payload} is a dead letter: {dead:?}"))
    };
    let reason = reason_of("not-utf8");
    assert!(
        reason.contains("x-note") && reason.contains("UTF-8"),
        "{reason}"
    );
    assert!(reason_of("missing").contains("carries no CloudEvents id"));
    assert!(reason_of("empty").contains("id attribute is empty"));
    assert_eq!(dead.len(), 3, "{dead:?}");
    harness.cleanup().await;
}
