//! Interop with a client in another language: Python's redis-py (`interop/peer.py`),
//! both ways. Redis Streams has no CloudEvents binding, so the `ce_*` fields are checked
//! by name as `docs/cloudevents.md` describes them. The Python tools come from
//! `scripts/interop-tools.sh` (run by `scripts/test`), found through `ONCEBOX_PYTHON`.

mod support;

use std::time::{Duration, SystemTime};

use oncebox_core::consumer::Outcome;
use oncebox_core::wire::parse_time;
use oncebox_core::{Message, Publisher};
use oncebox_testkit::inbox::InboxHarness;
use oncebox_testkit::interop::{inbox_outcomes, outcome_of, peer};
use serde_json::Value;
use support::{StreamsHarness, redis_url};

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

/// A Python producer's entries (redis-py, Kafka's naming) into a transactional inbox
/// run by a `Consumer`: UUID and other ids handled, a duplicate skipped, a missing and
/// an empty id dead-lettered saying so, and a field that is not UTF-8 (Redis values are
/// bytes) dead-lettered by the subscriber with its reason.
#[tokio::test(flavor = "multi_thread")]
async fn oncebox_receives_what_python_publishes() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("interop-in");
    let subscriber = harness.streams.subscribe(&topic, "billing").await.unwrap();
    let stream = harness.streams.stream_key(&topic);
    let url = redis_url();
    let args = ["redis-write", &url, &stream];
    let (store, seen) = inbox_outcomes(subscriber, peer(&args), 5).await;
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
