//! Interop with a client in another language: Python's nats-py and the CloudEvents SDK
//! (`interop/peer.py`), both ways. The Python tools come from `scripts/interop-tools.sh`
//! (run by `scripts/test`), found through `ONCEBOX_PYTHON`.

mod support;

use std::time::Duration;

use oncebox_core::consumer::{ConsumerOptions, Outcome, TransactionalInbox, process_delivery};
use oncebox_core::{Delivery, Message, Publisher, Subscriber};
use oncebox_testkit::inbox::InboxHarness;
use oncebox_testkit::interop::{Effect, peer};
use oncebox_testkit::sqlite::SqliteHarness;
use serde_json::Value;
use support::{NatsHarness, nats_url, unique};

/// What oncebox publishes reads as a valid CloudEvent with the SDK: every required
/// attribute, the key percent-encoded on the wire and decoded by the SDK, the content
/// type, the source configured once, `traceparent` passed through.
#[tokio::test(flavor = "multi_thread")]
async fn python_reads_what_oncebox_publishes() {
    let harness = NatsHarness::shared().await;
    let topic = format!("obt-interop-out-{}", unique());
    harness
        .streams_for("interop_out", &[&topic])
        .await
        .expect("create the streams");
    let transport = oncebox_nats::JetStreamTransport::connect(
        oncebox_nats::JetStreamOptions::new(nats_url()).source("/orders-service"),
    )
    .await
    .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::json(topic.clone(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_key("Zürich 42")
        .with_kind("order.placed")
        .with_header("traceparent", traceparent)
        .unwrap();
    transport.publisher().publish(&message).await.unwrap();

    let output = peer(&["nats-read", &nats_url(), &topic, "1"]).await;
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
    let headers = &event["headers"];
    assert_eq!(headers["ce-subject"], "Z%C3%BCrich%2042");
    assert_eq!(headers["traceparent"], traceparent);
    harness.cleanup().await;
}

/// A Python producer's events into a transactional inbox: UUID and other ids handled,
/// a duplicate skipped, a missing and an empty id dead-lettered saying so,
/// percent-encoded values decoded. (A header that is not UTF-8, which nats-py cannot
/// send, is `jetstream.rs`'s raw-protocol test.)
#[tokio::test(flavor = "multi_thread")]
async fn oncebox_receives_what_python_publishes() {
    let harness = NatsHarness::shared().await;
    let topic = format!("obt-interop-in-{}", unique());
    harness
        .streams_for("interop_in", &[&topic])
        .await
        .expect("create the streams");
    let mut subscriber = harness.transport.subscriber(&topic, "g").await.unwrap();
    let store = SqliteHarness::new().await;
    let inbox =
        TransactionalInbox::new(store.store(), Effect, ConsumerOptions::new("billing")).unwrap();

    peer(&["nats-write", &nats_url(), &topic]).await;

    let mut outcomes = Vec::new();
    for n in 0..6 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), subscriber.next())
            .await
            .unwrap_or_else(|_| panic!("delivery {n} within 10 s"))
            .unwrap();
        if &delivery.received().payload[..] == b"encoded" {
            let received = delivery.received();
            assert_eq!(received.key.as_deref(), Some("café au lait"));
            assert!(received.created_at.is_some(), "{received:?}");
        }
        outcomes.push(process_delivery(&inbox, delivery).await.unwrap());
    }
    assert_eq!(
        outcomes[..3],
        [Outcome::Handled, Outcome::Handled, Outcome::Duplicate]
    );
    assert!(
        matches!(&outcomes[3], Outcome::DeadLettered { reason } if reason.contains("id")),
        "missing id: {:?}",
        outcomes[3]
    );
    assert!(
        matches!(&outcomes[4], Outcome::DeadLettered { reason } if reason.contains("id attribute is empty")),
        "empty id: {:?}",
        outcomes[4]
    );
    assert_eq!(outcomes[5], Outcome::Handled);
    for effect in ["uuid", "order-42-v1", "encoded"] {
        assert_eq!(store.count_effects(effect).await.unwrap(), 1, "{effect}");
    }
    assert_eq!(store.count_effects("duplicate").await.unwrap(), 0);
    harness.cleanup().await;
}
