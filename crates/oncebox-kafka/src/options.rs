//! [`KafkaOptions`]: the brokers, and how the producer and the consumers behave.

use std::time::Duration;

use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, Result};
use rdkafka::ClientConfig;

/// The librdkafka settings the transport's guarantees rest on; [`KafkaOptions::set`]
/// refuses to change them.
const OWN_SETTINGS: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "transactional.id",
];

/// The environment variable [`KafkaOptions::from_env`] reads the broker list from.
pub const BROKERS_ENV: &str = "ONCEBOX_KAFKA_BROKERS";

/// The broker list when none is given: a local broker.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// The largest `max.in.flight.requests.per.connection` with which the idempotent
/// producer still keeps order.
pub const MAX_IN_FLIGHT_ORDERED: u32 = 5;

/// Where dead letters of a topic go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DeadLetterTopic {
    /// The topic's name with this suffix (`orders` → `orders.dlq`).
    Suffix(String),
    /// One topic for the dead letters of every topic.
    Fixed(String),
}

/// Settings of a Kafka [publisher](crate::KafkaPublisher) and its
/// [subscribers](crate::KafkaSubscriber).
///
/// ```
/// use std::time::Duration;
/// use oncebox_kafka::KafkaOptions;
///
/// let options = KafkaOptions::new("kafka-1:9092,kafka-2:9092")
///     .client_id("orders-relay")
///     .linger(Duration::from_millis(10))
///     .ack_timeout(Duration::from_secs(60))
///     .set("security.protocol", "ssl");
/// options.validate().unwrap();
/// ```
///
/// `Debug` prints the brokers and the transport's own settings, never the values given
/// to [`KafkaOptions::set`] (they may hold passwords).
#[derive(Clone)]
#[must_use]
pub struct KafkaOptions {
    pub(crate) brokers: String,
    pub(crate) client_id: String,
    pub(crate) wire: WireFormat,
    pub(crate) connect_timeout: Duration,
    pub(crate) publish_timeout: Duration,
    pub(crate) linger: Duration,
    pub(crate) max_in_flight: u32,
    pub(crate) max_message_bytes: usize,
    pub(crate) ack_timeout: Duration,
    dead_letter_topic: DeadLetterTopic,
    pub(crate) max_buffered: usize,
    pub(crate) commit_interval: Duration,
    extra: Vec<(String, String)>,
}

impl KafkaOptions {
    /// Options for the brokers `brokers` (librdkafka's `bootstrap.servers`: a
    /// comma-separated list of `host:port`); the other defaults are listed with each
    /// setter.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            client_id: "oncebox".to_owned(),
            wire: WireFormat::kafka(),
            connect_timeout: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(30),
            linger: Duration::from_millis(5),
            max_in_flight: MAX_IN_FLIGHT_ORDERED,
            max_message_bytes: 1_000_000,
            ack_timeout: Duration::from_secs(30),
            dead_letter_topic: DeadLetterTopic::Suffix(".dlq".to_owned()),
            max_buffered: 1000,
            commit_interval: Duration::from_secs(1),
            extra: Vec::new(),
        }
    }

    /// [`KafkaOptions::new`] with the brokers of [`BROKERS_ENV`]
    /// (`ONCEBOX_KAFKA_BROKERS`), else [`DEFAULT_BROKERS`].
    pub fn from_env() -> Self {
        Self::new(std::env::var(BROKERS_ENV).unwrap_or_else(|_| DEFAULT_BROKERS.to_owned()))
    }

    /// The `client.id` the brokers see in their logs and quotas. Default: `"oncebox"`.
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// The CloudEvents `source` written on every published message (see
    /// [`WireFormat::with_source`]). Default: `"oncebox"`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.wire = WireFormat::kafka().with_source(source.into());
        self
    }

    /// How long connecting may take before [`KafkaPublisher::connect`](crate::KafkaPublisher::connect)
    /// and [`KafkaSubscriber::subscribe`](crate::KafkaSubscriber::subscribe) give up.
    /// Default: 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a publish may wait for its delivery report, retries included
    /// (librdkafka's `message.timeout.ms`); after it the publish fails transiently.
    /// Default: 30 s.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How long the producer waits to fill a batch (`linger.ms`). Default: 5 ms.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Produce requests in flight per broker connection
    /// (`max.in.flight.requests.per.connection`), 1 to 5: the idempotent producer keeps
    /// per-partition order with up to 5. Default: 5.
    pub fn max_in_flight(mut self, requests: u32) -> Self {
        self.max_in_flight = requests;
        self
    }

    /// The largest message the producer sends (`message.max.bytes`); a larger one fails
    /// permanently. Counted as key + payload + header names and values. Keep it at or
    /// below the topic's `max.message.bytes`. Default: 1,000,000.
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// How long a subscriber waits for a delivery to be settled before it hands the
    /// message out again (Kafka has no ack timeout of its own: the subscriber keeps
    /// the deliveries it handed out). Default: 30 s.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// Dead letters of topic `T` go to topic `T` + `suffix`. Default: `".dlq"`.
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_topic = DeadLetterTopic::Suffix(suffix.into());
        self
    }

    /// Dead letters of every topic go to `topic` (their origin is in the
    /// `oncebox-dlq-topic` header).
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = DeadLetterTopic::Fixed(topic.into());
        self
    }

    /// How many records a subscriber holds (fetched, not yet settled) before it pauses
    /// fetching. Default: 1000.
    pub fn max_buffered(mut self, records: usize) -> Self {
        self.max_buffered = records;
        self
    }

    /// How often a subscriber commits the offsets it may commit
    /// (`auto.commit.interval.ms`); it also commits when it loses partitions and when
    /// it is dropped. Default: 1 s.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Sets any other librdkafka property on every client (TLS, SASL, timeouts...),
    /// such as `set("security.protocol", "sasl_ssl")`. Applied after the transport's
    /// defaults, so it overrides them, except the settings its guarantees rest on
    /// (`enable.idempotence`, `acks`, `enable.auto.offset.store`...), which
    /// [`KafkaOptions::validate`] refuses.
    pub fn set(mut self, property: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.push((property.into(), value.into()));
        self
    }

    /// The brokers, as given.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The wire format the publisher writes (with the configured `source`).
    pub fn wire_format(&self) -> &WireFormat {
        &self.wire
    }

    /// The topic dead letters of `topic` go to.
    pub fn dead_letter_topic_for(&self, topic: &str) -> String {
        match &self.dead_letter_topic {
            DeadLetterTopic::Suffix(suffix) => format!("{topic}{suffix}"),
            DeadLetterTopic::Fixed(fixed) => fixed.clone(),
        }
    }

    /// Checks the options for values that cannot work.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        let invalid = |what: String| Err(Error::InvalidOptions(what));
        validate_brokers(&self.brokers).map_err(Error::InvalidOptions)?;
        if self.client_id.is_empty() {
            return invalid("client_id must not be empty".to_owned());
        }
        if !(1..=MAX_IN_FLIGHT_ORDERED).contains(&self.max_in_flight) {
            return invalid(format!(
                "max_in_flight must be 1 to {MAX_IN_FLIGHT_ORDERED} (the idempotent producer keeps order only so), not {}",
                self.max_in_flight
            ));
        }
        if !(1000..=1_000_000_000).contains(&self.max_message_bytes) {
            return invalid(format!(
                "max_message_bytes must be 1000 to 1,000,000,000 (librdkafka's range), not {}",
                self.max_message_bytes
            ));
        }
        if self.publish_timeout < Duration::from_millis(1) || self.publish_timeout <= self.linger {
            return invalid("publish_timeout must be longer than linger".to_owned());
        }
        if self.linger > Duration::from_secs(900) {
            return invalid("linger must be at most 900 s".to_owned());
        }
        if self.connect_timeout.is_zero() {
            return invalid("connect_timeout must not be zero".to_owned());
        }
        if self.ack_timeout.is_zero() {
            return invalid("ack_timeout must not be zero".to_owned());
        }
        if self.commit_interval < Duration::from_millis(1) {
            return invalid("commit_interval must be at least 1 ms".to_owned());
        }
        if self.max_buffered == 0 {
            return invalid("max_buffered must be at least 1".to_owned());
        }
        match &self.dead_letter_topic {
            DeadLetterTopic::Suffix(suffix) if suffix.is_empty() => {
                return invalid("dead_letter_suffix must not be empty".to_owned());
            }
            DeadLetterTopic::Fixed(topic) if topic.is_empty() => {
                return invalid("dead_letter_topic must not be empty".to_owned());
            }
            _ => {}
        }
        if let Some((property, _)) = self
            .extra
            .iter()
            .find(|(property, _)| OWN_SETTINGS.contains(&property.as_str()))
        {
            return invalid(format!(
                "{property} is set by the transport itself and cannot be overridden"
            ));
        }
        Ok(())
    }

    /// The librdkafka configuration of the publisher's producer, also used for the
    /// subscribers' dead-letter producers: idempotent (`enable.idempotence=true`,
    /// `acks=all`), batching for [`linger`](KafkaOptions::linger) with
    /// [`max_in_flight`](KafkaOptions::max_in_flight) requests in flight, Java-compatible
    /// key partitioning (`murmur2_random`).
    ///
    /// Public so that benchmarks and tools can build a raw rdkafka producer with exactly
    /// the same settings.
    pub fn producer_config(&self) -> ClientConfig {
        let mut config = self.common_config();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "max.in.flight.requests.per.connection",
                self.max_in_flight.to_string(),
            )
            .set("linger.ms", millis(self.linger))
            .set("message.timeout.ms", millis(self.publish_timeout))
            .set("message.max.bytes", self.max_message_bytes.to_string())
            .set("partitioner", "murmur2_random");
        self.apply_extra(config)
    }

    /// The librdkafka configuration of a subscriber's consumer in `group`: offsets
    /// stored by the transport (`enable.auto.offset.store=false`) and committed in the
    /// background every [`commit_interval`](KafkaOptions::commit_interval), a new group
    /// starting at the earliest offset.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.common_config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.commit.interval.ms", millis(self.commit_interval))
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        self.apply_extra(config)
    }

    /// A configuration for administrative clients (topic creation, dead-letter reading).
    pub(crate) fn admin_config(&self) -> ClientConfig {
        self.apply_extra(self.common_config())
    }

    fn common_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("client.id", &self.client_id);
        config
    }

    fn apply_extra(&self, mut config: ClientConfig) -> ClientConfig {
        for (property, value) in &self.extra {
            config.set(property, value);
        }
        config
    }
}

impl Default for KafkaOptions {
    /// [`KafkaOptions::new`] for [`DEFAULT_BROKERS`].
    fn default() -> Self {
        Self::new(DEFAULT_BROKERS)
    }
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: Vec<&str> = self.extra.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("KafkaOptions")
            .field("brokers", &self.brokers)
            .field("client_id", &self.client_id)
            .field("source", &self.wire.source())
            .field("connect_timeout", &self.connect_timeout)
            .field("publish_timeout", &self.publish_timeout)
            .field("linger", &self.linger)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("ack_timeout", &self.ack_timeout)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("max_buffered", &self.max_buffered)
            .field("commit_interval", &self.commit_interval)
            .field("extra_properties", &extra)
            .finish()
    }
}

fn millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

/// Checks a `bootstrap.servers` list: non-empty entries of `[scheme://]host[:port]`.
fn validate_brokers(brokers: &str) -> Result<(), String> {
    if brokers.trim().is_empty() {
        return Err("the broker list is empty (expected host:port[,host:port...])".to_owned());
    }
    for entry in brokers.split(',') {
        let entry = entry.trim();
        let bad = |why: &str| Err(format!("broker {entry:?} in {brokers:?}: {why}"));
        if entry.is_empty() {
            return bad("empty entry (expected host:port[,host:port...])");
        }
        if entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad("contains whitespace");
        }
        let address = entry.split_once("://").map_or(entry, |(_, rest)| rest);
        let (host, port) = match address.rsplit_once(':') {
            // A bracketed IPv6 address without a port: `[::1]`.
            Some((host, _)) if address.ends_with(']') => (host, None),
            Some((host, port)) if !host.contains(':') || host.ends_with(']') => (host, Some(port)),
            _ => (address, None),
        };
        if host.is_empty() {
            return bad("no host");
        }
        if let Some(port) = port {
            match port.parse::<u16>() {
                Ok(0) | Err(_) => return bad("the port is not a number from 1 to 65535"),
                Ok(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        KafkaOptions::new("127.0.0.1:9092")
            .validate()
            .expect("valid");
        KafkaOptions::default().validate().expect("valid");
    }

    #[test]
    fn broker_lists() {
        for good in [
            "localhost:9092",
            "a:1,b:2",
            " a:9092 , b:9093 ",
            "kafka",
            "SSL://kafka:9093",
            "[::1]:9092",
            "[::1]",
        ] {
            assert!(validate_brokers(good).is_ok(), "{good}");
        }
        for bad in [
            "", " ", "a:9092,", "a:port", "a:0", "a:70000", ":9092", "a b:1",
        ] {
            let error = validate_brokers(bad).expect_err(bad);
            assert!(
                error.contains("broker") || error.contains("empty"),
                "{error}"
            );
        }
    }

    #[test]
    fn bad_values_are_named() {
        let error = KafkaOptions::new("k:9092")
            .max_in_flight(6)
            .validate()
            .expect_err("6 in flight");
        assert!(error.to_string().contains("max_in_flight"), "{error}");
        let error = KafkaOptions::new("k:9092")
            .set("enable.idempotence", "false")
            .validate()
            .expect_err("idempotence off");
        assert!(error.to_string().contains("enable.idempotence"), "{error}");
        let error = KafkaOptions::new("k:9092")
            .publish_timeout(Duration::from_millis(5))
            .validate()
            .expect_err("timeout below linger");
        assert!(error.to_string().contains("publish_timeout"), "{error}");
    }

    #[test]
    fn dead_letter_topics() {
        let options = KafkaOptions::new("k:9092");
        assert_eq!(options.dead_letter_topic_for("orders"), "orders.dlq");
        let options = options.dead_letter_topic("all-dead");
        assert_eq!(options.dead_letter_topic_for("orders"), "all-dead");
    }

    #[test]
    fn debug_hides_extra_values() {
        let options = KafkaOptions::new("k:9092").set("sasl.password", "hunter2");
        let debug = format!("{options:?}");
        assert!(
            debug.contains("sasl.password") && !debug.contains("hunter2"),
            "{debug}"
        );
    }

    #[test]
    fn producer_is_idempotent_and_batches() {
        let config = KafkaOptions::new("k:9092").producer_config();
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("linger.ms"), Some("5"));
        let config = KafkaOptions::new("k:9092").consumer_config("g");
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
    }
}
