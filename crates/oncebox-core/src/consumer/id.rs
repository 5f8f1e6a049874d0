//! Id strategies: which identity of a received message the consumer deduplicates on.

use sha2::{Digest, Sha256};

use crate::wire::kept_header_name;
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
    /// The id the producer set: the CloudEvents `id` attribute, which oncebox producers
    /// always set to a UUID and other producers to any non-empty text. The default.
    #[default]
    MessageId,
    /// The value of a header, such as `Idempotency-Key`. The CloudEvents id is a header
    /// too, under any of its bindings' names (`ce_id`, `ce-id`, `cloudEvents_id`,
    /// `cloudEvents:id`), whether or not it parsed as a UUID.
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
            Self::MessageId => cloudevents_id(received)?
                .ok_or_else(|| missing("the message carries no CloudEvents id attribute".into())),
            Self::Header(name) if is_cloudevents_id(name) => cloudevents_id(received)?
                .map(|id| format!("header:{id}"))
                .ok_or_else(|| missing(format!("no header {name:?}"))),
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

/// The CloudEvents id of `received`: the UUID the wire format parsed, or the text it kept
/// because it is not one (every non-empty string is a valid id). A UUID is written in
/// its hyphenated lower-case form, and text that parses as a UUID is never kept as text,
/// so the two kinds of id never collide.
///
/// # Errors
///
/// [`InvalidMessage::MissingId`] if the attribute is there but empty, which CloudEvents
/// forbids.
fn cloudevents_id(received: &Received) -> Result<Option<String>, InvalidMessage> {
    if let Some(id) = received.id {
        return Ok(Some(id.to_string()));
    }
    match received.headers.get(&kept_header_name("id")) {
        Some("") => Err(InvalidMessage::MissingId(
            "the message's CloudEvents id attribute is empty".into(),
        )),
        Some(id) => Ok(Some(id.to_owned())),
        None => Ok(None),
    }
}

/// Whether header `name` is the CloudEvents id in one of the bindings oncebox reads.
fn is_cloudevents_id(name: &str) -> bool {
    ["ce_id", "ce-id", "cloudEvents_id", "cloudEvents:id"].contains(&name)
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
        let error = IdStrategy::MessageId.id_of(&foreign).unwrap_err();
        assert_eq!(
            error.to_string(),
            InvalidMessage::MissingId("the message carries no CloudEvents id attribute".into())
                .to_string()
        );
    }

    /// A CloudEvents id that is not a UUID, as most producers write them, is the dedup
    /// id; an empty one is refused with a true reason.
    #[test]
    fn any_non_empty_cloudevents_id_is_the_message_id() {
        let decode = |id: &str| {
            crate::wire::WireFormat::kafka()
                .decode(
                    "orders",
                    [(&b"ce_id"[..], id.as_bytes())],
                    crate::Bytes::new(),
                    Coordinates::default(),
                    1,
                )
                .unwrap()
        };
        let foreign = decode("order-42-v1");
        assert_eq!(
            IdStrategy::MessageId.id_of(&foreign).unwrap(),
            "order-42-v1"
        );
        let uuid = decode("0193E0D4-8A5C-7D2E-9B1A-3F4E5D6C7B8A");
        assert_eq!(
            IdStrategy::MessageId.id_of(&uuid).unwrap(),
            "0193e0d4-8a5c-7d2e-9b1a-3f4e5d6c7b8a"
        );
        let empty = IdStrategy::MessageId.id_of(&decode("")).unwrap_err();
        assert!(empty.to_string().contains("is empty"), "{empty}");
    }

    /// `Header("ce_id")` (or another binding's name) finds the id whether or not it
    /// parsed as a UUID.
    #[test]
    fn the_cloudevents_id_header_reads_uuid_ids_too() {
        let r = received("{}");
        let uuid = r.id.unwrap().to_string();
        for name in ["ce_id", "ce-id", "cloudEvents_id", "cloudEvents:id"] {
            assert_eq!(
                IdStrategy::Header(name.into()).id_of(&r).unwrap(),
                format!("header:{uuid}")
            );
        }
        let mut foreign = Received { id: None, ..r };
        foreign.headers.insert("ce_id", "order-42-v1").unwrap();
        assert_eq!(
            IdStrategy::Header("ce_id".into()).id_of(&foreign).unwrap(),
            "header:order-42-v1"
        );
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
