//! What goes wrong with Kafka, and how it maps onto [`oncebox_core::Error`].
//!
//! The rule: an error is **permanent** only when the message itself can never be
//! accepted (too large, refused by the broker's record validation). Everything else is
//! **transient**, also the errors an operator fixes without touching the message: an
//! unknown topic, a missing ACL, brokers that cannot be reached. A permanent publish
//! error dead-letters the outbox row after one attempt, so a typo in a topic name or a
//! topic created a minute late must not be one: the relay retries with backoff, logs
//! the error with its cause, and carries on once the topic exists.

use oncebox_core::Error;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The errors of this crate. They reach callers as the source of an
/// [`Error::Transport`], whose [`Error::is_transient`] tells whether retrying may help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaTransportError {
    /// The message is larger than the producer's limit.
    #[error(
        "the message is {size} bytes (key + payload + headers), over the limit of {limit} bytes \
         (message.max.bytes, set with KafkaOptions::max_message_bytes)"
    )]
    MessageTooLarge {
        /// Size of the message in bytes.
        size: usize,
        /// The producer's limit.
        limit: usize,
    },

    /// The message was refused as too large: by librdkafka, counting the record's
    /// overhead against the producer's limit, or by the broker, against the topic's
    /// `max.message.bytes` or its own `message.max.bytes`.
    #[error(
        "the {size}-byte message (key + payload + headers) is too large for topic {topic:?}: \
         {code} (the producer's limit is {limit} bytes with record overhead; the broker \
         applies the topic's max.message.bytes)"
    )]
    RefusedAsTooLarge {
        /// The topic.
        topic: String,
        /// Size of the message in bytes (key + payload + headers).
        size: usize,
        /// The producer's limit (`message.max.bytes`).
        limit: usize,
        /// What the broker answered.
        code: RDKafkaErrorCode,
    },

    /// The topic does not exist (create it first; brokers with
    /// `auto.create.topics.enable` create it on first use).
    #[error("topic {topic:?} does not exist on the brokers {brokers}: create it first ({code})")]
    UnknownTopic {
        /// The topic.
        topic: String,
        /// The broker list used.
        brokers: String,
        /// What librdkafka reported.
        code: RDKafkaErrorCode,
    },

    /// No broker of the list answered in time.
    #[error("cannot reach the Kafka brokers {brokers} within {waited:?}: {cause}")]
    Unreachable {
        /// The broker list used.
        brokers: String,
        /// How long the client tried.
        waited: std::time::Duration,
        /// The last error librdkafka reported (a name that does not resolve, a refused
        /// connection), or the timeout.
        cause: String,
    },

    /// The broker refused a message or a request.
    #[error("{operation} failed: {source}")]
    Client {
        /// What the transport was doing: "publish to orders", "dead-letter to orders.dlq".
        operation: String,
        /// What librdkafka reported.
        #[source]
        source: KafkaError,
    },

    /// The client's configuration was refused by librdkafka.
    #[error("librdkafka refused the setting {property}: {reason}")]
    Config {
        /// The property.
        property: String,
        /// Why (the value is left out: it may be a password).
        reason: String,
    },

    /// The consumer stopped for good (a fatal librdkafka error); create a new subscriber.
    #[error("the Kafka consumer of group {group:?} stopped: {reason}")]
    ConsumerStopped {
        /// The consumer group.
        group: String,
        /// What stopped it.
        reason: String,
    },
}

impl KafkaTransportError {
    /// Whether retrying may succeed (see the module's rule).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::MessageTooLarge { .. } | Self::RefusedAsTooLarge { .. } | Self::Config { .. } => {
                false
            }
            Self::UnknownTopic { .. } | Self::Unreachable { .. } => true,
            Self::Client { source, .. } => {
                source.rdkafka_error_code().is_none_or(is_transient_code)
            }
            Self::ConsumerStopped { .. } => false,
        }
    }

    /// A client error while doing `operation`.
    pub(crate) fn client(operation: impl Into<String>, source: KafkaError) -> Self {
        Self::Client {
            operation: operation.into(),
            source,
        }
    }
}

impl From<KafkaTransportError> for Error {
    /// No broker answering is an outage (the relay hands its rows back without
    /// spending attempts); other errors are transient or permanent as
    /// [`KafkaTransportError::is_transient`] says.
    fn from(error: KafkaTransportError) -> Self {
        if matches!(error, KafkaTransportError::Unreachable { .. }) {
            Error::transport_outage(error)
        } else if error.is_transient() {
            Error::transport_transient(error)
        } else {
            Error::transport_permanent(error)
        }
    }
}

/// Whether an error code can clear without changing the message.
pub(crate) fn is_transient_code(code: RDKafkaErrorCode) -> bool {
    !matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTimestamp
            | RDKafkaErrorCode::UnsupportedForMessageFormat
            | RDKafkaErrorCode::KeySerialization
            | RDKafkaErrorCode::ValueSerialization
            | RDKafkaErrorCode::InvalidArgument
            | RDKafkaErrorCode::InvalidTopic
    )
}

/// Whether an error code says the message is too large.
pub(crate) fn is_too_large(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Whether an error code says the topic (or its partition) does not exist.
pub(crate) fn is_unknown_topic(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownPartition
    )
}

/// A configuration error, without the value (it may be a secret).
pub(crate) fn config_error(error: KafkaError) -> Error {
    match error {
        KafkaError::ClientConfig(_, reason, property, _value) => {
            Error::InvalidOptions(KafkaTransportError::Config { property, reason }.to_string())
        }
        other => KafkaTransportError::client("creating the Kafka client", other).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_message_itself_is_permanent() {
        let too_large = KafkaTransportError::MessageTooLarge {
            size: 2_000_000,
            limit: 1_000_000,
        };
        assert!(!too_large.is_transient());
        assert!(too_large.to_string().contains("1000000"));
        let unknown = KafkaTransportError::UnknownTopic {
            topic: "ordrs".into(),
            brokers: "k:9092".into(),
            code: RDKafkaErrorCode::UnknownTopicOrPartition,
        };
        assert!(Error::from(unknown).is_transient());
        let down = KafkaTransportError::client(
            "publish to orders",
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        );
        assert!(down.is_transient());
        let refused = KafkaTransportError::client(
            "publish to orders",
            KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord),
        );
        assert!(!Error::from(refused).is_transient());
    }

    #[test]
    fn config_errors_leave_the_value_out() {
        let error = config_error(KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value".into(),
            "sasl.password".into(),
            "hunter2".into(),
        ));
        let text = error.to_string();
        assert!(
            text.contains("sasl.password") && !text.contains("hunter2"),
            "{text}"
        );
        assert!(error.is_invalid_input());
    }
}
