//! A message as an SQS message: the body, the message attributes (CloudEvents and the
//! message's headers, at most ten), and back.

use std::collections::HashMap;

use aws_sdk_sqs::types::{
    Message as SqsMessage, MessageAttributeValue, MessageSystemAttributeName,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Coordinates, InvalidMessage, Message, Received};

/// The attribute saying how the body carries the payload when it is not the payload's
/// text: `base64` (bytes SQS cannot carry as text), `empty` (an empty payload; SQS
/// refuses empty bodies, so the body is then `-`).
pub const BODY_ATTRIBUTE: &str = "oncebox_body";

/// The attribute holding, as a JSON object of strings, the headers that did not fit in
/// SQS's ten message attributes or whose names SQS does not allow.
pub const HEADERS_ATTRIBUTE: &str = "oncebox_headers";

/// The most message attributes SQS accepts on one message.
pub(crate) const MAX_ATTRIBUTES: usize = 10;

/// The body sent for an empty payload.
const EMPTY_BODY: &str = "-";

/// A message ready for `SendMessage(Batch)`.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) body: String,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
    /// Its size as SQS counts it: body, and each attribute's name, type and value.
    pub(crate) size: usize,
}

/// Encodes `fields` (name, value) and a body as an SQS message: the fields SQS allows as
/// attributes are attributes, up to ten with `extra` (the body attribute) counted; the
/// rest travel in [`HEADERS_ATTRIBUTE`].
pub(crate) fn outgoing(
    body: String,
    body_kind: Option<&str>,
    fields: Vec<(String, String)>,
) -> Outgoing {
    let reserved = usize::from(body_kind.is_some());
    let (mut direct, mut packed): (Vec<_>, Vec<_>) =
        fields.into_iter().partition(|(name, value)| {
            attribute_name_allowed(name) && value.chars().all(text_char_allowed)
        });
    if direct.len() + reserved + usize::from(!packed.is_empty()) > MAX_ATTRIBUTES {
        let keep = MAX_ATTRIBUTES - reserved - 1;
        packed.splice(0..0, direct.split_off(keep));
    }
    let mut size = body.len();
    let mut attributes = HashMap::with_capacity(direct.len() + 2);
    let mut add = |name: String, value: String| {
        size += name.len() + "String".len() + value.len();
        attributes.insert(name, string_attribute(value));
    };
    if let Some(kind) = body_kind {
        add(BODY_ATTRIBUTE.to_owned(), kind.to_owned());
    }
    if !packed.is_empty() {
        let object: serde_json::Map<String, serde_json::Value> = packed
            .into_iter()
            .map(|(name, value)| (name, serde_json::Value::String(value)))
            .collect();
        add(
            HEADERS_ATTRIBUTE.to_owned(),
            ascii_json(&serde_json::Value::Object(object)),
        );
    }
    for (name, value) in direct {
        add(name, value);
    }
    Outgoing {
        body,
        attributes,
        size,
    }
}

/// A message's body and the [`BODY_ATTRIBUTE`] it needs, if any.
pub(crate) fn body_of(payload: &[u8]) -> (String, Option<&'static str>) {
    if payload.is_empty() {
        return (EMPTY_BODY.to_owned(), Some("empty"));
    }
    match std::str::from_utf8(payload) {
        Ok(text) if text.chars().all(text_char_allowed) => (text.to_owned(), None),
        _ => (BASE64.encode(payload), Some("base64")),
    }
}

/// Encodes an oncebox message.
pub(crate) fn encode(format: &WireFormat, message: &Message) -> Outgoing {
    let (body, kind) = body_of(&message.payload);
    outgoing(body, kind, format.encode(message))
}

fn string_attribute(value: String) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap_or_else(|_| unreachable!("the data type is set"))
}

/// The characters sent as text in a body or a string attribute value: those SQS
/// accepts, less the ones beyond U+FFFF, which SQS accepts but SQS-compatible servers
/// (fauxqs, for one) refuse. Text with others travels encoded.
pub(crate) fn text_char_allowed(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
}

/// `value` as JSON whose characters all pass [`text_char_allowed`]: the others written
/// as `\u` escapes (UTF-16 pairs beyond U+FFFF), which every JSON reader decodes.
fn ascii_json(value: &serde_json::Value) -> String {
    let json = value.to_string();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if text_char_allowed(c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// Whether SQS takes `name` as a message attribute name: up to 256 of ASCII letters,
/// digits, `_`, `-` and `.`, no leading, trailing or doubled `.`, not starting with
/// `AWS.` or `Amazon.` (any case).
pub(crate) fn attribute_name_allowed(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

/// The fields of a received message's attributes: [`HEADERS_ATTRIBUTE`] unpacked,
/// [`BODY_ATTRIBUTE`] returned apart, binary values as their bytes.
pub(crate) struct Fields {
    pub(crate) fields: Vec<(String, Vec<u8>)>,
    pub(crate) body_kind: Option<String>,
}

/// Reads a received message's attributes.
pub(crate) fn fields_of(message: &SqsMessage) -> Result<Fields, InvalidMessage> {
    let mut fields = Vec::new();
    let mut body_kind = None;
    for (name, value) in message.message_attributes().into_iter().flatten() {
        let bytes = match (value.string_value(), value.binary_value()) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(blob)) => blob.as_ref().to_vec(),
            (None, None) => Vec::new(),
        };
        match name.as_str() {
            BODY_ATTRIBUTE => body_kind = Some(String::from_utf8_lossy(&bytes).into_owned()),
            HEADERS_ATTRIBUTE => {
                let object: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(&bytes)
                        .map_err(|_| unreadable(HEADERS_ATTRIBUTE, "not a JSON object"))?;
                for (name, value) in object {
                    let serde_json::Value::String(value) = value else {
                        return Err(unreadable(
                            HEADERS_ATTRIBUTE,
                            "a value that is not a string",
                        ));
                    };
                    fields.push((name, value.into_bytes()));
                }
            }
            _ => fields.push((name.clone(), bytes)),
        }
    }
    Ok(Fields { fields, body_kind })
}

/// The payload a body carries, per its [`BODY_ATTRIBUTE`].
pub(crate) fn payload_of(body: &str, kind: Option<&str>) -> Result<Bytes, InvalidMessage> {
    match kind {
        None => Ok(Bytes::copy_from_slice(body.as_bytes())),
        Some("empty") => Ok(Bytes::new()),
        Some("base64") => BASE64
            .decode(body.trim())
            .map(Bytes::from)
            .map_err(|_| unreadable(BODY_ATTRIBUTE, "the body is not base64")),
        Some(_) => Err(unreadable(BODY_ATTRIBUTE, "unknown body encoding")),
    }
}

/// Decodes a received message; `topic` and `queue` are where it arrived.
pub(crate) fn decode(
    format: &WireFormat,
    topic: &str,
    queue: &str,
    message: &SqsMessage,
) -> Result<Received, InvalidMessage> {
    let Fields { fields, body_kind } = fields_of(message)?;
    let payload = payload_of(message.body().unwrap_or_default(), body_kind.as_deref())?;
    let system = |name| {
        message
            .attributes()
            .and_then(|a| a.get(&name))
            .map(String::as_str)
    };
    let position = system(MessageSystemAttributeName::SequenceNumber)
        .or(message.message_id())
        .unwrap_or_default()
        .to_owned();
    let delivery_count = system(MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|count| count.parse().ok())
        .unwrap_or(1);
    format.decode(
        topic,
        fields
            .iter()
            .map(|(name, value)| (name.as_bytes(), value.as_slice())),
        payload,
        Coordinates {
            source: queue.to_owned(),
            partition: None,
            position,
        },
        delivery_count,
    )
}

fn unreadable(name: &str, reason: &'static str) -> InvalidMessage {
    InvalidMessage::InvalidHeader {
        name: name.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(outgoing: &Outgoing) -> SqsMessage {
        SqsMessage::builder()
            .message_id("m-1")
            .body(outgoing.body.clone())
            .set_message_attributes(Some(outgoing.attributes.clone()))
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "3")
            .build()
    }

    #[test]
    fn a_message_round_trips() {
        let format = WireFormat::sqs();
        let mut message = Message::new("orders", "{\"total\":42}")
            .with_key("order-42")
            .with_kind("order.placed");
        message
            .headers
            .insert(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .unwrap();
        let out = encode(&format, &message);
        assert!(out.attributes.contains_key("ce_id"));
        assert!(!out.attributes.contains_key(BODY_ATTRIBUTE));
        let back = decode(&format, "orders", "orders", &received(&out)).unwrap();
        assert_eq!(back.id, Some(message.id));
        assert_eq!(back.key.as_deref(), Some("order-42"));
        assert_eq!(back.kind, "order.placed");
        assert_eq!(back.payload, message.payload);
        assert_eq!(back.delivery_count, 3);
        assert_eq!(
            back.headers.get("traceparent"),
            message.headers.get("traceparent")
        );
    }

    #[test]
    fn binary_and_empty_payloads_round_trip() {
        let format = WireFormat::sqs();
        for payload in [
            vec![0u8, 159, 146, 150, 1],
            Vec::new(),
            b"\x01control".to_vec(),
            "emoji \u{1F600}".as_bytes().to_vec(),
        ] {
            let message = Message::new("t", payload.clone());
            let out = encode(&format, &message);
            assert!(!out.body.is_empty());
            assert!(out.body.chars().all(text_char_allowed));
            let back = decode(&format, "t", "t", &received(&out)).unwrap();
            assert_eq!(back.payload.as_ref(), payload.as_slice());
        }
    }

    #[test]
    fn headers_beyond_ten_attributes_are_packed() {
        let format = WireFormat::sqs();
        let mut message = Message::new("t", vec![0u8]).with_key("k");
        for i in 0..12 {
            message
                .headers
                .insert(format!("x-{i}"), format!("v{i}"))
                .unwrap();
        }
        message.headers.insert("AWS.trace", "v").unwrap();
        message.headers.insert("x/y", "v").unwrap();
        message.headers.insert("x-emoji", "ok \u{1F600}").unwrap();
        let out = encode(&format, &message);
        assert_eq!(out.attributes.len(), MAX_ATTRIBUTES);
        assert!(out.attributes.contains_key(HEADERS_ATTRIBUTE));
        let back = decode(&format, "t", "t", &received(&out)).unwrap();
        assert_eq!(back.headers, message.headers);
        assert_eq!(back.id, Some(message.id));
    }

    #[test]
    fn size_counts_body_and_attributes() {
        let out = outgoing("abc".into(), None, vec![("n".into(), "vv".into())]);
        assert_eq!(out.size, 3 + 1 + 6 + 2);
    }

    #[test]
    fn unreadable_messages_are_refused() {
        let format = WireFormat::sqs();
        let bad_body = SqsMessage::builder()
            .body("%%%")
            .message_attributes(BODY_ATTRIBUTE, string_attribute("base64".into()))
            .build();
        assert!(decode(&format, "t", "t", &bad_body).is_err());
        let bad_headers = SqsMessage::builder()
            .body("x")
            .message_attributes(HEADERS_ATTRIBUTE, string_attribute("[1]".into()))
            .build();
        assert!(decode(&format, "t", "t", &bad_headers).is_err());
    }

    #[test]
    fn attribute_names_follow_sqs_rules() {
        assert!(attribute_name_allowed("ce_id"));
        assert!(attribute_name_allowed("content-type"));
        assert!(!attribute_name_allowed("AWS.trace"));
        assert!(!attribute_name_allowed("a..b"));
        assert!(!attribute_name_allowed("a:b"));
    }
}
