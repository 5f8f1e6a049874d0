//! The wire format every broker transport shares: CloudEvents binary content mode.
//!
//! A message travels as the broker's native body (the payload, untouched) plus headers.
//! The message's own fields become CloudEvents attributes, named with the broker's
//! header prefix; the message's [`Headers`] travel beside them unchanged, among them
//! [`traceparent`](crate::TRACEPARENT). A consumer in any language reads them with its
//! CloudEvents SDK or by name:
//!
//! | attribute | from | example |
//! |---|---|---|
//! | `specversion` | always `1.0` | `1.0` |
//! | `id` | [`Message::id`] | `01936f1e-8a5c-7d2e-9b1a-3f4e5d6c7b8a` |
//! | `source` | the publisher's [`WireFormat::with_source`] (default `oncebox`) | `/orders-service` |
//! | `type` | [`Message::kind`], or [`DEFAULT_TYPE`] when it is empty (CloudEvents requires a type) | `order.placed` |
//! | `subject` | [`Message::key`], left out when `None` | `order-42` |
//! | `time` | [`Message::created_at`], RFC 3339, UTC | `2026-11-21T13:05:09.123456Z` |
//! | `datacontenttype` | the message's [`CONTENT_TYPE`] header, when it has one ([`Message::json`] sets it) | `application/json` |
//!
//! | broker | prefix | so the id is | constructor |
//! |---|---|---|---|
//! | Kafka | `ce_` | `ce_id` | [`WireFormat::kafka`] |
//! | NATS | `ce-` | `ce-id` | [`WireFormat::nats`] |
//! | AMQP (RabbitMQ) | `cloudEvents_` (`cloudEvents:` and the RabbitMQ binding's `ce-` read too) | `cloudEvents_id` | [`WireFormat::amqp`] |
//! | Redis Streams | `ce_` (fields of the entry) | `ce_id` | [`WireFormat::redis`] |
//! | Amazon SQS | `ce_` (message attributes; `ce-` read too) | `ce_id` | [`WireFormat::sqs`] |
//!
//! The content type travels in each binding's own form: Kafka's and Redis's
//! `content-type` header (the message header, unchanged), NATS's `ce-datacontenttype`
//! (the NATS binding keeps `content-type` for structured mode), AMQP's `content_type`
//! property (set by the RabbitMQ transport). On NATS the attribute values are
//! percent-encoded as the binding's binary mode asks (section 3.1.3.2, HTTP's rule:
//! space, `"`, `%` and everything outside printable ASCII), and decoded on receipt.
//!
//! Reading is lenient, so that messages of producers that do not use oncebox still
//! arrive: an attribute that is missing leaves its field empty, and one that does not
//! parse (an `id` that is not a UUID, a `time` that is not RFC 3339, a `specversion`
//! other than `1.0`) stays in the headers under the name `ce_<attribute>`. An `id` kept
//! so is still the message's id: every non-empty string is a valid CloudEvents id, and
//! the default
//! [`IdStrategy::MessageId`](crate::consumer::IdStrategy::MessageId) deduplicates on it.
//! Extension attributes are kept the same way (`ce_partitionkey`, say). Only what no
//! [`Headers`] value may hold (bytes that are not UTF-8, control characters) is refused,
//! with an [`InvalidMessage`] for the transport to dead-letter.

use std::borrow::Cow;
use std::time::SystemTime;

use bytes::Bytes;

use crate::error::excerpt;
use crate::{Coordinates, Headers, InvalidMessage, Message, MessageId, Received};

/// The message header holding the payload's media type, written as CloudEvents'
/// `datacontenttype` in each binding's form.
pub const CONTENT_TYPE: &str = "content-type";

/// The media type of JSON payloads, set by [`Message::json`].
pub const JSON: &str = "application/json";

/// What HTTP's (and NATS's) binary mode percent-encodes in a header value: space, `"`,
/// `%`, and (by `percent_encoding`'s rule) everything outside printable ASCII.
const ENCODED: &percent_encoding::AsciiSet =
    &percent_encoding::CONTROLS.add(b' ').add(b'"').add(b'%');

/// The CloudEvents version written in `specversion`.
pub const SPEC_VERSION: &str = "1.0";

/// The `source` attribute written when the publisher sets none.
pub const DEFAULT_SOURCE: &str = "oncebox";

/// The `type` attribute written for a message without a kind, since CloudEvents requires
/// one; read back as an empty kind.
pub const DEFAULT_TYPE: &str = "oncebox.message";

/// The name under which an attribute that cannot fill its field (an unparsable id, an
/// extension) is kept in [`Received::headers`]: `ce_` and the attribute name.
pub fn kept_header_name(attribute: &str) -> String {
    format!("ce_{attribute}")
}

/// How one broker names CloudEvents attributes, and the `source` a publisher writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireFormat {
    prefix: &'static str,
    also_read: &'static [&'static str],
    source: Cow<'static, str>,
    /// NATS: attribute values percent-encoded, `datacontenttype` an attribute.
    nats: bool,
}

impl WireFormat {
    /// Kafka's binding: headers `ce_id`, `ce_type`, ...
    pub const fn kafka() -> Self {
        Self::with_prefix("ce_", &[])
    }

    /// NATS's binding: headers `ce-id`, `ce-type`, ...
    pub const fn nats() -> Self {
        let mut format = Self::with_prefix("ce-", &[]);
        format.nats = true;
        format
    }

    /// AMQP's binding: application properties `cloudEvents_id`, ...; the older
    /// `cloudEvents:id` spelling is read too, and so is `ce-id` (the RabbitMQ binding
    /// of Knative, which the CloudEvents SDKs ship for RabbitMQ).
    pub const fn amqp() -> Self {
        Self::with_prefix("cloudEvents_", &["cloudEvents:", "ce-"])
    }

    /// Redis Streams (no official binding; Kafka's naming): entry fields `ce_id`, ...
    pub const fn redis() -> Self {
        Self::with_prefix("ce_", &[])
    }

    /// Amazon SQS (no official binding; Kafka's naming, which SQS's attribute names
    /// allow): message attributes `ce_id`, ...; `ce-id` is read too.
    pub const fn sqs() -> Self {
        Self::with_prefix("ce_", &["ce-"])
    }

    const fn with_prefix(prefix: &'static str, also_read: &'static [&'static str]) -> Self {
        Self {
            prefix,
            also_read,
            source: Cow::Borrowed(DEFAULT_SOURCE),
            nats: false,
        }
    }

    /// Sets the `source` attribute written on every message (a URI reference naming the
    /// producing service, such as `/orders-service`).
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Cow<'static, str>>) -> Self {
        self.source = source.into();
        self
    }

    /// The header prefix this format writes.
    pub fn prefix(&self) -> &'static str {
        self.prefix
    }

    /// The `source` this format writes.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The header name of `attribute` (`"id"` → `"ce_id"` for Kafka).
    pub fn header_name(&self, attribute: &str) -> String {
        format!("{}{attribute}", self.prefix)
    }

    /// The headers that carry `message`: its CloudEvents attributes first, then its own
    /// headers. The payload travels as the broker's body, untouched.
    ///
    /// On NATS the attribute values are percent-encoded and the [`CONTENT_TYPE`] header
    /// becomes `ce-datacontenttype`; elsewhere it stays a header (an AMQP transport
    /// moves it to the `content_type` property).
    pub fn encode(&self, message: &Message) -> Vec<(String, String)> {
        let mut fields = self.encode_plain(message);
        if self.nats {
            for (name, value) in &mut fields {
                if name == CONTENT_TYPE {
                    *name = self.header_name("datacontenttype");
                }
                if name.starts_with(self.prefix) {
                    let encoded = percent_encoding::utf8_percent_encode(value, ENCODED);
                    if let Cow::Owned(encoded) = Cow::from(encoded) {
                        *value = encoded;
                    }
                }
            }
        }
        fields
    }

    fn encode_plain(&self, message: &Message) -> Vec<(String, String)> {
        let mut fields = Vec::with_capacity(6 + message.headers.len());
        fields.push((self.header_name("specversion"), SPEC_VERSION.to_owned()));
        fields.push((self.header_name("id"), message.id.to_string()));
        fields.push((self.header_name("source"), self.source.to_string()));
        let kind = if message.kind.is_empty() {
            DEFAULT_TYPE
        } else {
            &message.kind
        };
        fields.push((self.header_name("type"), kind.to_owned()));
        if let Some(key) = &message.key {
            fields.push((self.header_name("subject"), key.clone()));
        }
        fields.push((self.header_name("time"), format_time(message.created_at)));
        fields.extend(
            message
                .headers
                .iter()
                .map(|(name, value)| (name.to_owned(), value.to_owned())),
        );
        fields
    }

    /// Reads a delivery's headers (`fields`, as raw bytes) back into a [`Received`].
    ///
    /// `topic` is where it arrived; a transport whose broker has a native key (Kafka)
    /// sets [`Received::key`] itself when the `subject` attribute is missing.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidHeader`] for a header no [`Headers`] may hold; the
    /// transport dead-letters such a delivery with the error as the reason.
    pub fn decode<'a>(
        &self,
        topic: &str,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        payload: Bytes,
        coordinates: Coordinates,
        delivery_count: u32,
    ) -> Result<Received, InvalidMessage> {
        let mut received = Received {
            id: None,
            topic: topic.to_owned(),
            key: None,
            kind: String::new(),
            headers: Headers::new(),
            payload,
            created_at: None,
            coordinates,
            delivery_count,
        };
        for (name, value) in fields {
            let Some(attribute) = self.attribute_of(name) else {
                received.headers.insert_bytes(name, value)?;
                continue;
            };
            let invalid = |reason| InvalidMessage::InvalidHeader {
                name: excerpt(&String::from_utf8_lossy(name)),
                reason,
            };
            let decoded;
            let value = if self.nats {
                decoded = percent_encoding::percent_decode(value)
                    .decode_utf8()
                    .map_err(|_| invalid("value is not UTF-8 once percent-decoded"))?;
                &*decoded
            } else {
                std::str::from_utf8(value).map_err(|_| invalid("value is not UTF-8"))?
            };
            let kept = match attribute {
                "source" => None,
                // Another version (or garbage) is kept for the handler to judge.
                "specversion" => (value != SPEC_VERSION).then_some(value),
                "id" => match MessageId::parse(value) {
                    Ok(id) => {
                        received.id = Some(id);
                        None
                    }
                    Err(_) => Some(value),
                },
                "type" => {
                    if value != DEFAULT_TYPE {
                        value.clone_into(&mut received.kind);
                    }
                    None
                }
                "subject" => {
                    received.key = Some(value.to_owned());
                    None
                }
                "datacontenttype" => {
                    received.headers.insert(CONTENT_TYPE, value)?;
                    None
                }
                "time" => match parse_time(value) {
                    Some(time) => {
                        received.created_at = Some(time);
                        None
                    }
                    None => Some(value),
                },
                _ => Some(value),
            };
            if let Some(value) = kept {
                received
                    .headers
                    .insert(kept_header_name(attribute), value)?;
            }
        }
        Ok(received)
    }

    /// The attribute `name` carries, if it has one of this format's prefixes.
    fn attribute_of<'n>(&self, name: &'n [u8]) -> Option<&'n str> {
        let name = std::str::from_utf8(name).ok()?;
        std::iter::once(self.prefix)
            .chain(self.also_read.iter().copied())
            .find_map(|prefix| name.strip_prefix(prefix))
            .filter(|attribute| !attribute.is_empty())
    }
}

/// The attributes a message's own fields fill (every other attribute is an extension).
const ATTRIBUTES: [&str; 6] = ["specversion", "id", "source", "type", "subject", "time"];

/// Checks that no header of a message would be read back as something else on some
/// broker, as [`Message::validate`] does at enqueue: a header named like one of the
/// message's own attributes under any broker's prefix (`ce_id`, `ce-type`,
/// `cloudEvents_time`, ...) would override that attribute, and a header under the NATS
/// or AMQP prefix (`ce-…`, `cloudEvents_…`) would come back renamed `ce_…`. Headers named
/// `ce_<extension>` pass: they travel as CloudEvents extension attributes on Kafka and
/// Redis Streams and as plain headers elsewhere, and come back under the same name.
///
/// # Errors
///
/// [`InvalidMessage::InvalidHeader`] naming the first such header.
pub fn check_headers(headers: &Headers) -> Result<(), InvalidMessage> {
    let reserved = |name: &str| {
        ["ce_", "ce-", "cloudEvents_"].iter().any(|prefix| {
            name.strip_prefix(prefix).is_some_and(|attribute| {
                !attribute.is_empty() && (*prefix != "ce_" || ATTRIBUTES.contains(&attribute))
            })
        })
    };
    match headers.iter().find(|(name, _)| reserved(name)) {
        Some((name, _)) => Err(InvalidMessage::InvalidHeader {
            name: excerpt(name),
            reason: "reserved: brokers carry CloudEvents attributes under this name",
        }),
        None => Ok(()),
    }
}

/// `time` as RFC 3339 in UTC with microseconds, as the `time` attribute carries it.
pub fn format_time(time: SystemTime) -> String {
    match jiff::Timestamp::try_from(time) {
        Ok(timestamp) => format!("{timestamp:.6}"),
        // Outside jiff's range (years beyond ±9999): write the epoch rather than fail a
        // publish over a clock that far off; the id still identifies the message.
        Err(_) => format!("{:.6}", jiff::Timestamp::UNIX_EPOCH),
    }
}

/// Parses an RFC 3339 time with any offset; `None` if it is not one.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    text.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests;
