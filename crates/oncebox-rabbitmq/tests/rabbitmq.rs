//! What the conformance suite does not cover: errors and their classification,
//! unroutable messages, foreign and undecodable messages, the broker's delivery limit.
//! Against a real RabbitMQ (`ONCEBOX_AMQP_URL`), each test on an exchange and queues
//! of its own.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{RabbitHarness, amqp_url, unique};
use futures_util::future::join_all;
use oncebox_core::Backoff;
use oncebox_core::{Bytes, Delivery, Error, Message, Publisher, Subscriber};
use oncebox_rabbitmq::lapin::options::BasicPublishOptions;
use oncebox_rabbitmq::lapin::types::{AMQPValue, FieldTable, LongString};
use oncebox_rabbitmq::lapin::uri::AMQPUri;
use oncebox_rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use oncebox_rabbitmq::{
    FOREIGN_ID_HEADER, RabbitDelivery, RabbitError, RabbitOptions, RabbitPublisher,
    RabbitSubscriber, peek_dead_letters,
};
use oncebox_testkit::proxy::Proxy;
use oncebox_testkit::transport::TransportHarness;

const PATIENCE: Duration = Duration::from_secs(10);

fn rabbit_error(error: &Error) -> &RabbitError {
    let source = match error {
        Error::Transport { source, .. } => source,
        other => panic!("expected a transport error, got {other:?}"),
    };
    source
        .downcast_ref::<RabbitError>()
        .unwrap_or_else(|| panic!("expected a RabbitError, got {source:?}"))
}

async fn next(subscriber: &mut RabbitSubscriber) -> RabbitDelivery {
    tokio::time::timeout(PATIENCE, subscriber.next())
        .await
        .expect("a delivery in time")
        .expect("a delivery")
}

/// Publishes with lapin directly, as a producer that does not use oncebox would.
async fn publish_raw(
    harness: &RabbitHarness,
    topic: &str,
    properties: BasicProperties,
    body: &[u8],
) {
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(Default::default())
        .await
        .expect("confirm mode");
    let confirmation = channel
        .basic_publish(
            harness.exchange.as_str().into(),
            topic.into(),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(confirmation.is_ack());
    connection.close(200, "done".into()).await.expect("close");
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    fn send_future<F: std::future::Future + Send>(_: F) {}
    send_sync::<RabbitPublisher>();
    send::<RabbitSubscriber>();
    send_sync::<RabbitDelivery>();
    send_sync::<RabbitError>();
    let _ = |publisher: RabbitPublisher,
             mut subscriber: RabbitSubscriber,
             delivery: RabbitDelivery,
             message: Message| {
        send_future(async move { publisher.publish(&message).await });
        send_future(async move { subscriber.next().await });
        send_future(delivery.ack());
    };
}

#[tokio::test]
async fn a_bad_url_is_an_options_error_an_absent_broker_transient() {
    let bad = RabbitPublisher::connect(&RabbitOptions::new("http://127.0.0.1:5672"))
        .await
        .expect_err("not an AMQP URL");
    assert!(bad.is_invalid_input(), "{bad}");
    let absent = RabbitPublisher::connect(
        &RabbitOptions::new("amqp://guest:guest@127.0.0.1:1/%2f").connect_timeout(PATIENCE),
    )
    .await
    .expect_err("nothing listens on port 1");
    assert!(absent.is_transient(), "{absent}");
    assert!(
        !absent.to_string().contains("guest:guest"),
        "the password leaked: {absent}"
    );
}

#[tokio::test]
async fn refused_credentials_are_permanent() {
    let url = amqp_url().replacen("guest:guest", "guest:wrong-password", 1);
    let refused = RabbitPublisher::connect(&RabbitOptions::new(url))
        .await
        .expect_err("wrong password");
    assert!(!refused.is_transient(), "{refused}");
    assert!(!refused.to_string().contains("wrong-password"), "{refused}");
}

#[tokio::test]
async fn an_unknown_exchange_is_named() {
    let options = RabbitOptions::new(amqp_url())
        .exchange(unique("oncebox-test-missing"))
        .declare_exchange(false);
    let error = RabbitPublisher::connect(&options)
        .await
        .expect_err("the exchange does not exist");
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(rabbit_error(&error), RabbitError::ExchangeNotFound { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("oncebox-test-missing"),
        "{error}"
    );
    let error = RabbitSubscriber::connect(&options, "orders", &unique("group"))
        .await
        .expect_err("the exchange does not exist");
    assert!(
        matches!(rabbit_error(&error), RabbitError::ExchangeNotFound { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn an_unroutable_message_is_not_confirmed_as_published() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let publisher = harness.publisher().await?;
    let topic = unique("nobody-listens");
    let error = publisher
        .publish(&Message::new(topic.clone(), "lost?"))
        .await
        .expect_err("no queue is bound");
    assert!(
        error.is_transient(),
        "a configuration mistake must not dead-letter the outbox: {error}"
    );
    assert!(
        matches!(rabbit_error(&error), RabbitError::Unroutable { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&harness.exchange) && text.contains(&topic),
        "{text}"
    );
    // The publisher goes on.
    let mut subscriber = harness.subscriber(&topic, &unique("late")).await?;
    publisher
        .publish(&Message::new(topic.clone(), "found"))
        .await?;
    next(&mut subscriber).await.ack().await
}

/// Routable and unroutable messages published concurrently on one channel: confirms
/// come in `multiple` acks, and each return must be credited to its own message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_are_told_apart_under_load() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let (routed, lost) = (unique("routed"), unique("lost"));
    let mut subscriber = harness.subscriber(&routed, &unique("group")).await?;
    let publisher = harness.publisher().await?;
    let messages: Vec<Message> = (0..2000)
        .map(|i| {
            let topic = if i % 5 == 0 { &lost } else { &routed };
            Message::new(topic.clone(), i.to_string())
        })
        .collect();
    for round in messages.chunks(400) {
        let results = join_all(round.iter().map(|m| publisher.publish(m))).await;
        for (message, result) in round.iter().zip(results) {
            match (message.topic == lost, result) {
                (false, Ok(())) => {}
                (true, Err(error)) => assert!(
                    matches!(rabbit_error(&error), RabbitError::Unroutable { .. }),
                    "{error}"
                ),
                (unroutable, result) => {
                    panic!("unroutable: {unroutable}, but the publish gave {result:?}")
                }
            }
        }
    }
    let expected: HashSet<_> = messages
        .iter()
        .filter(|m| m.topic == routed)
        .map(|m| m.id)
        .collect();
    let mut got = HashSet::new();
    while got.len() < expected.len() {
        let delivery = next(&mut subscriber).await;
        got.insert(delivery.received().id.expect("an id"));
        delivery.ack().await?;
    }
    assert_eq!(got, expected);
    Ok(())
}

#[tokio::test]
async fn an_oversized_message_fails_permanently_before_it_is_sent() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new().with_options(|o| o.max_message_size(1024));
    let topic = unique("big");
    let _subscriber = harness.subscriber(&topic, &unique("group")).await?;
    let publisher = harness.publisher().await?;
    let error = publisher
        .publish(&Message::new(topic.clone(), vec![7u8; 2048]))
        .await
        .expect_err("over the limit");
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(
            rabbit_error(&error),
            RabbitError::TooLarge {
                size: 2048,
                limit: 1024
            }
        ),
        "{error}"
    );
    publisher
        .publish(&Message::new(topic, vec![7u8; 1024]))
        .await
}

#[tokio::test]
async fn foreign_messages_arrive_with_their_ids() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("foreign");
    let mut subscriber = harness.subscriber(&topic, &unique("group")).await?;
    let mut headers = FieldTable::default();
    headers.insert(
        "x-tenant".into(),
        AMQPValue::LongString(LongString::from("acme")),
    );
    headers.insert("x-attempt".into(), AMQPValue::LongInt(3));
    let properties = BasicProperties::default()
        .with_message_id("order-42-v1".into())
        .with_type("OrderPlaced".into())
        .with_headers(headers);
    publish_raw(&harness, &topic, properties, b"{\"order\":42}").await;
    let uuid = oncebox_core::MessageId::new();
    let properties = BasicProperties::default().with_message_id(uuid.to_string().into());
    publish_raw(&harness, &topic, properties, b"bare").await;

    let first = next(&mut subscriber).await;
    let received = first.received();
    assert_eq!(received.id, None);
    assert_eq!(received.headers.get(FOREIGN_ID_HEADER), Some("order-42-v1"));
    assert_eq!(received.headers.get("x-tenant"), Some("acme"));
    assert_eq!(received.headers.get("x-attempt"), Some("3"));
    assert_eq!(received.kind, "OrderPlaced");
    assert_eq!(received.topic, topic);
    assert_eq!(&received.payload[..], b"{\"order\":42}");
    first.ack().await?;
    let second = next(&mut subscriber).await;
    assert_eq!(second.received().id, Some(uuid));
    assert!(second.received().headers.is_empty());
    second.ack().await
}

#[tokio::test]
async fn an_undecodable_delivery_is_dead_lettered_with_the_reason() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("binary-headers");
    let group = unique("group");
    let mut subscriber = harness.subscriber(&topic, &group).await?;
    let mut headers = FieldTable::default();
    headers.insert(
        "x-blob".into(),
        AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
    );
    let properties = BasicProperties::default()
        .with_message_id("poison-1".into())
        .with_headers(headers);
    publish_raw(&harness, &topic, properties, b"poison").await;
    let good = Message::new(topic.clone(), "good");
    harness.publisher().await?.publish(&good).await?;

    let delivery = next(&mut subscriber).await;
    assert_eq!(
        delivery.received().id,
        Some(good.id),
        "the undecodable one is not handed out"
    );
    delivery.ack().await?;
    let dead = peek_dead_letters(&harness.options, &group, 10).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0].reason.contains("x-blob") && dead[0].reason.contains("UTF-8"),
        "{}",
        dead[0].reason
    );
    assert_eq!(&dead[0].received.payload[..], b"poison");
    assert_eq!(dead[0].received.topic, topic);
    assert_eq!(
        dead[0].received.headers.get(FOREIGN_ID_HEADER),
        Some("poison-1")
    );
    Ok(())
}

#[tokio::test]
async fn a_dead_letter_keeps_the_message() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("dead");
    let group = unique("group");
    let mut subscriber = harness.subscriber(&topic, &group).await?;
    let message = Message::new(topic.clone(), Bytes::from_static(&[0, 1, 2, 0xff]))
        .with_key("order-7")
        .with_kind("OrderPlaced")
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )?;
    harness.publisher().await?.publish(&message).await?;
    next(&mut subscriber).await.nack(Duration::ZERO).await?;
    let again = next(&mut subscriber).await;
    assert_eq!(again.received().delivery_count, 2);
    again.dead_letter("payment refused:\nline two").await?;

    let dead = peek_dead_letters(&harness.options, &group, 10).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let letter = &dead[0];
    assert_eq!(letter.reason, "payment refused: line two");
    assert_eq!(letter.received.id, Some(message.id));
    assert_eq!(letter.received.topic, topic);
    assert_eq!(letter.received.key, message.key);
    assert_eq!(letter.received.kind, message.kind);
    assert_eq!(letter.received.headers, message.headers);
    assert_eq!(letter.received.payload, message.payload);
    assert_eq!(letter.received.delivery_count, 2);
    // Reading does not take them away.
    assert_eq!(
        peek_dead_letters(&harness.options, &group, 10).await?.len(),
        1
    );
    Ok(())
}

#[tokio::test]
async fn the_broker_dead_letters_past_the_delivery_limit() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new().with_options(|o| o.delivery_limit(Some(2)));
    let topic = unique("limit");
    let group = unique("group");
    let mut subscriber = harness.subscriber(&topic, &group).await?;
    let message = Message::new(topic.clone(), "crashes its consumer");
    harness.publisher().await?.publish(&message).await?;
    for count in 1..=3 {
        let delivery = next(&mut subscriber).await;
        assert_eq!(delivery.received().id, Some(message.id));
        assert_eq!(delivery.received().delivery_count, count);
        delivery.nack(Duration::ZERO).await?;
    }
    let quiet = tokio::time::timeout(Duration::from_secs(2), subscriber.next()).await;
    assert!(quiet.is_err(), "delivered past the limit: {quiet:?}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        // The broker moves it asynchronously.
        let dead = peek_dead_letters(&harness.options, &group, 10).await?;
        if let Some(letter) = dead.first() {
            assert_eq!(letter.received.id, Some(message.id));
            assert_eq!(letter.received.topic, topic);
            assert!(
                letter.reason.contains("delivery_limit"),
                "{}",
                letter.reason
            );
            return Ok(());
        }
        assert!(tokio::time::Instant::now() < deadline, "no dead letter");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_queue_with_other_arguments_is_a_clear_permanent_error() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("typed");
    let group = unique("group");
    let _quorum = harness.subscriber(&topic, &group).await?;
    let classic = harness
        .options
        .clone()
        .queue_type(oncebox_rabbitmq::QueueType::Classic);
    let error = RabbitSubscriber::connect(&classic, &topic, &group)
        .await
        .expect_err("the queue is a quorum queue");
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains(&group), "{error}");
    Ok(())
}

/// Sets the broker's `max_message_size` for new channels, and puts RabbitMQ's default
/// back when dropped.
struct BrokerMessageLimit;

impl BrokerMessageLimit {
    fn set(bytes: usize) -> Self {
        rabbitmqctl_eval(&format!(
            "application:set_env(rabbit, max_message_size, {bytes})."
        ));
        Self
    }
}

impl Drop for BrokerMessageLimit {
    fn drop(&mut self) {
        rabbitmqctl_eval("application:set_env(rabbit, max_message_size, 134217728).");
    }
}

fn rabbitmqctl_eval(expression: &str) {
    let output = std::process::Command::new("rabbitmqctl")
        .args(["eval", expression])
        .output()
        .expect("run rabbitmqctl");
    assert!(
        output.status.success(),
        "rabbitmqctl eval {expression}: {output:?}"
    );
}

/// A body the broker refuses closes the channel: that message fails permanently, the
/// publisher reconnects and goes on.
#[tokio::test]
async fn a_message_the_broker_finds_too_large_fails_permanently() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("broker-limit");
    let mut subscriber = harness.subscriber(&topic, &unique("group")).await?;
    let limit = BrokerMessageLimit::set(64 * 1024);
    // The broker reads the limit when a channel opens.
    let publisher = harness.publisher().await?;
    let error = publisher
        .publish(&Message::new(topic.clone(), vec![1u8; 100 * 1024]))
        .await
        .expect_err("over the broker's limit");
    drop(limit);
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(
            rabbit_error(&error),
            RabbitError::TooLarge {
                size: 102_400,
                limit: 65_536
            }
        ),
        "{error}"
    );
    let small = Message::new(topic.clone(), "small");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match publisher.publish(&small).await {
            Ok(()) => break,
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error),
        }
    }
    let delivery = next(&mut subscriber).await;
    assert_eq!(delivery.received().id, Some(small.id));
    delivery.ack().await
}

/// Headers larger than an AMQP frame (128 KiB by default) cannot travel in a content
/// header frame: RabbitMQ would close the whole connection with `FRAME_ERROR`. Such a
/// message is refused before it is sent, for good (`HeadersTooLarge`), and the
/// publisher goes on.
#[tokio::test]
async fn headers_over_the_frame_size_fail_permanently() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let topic = unique("big-headers");
    let mut subscriber = harness.subscriber(&topic, &unique("group")).await?;
    let publisher = harness.publisher().await?;
    let mut big = Message::new(topic.clone(), "small payload");
    for i in 0..40 {
        big = big
            .with_header(format!("x-big-{i}"), "v".repeat(8 * 1024))
            .expect("each header within its own limit");
    }
    let error = tokio::time::timeout(PATIENCE, publisher.publish(&big))
        .await
        .expect("an answer in time")
        .expect_err("headers over the frame size");
    assert!(!error.is_transient(), "{error}");
    let Error::Transport { source, .. } = &error else {
        panic!("expected a transport error, got {error:?}")
    };
    assert!(
        matches!(
            source.downcast_ref::<oncebox_core::InvalidMessage>(),
            Some(oncebox_core::InvalidMessage::HeadersTooLarge { .. })
        ),
        "{error}"
    );
    let small = Message::new(topic.clone(), "small");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match publisher.publish(&small).await {
            Ok(()) => break,
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error),
        }
    }
    let delivery = next(&mut subscriber).await;
    assert_eq!(delivery.received().id, Some(small.id));
    delivery.ack().await
}

/// How late a slowed proxy forwards each chunk, in the tests of setups cut short.
const SLOW_LINK: Duration = Duration::from_millis(50);

/// A proxy to the broker, and options on the harness's exchange that reach the broker
/// through it, reconnecting quickly.
async fn proxied(harness: &RabbitHarness) -> oncebox_core::Result<(Proxy, RabbitOptions)> {
    let uri: AMQPUri = amqp_url().parse().map_err(Error::transport_permanent)?;
    let target = format!("{}:{}", uri.authority.host, uri.authority.port);
    let proxy = Proxy::start(target.clone())
        .await
        .map_err(Error::transport_permanent)?;
    let through = amqp_url().replacen(&target, &format!("127.0.0.1:{}", proxy.port()), 1);
    assert_ne!(
        through,
        amqp_url(),
        "the broker URL names its host and port"
    );
    let options = RabbitOptions::new(through)
        .exchange(harness.exchange.clone())
        .reconnect(
            Backoff::new()
                .initial(Duration::from_millis(50))
                .max(Duration::from_millis(200)),
        );
    Ok((proxy, options))
}

/// Publishes `count` messages to `topic` and checks that `subscriber` receives every
/// one of them: none is held by a consumer left behind.
async fn all_reach(
    harness: &RabbitHarness,
    topic: &str,
    subscriber: &mut RabbitSubscriber,
    count: usize,
) -> oncebox_core::Result<()> {
    let publisher = harness.publisher().await?;
    for i in 0..count {
        publisher
            .publish(&Message::new(topic, format!("{i}")).with_key("k"))
            .await?;
    }
    let mut received = HashSet::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while received.len() < count && tokio::time::Instant::now() < deadline {
        if let Ok(delivery) = tokio::time::timeout(Duration::from_secs(1), subscriber.next()).await
        {
            let delivery = delivery?;
            received.insert(delivery.received().payload.clone());
            delivery.ack().await?;
        }
    }
    assert_eq!(
        received.len(),
        count,
        "messages held by a consumer left behind by a setup cut short"
    );
    Ok(())
}

/// A subscriber of a fresh topic and group, connected over a slowed link, and how long
/// its setup took there.
struct SlowSetup {
    proxy: Proxy,
    options: RabbitOptions,
    topic: String,
    group: String,
    subscriber: RabbitSubscriber,
    setup: Duration,
}

impl SlowSetup {
    async fn new(harness: &RabbitHarness) -> oncebox_core::Result<Self> {
        let (proxy, options) = proxied(harness).await?;
        let topic = harness.fresh_topic("orders").await?;
        let group = unique("payments");
        harness.record_group(&topic, &group);
        proxy.slow(SLOW_LINK);
        let started = tokio::time::Instant::now();
        let subscriber = RabbitSubscriber::connect(&options, &topic, &group).await?;
        Ok(Self {
            setup: started.elapsed(),
            proxy,
            options,
            topic,
            group,
            subscriber,
        })
    }

    /// Instants sweeping the last round trips of a setup over the slow link.
    fn sweep(&self) -> impl Iterator<Item = Duration> {
        let (from, to) = (
            self.setup.saturating_sub(SLOW_LINK * 5),
            self.setup + SLOW_LINK * 2,
        );
        std::iter::successors(Some(from), |at| Some(*at + SLOW_LINK / 2))
            .take_while(move |at| *at < to)
    }
}

/// A reconnection cut short: while the subscriber reconnects over a slow link, `next` is
/// called with a timeout, each call cancelled a little later than the one before, so
/// that some are cancelled after the consumer was asked for and before the broker's
/// answer came. Dropped there, a connection stays open with the consumer the broker
/// registered, which is handed deliveries (up to the prefetch) that no one reads and
/// that stay unacknowledged as long as the process lives; the reconnection must go on
/// in the background instead. (Seen on a cluster, where asking for a consumer waits
/// for a quorum queue's new leader.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_cut_short_by_a_cancelled_next_leaves_no_consumer_behind()
-> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let mut slow = SlowSetup::new(&harness).await?;
    slow.proxy.cut();
    let lost = tokio::time::timeout(PATIENCE, slow.subscriber.next())
        .await
        .expect("the lost link is reported");
    assert!(lost.is_err_and(|error| error.is_transient()));
    slow.proxy.restore();
    slow.proxy.slow(SLOW_LINK);
    // Calls cancelled at instants sweeping the last round trips of a setup.
    for after in slow.sweep().collect::<Vec<_>>() {
        let _ = tokio::time::timeout(after, slow.subscriber.next()).await;
    }
    slow.proxy.restore();
    all_reach(&harness, &slow.topic, &mut slow.subscriber, 200).await?;
    slow.subscriber.close().await;
    Ok(())
}

/// A setup cut short by the connect timeout: subscribers of the same group connect over
/// a slow link with connect timeouts sweeping the last round trips of a setup, so that
/// some time out after the consumer was asked for and before the broker's answer came
/// (as a setup does when a restarting broker answers late). What such a setup opened
/// must be closed once it completes, not left open with a consumer that holds
/// deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_cut_short_by_the_connect_timeout_leaves_no_consumer_behind()
-> oncebox_core::Result<()> {
    let harness = RabbitHarness::new();
    let mut slow = SlowSetup::new(&harness).await?;
    for timeout in slow.sweep() {
        let cut_short = slow.options.clone().connect_timeout(timeout);
        if let Ok(other) = RabbitSubscriber::connect(&cut_short, &slow.topic, &slow.group).await {
            other.close().await;
        }
    }
    slow.proxy.restore();
    all_reach(&harness, &slow.topic, &mut slow.subscriber, 200).await?;
    slow.subscriber.close().await;
    Ok(())
}
