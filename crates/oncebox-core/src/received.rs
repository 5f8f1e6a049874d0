//! A message as a consumer receives it.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;

use crate::{Headers, Message, MessageId};

/// Where a delivery sits in its broker: topic or stream, partition, offset or sequence.
///
/// Used by the [`IdStrategy::Coordinates`](crate::consumer::IdStrategy::Coordinates) id
/// strategy for producers that put no id on their messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Coordinates {
    /// Topic, stream or queue name.
    pub source: String,
    /// Partition, if the broker has partitions.
    pub partition: Option<i32>,
    /// Offset, sequence number or stream entry id within the source (or partition).
    pub position: String,
}

impl fmt::Display for Coordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.partition {
            Some(p) => write!(f, "{}/{}/{}", self.source, p, self.position),
            None => write!(f, "{}/{}", self.source, self.position),
        }
    }
}

/// A message as received from a broker.
///
/// Unlike [`Message`], the id is optional: a message from a producer that does not use
/// oncebox may carry none, and then an [`IdStrategy`](crate::consumer::IdStrategy) finds
/// another identity for it (a header, a content hash, the broker coordinates).
#[derive(Clone, PartialEq, Eq)]
pub struct Received {
    /// The id the producer gave the message, if it carried one.
    pub id: Option<MessageId>,
    /// Topic (or subject, routing key, stream) it arrived on.
    pub topic: String,
    /// Ordering key, if the message carried one.
    pub key: Option<String>,
    /// Event type; empty if unknown.
    pub kind: String,
    /// Headers, without the ones the transport used to carry the fields above.
    pub headers: Headers,
    /// The body.
    pub payload: Bytes,
    /// When the producer created the message, if known.
    pub created_at: Option<SystemTime>,
    /// Where the broker keeps this delivery.
    pub coordinates: Coordinates,
    /// How many times the broker has delivered this message, this delivery included
    /// (1 on first delivery). Transports that cannot tell report 1.
    pub delivery_count: u32,
}

impl Received {
    /// A received copy of `message` as a transport that carries oncebox's wire format
    /// delivers it.
    pub fn from_message(message: &Message, coordinates: Coordinates, delivery_count: u32) -> Self {
        Self {
            id: Some(message.id),
            topic: message.topic.clone(),
            key: message.key.clone(),
            kind: message.kind.clone(),
            headers: message.headers.clone(),
            payload: message.payload.clone(),
            created_at: Some(message.created_at),
            coordinates,
            delivery_count,
        }
    }

    /// Decodes the payload as JSON.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Json`](crate::InvalidMessage::Json) if the payload is not valid
    /// JSON for `T`.
    pub fn payload_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::InvalidMessage> {
        Ok(serde_json::from_slice(&self.payload)?)
    }
}

impl fmt::Debug for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Received")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("headers", &self.headers)
            .field("payload_len", &self.payload.len())
            .field("coordinates", &self.coordinates)
            .field("delivery_count", &self.delivery_count)
            .finish_non_exhaustive()
    }
}
