//! [`KafkaAdmin`]: creating and deleting topics, reading dead letters.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Coordinates, Error, Received, Result};
use rdkafka::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Headers as _;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::util::Timeout;

use crate::KafkaOptions;
use crate::context::LoggingContext;
use crate::dead_letter;
use crate::error::{KafkaTransportError, config_error};

impl ConsumerContext for LoggingContext {}

/// A message found on a dead-letter topic.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message, decoded as a subscriber would have (the `oncebox-dlq-*` headers
    /// removed); for a record that could not be decoded, an empty message with its
    /// coordinates on the dead-letter topic.
    pub received: Received,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Where it came from: topic, partition, offset.
    pub origin: Coordinates,
    /// The consumer group that dead-lettered it.
    pub group: String,
}

/// Topic administration and dead-letter inspection, for tests, tools and deployments
/// that create their topics from code.
pub struct KafkaAdmin {
    options: KafkaOptions,
    client: Arc<AdminClient<LoggingContext>>,
}

impl KafkaAdmin {
    /// An admin client for the options' brokers (no connection is made until used).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that fail [`KafkaOptions::validate`] or
    /// that librdkafka refuses.
    pub fn new(options: KafkaOptions) -> Result<Self> {
        options.validate()?;
        let client = options
            .admin_config()
            .create_with_context(LoggingContext::default())
            .map_err(config_error)?;
        Ok(Self {
            options,
            client: Arc::new(client),
        })
    }

    /// Creates `topic` with `partitions` partitions and a replication factor of
    /// `replication`; a topic that exists already is left as it is.
    ///
    /// # Errors
    ///
    /// A transport error when the brokers refuse (a transient one when they cannot be
    /// reached within [`KafkaOptions::connect_timeout`]).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the topic created.
    pub async fn create_topic(&self, topic: &str, partitions: i32, replication: i32) -> Result<()> {
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        let results = self
            .client
            .create_topics([&new], &self.admin_options())
            .await
            .map_err(|error| {
                Error::from(KafkaTransportError::client(
                    format!("create topic {topic:?}"),
                    error,
                ))
            })?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(KafkaTransportError::client(
                        format!("create topic {name:?}"),
                        KafkaError::AdminOp(code),
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// The names of the topics the brokers hold, sorted, from the cluster's metadata
    /// (which creates nothing, whatever `auto.create.topics.enable` says).
    ///
    /// # Errors
    ///
    /// A transient transport error when no broker answers within
    /// [`KafkaOptions::connect_timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the request goes on in a blocking thread until it ends.
    pub async fn topics(&self) -> Result<Vec<String>> {
        let client = Arc::clone(&self.client);
        let waited = self.options.connect_timeout;
        let fetched = tokio::task::spawn_blocking(move || {
            let client = client.inner();
            client
                .fetch_metadata(None, Timeout::After(waited))
                .map(|metadata| {
                    let mut names: Vec<String> = metadata
                        .topics()
                        .iter()
                        .map(|topic| topic.name().to_owned())
                        .collect();
                    names.sort_unstable();
                    names
                })
                .map_err(|error| {
                    client
                        .context()
                        .last_error()
                        .unwrap_or_else(|| error.to_string())
                })
        })
        .await
        .map_err(|joined| Error::transport_transient(joined.to_string()))?;
        fetched.map_err(|cause| {
            KafkaTransportError::Unreachable {
                brokers: self.options.brokers.clone(),
                waited,
                cause,
            }
            .into()
        })
    }

    /// Deletes `topics`; those that do not exist are skipped.
    ///
    /// # Errors
    ///
    /// A transport error when the brokers refuse.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the topics deleted.
    pub async fn delete_topics(&self, topics: &[&str]) -> Result<()> {
        let results = self
            .client
            .delete_topics(topics, &self.admin_options())
            .await
            .map_err(|error| Error::from(KafkaTransportError::client("delete topics", error)))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((name, code)) => {
                    return Err(KafkaTransportError::client(
                        format!("delete topic {name:?}"),
                        KafkaError::AdminOp(code),
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Reads every dead letter on `dead_letter_topic` (see
    /// [`KafkaOptions::dead_letter_topic_for`]), from the start of each partition up to
    /// its end when called, in partition order.
    ///
    /// # Errors
    ///
    /// A transient transport error when the brokers cannot be reached or the topic is
    /// not read to its end within `timeout`. A topic that does not exist has no dead
    /// letters.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the read goes on in a blocking thread until it ends.
    pub async fn dead_letters(
        &self,
        dead_letter_topic: &str,
        timeout: Duration,
    ) -> Result<Vec<DeadLetter>> {
        let mut config = self.options.admin_config();
        // librdkafka assigns partitions only in a group; this one never joins nor
        // commits, so it leaves nothing on the brokers.
        config
            .set(
                "group.id",
                format!(
                    "oncebox-dead-letter-reader-{}",
                    oncebox_core::MessageId::new()
                ),
            )
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true");
        let topic = dead_letter_topic.to_owned();
        let brokers = self.options.brokers.clone();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer<LoggingContext> = config
                .create_with_context(LoggingContext::default())
                .map_err(config_error)?;
            read_dead_letters(&consumer, &topic, timeout).map_err(|cause| {
                Error::from(KafkaTransportError::Unreachable {
                    brokers,
                    waited: timeout,
                    cause,
                })
            })
        })
        .await
        .map_err(|joined| Error::transport_transient(joined.to_string()))?
    }

    fn admin_options(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(Timeout::After(self.options.connect_timeout)))
            .operation_timeout(Some(Timeout::After(self.options.connect_timeout)))
    }
}

impl fmt::Debug for KafkaAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaAdmin")
            .field("brokers", &self.options.brokers)
            .finish_non_exhaustive()
    }
}

/// Reads `topic` from the start of each partition to its end.
///
/// The end is where the broker reports end-of-partition, not the high watermark:
/// tansu 0.6 reports a high watermark short of the last batch's records.
fn read_dead_letters(
    consumer: &BaseConsumer<LoggingContext>,
    topic: &str,
    timeout: Duration,
) -> std::result::Result<Vec<DeadLetter>, String> {
    let deadline = std::time::Instant::now() + timeout;
    let metadata = consumer
        .fetch_metadata(Some(topic), Timeout::After(timeout))
        .map_err(|error| error.to_string())?;
    let Some(found) = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
    else {
        return Ok(Vec::new());
    };
    let mut assignment = TopicPartitionList::new();
    let mut open: HashSet<i32> = HashSet::new();
    for partition in found.partitions() {
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .map_err(|error| error.to_string())?;
        open.insert(partition.id());
    }
    consumer
        .assign(&assignment)
        .map_err(|error| error.to_string())?;
    let mut letters: Vec<(i32, i64, DeadLetter)> = Vec::new();
    while !open.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!(
                "read dead-letter topic {topic:?}: not at its end in time"
            ));
        }
        match consumer.poll(Timeout::After(left.min(Duration::from_millis(200)))) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                open.remove(&partition);
            }
            Some(Err(error)) => tracing::debug!(%error, topic, "reading dead letters"),
            Some(Ok(message)) => {
                letters.push((
                    message.partition(),
                    message.offset(),
                    dead_letter_of(&message),
                ));
            }
        }
    }
    letters.sort_by_key(|(partition, offset, _)| (*partition, *offset));
    Ok(letters.into_iter().map(|(_, _, letter)| letter).collect())
}

/// Decodes one dead-letter record.
fn dead_letter_of(message: &rdkafka::message::BorrowedMessage<'_>) -> DeadLetter {
    let coordinates = Coordinates {
        source: message.topic().to_owned(),
        partition: Some(message.partition()),
        position: message.offset().to_string(),
    };
    let payload = Bytes::copy_from_slice(message.payload().unwrap_or_default());
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let fields = message
            .headers()
            .into_iter()
            .flat_map(|headers| headers.iter())
            .map(|header| (header.key.as_bytes(), header.value.unwrap_or_default()));
        // The dead-letter headers themselves, read as bytes so that they are found even
        // when the rest does not decode.
        let mut added: HashMap<&'static str, String> = HashMap::new();
        let fields: Vec<(&[u8], &[u8])> = fields
            .filter(|(name, value)| {
                match dead_letter::ALL.iter().find(|own| own.as_bytes() == *name) {
                    Some(own) => {
                        added.insert(own, String::from_utf8_lossy(value).into_owned());
                        false
                    }
                    None => true,
                }
            })
            .collect();
        let received = WireFormat::kafka().decode(
            message.topic(),
            fields,
            payload.clone(),
            coordinates.clone(),
            1,
        );
        (received, added)
    }));
    let (received, mut added) = match decoded {
        Ok((received, added)) => (received.ok(), added),
        Err(_) => (None, HashMap::new()),
    };
    let mut take = |name: &str| added.remove(name).unwrap_or_default();
    let origin = Coordinates {
        source: take(dead_letter::TOPIC),
        partition: take(dead_letter::PARTITION).parse().ok(),
        position: take(dead_letter::OFFSET),
    };
    DeadLetter {
        received: received.unwrap_or_else(|| Received {
            id: None,
            topic: message.topic().to_owned(),
            key: None,
            kind: String::new(),
            headers: oncebox_core::Headers::new(),
            payload,
            created_at: None,
            coordinates,
            delivery_count: 1,
        }),
        reason: take(dead_letter::REASON),
        origin,
        group: take(dead_letter::GROUP),
    }
}
