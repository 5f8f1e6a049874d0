//! Stream entries as Redis returns them, and their decoding into [`Received`].
//!
//! Replies are read from raw [`Value`]s rather than through typed conversions, so that a
//! field that is not UTF-8 or an entry without a `data` field is one bad entry (which the
//! subscriber dead-letters) rather than a failed read of the whole batch.

use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Coordinates, Received};
use redis::Value;

use crate::error::StreamError;

/// The field of an entry that holds the payload, byte for byte.
pub const DATA_FIELD: &str = "data";

/// One entry of a stream: its id and its fields, in order, as bytes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RawEntry {
    pub(crate) id: String,
    pub(crate) fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RawEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Field values may hold payloads and credentials: their count only.
        f.debug_struct("RawEntry")
            .field("id", &self.id)
            .field("fields", &self.fields.len())
            .finish()
    }
}

/// Why an entry cannot be handed to a consumer; the subscriber dead-letters it with this
/// as the reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UndecodableEntry {
    #[error("the entry has no `data` field (the payload)")]
    MissingData,
    #[error("{0}")]
    Invalid(#[from] oncebox_core::InvalidMessage),
}

impl RawEntry {
    /// Decodes the entry received on `topic`: the first `data` field is the payload, the
    /// other fields are CloudEvents attributes and headers (see [`WireFormat::decode`]).
    pub(crate) fn decode(
        &self,
        format: &WireFormat,
        topic: &str,
        delivery_count: u32,
    ) -> Result<Received, UndecodableEntry> {
        let data = self
            .fields
            .iter()
            .position(|(name, _)| name == DATA_FIELD.as_bytes())
            .ok_or(UndecodableEntry::MissingData)?;
        let payload = Bytes::copy_from_slice(&self.fields[data].1);
        let coordinates = Coordinates {
            source: topic.to_owned(),
            partition: None,
            position: self.id.clone(),
        };
        let others = self
            .fields
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != data)
            .map(|(_, (name, value))| (name.as_slice(), value.as_slice()));
        Ok(format.decode(topic, others, payload, coordinates, delivery_count)?)
    }
}

fn unexpected(command: &'static str, value: &Value) -> StreamError {
    StreamError::UnexpectedReply {
        command,
        shape: shape(value),
    }
}

/// The shape of a reply, never its content.
pub(crate) fn shape(value: &Value) -> String {
    match value {
        Value::Nil => "nil".into(),
        Value::Int(n) => format!("integer {n}"),
        Value::BulkString(b) => format!("string of {} bytes", b.len()),
        Value::Array(items) => format!("array of {}", items.len()),
        Value::Map(items) => format!("map of {}", items.len()),
        _ => "a value of another type".into(),
    }
}

/// The bytes of a string reply.
pub(crate) fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

/// The text of a string reply that Redis itself produces (an entry id, a cursor).
pub(crate) fn text(value: Value) -> Option<String> {
    bytes(value).and_then(|b| String::from_utf8(b).ok())
}

/// The items of an array reply (a set under RESP3).
pub(crate) fn items(value: Value) -> Option<Vec<Value>> {
    match value {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

fn malformed(command: &'static str, what: &str) -> StreamError {
    StreamError::UnexpectedReply {
        command,
        shape: what.to_owned(),
    }
}

/// One entry, `[id, [field, value, ...]]`. `Ok(None)` for an entry whose fields are nil
/// (deleted while pending).
pub(crate) fn parse_entry(
    command: &'static str,
    value: Value,
) -> Result<Option<RawEntry>, StreamError> {
    let parts = match value {
        Value::Array(parts) if parts.len() == 2 => parts,
        other => return Err(unexpected(command, &other)),
    };
    let mut parts = parts.into_iter();
    let (Some(id), Some(fields)) = (parts.next().and_then(text), parts.next()) else {
        return Err(malformed(command, "an entry whose id is not text"));
    };
    let flat = match fields {
        Value::Nil => return Ok(None),
        Value::Map(pairs) => pairs.into_iter().flat_map(|(n, v)| [n, v]).collect(),
        other => {
            items(other).ok_or_else(|| malformed(command, "entry fields that are not a list"))?
        }
    };
    if flat.len() % 2 != 0 {
        return Err(malformed(command, "an odd number of entry fields"));
    }
    let mut fields = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(name), Some(field)) = (flat.next(), flat.next()) {
        match (bytes(name), bytes(field)) {
            (Some(name), Some(field)) => fields.push((name, field)),
            _ => return Err(malformed(command, "an entry field that is not a string")),
        }
    }
    Ok(Some(RawEntry { id, fields }))
}

/// A list of entries, skipping deleted ones.
pub(crate) fn parse_entries(
    command: &'static str,
    value: Value,
) -> Result<Vec<RawEntry>, StreamError> {
    let list = match value {
        Value::Array(list) => list,
        other => return Err(unexpected(command, &other)),
    };
    let mut entries = Vec::with_capacity(list.len());
    for item in list {
        if let Some(entry) = parse_entry(command, item)? {
            entries.push(entry);
        }
    }
    Ok(entries)
}

/// The entries of an `XREADGROUP` reply for one stream: nil (timed out),
/// `[[stream, [entry, ...]]]`, or under RESP3 `{stream: [entry, ...]}`.
pub(crate) fn parse_read_reply(value: Value) -> Result<Vec<RawEntry>, StreamError> {
    const COMMAND: &str = "XREADGROUP";
    let streams: Vec<Value> = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs.into_iter().map(|(_, entries)| entries).collect(),
        Value::Array(list) => {
            let mut streams = Vec::with_capacity(list.len());
            for stream in list {
                match stream {
                    Value::Array(mut pair) if pair.len() == 2 => streams.push(pair.swap_remove(1)),
                    other => return Err(unexpected(COMMAND, &other)),
                }
            }
            streams
        }
        other => return Err(unexpected(COMMAND, &other)),
    };
    let mut entries = Vec::new();
    for stream in streams {
        entries.extend(parse_entries(COMMAND, stream)?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use oncebox_core::{Message, MessageId};

    use super::*;

    fn bulk(text: &[u8]) -> Value {
        Value::BulkString(text.to_vec())
    }

    fn entry(id: &str, fields: &[(&[u8], &[u8])]) -> Value {
        Value::Array(vec![
            bulk(id.as_bytes()),
            Value::Array(
                fields
                    .iter()
                    .flat_map(|(n, v)| [bulk(n), bulk(v)])
                    .collect(),
            ),
        ])
    }

    #[test]
    fn reads_a_read_reply_in_both_protocols() {
        let entries = Value::Array(vec![
            entry("1-0", &[(b"data", b"a")]),
            Value::Array(vec![bulk(b"2-0"), Value::Nil]),
        ]);
        let resp2 = Value::Array(vec![Value::Array(vec![bulk(b"s"), entries.clone()])]);
        let resp3 = Value::Map(vec![(bulk(b"s"), entries)]);
        for reply in [resp2, resp3] {
            let got = parse_read_reply(reply).expect("parses");
            assert_eq!(got.len(), 1, "the deleted entry is skipped");
            assert_eq!(got[0].id, "1-0");
            assert_eq!(got[0].fields, vec![(b"data".to_vec(), b"a".to_vec())]);
        }
        assert!(parse_read_reply(Value::Nil).expect("timeout").is_empty());
        assert!(parse_read_reply(Value::Int(3)).is_err());
        assert!(parse_read_reply(Value::Array(vec![Value::Int(3)])).is_err());
        let odd = Value::Array(vec![bulk(b"1-0"), Value::Array(vec![bulk(b"data")])]);
        assert!(parse_entry("X", odd).is_err());
    }

    #[test]
    fn decodes_our_own_entries() {
        let message = Message::new("orders", &b"\xff\x00binary"[..])
            .with_key("k")
            .with_kind("OrderPlaced")
            .with_header("x-tenant", "acme")
            .expect("valid header");
        let format = WireFormat::redis();
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = format
            .encode(&message)
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect();
        fields.push((b"data".to_vec(), message.payload.to_vec()));
        let raw = RawEntry {
            id: "5-1".into(),
            fields,
        };
        let received = raw.decode(&format, "orders", 3).expect("decodes");
        assert_eq!(received.id, Some(message.id));
        assert_eq!(received.payload, message.payload);
        assert_eq!(received.headers, message.headers);
        assert_eq!(received.coordinates.to_string(), "orders/5-1");
        assert_eq!(received.delivery_count, 3);
    }

    #[test]
    fn foreign_and_broken_entries() {
        let format = WireFormat::redis();
        let foreign = RawEntry {
            id: "7-0".into(),
            fields: vec![
                (b"tenant".to_vec(), b"acme".to_vec()),
                (b"data".to_vec(), b"{}".to_vec()),
                (b"ce_id".to_vec(), MessageId::new().to_string().into_bytes()),
            ],
        };
        let received = foreign.decode(&format, "t", 1).expect("decodes");
        assert!(received.id.is_some());
        assert_eq!(received.headers.get("tenant"), Some("acme"));

        let bare = RawEntry {
            id: "8-0".into(),
            fields: vec![(b"data".to_vec(), Vec::new())],
        };
        let received = bare.decode(&format, "t", 1).expect("decodes");
        assert_eq!((received.id, received.payload.len()), (None, 0));

        let no_data = RawEntry {
            id: "9-0".into(),
            fields: vec![(b"payload".to_vec(), b"x".to_vec())],
        };
        assert!(matches!(
            no_data.decode(&format, "t", 1),
            Err(UndecodableEntry::MissingData)
        ));
        let binary_header = RawEntry {
            id: "9-1".into(),
            fields: vec![
                (b"data".to_vec(), b"x".to_vec()),
                (b"x-blob".to_vec(), vec![0xff]),
            ],
        };
        let error = binary_header
            .decode(&format, "t", 1)
            .expect_err("not UTF-8");
        assert!(error.to_string().contains("x-blob"), "{error}");
    }
}
