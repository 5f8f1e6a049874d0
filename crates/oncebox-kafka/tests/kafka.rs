//! What is particular to the Kafka transport, beyond the conformance suite: foreign and
//! undecodable records, committing only the settled prefix, rebalances, errors.
//!
//! Most tests run against the broker at `ONCEBOX_KAFKA_BROKERS` (tansu). Two use
//! librdkafka's mock cluster instead, for what tansu cannot show:
//! `unknown_topics_fail_transiently_naming_the_topic` (tansu creates a topic on first
//! produce) and `clients_ride_out_a_broker_outage` (tansu's in-memory storage does not
//! survive the restart that an outage would take).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use oncebox_core::{Delivery, Error, Message, MessageId, Publisher, Result, Subscriber};
use oncebox_kafka::rdkafka::message::{Header, OwnedHeaders};
use oncebox_kafka::rdkafka::mocking::MockCluster;
use oncebox_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use oncebox_kafka::rdkafka::types::RDKafkaRespErr;
use oncebox_kafka::{
    KafkaDelivery, KafkaOptions, KafkaPublisher, KafkaSubscriber, KafkaTransportError,
};
use oncebox_testkit::transport::TransportHarness;
use tokio::time::{Instant, timeout};

use common::{ACK_TIMEOUT, KafkaHarness};

/// Long enough for a consumer to rejoin its group after a broker outage on a loaded
/// host (the session timeout of the outage test is 6 s).
const PATIENCE: Duration = Duration::from_secs(30);

/// The next delivery within `PATIENCE`, retrying transient errors.
async fn receive(subscriber: &mut KafkaSubscriber) -> KafkaDelivery {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, subscriber.next()).await {
            Ok(Ok(delivery)) => return delivery,
            Ok(Err(error)) if error.is_transient() => {}
            Ok(Err(error)) => panic!("receiving failed for good: {error}"),
            Err(_) => panic!("nothing delivered within {PATIENCE:?}"),
        }
    }
}

/// Fails if anything is delivered within `period`.
async fn expect_nothing(subscriber: &mut KafkaSubscriber, period: Duration) {
    let deadline = Instant::now() + period;
    loop {
        match tokio::time::timeout_at(deadline, subscriber.next()).await {
            Err(_) => return,
            Ok(Ok(delivery)) => panic!("unexpected delivery: {:?}", delivery.received()),
            Ok(Err(error)) if error.is_transient() => {}
            Ok(Err(error)) => panic!("receiving failed for good: {error}"),
        }
    }
}

fn id(delivery: &KafkaDelivery) -> MessageId {
    delivery
        .received()
        .id
        .expect("an oncebox message carries its id")
}

/// A raw rdkafka producer with the transport's settings, for records oncebox would not
/// write.
fn raw_producer(options: &KafkaOptions) -> FutureProducer {
    options.producer_config().create().expect("producer")
}

/// Sends a raw record; returns its partition and offset.
async fn send_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    headers: OwnedHeaders,
    payload: &[u8],
) -> (i32, i64) {
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(payload)
        .headers(headers);
    let delivered = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(error, _)| error)
        .expect("raw record delivered");
    (delivered.partition, delivered.offset)
}

/// A harness with one fresh topic; the test body runs, then the topics are deleted.
async fn with_topic<F, Fut>(label: &str, body: F)
where
    F: FnOnce(KafkaHarness, String) -> Fut,
    Fut: Future<Output = KafkaHarness>,
{
    let harness = KafkaHarness::new();
    let topic = harness.fresh_topic(label).await.expect("topic created");
    let harness = body(harness, topic).await;
    harness.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_records_arrive_with_their_coordinates() {
    with_topic("foreign", |harness, topic| async move {
        let mut subscriber = harness
            .subscriber(&topic, &format!("{topic}-a"))
            .await
            .expect("subscribed");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "x-tenant",
                value: Some("acme"),
            })
            .insert(Header {
                key: "ce_type",
                value: Some("order.placed"),
            });
        let (partition, offset) = send_raw(
            &raw_producer(&harness.options),
            &topic,
            "order-42",
            headers,
            b"{}",
        )
        .await;

        let delivery = receive(&mut subscriber).await;
        let received = delivery.received();
        assert_eq!(received.id, None, "no ce_id, no id");
        assert_eq!(
            received.key.as_deref(),
            Some("order-42"),
            "the record key stands in for ce_subject"
        );
        assert_eq!(received.kind, "order.placed");
        assert_eq!(received.headers.get("x-tenant"), Some("acme"));
        assert_eq!(received.coordinates.source, topic);
        assert_eq!(received.coordinates.partition, Some(partition));
        assert_eq!(received.coordinates.position, offset.to_string());
        delivery.ack().await.expect("acked");
        harness
    })
    .await;
}

/// A record whose key is not UTF-8 (a schema-registry encoded key, say) is delivered,
/// not dead-lettered: its `Received::key` is `None`, its id and payload are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_utf8_is_delivered_without_a_key() {
    with_topic("binary-key", |harness, topic| async move {
        let mut subscriber = harness
            .subscriber(&topic, &format!("{topic}-a"))
            .await
            .expect("subscribed");
        let id = MessageId::new().to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "ce_id",
            value: Some(id.as_str()),
        });
        let record = FutureRecord::to(&topic)
            .key(&[0x00, 0xff, 0xfe, 0x01][..])
            .payload(&b"{}"[..])
            .headers(headers);
        raw_producer(&harness.options)
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(error, _)| error)
            .expect("raw record delivered");
        let delivery = receive(&mut subscriber).await;
        let received = delivery.received();
        assert_eq!(received.key, None, "a binary key is no text key");
        assert_eq!(received.id.map(|id| id.to_string()), Some(id));
        assert_eq!(&received.payload[..], b"{}");
        delivery.ack().await.expect("acked");
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_records_are_dead_lettered_by_the_subscriber() {
    with_topic("undecodable", |harness, topic| async move {
        let group = format!("{topic}-a");
        let mut subscriber = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed");
        // Same key: same partition, the undecodable record first.
        let headers = OwnedHeaders::new().insert(Header {
            key: "x-blob",
            value: Some(&[0xff_u8, 0xfe][..]),
        });
        let (partition, offset) = send_raw(
            &raw_producer(&harness.options),
            &topic,
            "k",
            headers,
            b"poison",
        )
        .await;
        let good = Message::new(topic.clone(), "good").with_key("k");
        harness
            .publisher()
            .await
            .expect("publisher")
            .publish(&good)
            .await
            .expect("published");

        let delivery = receive(&mut subscriber).await;
        assert_eq!(
            id(&delivery),
            good.id,
            "the undecodable record is never handed out"
        );
        delivery.ack().await.expect("acked");

        let deadline = Instant::now() + PATIENCE;
        let letter = loop {
            let letters = harness
                .admin
                .dead_letters(subscriber.dead_letter_topic(), PATIENCE)
                .await
                .expect("dead letters read");
            if let Some(letter) = letters.into_iter().next() {
                break letter;
            }
            assert!(
                Instant::now() < deadline,
                "the undecodable record was not dead-lettered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            letter.reason.contains("x-blob"),
            "reason names the header: {}",
            letter.reason
        );
        assert_eq!(letter.origin.source, topic);
        assert_eq!(letter.origin.partition, Some(partition));
        assert_eq!(letter.origin.position, offset.to_string());
        assert_eq!(letter.group, group);
        assert_eq!(
            &letter.received.payload[..],
            b"poison",
            "the copy keeps the value"
        );

        // Both offsets were committed: the group's next member gets nothing.
        subscriber.close().await.expect("closed");
        let mut next = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed again");
        expect_nothing(&mut next, ACK_TIMEOUT * 2).await;
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_acked_prefix_is_committed() {
    with_topic("prefix", |harness, topic| async move {
        let group = format!("{topic}-a");
        let mut first = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed");
        let messages: Vec<Message> = (0..3)
            .map(|n| Message::new(topic.clone(), n.to_string()).with_key("one-partition"))
            .collect();
        let publisher = harness.publisher().await.expect("publisher");
        for message in &messages {
            publisher.publish(message).await.expect("published");
        }
        let (m0, m1, m2) = (
            receive(&mut first).await,
            receive(&mut first).await,
            receive(&mut first).await,
        );
        assert_eq!(
            [id(&m0), id(&m1), id(&m2)],
            [messages[0].id, messages[1].id, messages[2].id]
        );
        m0.ack().await.expect("acked");
        m2.ack().await.expect("acked");
        // The second one is never settled: the committed offset stops before it.
        drop(m1);
        first.close().await.expect("closed");

        let mut second = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed");
        let again = [receive(&mut second).await, receive(&mut second).await];
        assert_eq!(
            again.iter().map(id).collect::<Vec<_>>(),
            [messages[1].id, messages[2].id],
            "everything from the first unsettled record on comes again, nothing before it"
        );
        for delivery in again {
            delivery.ack().await.expect("acked");
        }
        expect_nothing(&mut second, ACK_TIMEOUT * 2).await;
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_after_a_rebalance_is_harmless() {
    with_topic("rebalance", |harness, topic| async move {
        let group = format!("{topic}-a");
        let mut first = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed");
        let message = Message::new(topic.clone(), "moved");
        harness
            .publisher()
            .await
            .expect("publisher")
            .publish(&message)
            .await
            .expect("published");
        let held = receive(&mut first).await;

        // A second member joins: the group rebalances, the held delivery goes stale.
        let mut second = harness
            .subscriber(&topic, &group)
            .await
            .expect("subscribed");
        held.ack().await.expect("a late ack succeeds");

        // Not committed, so the partition's owner (old or new) delivers it again.
        let again = tokio::select! {
            delivery = receive(&mut first) => delivery,
            delivery = receive(&mut second) => delivery,
        };
        assert_eq!(id(&again), message.id);
        again.ack().await.expect("acked");
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_count_counts_this_subscribers_redeliveries() {
    with_topic("count", |harness, topic| async move {
        let mut subscriber = harness
            .subscriber(&topic, &format!("{topic}-a"))
            .await
            .expect("subscribed");
        harness
            .publisher()
            .await
            .expect("publisher")
            .publish(&Message::new(topic.clone(), "x"))
            .await
            .expect("published");
        let first = receive(&mut subscriber).await;
        assert_eq!(first.received().delivery_count, 1);
        first.nack(Duration::ZERO).await.expect("nacked");
        let second = receive(&mut subscriber).await;
        assert_eq!(second.received().delivery_count, 2);
        drop(second);
        let third = receive(&mut subscriber).await;
        assert_eq!(third.received().delivery_count, 3, "after the ack timeout");
        third.ack().await.expect("acked");
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_fail_for_good_naming_the_limit() {
    with_topic("oversized", |harness, topic| async move {
        let publisher = KafkaPublisher::connect(harness.options.clone().max_message_bytes(10_000))
            .await
            .expect("publisher");
        let error = publisher
            .publish(&Message::new(topic.clone(), vec![b'x'; 20_000]))
            .await
            .expect_err("over the limit");
        assert!(!error.is_transient(), "{error}");
        let text = error.to_string();
        assert!(
            text.contains("10000") && text.contains("message.max.bytes"),
            "{text}"
        );
        // A message within the limit still goes through.
        publisher
            .publish(&Message::new(topic.clone(), vec![b'x'; 5_000]))
            .await
            .expect("published");
        harness
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_to_a_missing_topic_fails_transiently() {
    let topic = common::unique("missing");
    let error = KafkaSubscriber::subscribe(common::options(), &topic, "g")
        .await
        .expect_err("no such topic");
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains(&topic), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_broker_lists_are_refused_clearly() {
    let error = KafkaPublisher::connect(KafkaOptions::new("kafka:ninety"))
        .await
        .expect_err("bad port");
    assert!(
        error.is_invalid_input() && error.to_string().contains("kafka:ninety"),
        "{error}"
    );

    let unreachable = KafkaOptions::new("127.0.0.1:1").connect_timeout(Duration::from_secs(2));
    let error = KafkaPublisher::connect(unreachable.clone())
        .await
        .expect_err("nothing listens");
    assert!(error.is_transient(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("127.0.0.1:1") && text.contains("refused"),
        "{text}"
    );
    let error = KafkaSubscriber::subscribe(unreachable, "t", "g")
        .await
        .expect_err("nothing listens");
    assert!(
        error.is_transient() && error.to_string().contains("127.0.0.1:1"),
        "{error}"
    );

    let error = KafkaPublisher::connect(
        KafkaOptions::new("no-such-host.invalid:9092").connect_timeout(Duration::from_secs(2)),
    )
    .await
    .expect_err("no such host");
    assert!(error.to_string().contains("resolve"), "{error}");
}

/// tansu creates topics on first produce; the mock cluster can refuse them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_fail_transiently_naming_the_topic() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .topic_error(
            "nowhere",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        )
        .expect("topic error set");
    let options =
        KafkaOptions::new(cluster.bootstrap_servers()).publish_timeout(Duration::from_secs(2));
    let publisher = KafkaPublisher::connect(options).await.expect("publisher");
    let error = publisher
        .publish(&Message::new("nowhere", "x"))
        .await
        .expect_err("unknown topic");
    assert!(
        error.is_transient(),
        "a configuration mistake must not dead-letter: {error}"
    );
    let Error::Transport { source, .. } = &error else {
        panic!("expected a transport error, got {error}");
    };
    assert!(
        matches!(source.downcast_ref::<KafkaTransportError>(), Some(KafkaTransportError::UnknownTopic { topic, .. }) if topic == "nowhere"),
        "{error}"
    );
    drop(publisher);
}

/// tansu's in-memory storage does not survive the restart an outage would take; the
/// mock cluster takes its broker down and up with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_ride_out_a_broker_outage() -> Result<()> {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("orders", 3, 1).expect("topic");
    cluster.create_topic("orders.dlq", 3, 1).expect("topic");
    let options = KafkaOptions::new(cluster.bootstrap_servers())
        .ack_timeout(ACK_TIMEOUT)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    let publisher = KafkaPublisher::connect(options.clone()).await?;
    let mut subscriber = KafkaSubscriber::subscribe(options, "orders", "payments").await?;
    subscriber
        .wait_for_assignment(Duration::from_secs(30))
        .await?;
    let before = Message::new("orders", "before");
    publisher.publish(&before).await?;
    let delivery = receive(&mut subscriber).await;
    assert_eq!(id(&delivery), before.id);
    delivery.ack().await?;

    cluster.broker_down(1).expect("broker down");
    let during = Message::new("orders", "during");
    let publish = async {
        let published = timeout(Duration::from_secs(20), publisher.publish(&during)).await;
        (published, Instant::now())
    };
    // The outage lasts two seconds; the publish must wait it out, not fail nor
    // return early.
    let outage = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.broker_up(1).expect("broker up");
        Instant::now()
    };
    let ((published, confirmed_at), up_at) = tokio::join!(publish, outage);
    published.expect("published once the broker is back")?;
    assert!(confirmed_at >= up_at, "confirmed while the broker was down");

    let mut seen: HashMap<MessageId, u32> = HashMap::new();
    while !seen.contains_key(&during.id) {
        let delivery = receive(&mut subscriber).await;
        *seen.entry(id(&delivery)).or_default() += 1;
        delivery.ack().await?;
    }
    subscriber.close().await?;
    drop(publisher);
    Ok(())
}
