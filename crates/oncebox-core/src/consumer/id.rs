//! Id strategies: which identity of a received message the consumer deduplicates on.

use sha2::{Digest, Sha256};

use crate::{InvalidMessage, Received};

/// How a consumer finds the dedup id of a received message.
///
/// ```
/// use oncebox_core::consumer::IdStrategy;
///
/// // Payment providers' retries carry the same request id header:
/// let by_header = IdStrategy::Header("PayPal-Request-Id".into());
/// // No id at all? The same order event for the same order is the same message:
/// let by_fields = IdStrategy::Composite(vec![
///     IdStrategy::Kind,
///     IdStrategy::JsonField("/order_id".into()),
/// ]);
/// # let _ = (by_header, by_fields);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdStrategy {
    /// The message id the producer set (oncebox producers always set one). The default.
    #[default]
    MessageId,
    /// The value of a header, such as `Idempotency-Key`.
    Header(String),
    /// SHA-256 of the payload: byte-identical payloads are the same message.
    ContentHash,
    /// A field of the JSON payload, named by a JSON pointer such as `/order_id`.
    JsonField(String),
    /// The event type (useful inside a [`Composite`](IdStrategy::Composite)).
    Kind,
    /// Where the broker keeps the message: topic, partition, offset or stream entry id.
    /// Only catches redeliveries of one broker entry, not a producer's resends.
    Coordinates,
    /// Several strategies together; the id holds every part.
    Composite(Vec<IdStrategy>),
}

impl IdStrategy {
    /// The dedup id of `received`.
    ///
    /// Ids of different strategies never collide: each but [`IdStrategy::MessageId`] is
    /// prefixed with its strategy.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::MissingId`] if the message lacks what the strategy reads (no
    /// message id, no such header, payload not JSON or without the field).
    pub fn id_of(&self, received: &Received) -> Result<String, InvalidMessage> {
        let missing = |what: String| InvalidMessage::MissingId(what);
        match self {
            Self::MessageId => received
                .id
                .map(|id| id.to_string())
                .ok_or_else(|| missing("the message carries no message id".into())),
            Self::Header(name) => received
                .headers
                .get(name)
                .filter(|v| !v.is_empty())
                .map(|v| format!("header:{v}"))
                .ok_or_else(|| missing(format!("no header {name:?}"))),
            Self::ContentHash => Ok(format!(
                "sha256:{}",
                hex(&Sha256::digest(&received.payload))
            )),
            Self::JsonField(pointer) => {
                let value: serde_json::Value = serde_json::from_slice(&received.payload)
                    .map_err(|_| missing(format!("payload is not JSON, so no field {pointer}")))?;
                match value.pointer(pointer) {
                    Some(serde_json::Value::String(s)) => Ok(format!("field:{s}")),
                    Some(serde_json::Value::Null) | None => {
                        Err(missing(format!("no field {pointer} in the payload")))
                    }
                    Some(other) => Ok(format!("field:{other}")),
                }
            }
            Self::Kind if received.kind.is_empty() => Err(missing("no event type".into())),
            Self::Kind => Ok(format!("kind:{}", received.kind)),
            Self::Coordinates => Ok(format!("at:{}", received.coordinates)),
            Self::Composite(parts) => {
                // Length-prefixed parts, so that ("a|b", "c") and ("a", "b|c") differ.
                let mut id = String::from("composite");
                for part in parts {
                    let value = part.id_of(received)?;
                    id.push_str(&format!(":{}:{value}", value.len()));
                }
                Ok(id)
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Coordinates, Message, MessageId};

    fn received(payload: &str) -> Received {
        let msg = Message::new("orders", payload.to_owned())
            .with_kind("OrderPlaced")
            .with_header("Idempotency-Key", "abc")
            .unwrap();
        let at = Coordinates {
            source: "orders".into(),
            partition: Some(2),
            position: "17".into(),
        };
        Received::from_message(&msg, at, 1)
    }

    #[test]
    fn message_id() {
        let r = received("{}");
        assert_eq!(
            IdStrategy::MessageId.id_of(&r).unwrap(),
            r.id.unwrap().to_string()
        );
        let foreign = Received { id: None, ..r };
        assert!(matches!(
            IdStrategy::MessageId.id_of(&foreign),
            Err(InvalidMessage::MissingId(_))
        ));
    }

    #[test]
    fn header() {
        let r = received("{}");
        assert_eq!(
            IdStrategy::Header("Idempotency-Key".into())
                .id_of(&r)
                .unwrap(),
            "header:abc"
        );
        assert!(IdStrategy::Header("X-Other".into()).id_of(&r).is_err());
    }

    #[test]
    fn content_hash_depends_on_payload_only() {
        let (a, b, c) = (received("same"), received("same"), received("other"));
        assert_ne!(a.id, b.id);
        let id = |r| IdStrategy::ContentHash.id_of(r).unwrap();
        assert_eq!(id(&a), id(&b));
        assert_ne!(id(&a), id(&c));
        assert_eq!(
            id(&received("")),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn json_field_and_composite() {
        let r = received(r#"{"order_id": "o-7", "n": 3}"#);
        assert_eq!(
            IdStrategy::JsonField("/order_id".into()).id_of(&r).unwrap(),
            "field:o-7"
        );
        assert_eq!(
            IdStrategy::JsonField("/n".into()).id_of(&r).unwrap(),
            "field:3"
        );
        assert!(IdStrategy::JsonField("/missing".into()).id_of(&r).is_err());
        assert!(
            IdStrategy::JsonField("/order_id".into())
                .id_of(&received("not json"))
                .is_err()
        );
        let both = IdStrategy::Composite(vec![
            IdStrategy::Kind,
            IdStrategy::JsonField("/order_id".into()),
        ]);
        assert_eq!(
            both.id_of(&r).unwrap(),
            "composite:16:kind:OrderPlaced:9:field:o-7"
        );
    }

    #[test]
    fn coordinates() {
        let r = received("{}");
        assert_eq!(IdStrategy::Coordinates.id_of(&r).unwrap(), "at:orders/2/17");
        let _ = MessageId::new();
    }
}
