//! Interop with Python's boto3 both ways (`interop/peer.py`; the Python tools come from
//! `scripts/interop-tools.sh`, run by `scripts/test`, found through `ONCEBOX_PYTHON`).

mod support;

use std::time::{Duration, SystemTime};

use oncebox_core::consumer::Outcome;
use oncebox_core::{Message, Publisher};
use oncebox_sqs::QueueSettings;
use oncebox_testkit::inbox::InboxHarness;
use oncebox_testkit::interop::{inbox_outcomes, outcome_of, peer};
use serde_json::Value;
use support::{SqsHarness, endpoint};

/// What oncebox publishes to a FIFO queue reads as a valid CloudEvent with the SDK's
/// Kafka binding (SQS has no binding; oncebox writes Kafka's `ce_` names as message
/// attributes): every required attribute, the key as `ce_subject` and as the message
/// group, the id as the deduplication id, the content type, the source configured once,
/// `traceparent` passed through, a JSON body as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_what_oncebox_publishes() {
    let harness = SqsHarness::with_options(true, |options| options.source("/orders-service")).await;
    let topic = harness
        .topic("interop-out", &QueueSettings::new())
        .await
        .unwrap();
    let url = harness
        .transport
        .ensure_queue(&topic, &QueueSettings::new())
        .await
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::json(topic.clone(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_key("Zürich 42")
        .with_kind("order.placed")
        .with_header("traceparent", traceparent)
        .unwrap();
    harness
        .transport
        .publisher()
        .publish(&message)
        .await
        .unwrap();

    let output = peer(&["sqs-read", &endpoint(), &url, "1"]).await;
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
            .is_some_and(|t| t.starts_with("20"))
    );
    assert_eq!(event["headers"]["traceparent"], traceparent);
    assert_eq!(event["body"], r#"{"order":42}"#);
    // The key is not a valid group id (a space, a non-ASCII letter): its SHA-256 is.
    assert_eq!(event["group"].as_str().map(str::len), Some(64));
    assert_eq!(event["dedup"], message.id.to_string());
    harness.cleanup().await;
}

/// A Python producer's messages (boto3, `ce_` attributes, one FIFO group) into a
/// transactional inbox run by a `Consumer`: UUID and other ids handled, a duplicate
/// skipped, a missing and an empty id dead-lettered saying so, and a binary attribute
/// that is not UTF-8 dead-lettered by the subscriber with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oncebox_receives_what_python_publishes() {
    let harness = SqsHarness::new(true).await;
    let topic = harness
        .topic("interop-in", &QueueSettings::new())
        .await
        .unwrap();
    let url = harness
        .transport
        .ensure_queue(&topic, &QueueSettings::new())
        .await
        .unwrap();
    let subscriber = harness.transport.subscriber(&topic).await.unwrap();
    let (store, seen) =
        inbox_outcomes(subscriber, peer(&["sqs-write", &endpoint(), &url]), 5).await;
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

    let dead = harness.transport.dead_letters(&topic, 100).await.unwrap();
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
    harness.cleanup().await;
}
