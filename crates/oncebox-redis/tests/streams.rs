//! What the Redis Streams transport does beyond the transport suite: its wire format as
//! other clients see it, foreign and broken entries, long nack delays, the delivery
//! limit, a group Redis lost, and its errors.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use oncebox_core::{Bytes, Delivery, Message, Publisher, Subscriber};
use oncebox_redis::redis::{self, Value};
use oncebox_redis::{RedisStreamOptions, RedisStreams};
use support::{ACK_TIMEOUT, StreamsHarness};
use tokio::time::{Instant, timeout};

/// Enough for anything that should happen promptly.
const PATIENCE: Duration = Duration::from_secs(5);

async fn next<S: Subscriber>(subscriber: &mut S) -> S::Delivery {
    timeout(PATIENCE, subscriber.next())
        .await
        .expect("a delivery in time")
        .expect("no transport error")
}

async fn nothing_within<S: Subscriber>(subscriber: &mut S, period: Duration) {
    if let Ok(delivery) = timeout(period, subscriber.next()).await {
        panic!(
            "expected nothing, got {:?}",
            delivery.map(|d| d.received().clone())
        );
    }
}

/// A stream entry as `XRANGE` returns it: id, and fields with their values as bytes.
type Entry = (String, Vec<(String, Vec<u8>)>);

/// Every entry of `key`.
async fn entries(harness: &StreamsHarness, key: &str) -> Vec<Entry> {
    harness
        .query(redis::cmd("XRANGE").arg(key).arg("-").arg("+"))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wire_format_is_what_the_docs_say() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("wire");
    let message = Message::new(topic.clone(), Bytes::from_static(&[0, 0xff, b'{']))
        .with_key("order-7")
        .with_kind("OrderPlaced")
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .expect("valid header");
    harness
        .streams
        .publisher()
        .publish(&message)
        .await
        .expect("published");

    let stream = harness.streams.stream_key(&topic);
    assert_eq!(stream, format!("{}{topic}", harness.prefix));
    let got = entries(&harness, &stream).await;
    assert_eq!(got.len(), 1);
    let names: Vec<&str> = got[0].1.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ce_specversion",
            "ce_id",
            "ce_source",
            "ce_type",
            "ce_subject",
            "ce_time",
            "traceparent",
            "data"
        ]
    );
    let field = |name: &str| {
        got[0]
            .1
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .expect("field present")
    };
    assert_eq!(field("ce_id"), message.id.to_string().into_bytes());
    assert_eq!(field("ce_subject"), b"order-7");
    assert_eq!(field("data"), [0, 0xff, b'{']);
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_entries_arrive_without_an_id() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("foreign");
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    let id: String = harness
        .query(
            redis::cmd("XADD")
                .arg(harness.streams.stream_key(&topic))
                .arg("*")
                .arg("tenant")
                .arg("acme")
                .arg("data")
                .arg(&b"\x00raw"[..]),
        )
        .await;
    let delivery = next(&mut subscriber).await;
    let received = delivery.received();
    assert_eq!(received.id, None);
    assert_eq!(received.headers.get("tenant"), Some("acme"));
    assert_eq!(&received.payload[..], b"\x00raw");
    assert_eq!(received.coordinates.to_string(), format!("{topic}/{id}"));
    assert_eq!(received.delivery_count, 1);
    delivery.ack().await.expect("acked");
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_entries_are_dead_lettered_not_dropped() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("broken");
    let stream = harness.streams.stream_key(&topic);
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    let no_data: String = harness
        .query(
            redis::cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("payload")
                .arg("x"),
        )
        .await;
    let binary_header: String = harness
        .query(
            redis::cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("x-blob")
                .arg(&[0xff_u8, 0xfe][..])
                .arg("data")
                .arg("y"),
        )
        .await;
    let good = Message::new(topic.clone(), "fine");
    harness
        .streams
        .publisher()
        .publish(&good)
        .await
        .expect("published");

    let delivery = next(&mut subscriber).await;
    assert_eq!(
        delivery.received().id,
        Some(good.id),
        "the broken entries are skipped"
    );
    delivery.ack().await.expect("acked");

    let dead = harness
        .streams
        .dead_letters(&topic, 10)
        .await
        .expect("dead letters");
    let reasons: Vec<(&str, &str)> = dead.iter().map(|d| (d.entry_id(), d.reason())).collect();
    assert_eq!(reasons.len(), 2, "{dead:?}");
    assert_eq!(reasons[0].0, no_data);
    assert!(reasons[0].1.contains("no `data` field"), "{reasons:?}");
    assert_eq!(reasons[1].0, binary_header);
    assert!(reasons[1].1.contains("x-blob"), "{reasons:?}");
    // Kept as they were, and no longer pending in the group.
    let kept: Vec<(&[u8], &[u8])> = dead[1].fields().collect();
    assert_eq!(kept[0], (&b"x-blob"[..], &[0xff_u8, 0xfe][..]));
    let pending: (i64, Value, Value, Value) = harness
        .query(redis::cmd("XPENDING").arg(&stream).arg("g"))
        .await;
    assert_eq!(pending.0, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nack_longer_than_the_ack_timeout_is_honoured() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("long-nack");
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    let message = Message::new(topic.clone(), "later");
    harness
        .streams
        .publisher()
        .publish(&message)
        .await
        .expect("published");
    let first = next(&mut subscriber).await;
    let delay = ACK_TIMEOUT * 5 / 2;
    first.nack(delay).await.expect("nacked");
    let nacked = Instant::now();

    // Past the ack timeout the entry is idle and reclaimed, and parked again.
    nothing_within(&mut subscriber, delay - Duration::from_millis(200)).await;
    let again = next(&mut subscriber).await;
    let after = nacked.elapsed();
    assert!(
        after >= delay - Duration::from_millis(50),
        "redelivered after {after:?}"
    );
    assert_eq!(again.received().id, Some(message.id));
    assert_eq!(
        again.received().delivery_count,
        2,
        "parking counts no delivery"
    );
    again.ack().await.expect("acked");
    let parked: i64 = harness
        .query(redis::cmd("HLEN").arg(format!("{}:parked", harness.streams.stream_key(&topic))))
        .await;
    assert_eq!(parked, 0, "the parked due time is gone once it passed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nack_by_a_delivery_that_lost_the_entry_changes_nothing() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("stale-nack");
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    harness
        .streams
        .publisher()
        .publish(&Message::new(topic.clone(), "x"))
        .await
        .expect("published");
    let stale = next(&mut subscriber).await;
    // Held past the ack timeout: claimed again.
    let current = timeout(ACK_TIMEOUT + PATIENCE, subscriber.next())
        .await
        .expect("redelivered")
        .expect("no error");
    assert_eq!(current.received().delivery_count, 2);
    stale
        .nack(Duration::ZERO)
        .await
        .expect("a stale nack is not an error");
    nothing_within(&mut subscriber, ACK_TIMEOUT / 2).await;
    current.ack().await.expect("acked");
    nothing_within(&mut subscriber, ACK_TIMEOUT * 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn entries_delivered_too_often_are_dead_lettered() {
    let harness = StreamsHarness::with_options(|options| options.max_deliveries(2)).await;
    let topic = harness.topic("limit");
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    let poison = Message::new(topic.clone(), "crashes every consumer");
    harness
        .streams
        .publisher()
        .publish(&poison)
        .await
        .expect("published");
    for count in 1..=2 {
        let delivery = timeout(ACK_TIMEOUT + PATIENCE, subscriber.next())
            .await
            .expect("delivered")
            .expect("no error");
        assert_eq!(delivery.received().delivery_count, count);
        drop(delivery); // the consumer crashed
    }
    nothing_within(&mut subscriber, ACK_TIMEOUT * 2).await;
    let dead = harness
        .streams
        .dead_letters(&topic, 10)
        .await
        .expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason().contains("over the limit of 2"), "{dead:?}");
    assert_eq!(dead[0].deliveries(), 3);
    assert_eq!(dead[0].received().expect("decodes").id, Some(poison.id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_redis_lost_is_created_again() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("lost-group");
    let stream = harness.streams.stream_key(&topic);
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    // What a restart without persistence does to the stream and its groups.
    let _: i64 = harness.query(redis::cmd("DEL").arg(&stream)).await;
    let message = Message::new(topic.clone(), "after the loss");
    harness
        .streams
        .publisher()
        .publish(&message)
        .await
        .expect("published");
    let delivery = next(&mut subscriber).await;
    assert_eq!(delivery.received().id, Some(message.id));
    delivery.ack().await.expect("acked");
}

/// Retries `attempt` while it fails transiently (Redis restarting), for up to
/// [`PATIENCE`].
async fn retrying<T, F: std::future::Future<Output = oncebox_core::Result<T>>>(
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                // Reconnecting has no event to wait for: a short pause between attempts.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("failed for good: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_restart_without_persistence_reading_goes_on() {
    let harness = StreamsHarness::with_own_server(false).await;
    let topic = harness.topic("amnesia");
    let stream = harness.streams.stream_key(&topic);
    let mut subscriber = harness
        .streams
        .subscribe(&topic, "g")
        .await
        .expect("subscribed");
    let publisher = harness.streams.publisher();
    let before = Message::new(topic.clone(), "before");
    publisher.publish(&before).await.expect("published");
    next(&mut subscriber).await.ack().await.expect("acked");

    oncebox_testkit::transport::TransportHarness::restart(&harness)
        .await
        .expect("restarted");
    let exists: i64 = retrying(|| async {
        let mut connection = harness.streams.connection().clone();
        redis::cmd("EXISTS")
            .arg(&stream)
            .query_async(&mut connection)
            .await
            .map_err(oncebox_core::Error::transport_transient)
    })
    .await;
    assert_eq!(
        exists, 0,
        "a restart without persistence forgets the stream"
    );

    let after = Message::new(topic.clone(), "after");
    retrying(|| publisher.publish(&after)).await;
    let deadline = Instant::now() + PATIENCE;
    let delivery = loop {
        match tokio::time::timeout_at(deadline, subscriber.next()).await {
            Ok(Ok(delivery)) => break delivery,
            Ok(Err(error)) if error.is_transient() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Err(error)) => panic!("failed for good: {error}"),
            Err(_) => panic!("nothing delivered within {PATIENCE:?} after the restart"),
        }
    };
    assert_eq!(
        delivery.received().id,
        Some(after.id),
        "the group was created again"
    );
    delivery.ack().await.expect("acked");
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_are_clear_and_classified() {
    let bad = RedisStreams::connect("not a url", RedisStreamOptions::new())
        .await
        .expect_err("a bad URL");
    assert!(bad.is_invalid_input(), "{bad:?}");
    let down = RedisStreams::connect("redis://127.0.0.1:1", RedisStreamOptions::new())
        .await
        .expect_err("nothing listens on port 1");
    assert!(down.is_transient(), "{down:?}");
    let invalid = RedisStreams::connect(
        &support::redis_url(),
        RedisStreamOptions::new().batch_size(0),
    )
    .await
    .expect_err("invalid options");
    assert!(invalid.is_invalid_input(), "{invalid:?}");

    let harness = StreamsHarness::with_options(|options| options.max_payload_bytes(1024)).await;
    let topic = harness.topic("errors");
    let publisher = harness.streams.publisher();
    let big = Message::new(topic.clone(), vec![7_u8; 1025]);
    let error = publisher.publish(&big).await.expect_err("too large");
    assert!(!error.is_transient(), "{error:?}");
    assert!(
        error.to_string().contains("over the limit of 1024"),
        "{error}"
    );
    let data = Message::new(topic.clone(), "x")
        .with_header("data", "y")
        .expect("valid header");
    assert!(
        !publisher
            .publish(&data)
            .await
            .expect_err("reserved")
            .is_transient()
    );
    let length: i64 = harness
        .query(redis::cmd("XLEN").arg(harness.streams.stream_key(&topic)))
        .await;
    assert_eq!(length, 0, "nothing refused reached Redis");

    let taken = harness.topic("a-string");
    let key = harness.streams.stream_key(&taken);
    let _: () = harness
        .query(redis::cmd("SET").arg(&key).arg("not a stream"))
        .await;
    let error = publisher
        .publish(&Message::new(taken.clone(), "x"))
        .await
        .expect_err("WRONGTYPE");
    assert!(!error.is_transient(), "{error:?}");
    assert!(error.to_string().contains(&key), "{error}");
    let error = harness
        .streams
        .subscribe(&taken, "g")
        .await
        .expect_err("WRONGTYPE");
    assert!(
        !error.is_transient() && error.to_string().contains(&key),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn max_len_trims_the_stream_approximately() {
    let harness = StreamsHarness::with_options(|options| options.max_len(10)).await;
    let topic = harness.topic("trimmed");
    let publisher = harness.streams.publisher();
    for n in 0..1000 {
        publisher
            .publish(&Message::new(topic.clone(), n.to_string()))
            .await
            .expect("published");
    }
    let length: i64 = harness
        .query(redis::cmd("XLEN").arg(harness.streams.stream_key(&topic)))
        .await;
    // `~` trims whole radix-tree nodes (100 entries by default), never below the limit.
    assert!((10..=200).contains(&length), "{length} entries left");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_publishes_are_all_confirmed_and_stored() {
    let harness = StreamsHarness::new().await;
    let topic = harness.topic("pipelined");
    let publisher = harness.streams.publisher();
    let messages: Vec<Message> = (0..500)
        .map(|n| Message::new(topic.clone(), n.to_string()))
        .collect();
    let results = join_all(messages.iter().map(|m| publisher.publish(m))).await;
    assert!(results.iter().all(Result::is_ok));
    let length: i64 = harness
        .query(redis::cmd("XLEN").arg(harness.streams.stream_key(&topic)))
        .await;
    assert_eq!(length, 500);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_publish_fails_alone_among_concurrent_ones() {
    let harness = StreamsHarness::new().await;
    let fine = harness.topic("fine");
    let taken = harness.topic("taken");
    let _: () = harness
        .query(
            redis::cmd("SET")
                .arg(harness.streams.stream_key(&taken))
                .arg("not a stream"),
        )
        .await;
    let publisher = harness.streams.publisher();
    // Every tenth publish goes to the key that holds a string; all are in flight at once,
    // so they share pipelines with the others.
    let messages: Vec<Message> = (0..300)
        .map(|n| {
            let topic = if n % 10 == 0 { &taken } else { &fine };
            Message::new(topic.clone(), n.to_string())
        })
        .collect();
    let results = join_all(messages.iter().map(|m| publisher.publish(m))).await;
    for (message, result) in messages.iter().zip(&results) {
        match result {
            Ok(()) => assert_eq!(message.topic, fine),
            Err(error) => {
                assert_eq!(message.topic, taken, "{error}");
                assert!(!error.is_transient(), "{error:?}");
            }
        }
    }
    let length: i64 = harness
        .query(redis::cmd("XLEN").arg(harness.streams.stream_key(&fine)))
        .await;
    assert_eq!(length, 270, "every publish to the stream was stored");
}

#[test]
fn a_publisher_outlives_the_runtime_it_first_published_on() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let first = runtime();
    let (harness, publisher, topic) = first.block_on(async {
        let harness = StreamsHarness::new().await;
        let publisher = harness.streams.publisher();
        let topic = harness.topic("runtimes");
        publisher
            .publish(&Message::new(topic.clone(), "first"))
            .await
            .expect("published");
        (harness, publisher, topic)
    });
    // Its tasks (the publisher's and the connection's) end with it.
    drop(first);

    runtime().block_on(async {
        // The connection notices that its task is gone and reconnects.
        let second = Message::new(topic.clone(), "second");
        retrying(|| publisher.publish(&second)).await;
        let length: i64 = harness
            .query(redis::cmd("XLEN").arg(harness.streams.stream_key(&topic)))
            .await;
        assert_eq!(length, 2);
    });
}
