//! [`KafkaPublisher`]: an idempotent producer that returns after the delivery report.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use oncebox_core::{Error, Message, Publisher, Result};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::KafkaOptions;
use crate::context::LoggingContext;
use crate::error::{KafkaTransportError, config_error, is_too_large, is_unknown_topic};

/// The producer type both the publisher and the dead-letter writers use.
pub(crate) type KafkaProducer = FutureProducer<LoggingContext>;

/// Publishes to Kafka with the idempotent producer. Cheap to clone; clones share one
/// producer (one librdkafka client, its threads and connections).
///
/// - **Confirmed**: [`publish`](Publisher::publish) returns once the delivery report
///   arrived, that is once every in-sync replica has the message (`acks=all`).
/// - **Batched and pipelined**: concurrent publishes share batches (`linger.ms`, 5 ms by
///   default) and up to 5 requests per broker are in flight, so throughput is not one
///   round trip per message. The relay publishes many keys concurrently.
/// - **Ordered per key**: the key picks the partition (murmur2, as the Java client), and
///   the idempotent producer (`enable.idempotence=true`) keeps the order of a partition
///   and drops the duplicates its own retries would cause, up to 5 requests in flight.
/// - **Identified**: the message id travels as the CloudEvents `ce_id` header (see the
///   crate's wire format table), so consumers deduplicate across relay retries.
///
/// A fatal error of the idempotent producer (librdkafka gives up on the producer, after
/// which every publish fails) is answered by creating a new producer; the publish that
/// met it fails transiently and the relay publishes it again.
#[derive(Clone)]
pub struct KafkaPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    options: KafkaOptions,
    current: RwLock<Current>,
}

/// The producer in use, and how many were created before it.
struct Current {
    generation: u64,
    producer: KafkaProducer,
}

impl KafkaPublisher {
    /// Creates the producer and checks that the brokers answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that fail [`KafkaOptions::validate`] or
    /// that librdkafka refuses; a transient transport error
    /// ([`KafkaTransportError::Unreachable`], naming the broker list and librdkafka's
    /// last error, such as a host name that does not resolve) when no broker answers
    /// within [`KafkaOptions::connect_timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the new producer.
    pub async fn connect(options: KafkaOptions) -> Result<Self> {
        options.validate()?;
        let context = LoggingContext::default();
        let producer = create_producer(&options, context.clone())?;
        check_reachable(&options, producer.clone(), context).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                options,
                current: RwLock::new(Current {
                    generation: 0,
                    producer,
                }),
            }),
        })
    }

    /// The options this publisher was created with.
    pub fn options(&self) -> &KafkaOptions {
        &self.inner.options
    }

    /// Waits until every message handed to the producer so far has its delivery report,
    /// for at most `timeout` (useful before a process exits: messages whose publish
    /// future was dropped are still sent).
    ///
    /// # Errors
    ///
    /// A transient transport error if some messages are still waiting after `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the flush goes on in a blocking thread until it ends.
    pub async fn flush(&self, timeout: Duration) -> Result<()> {
        let producer = self.producer().1;
        tokio::task::spawn_blocking(move || producer.flush(Timeout::After(timeout)))
            .await
            .map_err(|joined| Error::transport_transient(joined.to_string()))?
            .map_err(|error| KafkaTransportError::client("flushing the producer", error).into())
    }

    fn producer(&self) -> (u64, KafkaProducer) {
        let current = self
            .inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        (current.generation, current.producer.clone())
    }

    /// Replaces producer `generation` after a fatal error (unless another publish
    /// already did).
    fn replace(&self, generation: u64, producer: &KafkaProducer) {
        let Some((code, reason)) = producer.client().fatal_error() else {
            return;
        };
        let mut current = self
            .inner
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if current.generation != generation {
            return;
        }
        match create_producer(&self.inner.options, LoggingContext::default()) {
            Ok(fresh) => {
                tracing::error!(%code, reason, "the Kafka producer failed fatally; created a new one");
                current.generation += 1;
                current.producer = fresh;
            }
            Err(error) => {
                tracing::error!(%code, reason, %error, "the Kafka producer failed fatally and cannot be replaced");
            }
        }
    }
}

impl Publisher for KafkaPublisher {
    /// Sends `message` to its topic, keyed by [`Message::key`], with the wire format's
    /// headers, and waits for the delivery report.
    ///
    /// # Errors
    ///
    /// - permanent: [`KafkaTransportError::MessageTooLarge`] (over
    ///   [`KafkaOptions::max_message_bytes`], checked before sending) or
    ///   [`KafkaTransportError::RefusedAsTooLarge`] (the broker's or topic's limit), and
    ///   other refusals of the record itself;
    /// - transient: [`KafkaTransportError::UnknownTopic`] (a configuration mistake must
    ///   not dead-letter the outbox: the relay retries until the topic exists), no
    ///   delivery report within [`KafkaOptions::publish_timeout`] (brokers unreachable),
    ///   and every other broker error.
    ///
    /// # Cancel safety
    ///
    /// Once the future ran, the message is in librdkafka's queue: dropping the future
    /// does not take it back, so it may be published (the relay then publishes it
    /// again, and consumers deduplicate by its id).
    async fn publish(&self, message: &Message) -> Result<()> {
        let options = &self.inner.options;
        let fields = options.wire.encode(message);
        let key = message.key.as_deref().map(str::as_bytes);
        let size = message_size(key, &message.payload, &fields);
        if size > options.max_message_bytes {
            return Err(KafkaTransportError::MessageTooLarge {
                size,
                limit: options.max_message_bytes,
            }
            .into());
        }
        let headers = fields.iter().fold(
            OwnedHeaders::new_with_capacity(fields.len()),
            |headers, (name, value)| {
                headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                })
            },
        );
        let mut record = FutureRecord::to(&message.topic)
            .payload(&message.payload[..])
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        let (generation, producer) = self.producer();
        // A full local queue waits (up to the publish timeout) rather than fail.
        match producer
            .send(record, Timeout::After(options.publish_timeout))
            .await
        {
            Ok(_) => Ok(()),
            Err((error, _unsent)) => {
                let Some(code) = error.rdkafka_error_code() else {
                    return Err(publish_error(&message.topic, error));
                };
                if is_too_large(code) {
                    return Err(KafkaTransportError::RefusedAsTooLarge {
                        topic: message.topic.clone(),
                        size,
                        limit: options.max_message_bytes,
                        code,
                    }
                    .into());
                }
                if is_unknown_topic(code) {
                    return Err(KafkaTransportError::UnknownTopic {
                        topic: message.topic.clone(),
                        brokers: options.brokers.clone(),
                        code,
                    }
                    .into());
                }
                if code == RDKafkaErrorCode::MessageTimedOut
                    && topic_is_missing(&producer, &message.topic).await
                {
                    // librdkafka holds messages for a topic it cannot find until they
                    // time out; say why.
                    return Err(KafkaTransportError::UnknownTopic {
                        topic: message.topic.clone(),
                        brokers: options.brokers.clone(),
                        code: RDKafkaErrorCode::UnknownTopicOrPartition,
                    }
                    .into());
                }
                self.replace(generation, &producer);
                Err(publish_error(&message.topic, error))
            }
        }
    }

    fn messaging_system(&self) -> &'static str {
        "kafka"
    }
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("brokers", &self.inner.options.brokers)
            .finish_non_exhaustive()
    }
}

fn publish_error(topic: &str, error: rdkafka::error::KafkaError) -> Error {
    KafkaTransportError::client(format!("publish to {topic:?}"), error).into()
}

/// The size the producer limit is checked against: key, payload, header names and values.
pub(crate) fn message_size(
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(String, String)],
) -> usize {
    key.map_or(0, <[u8]>::len)
        + payload.len()
        + headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

/// Whether the brokers say `topic` does not exist (asked after a publish timed out).
async fn topic_is_missing(producer: &KafkaProducer, topic: &str) -> bool {
    let producer = producer.clone();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(Some(&topic), Timeout::After(Duration::from_secs(2)))
            .is_ok_and(|metadata| {
                metadata.topics().iter().any(|found| {
                    found.name() == topic
                        && found
                            .error()
                            .is_some_and(|error| is_unknown_topic(RDKafkaErrorCode::from(error)))
                })
            })
    })
    .await
    .unwrap_or(false)
}

/// A producer with the options' configuration.
pub(crate) fn create_producer(
    options: &KafkaOptions,
    context: LoggingContext,
) -> Result<KafkaProducer> {
    options
        .producer_config()
        .create_with_context(context)
        .map_err(config_error)
}

/// Fetches the cluster's metadata to check that a broker answers.
async fn check_reachable(
    options: &KafkaOptions,
    producer: KafkaProducer,
    context: LoggingContext,
) -> Result<()> {
    let waited = options.connect_timeout;
    let fetched = tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(None, Timeout::After(waited))
            .map(drop)
            .map_err(|error| context.last_error().unwrap_or_else(|| error.to_string()))
    })
    .await
    .map_err(|joined| Error::transport_transient(joined.to_string()))?;
    fetched.map_err(|cause| {
        KafkaTransportError::Unreachable {
            brokers: options.brokers.clone(),
            waited,
            cause,
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_counts_key_payload_and_headers() {
        let headers = vec![("ce_id".to_owned(), "abc".to_owned())];
        assert_eq!(message_size(Some(b"k1"), b"12345", &headers), 2 + 5 + 8);
        assert_eq!(message_size(None, b"", &[]), 0);
    }
}
