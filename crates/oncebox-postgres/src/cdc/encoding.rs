//! The content of an outbox message written as a logical decoding message.
//!
//! ```text
//! byte 0          the encoding's version: 1
//! bytes 1..5      n, the length of the metadata: unsigned 32-bit, big-endian
//! bytes 5..5+n    the metadata: a JSON object in UTF-8
//! bytes 5+n..     the payload, as is
//! ```
//!
//! The metadata's members: `id` (a UUID, required), `topic` (a non-empty string,
//! required), `key` (a string or null), `kind` (a string, default empty), `headers` (an
//! object of strings, default empty) and `created_at` (an RFC 3339 timestamp; default: the
//! commit time of the transaction that emitted the message). Other members are ignored,
//! so later versions can add some without breaking older relays.

use std::time::SystemTime;

use bytes::Bytes;
use oncebox_core::{Headers, Message, MessageId};
use serde::{Deserialize, Serialize};

/// The version byte this relay writes and reads.
pub const VERSION: u8 = 1;

/// Why the content of a logical decoding message is not an outbox message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an oncebox message (encoding version {VERSION}): {0}")]
pub struct EncodingError(String);

#[derive(Serialize)]
struct MetaOut<'a> {
    id: &'a uuid::Uuid,
    topic: &'a str,
    key: Option<&'a str>,
    kind: &'a str,
    headers: &'a Headers,
    created_at: String,
}

#[derive(Deserialize)]
struct MetaIn {
    id: String,
    topic: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    headers: Headers,
    #[serde(default)]
    created_at: Option<String>,
}

/// Encodes `message`, with `headers` for its own (the enqueue adds the trace context),
/// as the content of a logical decoding message.
pub fn encode(message: &Message, headers: &Headers) -> Vec<u8> {
    let created_at = jiff::Timestamp::try_from(message.created_at)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string();
    let meta = MetaOut {
        id: message.id.as_uuid(),
        topic: &message.topic,
        key: message.key.as_deref(),
        kind: &message.kind,
        headers,
        created_at,
    };
    // A struct of strings and a map of strings always serializes.
    let meta = serde_json::to_vec(&meta).unwrap_or_default();
    let mut content = Vec::with_capacity(5 + meta.len() + message.payload.len());
    content.push(VERSION);
    content.extend_from_slice(&u32::try_from(meta.len()).unwrap_or(u32::MAX).to_be_bytes());
    content.extend_from_slice(&meta);
    content.extend_from_slice(&message.payload);
    content
}

/// Decodes the content of a logical decoding message; `committed_at` stands in for a
/// missing `created_at`.
pub fn decode(content: &Bytes, committed_at: SystemTime) -> Result<Message, EncodingError> {
    let fail = |reason: String| EncodingError(reason);
    let (&version, rest) = content
        .split_first()
        .ok_or_else(|| fail("the content is empty".into()))?;
    if version != VERSION {
        return Err(fail(format!("version byte {version}")));
    }
    let Some((length, _)) = rest.split_first_chunk::<4>() else {
        return Err(fail("the metadata length is cut short".into()));
    };
    let length = u32::from_be_bytes(*length) as usize;
    let meta_end = 5usize
        .checked_add(length)
        .filter(|end| *end <= content.len())
        .ok_or_else(|| {
            fail(format!(
                "the metadata length {length} runs past the content's {} bytes",
                content.len()
            ))
        })?;
    let meta: MetaIn = serde_json::from_slice(&content[5..meta_end])
        .map_err(|error| fail(format!("the metadata is not valid: {error}")))?;
    let id = MessageId::parse(&meta.id).map_err(|error| fail(error.to_string()))?;
    if meta.topic.is_empty() {
        return Err(fail("the topic is empty".into()));
    }
    meta.headers
        .validate()
        .and_then(|()| oncebox_core::wire::check_headers(&meta.headers))
        .map_err(|error| fail(error.to_string()))?;
    let created_at = match meta.created_at {
        None => committed_at,
        Some(text) => text
            .parse::<jiff::Timestamp>()
            .map_err(|error| fail(format!("created_at {text:?}: {error}")))?
            .into(),
    };
    let mut message = Message::new(meta.topic, content.slice(meta_end..)).with_id(id);
    message.key = meta.key;
    message.kind = meta.kind;
    message.headers = meta.headers;
    message.created_at = created_at;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_message_survives_the_round_trip() {
        let message = Message::new("orders", &b"\x00binary\xff"[..])
            .with_key("order-7")
            .with_kind("OrderPlaced")
            .with_header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .expect("a valid header");
        let decoded = decode(
            &Bytes::from(encode(&message, &message.headers)),
            SystemTime::UNIX_EPOCH,
        )
        .expect("decodes");
        assert_eq!(decoded.id, message.id);
        assert_eq!(decoded.topic, "orders");
        assert_eq!(decoded.key.as_deref(), Some("order-7"));
        assert_eq!(decoded.kind, "OrderPlaced");
        assert_eq!(decoded.headers, message.headers);
        assert_eq!(decoded.payload, message.payload);
        let drift = decoded
            .created_at
            .duration_since(message.created_at)
            .unwrap_or_else(|e| e.duration());
        assert!(drift < Duration::from_micros(1), "{drift:?}");
    }

    #[test]
    fn only_id_and_topic_are_required() {
        let meta = br#"{"id":"0193a0c4-5b1e-7c6f-8d2a-1f0e9b8c7d6e","topic":"t"}"#;
        let mut content = vec![VERSION];
        content.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        content.extend_from_slice(meta);
        content.extend_from_slice(b"body");
        let committed = SystemTime::UNIX_EPOCH + Duration::from_secs(7);
        let message = decode(&Bytes::from(content), committed).expect("decodes");
        assert_eq!((message.key, message.kind.as_str()), (None, ""));
        assert_eq!(
            (message.created_at, &message.payload[..]),
            (committed, &b"body"[..])
        );
    }

    #[test]
    fn bad_content_is_refused_with_its_reason() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "empty"),
            (b"\x02\x00\x00\x00\x00", "version byte 2"),
            (b"\x01\x00\x00", "cut short"),
            (b"\x01\x00\x00\x00\x09{}", "runs past"),
            (b"\x01\x00\x00\x00\x02{}", "missing field"),
            (
                b"\x01\x00\x00\x00\x16{\"id\":\"x\",\"topic\":\"t\"}",
                "UUID",
            ),
            // Emitted by SQL: a header that would replace the message's id on the wire.
            (
                b"\x01\x00\x00\x00\x51{\"id\":\"0193a0c4-5b1e-7c6f-8d2a-1f0e9b8c7d6e\",\"topic\":\"t\",\"headers\":{\"ce_id\":\"x\"}}",
                "reserved",
            ),
        ];
        for (content, reason) in cases {
            let error = decode(&Bytes::copy_from_slice(content), SystemTime::UNIX_EPOCH)
                .expect_err("refused");
            assert!(error.to_string().contains(reason), "{content:?}: {error}");
        }
    }
}
