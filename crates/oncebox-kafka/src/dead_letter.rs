//! Dead letters: a copy of the record, on the dead-letter topic, with why and where from.
//!
//! The copy keeps the record's key, value and headers byte for byte (so it can be
//! replayed as it was) and adds:
//!
//! | header | value |
//! |---|---|
//! | [`REASON`] `oncebox-dlq-reason` | why it was dead-lettered (cut to 4 KiB) |
//! | [`TOPIC`] `oncebox-dlq-topic` | the topic it came from |
//! | [`PARTITION`] `oncebox-dlq-partition` | its partition there |
//! | [`OFFSET`] `oncebox-dlq-offset` | its offset there |
//! | [`GROUP`] `oncebox-dlq-group` | the consumer group that gave up on it |

use oncebox_core::{Error, Result};
use rdkafka::message::Header;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;

use crate::KafkaOptions;
use crate::error::{KafkaTransportError, is_unknown_topic};
use crate::publisher::KafkaProducer;
use crate::subscriber::record::Record;

/// Header with the reason a message was dead-lettered.
pub const REASON: &str = "oncebox-dlq-reason";
/// Header with the topic a dead letter came from.
pub const TOPIC: &str = "oncebox-dlq-topic";
/// Header with the partition a dead letter came from.
pub const PARTITION: &str = "oncebox-dlq-partition";
/// Header with the offset a dead letter had.
pub const OFFSET: &str = "oncebox-dlq-offset";
/// Header with the consumer group that dead-lettered the message.
pub const GROUP: &str = "oncebox-dlq-group";

/// The headers this transport adds to a dead letter.
pub(crate) const ALL: [&str; 5] = [REASON, TOPIC, PARTITION, OFFSET, GROUP];

/// The longest reason kept, in bytes.
const MAX_REASON: usize = 4096;

/// Writes the dead letters of one subscriber.
pub(crate) struct DeadLetterWriter {
    producer: KafkaProducer,
    topic: String,
    dead_letter_topic: String,
    group: String,
    brokers: String,
    timeout: std::time::Duration,
}

impl DeadLetterWriter {
    pub(crate) fn new(
        producer: KafkaProducer,
        options: &KafkaOptions,
        topic: &str,
        group: &str,
    ) -> Self {
        Self {
            producer,
            topic: topic.to_owned(),
            dead_letter_topic: options.dead_letter_topic_for(topic),
            group: group.to_owned(),
            brokers: options.brokers.clone(),
            timeout: options.publish_timeout,
        }
    }

    /// The dead-letter topic.
    pub(crate) fn dead_letter_topic(&self) -> &str {
        &self.dead_letter_topic
    }

    /// Writes a copy of `record` with `reason` and waits for the delivery report.
    ///
    /// # Errors
    ///
    /// As [`KafkaPublisher::publish`](crate::KafkaPublisher): transient when the
    /// dead-letter topic does not exist or the brokers cannot be reached.
    pub(crate) async fn write(&self, record: &Record, reason: &str) -> Result<()> {
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        let reason = cut(reason, MAX_REASON);
        let added = [
            (REASON, reason),
            (TOPIC, self.topic.as_str()),
            (PARTITION, partition.as_str()),
            (OFFSET, offset.as_str()),
            (GROUP, self.group.as_str()),
        ];
        let headers = added.iter().fold(
            record.headers.clone().unwrap_or_default(),
            |headers, (name, value)| {
                headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                })
            },
        );
        let mut copy = FutureRecord::to(&self.dead_letter_topic)
            .payload(&record.payload[..])
            .headers(headers);
        if let Some(key) = &record.key {
            copy = copy.key(&key[..]);
        }
        match self.producer.send(copy, Timeout::After(self.timeout)).await {
            Ok(_) => Ok(()),
            Err((error, _)) => match error.rdkafka_error_code() {
                Some(code) if is_unknown_topic(code) => Err(KafkaTransportError::UnknownTopic {
                    topic: self.dead_letter_topic.clone(),
                    brokers: self.brokers.clone(),
                    code,
                }
                .into()),
                _ => Err(Error::from(KafkaTransportError::client(
                    format!("dead-letter to {:?}", self.dead_letter_topic),
                    error,
                ))),
            },
        }
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let end = (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_on_char_boundaries() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("ééé", 3), "é");
        assert_eq!(cut(&"x".repeat(5000), MAX_REASON).len(), MAX_REASON);
    }
}
