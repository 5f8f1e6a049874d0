//! The Kafka harness shared by the conformance and end-to-end tests: the broker at
//! `ONCEBOX_KAFKA_BROKERS` (default `127.0.0.1:9092`; `scripts/services.sh kafka`
//! starts tansu), a topic and its dead-letter topic per check, deleted afterwards.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use oncebox_core::{MessageId, Received, Result};
use oncebox_kafka::{KafkaAdmin, KafkaOptions, KafkaPublisher, KafkaSubscriber};
use oncebox_testkit::transport::{Capabilities, TransportHarness};

/// Partitions of every test topic: more than one, so that groups share work and order
/// is only per key.
pub const PARTITIONS: i32 = 3;

/// The ack timeout the subscribers run with: short, so that redeliveries come fast.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The options every test client uses: the brokers of `ONCEBOX_KAFKA_BROKERS`, else
/// `127.0.0.1:9092`.
///
/// tansu answers a JoinGroup after half the session timeout (librdkafka's default of
/// 45 s makes every assignment take 23 s), so the tests run with 6 s, and heartbeats
/// every second so that members notice a rebalance quickly.
pub fn options() -> KafkaOptions {
    KafkaOptions::from_env()
        .client_id("oncebox-kafka-tests")
        .ack_timeout(ACK_TIMEOUT)
        .commit_interval(Duration::from_millis(200))
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
}

/// A name no other test (or run) uses.
pub fn unique(label: &str) -> String {
    format!("oncebox-{label}-{}", MessageId::new())
}

/// Completes once a subscriber's consumer is closed.
type Closed = Pin<Box<dyn Future<Output = ()> + Send>>;

pub struct KafkaHarness {
    pub options: KafkaOptions,
    pub admin: KafkaAdmin,
    created: Mutex<Vec<String>>,
    subscribers: Mutex<Vec<Closed>>,
}

impl KafkaHarness {
    pub fn new() -> Self {
        Self::with_options(options())
    }

    pub fn with_options(options: KafkaOptions) -> Self {
        Self {
            admin: KafkaAdmin::new(options.clone()).expect("valid options"),
            options,
            created: Mutex::new(Vec::new()),
            subscribers: Mutex::new(Vec::new()),
        }
    }

    /// Creates `topic` and its dead-letter topic, to be deleted by `cleanup`.
    pub async fn create(&self, topic: &str) -> Result<()> {
        let dead_letters = self.options.dead_letter_topic_for(topic);
        for name in [topic, dead_letters.as_str()] {
            self.admin.create_topic(name, PARTITIONS, 1).await?;
            self.created.lock().expect("lock").push(name.to_owned());
        }
        Ok(())
    }

    /// Deletes the topics this harness created (best effort), once every subscriber it
    /// made is closed: a consumer still fetching from a topic being deleted trips a
    /// librdkafka 2.12 crash on tansu's answer (see the crate's report).
    pub async fn cleanup(&self) {
        let closing = std::mem::take(&mut *self.subscribers.lock().expect("lock"));
        if tokio::time::timeout(Duration::from_secs(60), futures_join_all(closing))
            .await
            .is_err()
        {
            eprintln!("subscribers still open after 60 s; test topics left in place");
            return;
        }
        let created = std::mem::take(&mut *self.created.lock().expect("lock"));
        let names: Vec<&str> = created.iter().map(String::as_str).collect();
        if let Err(error) = self.admin.delete_topics(&names).await {
            eprintln!("could not delete test topics {names:?}: {error}");
        }
    }
}

impl TransportHarness for KafkaHarness {
    type Publisher = KafkaPublisher;
    type Subscriber = KafkaSubscriber;

    fn capabilities(&self) -> Capabilities {
        // delivery_count: Kafka keeps no count across consumers (the subscriber counts
        // its own redeliveries only); restart: tansu's in-memory storage does not
        // survive one.
        Capabilities::new()
            .per_key_order(true)
            .consumer_groups(true)
            .dead_letter_inspection(true)
            .nack_delay(true)
            .retained_log(true)
    }

    fn ack_timeout(&self) -> Duration {
        ACK_TIMEOUT
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(10)
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        let topic = unique(label);
        self.create(&topic).await?;
        Ok(topic)
    }

    async fn publisher(&self) -> Result<KafkaPublisher> {
        KafkaPublisher::connect(self.options.clone()).await
    }

    async fn subscriber(&self, topic: &str, group: &str) -> Result<KafkaSubscriber> {
        let subscriber = KafkaSubscriber::subscribe(self.options.clone(), topic, group).await?;
        // Ready when it returns: the first assignment takes ~3 s (the group's initial
        // rebalance delay), more when other members rebalance.
        subscriber
            .wait_for_assignment(Duration::from_secs(60))
            .await?;
        self.subscribers
            .lock()
            .expect("lock")
            .push(Box::pin(subscriber.closed()));
        Ok(subscriber)
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        let letters = self
            .admin
            .dead_letters(
                &self.options.dead_letter_topic_for(topic),
                Duration::from_secs(10),
            )
            .await?;
        Ok(letters
            .into_iter()
            .map(|letter| (letter.received, letter.reason))
            .collect())
    }
}

/// Awaits every future (the tests have no futures-util of their own).
async fn futures_join_all(futures: Vec<Closed>) {
    for future in futures {
        future.await;
    }
}
