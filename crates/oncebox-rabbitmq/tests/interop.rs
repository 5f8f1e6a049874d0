//! Interop with a client in another language: Python's pika and the CloudEvents SDK
//! (`interop/peer.py`), both ways. The Python tools come from `scripts/interop-tools.sh`
//! (run by `scripts/test`), found through `ONCEBOX_PYTHON`.

mod common;

use std::time::{Duration, SystemTime};

use common::{RabbitHarness, amqp_url, unique};
use oncebox_core::consumer::Outcome;
use oncebox_core::{Message, Publisher};
use oncebox_rabbitmq::{RabbitPublisher, peek_dead_letters};
use oncebox_testkit::inbox::InboxHarness;
use oncebox_testkit::interop::{inbox_outcomes, outcome_of, peer};
use oncebox_testkit::transport::TransportHarness;
use serde_json::Value;

/// What oncebox publishes reads as a valid CloudEvent with the SDK's AMQP binding
/// (RabbitMQ's headers as the application properties): every required attribute, the
/// content type as the `content_type` property, the source configured once,
/// `traceparent` passed through.
#[tokio::test(flavor = "multi_thread")]
async fn python_reads_what_oncebox_publishes() {
    let harness = RabbitHarness::new().with_options(|options| options.source("/orders-service"));
    let topic = unique("interop-out");
    let queue = unique("interop-out-queue");
    // The queue the Python client reads: the group's, bound before publishing, its
    // consumer gone.
    drop(harness.subscriber(&topic, &queue).await.unwrap());
    let publisher = RabbitPublisher::connect(&harness.options).await.unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::json(topic.clone(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_key("Zürich 42")
        .with_kind("order.placed")
        .with_header("traceparent", traceparent)
        .unwrap();
    publisher.publish(&message).await.unwrap();

    let output = peer(&["amqp-read", &amqp_url(), &queue, "1"]).await;
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
    assert_eq!(event["content_type"], "application/json");
    assert_eq!(event["message_id"], message.id.to_string());
    let headers = &event["headers"];
    assert_eq!(headers["traceparent"], traceparent);
    assert!(headers.get("content-type").is_none(), "{headers}");
}

/// A Python producer's events (pika) into a transactional inbox run by a `Consumer`:
/// UUID and other ids handled, a duplicate skipped, a missing and an empty id
/// dead-lettered saying so, the SDK's RabbitMQ binding (`ce-` headers) read too, `time`
/// as the SDK's integer milliseconds and as AMQP 0-9-1's timestamp read, and a header
/// that is not UTF-8 dead-lettered by the subscriber with its reason.
#[tokio::test(flavor = "multi_thread")]
async fn oncebox_receives_what_python_publishes() {
    let harness = RabbitHarness::new();
    let topic = unique("interop-in");
    let group = unique("interop-in-group");
    let subscriber = harness.subscriber(&topic, &group).await.unwrap();
    let (store, seen) = inbox_outcomes(
        subscriber,
        peer(&["amqp-write", &amqp_url(), &harness.exchange, &topic]),
        7,
    )
    .await;
    let outcome = |payload: &str| outcome_of(&seen, payload);
    // 2026-11-21T13:05:09.123Z, as the Python producer wrote it.
    let time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_266_309_123);
    for payload in ["uuid", "order-42-v1", "knative"] {
        let (received, handled) = outcome(payload);
        assert_eq!(handled, Outcome::Handled, "{payload}");
        assert_eq!(received.kind, "order.placed", "{payload}");
        assert_eq!(received.created_at, Some(time), "{payload}");
        assert_eq!(
            received.headers.get("content-type"),
            Some("text/plain"),
            "{payload}"
        );
    }
    assert_eq!(outcome("duplicate").1, Outcome::Duplicate);
    let (received, handled) = outcome("timestamp");
    assert_eq!(handled, Outcome::Handled);
    // AMQP 0-9-1's timestamp has whole seconds.
    assert_eq!(
        received.created_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_266_309))
    );
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
    for effect in ["uuid", "order-42-v1", "knative", "timestamp"] {
        assert_eq!(store.count_effects(effect).await.unwrap(), 1, "{effect}");
    }
    assert_eq!(store.count_effects("duplicate").await.unwrap(), 0);

    let dead = peek_dead_letters(&harness.options, &group, 10)
        .await
        .unwrap();
    let reason_of = |payload: &str| {
        dead.iter()
            .find(|letter| &letter.received.payload[..] == payload.as_bytes())
            .map(|letter| letter.reason.clone())
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
}
