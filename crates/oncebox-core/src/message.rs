//! The outgoing message and its id.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use bytes::Bytes;
use uuid::Uuid;

use crate::Headers;
use crate::error::{InvalidMessage, excerpt};

/// The id of a message: a UUID, version 7 (time-ordered) unless the producer chose one.
///
/// The id is what consumers deduplicate on, so a producer that retries the same logical
/// message must reuse its id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(Uuid);

impl MessageId {
    /// A new time-ordered id (UUIDv7).
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps an existing UUID.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID inside.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// Parses an id received from the wire or a database.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidId`] if `input` is not a UUID in any of its usual text
    /// forms.
    pub fn parse(input: &str) -> Result<Self, InvalidMessage> {
        Uuid::try_parse(input)
            .map(Self)
            .map_err(|_| InvalidMessage::InvalidId {
                input: excerpt(input),
            })
    }

    /// Parses an id from raw header bytes.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidId`] if the bytes are not the text of a UUID.
    pub fn parse_bytes(input: &[u8]) -> Result<Self, InvalidMessage> {
        match std::str::from_utf8(input) {
            Ok(text) => Self::parse(text),
            Err(_) => Err(InvalidMessage::InvalidId {
                input: excerpt(&String::from_utf8_lossy(input)),
            }),
        }
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl FromStr for MessageId {
    type Err = InvalidMessage;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({})", self.0.hyphenated())
    }
}

impl serde::Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MessageId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A message to publish: what a producer enqueues in the outbox and a relay hands to the
/// broker.
///
/// Build one with [`Message::new`] or [`Message::json`] and the `with_*` methods. It is
/// plain data; [`Message::validate`] checks it against [`Limits`], and every store does so
/// at enqueue. `Debug` prints the payload's size, never its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    /// Unique id; consumers deduplicate on it.
    pub id: MessageId,
    /// Where the message goes: a Kafka topic, a NATS subject, a RabbitMQ routing key, a
    /// Redis stream.
    pub topic: String,
    /// The ordering key (aggregate id). Messages with the same key are published in the
    /// order they were committed; messages without a key are not ordered.
    pub key: Option<String>,
    /// The event type, such as `OrderPlaced`.
    pub kind: String,
    /// Trace context, correlation ids and other metadata.
    pub headers: Headers,
    /// The body.
    pub payload: Bytes,
    /// When the message was created.
    pub created_at: SystemTime,
}

impl Message {
    /// A message with a new id, no key, no kind and no headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            id: MessageId::new(),
            topic: topic.into(),
            key: None,
            kind: String::new(),
            headers: Headers::new(),
            payload: payload.into(),
            created_at: SystemTime::now(),
        }
    }

    /// A message whose payload is `value` as JSON, with the header
    /// [`content-type`](crate::wire::CONTENT_TYPE)`: application/json`, which every
    /// transport writes as CloudEvents' `datacontenttype` in its binding's form.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Json`] if `value` cannot be serialized.
    pub fn json<T: serde::Serialize + ?Sized>(
        topic: impl Into<String>,
        value: &T,
    ) -> Result<Self, InvalidMessage> {
        let mut message = Self::new(topic, serde_json::to_vec(value)?);
        message
            .headers
            .insert(crate::wire::CONTENT_TYPE, crate::wire::JSON)?;
        Ok(message)
    }

    /// Sets the id (for producers that derive ids from their own data).
    #[must_use]
    pub fn with_id(mut self, id: MessageId) -> Self {
        self.id = id;
        self
    }

    /// Sets the ordering key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the event type.
    #[must_use]
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Adds a header.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidHeader`] if the name or value is not acceptable.
    pub fn with_header(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, InvalidMessage> {
        self.headers.insert(name, value)?;
        Ok(self)
    }

    /// Decodes the payload as JSON.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Json`] if the payload is not valid JSON for `T`.
    pub fn payload_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, InvalidMessage> {
        Ok(serde_json::from_slice(&self.payload)?)
    }

    /// Checks the message against `limits`.
    ///
    /// # Errors
    ///
    /// The first rule the message breaks: empty or overlong topic, a control character
    /// in the topic, key or kind, payload over the limit, headers over their limit, an
    /// invalid header, a header named like a CloudEvents attribute
    /// ([`check_headers`](crate::wire::check_headers)).
    pub fn validate(&self, limits: &Limits) -> Result<(), InvalidMessage> {
        if self.topic.is_empty() {
            return Err(InvalidMessage::EmptyTopic);
        }
        // PostgreSQL's text cannot hold a NUL, and NATS headers (where the key and the
        // kind travel) no line break.
        const CONTROL: &str = "it contains a control character";
        if let Some(topic) = cut_if_control(&self.topic) {
            return Err(InvalidMessage::InvalidTopic {
                topic,
                reason: CONTROL,
            });
        }
        if let Some(key) = self.key.as_deref().and_then(cut_if_control) {
            return Err(InvalidMessage::InvalidKey {
                key,
                reason: CONTROL,
            });
        }
        if let Some(kind) = cut_if_control(&self.kind) {
            return Err(InvalidMessage::InvalidKind {
                kind,
                reason: CONTROL,
            });
        }
        if self.topic.len() > limits.max_topic_len {
            return Err(InvalidMessage::TopicTooLong {
                len: self.topic.len(),
                limit: limits.max_topic_len,
            });
        }
        if self.payload.len() > limits.max_payload_bytes {
            return Err(InvalidMessage::PayloadTooLarge {
                size: self.payload.len(),
                limit: limits.max_payload_bytes,
            });
        }
        let size = self.headers.size();
        if size > limits.max_header_bytes {
            return Err(InvalidMessage::HeadersTooLarge {
                size,
                limit: limits.max_header_bytes,
            });
        }
        self.headers.validate()?;
        crate::wire::check_headers(&self.headers)
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("headers", &self.headers)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

/// Size limits applied to messages at enqueue and on receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest payload accepted, in bytes. Default: 1 MiB (what most brokers accept by
    /// default).
    pub max_payload_bytes: usize,
    /// Longest topic accepted, in bytes. Default: 255.
    pub max_topic_len: usize,
    /// Largest sum of the headers' names and values accepted, in bytes. Default: 64 KiB,
    /// which leaves room for the CloudEvents attributes in every broker's header block
    /// (RabbitMQ's smallest frame is 128 KiB; NATS and Kafka count headers toward their
    /// 1 MiB message limit).
    pub max_header_bytes: usize,
}

impl Limits {
    /// The defaults.
    pub const fn new() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_topic_len: 255,
            max_header_bytes: 64 * 1024,
        }
    }

    /// Sets the largest payload accepted.
    #[must_use]
    pub const fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets the longest topic accepted.
    #[must_use]
    pub const fn max_topic_len(mut self, len: usize) -> Self {
        self.max_topic_len = len;
        self
    }

    /// Sets the largest sum of header names and values accepted.
    #[must_use]
    pub const fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes;
        self
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new()
    }
}

/// `value` cut to its first 64 characters, if it holds a control character (NUL among
/// them): what an error about it shows.
fn cut_if_control(value: &str) -> Option<String> {
    value
        .chars()
        .any(char::is_control)
        .then(|| value.chars().take(64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_time_ordered_and_round_trip() {
        let a = MessageId::new();
        let b = MessageId::new();
        assert!(a < b);
        assert_eq!(MessageId::parse(&a.to_string()).unwrap(), a);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<MessageId>(&json).unwrap(), a);
    }

    #[test]
    fn bad_ids_from_the_wire_are_typed_errors() {
        let err = MessageId::parse("order-42").unwrap_err();
        assert!(matches!(err, InvalidMessage::InvalidId { ref input } if input == "order-42"));
        assert!(MessageId::parse_bytes(&[0xff; 16]).is_err());
        assert!(MessageId::parse(&"x".repeat(10_000)).is_err());
        assert!(serde_json::from_str::<MessageId>("\"nope\"").is_err());
    }

    #[test]
    fn validation() {
        let limits = Limits::new().max_payload_bytes(4);
        assert!(Message::new("t", "1234").validate(&limits).is_ok());
        assert!(matches!(
            Message::new("t", "12345").validate(&limits),
            Err(InvalidMessage::PayloadTooLarge { size: 5, limit: 4 })
        ));
        assert!(matches!(
            Message::new("", "").validate(&limits),
            Err(InvalidMessage::EmptyTopic)
        ));
        assert!(Message::new("t".repeat(256), "").validate(&limits).is_err());
        for bad in ["or\0ders", "orders\n", "tab\there", "del\u{7f}", "c1\u{85}"] {
            assert!(
                matches!(
                    Message::new(bad, "").validate(&limits),
                    Err(InvalidMessage::InvalidTopic { ref topic, .. }) if topic == bad
                ),
                "{bad:?} was accepted as a topic"
            );
        }
        let long = format!("\0{}", "x".repeat(500));
        match Message::new(long, "").validate(&limits) {
            Err(InvalidMessage::InvalidTopic { topic, .. }) => {
                assert_eq!(topic.chars().count(), 64)
            }
            other => panic!("expected InvalidTopic, got {other:?}"),
        }
        // Any other character is a store's or a broker's to judge.
        assert!(
            Message::new("shop.orders/v1 ümlaut", "")
                .validate(&limits)
                .is_ok()
        );
    }

    #[test]
    fn json_helpers_and_debug() {
        let msg = Message::json("orders", &serde_json::json!({"card": "4111"})).unwrap();
        let value: serde_json::Value = msg.payload_json().unwrap();
        assert_eq!(value["card"], "4111");
        assert!(!format!("{msg:?}").contains("4111"));
        assert!(msg.payload_json::<u32>().is_err());
    }
}
