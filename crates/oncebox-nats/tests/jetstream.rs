//! What the JetStream transport does beyond the conformance suite: errors, foreign and
//! undecodable messages, broker-side dedup, `max_deliver`, stream management, and
//! publishing through a broker restart.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use oncebox_core::{Bytes, Delivery, Error, Message, MessageId, Publisher, Subscriber};
use oncebox_nats::async_nats::HeaderMap;
use oncebox_nats::async_nats::jetstream::message::PublishMessage as Publish;
use oncebox_nats::{
    JetStreamDelivery, JetStreamError, JetStreamOptions, JetStreamSubscriber, JetStreamTransport,
    StreamSettings, SubscriberOptions,
};
use support::{LocalServer, NatsHarness, unique};
use tokio::sync::Notify;
use tracing_subscriber::layer::{self, Layer, SubscriberExt};

const PATIENCE: Duration = Duration::from_secs(5);

async fn receive(subscriber: &mut JetStreamSubscriber, what: &str) -> JetStreamDelivery {
    match tokio::time::timeout(PATIENCE, subscriber.next()).await {
        Ok(Ok(delivery)) => delivery,
        Ok(Err(error)) => panic!("{what}: {error}"),
        Err(_) => panic!("{what}: nothing within {PATIENCE:?}"),
    }
}

fn source_of(error: &Error) -> &JetStreamError {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<JetStreamError>())
        .unwrap_or_else(|| panic!("not a JetStreamError: {error:?}"))
}

/// A topic with its streams on the shared server.
async fn fresh(harness: &NatsHarness, label: &str) -> (String, String) {
    let topic = format!("obt-{label}-{}", unique());
    let (stream, _) = harness
        .streams_for(&label.replace('-', "_"), &[&topic])
        .await
        .expect("create the streams");
    (topic, stream)
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_urls_and_unreachable_servers() {
    let error = JetStreamTransport::connect(JetStreamOptions::new("http://127.0.0.1:4222"))
        .await
        .unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
    assert!(error.to_string().contains("scheme"), "{error}");

    let error = JetStreamTransport::connect(JetStreamOptions::new("nats://u:hunter2@127.0.0.1:x"))
        .await
        .unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
    assert!(!error.to_string().contains("hunter2"), "{error}");

    // A port nothing listens on: worth retrying, the server may come.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let options = JetStreamOptions::new(format!("nats://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1));
    let error = JetStreamTransport::connect(options).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn publishing_where_no_stream_listens_is_transient_and_names_the_subject() {
    let harness = NatsHarness::shared().await;
    let topic = format!("obt-nostream-{}", unique());
    let error = harness
        .transport
        .publisher()
        .publish(&Message::new(topic.clone(), "x"))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(
        matches!(source_of(&error), JetStreamError::NoStream { subject } if *subject == topic),
        "{error}"
    );
    assert!(error.to_string().contains(&topic), "{error}");
    let error = harness.transport.subscriber(&topic, "g").await.unwrap_err();
    assert!(
        error.is_transient() && error.to_string().contains(&topic),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_subjects_and_groups_are_refused_for_good() {
    let harness = NatsHarness::shared().await;
    for topic in ["has space", "a..b", "orders.>"] {
        let error = harness
            .transport
            .publisher()
            .publish(&Message::new(topic, "x"))
            .await
            .unwrap_err();
        assert!(!error.is_transient(), "{topic}: {error}");
        assert!(
            matches!(source_of(&error), JetStreamError::InvalidSubject { .. }),
            "{error}"
        );
    }
    let (topic, _) = fresh(&harness, "bad-group").await;
    let error = harness
        .transport
        .subscriber(&topic, "a.b")
        .await
        .unwrap_err();
    assert!(error.is_invalid_input(), "{error}");
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_messages_fail_for_good_naming_the_limit() {
    let harness = NatsHarness::shared().await;
    let (topic, stream) = fresh(&harness, "oversized").await;
    let settings = StreamSettings::new(&stream)
        .topic(&topic)
        .max_message_size(1024)
        .max_age(Duration::from_secs(3600));
    harness.transport.ensure_stream(&settings).await.unwrap();
    let publisher = harness.transport.publisher();

    let error = publisher
        .publish(&Message::new(topic.clone(), vec![7u8; 2000]))
        .await
        .unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(source_of(&error), JetStreamError::TooLarge { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("max_msg_size of 1024 bytes"),
        "{error}"
    );

    let max = harness.transport.client().max_payload();
    let error = publisher
        .publish(&Message::new(topic.clone(), vec![7u8; max + 1]))
        .await
        .unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("max_payload of {max} bytes")),
        "{error}"
    );

    // A message that fits still goes through.
    publisher
        .publish(&Message::new(topic, vec![7u8; 100]))
        .await
        .unwrap();
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_messages_arrive_without_an_id() {
    let harness = NatsHarness::shared().await;
    let (topic, _) = fresh(&harness, "foreign").await;
    let mut subscriber = harness.transport.subscriber(&topic, "g").await.unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("x-tenant", "acme");
    headers.insert("ce-type", "order.placed");
    harness
        .transport
        .jetstream()
        .send_publish(
            topic.clone(),
            Publish::build()
                .payload(Bytes::from_static(b"{}"))
                .headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let delivery = receive(&mut subscriber, "the foreign message").await;
    let received = delivery.received();
    assert_eq!(received.id, None);
    assert_eq!(received.kind, "order.placed");
    assert_eq!(received.topic, topic);
    assert_eq!(received.headers.get("x-tenant"), Some("acme"));
    assert_eq!(&received.payload[..], b"{}");
    assert_eq!(received.delivery_count, 1);
    assert_eq!(
        received.coordinates.position,
        delivery.stream_sequence().to_string()
    );
    delivery.ack().await.unwrap();
    harness.cleanup().await;
}

/// CloudEvents ids need not be UUIDs: a foreign producer's `ce-id: order-42-v1`, sent
/// twice, is handled once by a transactional inbox and skipped the second time; an
/// empty `ce-id` is dead-lettered saying so.
#[tokio::test(flavor = "multi_thread")]
async fn foreign_ids_that_are_not_uuids_are_deduplicated() {
    use oncebox_core::consumer::{
        ConsumerOptions, Outcome, TransactionalInbox, TxHandler, process_delivery,
    };
    use oncebox_testkit::inbox::{InboxHarness, TxOf};
    use oncebox_testkit::sqlite::SqliteHarness;

    struct Effect;
    impl TxHandler<TxOf<SqliteHarness>> for Effect {
        type Output = ();
        async fn handle(
            &self,
            message: &oncebox_core::Received,
            tx: &mut TxOf<SqliteHarness>,
        ) -> oncebox_core::Result<()> {
            SqliteHarness::insert_effect(tx, &String::from_utf8_lossy(&message.payload)).await
        }
    }

    let harness = NatsHarness::shared().await;
    let (topic, _) = fresh(&harness, "foreign-ids").await;
    let mut subscriber = harness.transport.subscriber(&topic, "g").await.unwrap();
    let store = SqliteHarness::new().await;
    let inbox =
        TransactionalInbox::new(store.store(), Effect, ConsumerOptions::new("billing")).unwrap();
    for id in ["order-42-v1", "order-42-v1", ""] {
        let mut headers = HeaderMap::new();
        headers.insert("ce-id", id);
        harness
            .transport
            .jetstream()
            .send_publish(
                topic.clone(),
                Publish::build()
                    .payload(Bytes::from(format!("effect-{id}")))
                    .headers(headers),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut outcomes = Vec::new();
    for n in 0..3 {
        let delivery = receive(&mut subscriber, &format!("delivery {n}")).await;
        outcomes.push(process_delivery(&inbox, delivery).await.unwrap());
    }
    assert_eq!(outcomes[..2], [Outcome::Handled, Outcome::Duplicate]);
    assert!(
        matches!(&outcomes[2], Outcome::DeadLettered { reason } if reason.contains("id attribute is empty")),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(store.count_effects("effect-order-42-v1").await.unwrap(), 1);
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_headers_are_dead_lettered_by_the_subscriber() {
    let harness = NatsHarness::shared().await;
    let (topic, _) = fresh(&harness, "undecodable").await;
    let mut subscriber = harness.transport.subscriber(&topic, "g").await.unwrap();
    let publish_raw = |headers: HeaderMap| {
        let context = harness.transport.jetstream().clone();
        let topic = topic.clone();
        async move {
            context
                .send_publish(
                    topic,
                    Publish::build().payload("bad".into()).headers(headers),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let mut control = HeaderMap::new();
    control.insert("x-bell", "ding\u{7}");
    publish_raw(control).await;
    let mut huge = HeaderMap::new();
    huge.insert("x-huge", "v".repeat(9 * 1024).as_str());
    publish_raw(huge).await;
    let good = Message::new(topic.clone(), "good");
    harness.transport.publisher().publish(&good).await.unwrap();

    // The two bad ones are never handed out; the good one is.
    let delivery = receive(&mut subscriber, "the message after two bad ones").await;
    assert_eq!(delivery.received().id, Some(good.id));
    delivery.ack().await.unwrap();

    let letters = harness.transport.dead_letters(&topic, 10).await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    for letter in &letters {
        assert!(
            letter.reason.contains("cannot be decoded"),
            "{}",
            letter.reason
        );
        assert_eq!(letter.group, "g");
        assert_eq!(&letter.received.payload[..], b"bad");
    }
    assert!(
        letters[0].reason.contains("control character"),
        "{}",
        letters[0].reason
    );
    assert!(letters[1].reason.contains("8 KiB"), "{}", letters[1].reason);
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_republished_id_is_stored_once() {
    let harness = NatsHarness::shared().await;
    let (topic, stream) = fresh(&harness, "dedup").await;
    let publisher = harness.transport.publisher();
    let message = Message::new(topic.clone(), "once").with_key("k");
    publisher.publish(&message).await.unwrap();
    publisher.publish(&message).await.unwrap();
    let mut info = harness
        .transport
        .jetstream()
        .get_stream(&stream)
        .await
        .unwrap();
    assert_eq!(info.info().await.unwrap().state.messages, 1);
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_allowed_delivery_is_dead_lettered_not_lost() {
    let harness = NatsHarness::shared().await;
    let (topic, _) = fresh(&harness, "max-deliver").await;
    let options = SubscriberOptions::new()
        .ack_wait(Duration::from_secs(1))
        .max_deliver(3);
    let mut subscriber = harness
        .transport
        .subscriber_with(&topic, "g", options)
        .await
        .unwrap();
    let publisher = harness.transport.publisher();
    let poison = Message::new(topic.clone(), "poison");
    publisher.publish(&poison).await.unwrap();

    for attempt in 1..=2 {
        let delivery = receive(&mut subscriber, "the poison message").await;
        assert_eq!(delivery.received().id, Some(poison.id));
        assert_eq!(delivery.received().delivery_count, attempt);
        delivery.nack(Duration::ZERO).await.unwrap();
    }
    // The third delivery is the last max_deliver allows: the subscriber dead-letters it
    // instead of handing it out, and goes on with the next message.
    let quiet = tokio::time::timeout(Duration::from_secs(2), subscriber.next()).await;
    assert!(
        quiet.is_err(),
        "the last delivery was handed out: {quiet:?}"
    );
    let next = Message::new(topic.clone(), "next");
    publisher.publish(&next).await.unwrap();
    let delivery = receive(&mut subscriber, "the message after the poison").await;
    assert_eq!(delivery.received().id, Some(next.id));
    delivery.ack().await.unwrap();

    let letters = harness.transport.dead_letters(&topic, 10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].received.id, Some(poison.id));
    assert!(
        letters[0].reason.contains("delivered 3 times"),
        "{}",
        letters[0].reason
    );
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ensure_stream_merges_topics_and_applies_the_window() {
    let harness = NatsHarness::shared().await;
    let (first, stream) = fresh(&harness, "ensure").await;
    let second = format!("{first}-more.>");
    let settings = StreamSettings::new(&stream)
        .topic(&second)
        .duplicate_window(Duration::from_secs(600))
        .max_age(Duration::from_secs(3600));
    harness.transport.ensure_stream(&settings).await.unwrap();
    // Idempotent.
    harness.transport.ensure_stream(&settings).await.unwrap();
    let mut handle = harness
        .transport
        .jetstream()
        .get_stream(&stream)
        .await
        .unwrap();
    let config = handle.info().await.unwrap().config.clone();
    assert_eq!(config.subjects, vec![first.clone(), second]);
    assert_eq!(config.duplicate_window, Duration::from_secs(600));

    let overlapping = StreamSettings::new(format!("{stream}_OTHER")).topic(&first);
    let error = harness
        .transport
        .ensure_stream(&overlapping)
        .await
        .unwrap_err();
    assert!(!error.is_transient(), "{error}");
    harness.cleanup().await;
}

/// Signals each warning the transport logs.
struct OnWarning(Arc<Notify>);

impl<S: tracing::Subscriber> Layer<S> for OnWarning {
    fn on_event(&self, event: &tracing::Event<'_>, _: layer::Context<'_, S>) {
        let metadata = event.metadata();
        if *metadata.level() == tracing::Level::WARN
            && metadata.target().starts_with("oncebox_nats")
        {
            self.0.notify_one();
        }
    }
}

/// A server that cannot create a stream's storage answers only "error creating store for
/// stream": `ensure_stream` tries again, gets through once the cause is gone, and returns
/// a transient error if it is not.
// One thread: the tracing subscriber set below sees the transport's events.
#[tokio::test]
async fn ensure_stream_tries_again_when_the_server_cannot_create_the_store() {
    let server = LocalServer::start().await.unwrap();
    let transport = support::connect(&server.url(), Duration::from_secs(2)).await;
    let name = support::stream_name("store");
    let settings = StreamSettings::new(&name).topic(format!("obt-store-{}", unique()));
    // A file where the stream's directory goes.
    let blocker = server.stream_dir(&name);
    std::fs::create_dir_all(blocker.parent().unwrap()).unwrap();
    std::fs::write(&blocker, b"not a directory").unwrap();

    let error = transport.ensure_stream(&settings).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("error creating store"),
        "{error}"
    );

    let warned = Arc::new(Notify::new());
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(OnWarning(Arc::clone(&warned))),
    );
    let (created, ()) = tokio::join!(transport.ensure_stream(&settings), async {
        if tokio::time::timeout(PATIENCE, warned.notified())
            .await
            .is_ok()
        {
            std::fs::remove_file(&blocker).unwrap();
        }
    });
    created.expect("the stream is created once the cause is gone");
    transport.jetstream().get_stream(&name).await.unwrap();
    server.stop().await;
}

/// Publishes concurrently while the broker is killed and, once publishes have failed,
/// started again, retrying transient failures as the relay does: every message ends up
/// in the stream exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn publishes_in_flight_during_a_restart_get_through_once() {
    const BEFORE: usize = 100;
    const DURING: usize = 200;
    let server = LocalServer::start().await.unwrap();
    let transport = support::connect(&server.url(), Duration::from_secs(1)).await;
    let stream = support::stream_name("restart");
    let topic = format!("obt-restart-{}", unique());
    transport
        .ensure_stream(&StreamSettings::new(&stream).topic(&topic))
        .await
        .unwrap();
    let publisher = transport.publisher();
    let messages: Vec<Message> = (0..BEFORE + DURING)
        .map(|i| Message::new(topic.clone(), i.to_string()))
        .collect();
    let failures = AtomicUsize::new(0);
    let failed = Notify::new();
    let publish = |message: &Message| {
        let (publisher, failures, failed) = (&publisher, &failures, &failed);
        let message = message.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                match publisher.publish(&message).await {
                    Ok(()) => return,
                    Err(error)
                        if error.is_transient() && tokio::time::Instant::now() < deadline =>
                    {
                        failures.fetch_add(1, Ordering::Relaxed);
                        failed.notify_one();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(error) => panic!("publish failed for good: {error}"),
                }
            }
        }
    };

    join_all(messages[..BEFORE].iter().map(publish)).await;
    // Kill the server under the next publishes, and start it again once they failed.
    let restarting = async {
        server.kill().await.unwrap();
        failed.notified().await;
        server.start_again().await.unwrap();
    };
    tokio::join!(join_all(messages[BEFORE..].iter().map(publish)), restarting);

    let connects = transport
        .client()
        .statistics()
        .connects
        .load(Ordering::Relaxed);
    assert!(
        connects >= 2,
        "the client never reconnected ({connects} connects)"
    );
    assert!(failures.load(Ordering::Relaxed) > 0);
    let mut handle = transport.jetstream().get_stream(&stream).await.unwrap();
    let stored = handle.info().await.unwrap().state.messages;
    assert_eq!(
        stored,
        (BEFORE + DURING) as u64,
        "every message stored exactly once"
    );

    // And they are the messages published, each once.
    let mut subscriber = transport.subscriber(&topic, "check").await.unwrap();
    let mut seen = HashSet::new();
    while seen.len() < BEFORE + DURING {
        let delivery = receive(&mut subscriber, "a stored message").await;
        let id: MessageId = delivery.received().id.expect("an id");
        assert!(seen.insert(id), "{id} delivered twice");
        delivery.ack().await.unwrap();
    }
    eprintln!(
        "restart: {} messages stored once; {} transient publish failures retried",
        BEFORE + DURING,
        failures.load(Ordering::Relaxed)
    );
    server.stop().await;
}

/// Publishes `payload` on `subject` with `headers` written byte for byte, as a client in
/// another language may: through a plain TCP connection speaking NATS's `HPUB`.
async fn publish_raw_bytes(subject: &str, headers: &[(&[u8], &[u8])], payload: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = support::nats_url();
    let address = url.trim_start_matches("nats://");
    let mut socket = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to NATS");
    let mut block = b"NATS/1.0\r\n".to_vec();
    for (name, value) in headers {
        block.extend_from_slice(name);
        block.extend_from_slice(b": ");
        block.extend_from_slice(value);
        block.extend_from_slice(b"\r\n");
    }
    block.extend_from_slice(b"\r\n");
    let mut frame = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true}}\r\nHPUB {subject} {} {}\r\n",
        block.len(),
        block.len() + payload.len()
    )
    .into_bytes();
    frame.extend_from_slice(&block);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    socket.write_all(&frame).await.expect("send HPUB");
    // The PONG (after the INFO line) says the server has processed the HPUB.
    let mut seen = Vec::new();
    let mut buffer = [0_u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("PONG") {
        let read = tokio::time::timeout(PATIENCE, socket.read(&mut buffer))
            .await
            .expect("the server answers PING")
            .expect("read from NATS");
        assert!(read > 0, "the server closed the connection: {seen:?}");
        seen.extend_from_slice(&buffer[..read]);
    }
    assert!(
        !String::from_utf8_lossy(&seen).contains("-ERR"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

/// A header value that is not UTF-8 (a client in another language can send one) makes
/// the NATS client drop its connection when it reads the message. The subscriber still
/// dead-letters it with the reason, hands out the messages around it, and the
/// connection is not dropped again and again.
#[tokio::test(flavor = "multi_thread")]
async fn a_header_that_is_not_utf8_is_dead_lettered_without_a_reconnect_loop() {
    let harness = NatsHarness::shared().await;
    let (topic, stream) = fresh(&harness, "poison").await;
    let mut subscriber = harness.transport.subscriber(&topic, "g").await.unwrap();
    let before = Message::new(topic.clone(), "before");
    harness
        .transport
        .publisher()
        .publish(&before)
        .await
        .unwrap();
    publish_raw_bytes(
        &topic,
        &[(b"ce-id", b"poison-1"), (b"x-latin1", b"caf\xe9")],
        b"poison",
    )
    .await;
    let after: Vec<Message> = (0..3)
        .map(|n| Message::new(topic.clone(), format!("after {n}")))
        .collect();
    for message in &after {
        harness
            .transport
            .publisher()
            .publish(message)
            .await
            .unwrap();
    }
    let connects = || {
        harness
            .transport
            .client()
            .statistics()
            .connects
            .load(Ordering::Relaxed)
    };
    let connected = connects();

    // An ack sent while the poison message drops the connection may be lost: its message
    // comes back after the ack wait, and counts once it is acked.
    let mut handed_out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handed_out.len() < 4 && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), subscriber.next()).await {
            Ok(Ok(delivery)) => {
                let id = delivery.received().id.expect("oncebox's own messages");
                match delivery.ack().await {
                    Ok(()) if !handed_out.contains(&id) => handed_out.push(id),
                    Ok(()) => {}
                    Err(error) => eprintln!("ack of {id} lost, it comes back: {error}"),
                }
            }
            Ok(Err(error)) => eprintln!("next: {error}"),
            Err(_) => {}
        }
    }
    let mut expected: Vec<MessageId> = std::iter::once(&before)
        .chain(&after)
        .map(|message| message.id)
        .collect();
    expected.sort();
    handed_out.sort();
    handed_out.dedup();
    assert_eq!(handed_out, expected, "every message around the poison one");

    let letters = harness.transport.dead_letters(&topic, 10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert!(letter.reason.contains("x-latin1"), "{}", letter.reason);
    assert!(letter.reason.contains("not UTF-8"), "{}", letter.reason);
    assert_eq!(&letter.received.payload[..], b"poison");
    assert_eq!(letter.received.headers.get("ce_id"), Some("poison-1"));
    assert_eq!(letter.group, "g");
    assert_eq!(letter.stream, stream);

    // Nothing comes back after the ack wait, and the connection was dropped once at most.
    tokio::time::sleep(support::ACK_WAIT * 3).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), subscriber.next())
            .await
            .is_err(),
        "nothing more to hand out"
    );
    assert!(
        connects() <= connected + 1,
        "reconnected {} times",
        connects() - connected
    );
    harness.cleanup().await;
}
