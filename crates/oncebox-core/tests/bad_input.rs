//! Outside data never panics: bad ids, headers and payloads are typed errors or dead
//! letters with a reason.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use oncebox_core::consumer::{
    ConsumerOptions, Handler, IdStrategy, IdempotentReceiver, Outcome, process_delivery,
};
use oncebox_core::memory::{MemoryBroker, MemoryDedupStore};
use oncebox_core::wire::WireFormat;
use oncebox_core::{
    Bytes, Coordinates, Delivery, Error, Headers, InvalidMessage, Limits, Message, MessageId,
    Publisher, Received, Result, Subscriber,
};

#[test]
fn wire_values_are_checked() {
    assert!(matches!(
        MessageId::parse("42"),
        Err(InvalidMessage::InvalidId { .. })
    ));
    assert!(matches!(
        MessageId::parse_bytes(b"\xff\x00"),
        Err(InvalidMessage::InvalidId { .. })
    ));
    let mut headers = Headers::new();
    assert!(matches!(
        headers.insert_bytes(b"x-ok", b"\xc3\x28"),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    assert!(matches!(
        headers.insert_bytes(b"bad name", b"v"),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    let limits = Limits::new().max_payload_bytes(1024);
    assert!(matches!(
        Message::new("t", vec![0u8; 1025]).validate(&limits),
        Err(InvalidMessage::PayloadTooLarge {
            size: 1025,
            limit: 1024
        })
    ));
    assert!(matches!(
        Message::new("", "x").validate(&limits),
        Err(InvalidMessage::EmptyTopic)
    ));
}

#[derive(Clone, Default)]
struct Count(Arc<AtomicU32>);

impl Handler for Count {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Bytes::new())
    }
}

#[tokio::test]
async fn a_message_without_the_configured_id_is_dead_lettered_with_the_reason() {
    let broker = MemoryBroker::new();
    let runs = Count::default();
    let options =
        ConsumerOptions::new("c").id_strategy(IdStrategy::Header("Idempotency-Key".into()));
    let receiver = IdempotentReceiver::new(MemoryDedupStore::default(), runs.clone(), options)
        .expect("options");
    broker
        .publisher()
        .publish(&Message::new("no-key", "x"))
        .await
        .expect("published");
    let delivery = broker
        .subscribe("no-key", "c")
        .next()
        .await
        .expect("delivered");
    let outcome = process_delivery(&receiver, delivery)
        .await
        .expect("settled");
    let Outcome::DeadLettered { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(reason.contains("Idempotency-Key"), "{reason}");
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);
    assert_eq!(broker.dead_letters("no-key").len(), 1);
}

/// A NUL byte (or any control character but tab) in a header value is refused however
/// the header is made: set by a producer, read off the wire, or deserialized from a
/// stored row, where only [`Message::validate`] at enqueue and publish catches it.
#[tokio::test]
async fn a_nul_byte_in_a_header_value_is_an_invalid_header() {
    let control = |result: Result<(), InvalidMessage>| {
        matches!(
            result,
            Err(InvalidMessage::InvalidHeader {
                reason: "value contains a control character",
                ..
            })
        )
    };
    let mut headers = Headers::new();
    assert!(control(headers.insert("x-tenant", "ac\0me")));
    assert!(control(headers.insert_bytes(b"x-tenant", b"ac\0me")));
    assert!(matches!(
        Message::new("orders", "x").with_header("x-tenant", "ac\0me"),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    assert!(headers.is_empty());

    let stored: Headers =
        serde_json::from_str(r#"{"x-tenant": "ac\u0000me"}"#).expect("any JSON object of strings");
    let mut message = Message::new("orders", "x");
    message.headers = stored;
    assert!(control(message.validate(&Limits::new())));
    let error = MemoryBroker::new()
        .publisher()
        .publish(&message)
        .await
        .expect_err("a NUL in a header value is refused at publish");
    assert!(!error.is_transient(), "{error}");
}

/// One header value over 8 KiB is an invalid header; many headers within their own
/// limit but over [`Limits::max_header_bytes`] together (the count of headers is bounded
/// through it) are [`InvalidMessage::HeadersTooLarge`]; headers exactly at the limit pass.
#[test]
fn oversized_headers_are_refused() {
    let mut headers = Headers::new();
    assert!(matches!(
        headers.insert("x-big", "v".repeat(8 * 1024 + 1)),
        Err(InvalidMessage::InvalidHeader {
            reason: "value is longer than 8 KiB",
            ..
        })
    ));
    assert!(matches!(
        headers.insert("n".repeat(256), "v"),
        Err(InvalidMessage::InvalidHeader {
            reason: "name is longer than 255 bytes",
            ..
        })
    ));
    let limits = Limits::new();
    assert_eq!(limits.max_header_bytes, 64 * 1024);
    let mut many = Message::new("orders", "x");
    for i in 0..10 {
        many = many
            .with_header(format!("x-h{i}"), "v".repeat(8 * 1024 - 4))
            .expect("each header within its own limit");
    }
    let size = many.headers.size();
    assert_eq!(size, 10 * 8 * 1024);
    assert!(matches!(
        many.validate(&limits),
        Err(InvalidMessage::HeadersTooLarge { size: s, limit }) if s == size && limit == 64 * 1024
    ));
    assert!(
        many.validate(&limits.clone().max_header_bytes(size))
            .is_ok()
    );
    // Ten thousand tiny headers are refused the same way.
    let mut tiny = Message::new("orders", "x");
    for i in 0..10_000 {
        tiny.headers
            .insert(format!("x-{i:05}"), "v")
            .expect("a tiny header");
    }
    assert!(matches!(
        tiny.validate(&limits),
        Err(InvalidMessage::HeadersTooLarge { .. })
    ));
}

/// Keeps the payload of every message it handles; answers with the payload.
#[derive(Clone, Default)]
struct Record(Arc<Mutex<Vec<Bytes>>>);

impl Handler for Record {
    type Output = Bytes;

    async fn handle(&self, message: &Received) -> Result<Bytes> {
        self.0
            .lock()
            .expect("not poisoned")
            .push(message.payload.clone());
        Ok(message.payload.clone())
    }
}

/// The id is the message's identity: a second message with the same id and another
/// payload is a duplicate, acked without running the handler, and the first result
/// stands. (A producer that reuses ids for different messages loses the later ones to
/// deduplication; the outbox refuses such a reuse at enqueue with `Error::Duplicate`.)
#[tokio::test]
async fn the_same_id_with_another_payload_is_a_duplicate_of_the_first() {
    let broker = MemoryBroker::new();
    let handled = Record::default();
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::default(),
        handled.clone(),
        ConsumerOptions::new("c"),
    )
    .expect("options");
    let first = Message::new("same-id", "first");
    let second = Message::new("same-id", "second").with_id(first.id);
    let publisher = broker.publisher();
    let mut subscriber = broker.subscribe("same-id", "c");
    for message in [&first, &second] {
        publisher.publish(message).await.expect("published");
    }
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let delivery = subscriber.next().await.expect("delivered");
        outcomes.push(
            process_delivery(&receiver, delivery)
                .await
                .expect("settled"),
        );
    }
    assert!(
        matches!(outcomes[..], [Outcome::Handled, Outcome::Duplicate]),
        "{outcomes:?}"
    );
    assert_eq!(
        *handled.0.lock().expect("not poisoned"),
        [Bytes::from_static(b"first")]
    );
}

fn decode(pairs: &[(&[u8], &[u8])]) -> Result<Received, InvalidMessage> {
    WireFormat::nats().decode(
        "orders",
        pairs.iter().copied(),
        Bytes::from_static(b"{}"),
        Coordinates::default(),
        1,
    )
}

/// A `ce-specversion` other than `1.0` (another version, garbage, empty) does not stop
/// the message: it arrives with the value kept in its headers as `ce_specversion`, for
/// the handler to judge; one that no header may hold (not UTF-8, a control character)
/// is an invalid header, which the transports dead-letter with it as the reason.
#[test]
fn a_malformed_specversion_is_kept_or_refused() {
    let id = MessageId::new().to_string();
    let id = id.as_bytes();
    let current = decode(&[(b"ce-specversion", b"1.0"), (b"ce-id", id)]).expect("decodes");
    assert_eq!(current.headers.get("ce_specversion"), None);
    for odd in ["0.3", "banana", "", "1.0 "] {
        let received = decode(&[(b"ce-specversion", odd.as_bytes()), (b"ce-id", id)])
            .expect("an odd version still decodes");
        assert_eq!(received.headers.get("ce_specversion"), Some(odd), "{odd:?}");
        assert_eq!(
            received.id.map(|id| id.to_string()).as_deref(),
            std::str::from_utf8(id).ok()
        );
    }
    for bad in [&b"\xff1.0"[..], b"1.0\0", b"1.0\r\n"] {
        assert!(
            matches!(
                decode(&[(b"ce-specversion", bad)]),
                Err(InvalidMessage::InvalidHeader { .. })
            ),
            "{bad:?}"
        );
    }
}

/// Headers over the limit are refused at publish too (the in-process broker, like every
/// transport, validates what it is given): a permanent error, so the relay dead-letters
/// the row rather than retry it.
#[tokio::test]
async fn headers_over_the_limit_fail_publish_permanently() {
    let mut message = Message::new("big-headers", "x");
    for i in 0..9 {
        message
            .headers
            .insert(format!("x-h{i}"), "v".repeat(8 * 1024))
            .expect("each header within its own limit");
    }
    let error = MemoryBroker::new()
        .publisher()
        .publish(&message)
        .await
        .expect_err("over the limit");
    let Error::Transport { source, .. } = &error else {
        panic!("expected a transport error, got {error:?}")
    };
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(
            source.downcast_ref::<InvalidMessage>(),
            Some(InvalidMessage::HeadersTooLarge { .. })
        ),
        "{error}"
    );
}

/// An empty payload is a message like any other; a topic over the limit is
/// [`InvalidMessage::TopicTooLong`] with its length and the limit.
#[tokio::test]
async fn an_empty_payload_passes_an_overlong_topic_does_not() {
    let limits = Limits::new();
    let empty = Message::new("orders", Bytes::new());
    assert!(empty.validate(&limits).is_ok());
    let broker = MemoryBroker::new();
    let mut subscriber = broker.subscribe("orders", "c");
    broker.publisher().publish(&empty).await.expect("published");
    let delivery = subscriber.next().await.expect("delivered");
    assert!(delivery.received().payload.is_empty());

    assert!(matches!(
        Message::new("t".repeat(256), "x").validate(&limits),
        Err(InvalidMessage::TopicTooLong {
            len: 256,
            limit: 255
        })
    ));
}

/// Time in the process is tokio's monotonic clock, which wall-clock jumps (NTP steps, a
/// VM resumed) do not move; a jump of the clock the engines read is modelled by
/// advancing tokio's paused clock by an hour. A lease it outran is over: the id is
/// free with a larger token and the old holder is fenced; a result it outran (past its
/// TTL) is forgotten and the id is new again. Nothing panics, nothing is held forever.
#[tokio::test(start_paused = true)]
async fn a_clock_that_jumps_ends_leases_and_ttls_without_confusion() {
    use oncebox_core::store::{Begin, DedupStore};
    use std::time::Duration;
    let store = MemoryDedupStore::default();
    let lease = Duration::from_secs(30);
    let Ok(Begin::Started(old)) = store.begin("held", lease).await else {
        panic!("a fresh id starts")
    };
    let Ok(Begin::Started(done)) = store.begin("done", lease).await else {
        panic!("a fresh id starts")
    };
    store
        .complete("done", done, b"result", Duration::from_secs(600))
        .await
        .expect("completed");
    tokio::time::advance(Duration::from_secs(3600)).await;
    let Ok(Begin::Started(new)) = store.begin("held", lease).await else {
        panic!("the lease the clock jumped past is over")
    };
    assert!(new > old, "a larger token after the jump");
    assert!(matches!(
        store.complete("held", old, b"late", lease).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.begin("done", lease).await,
        Ok(Begin::Started(_))
    ));
}

/// A control character in the key or the kind (a NUL, which PostgreSQL's text cannot
/// hold; a line break, which a NATS header cannot carry) is refused like one in the
/// topic: [`InvalidMessage::InvalidKey`] and [`InvalidMessage::InvalidKind`], at
/// enqueue on every store and at publish.
#[tokio::test]
async fn a_control_character_in_the_key_or_kind_is_refused() {
    let limits = Limits::new();
    for bad in ["k\0ey", "line\nbreak", "tab\there", "del\u{7f}"] {
        let keyed = Message::new("orders", "x").with_key(bad);
        assert!(
            matches!(
                keyed.validate(&limits),
                Err(InvalidMessage::InvalidKey { ref key, .. }) if key == bad
            ),
            "{bad:?} was accepted as a key"
        );
        let kinded = Message::new("orders", "x").with_kind(bad);
        assert!(
            matches!(
                kinded.validate(&limits),
                Err(InvalidMessage::InvalidKind { ref kind, .. }) if kind == bad
            ),
            "{bad:?} was accepted as a kind"
        );
        let error = MemoryBroker::new()
            .publisher()
            .publish(&keyed)
            .await
            .expect_err("refused at publish");
        assert!(!error.is_transient(), "{error}");
    }
    let fine = Message::new("orders", "x")
        .with_key("order 42/ümlaut")
        .with_kind("order.placed v2");
    assert!(fine.validate(&limits).is_ok());
}
