//! Messages to AMQP properties and back; the mapping is documented in the crate's wire
//! format table (`docs/wire.md`).

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use oncebox_core::wire::{CONTENT_TYPE, WireFormat, format_time};
use oncebox_core::{Bytes, Coordinates, Headers, InvalidMessage, Message, MessageId, Received};

/// The header that carries a message's `message_id` property when it is not a UUID
/// (a producer that does not use oncebox), for an
/// [`IdStrategy::Header`](oncebox_core::consumer::IdStrategy::Header).
pub const FOREIGN_ID_HEADER: &str = "amqp_message_id";

/// The quorum-queue header counting earlier deliveries.
pub(crate) const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// Persistent messages (AMQP `delivery_mode` 2) survive a broker restart.
const PERSISTENT: u8 = 2;

/// The AMQP properties that carry `message`: the message id, persistence, the creation
/// time in seconds, the kind as `type`, the [`CONTENT_TYPE`] header as the
/// `content_type` property (CloudEvents' `datacontenttype` in the AMQP binding), and the
/// CloudEvents attributes and the message's other headers as application headers (long
/// strings).
///
/// A message header `x-delivery-count` is refused: quorum queues count deliveries in it,
/// and the subscriber reads it as the delivery count, not as a header.
pub(crate) fn encode(
    format: &WireFormat,
    message: &Message,
) -> Result<BasicProperties, InvalidMessage> {
    if message.headers.get(DELIVERY_COUNT_HEADER).is_some() {
        return Err(InvalidMessage::InvalidHeader {
            name: DELIVERY_COUNT_HEADER.to_owned(),
            reason: "reserved: RabbitMQ's quorum queues count deliveries in this header",
        });
    }
    let mut headers = FieldTable::default();
    let mut content_type = None;
    for (name, value) in format.encode(message) {
        if name == CONTENT_TYPE
            && let Ok(value) = ShortString::try_new(value.as_str())
        {
            content_type = Some(value);
            continue;
        }
        let name = ShortString::try_new(name).map_err(|_| InvalidMessage::InvalidHeader {
            name: "(over 255 bytes)".to_owned(),
            reason: "AMQP header names are at most 255 bytes",
        })?;
        headers.insert(name, AMQPValue::LongString(LongString::from(value)));
    }
    let mut properties = BasicProperties::default()
        .with_message_id(ShortString::from(message.id.to_string()))
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if let Some(content_type) = content_type {
        properties = properties.with_content_type(content_type);
    }
    if let Ok(since_epoch) = message.created_at.duration_since(SystemTime::UNIX_EPOCH) {
        properties = properties.with_timestamp(since_epoch.as_secs());
    }
    if !message.kind.is_empty()
        && let Ok(kind) = ShortString::try_new(message.kind.as_str())
    {
        properties = properties.with_type(kind);
    }
    Ok(properties)
}

/// A delivery as lapin hands it over, borrowed.
pub(crate) struct Incoming<'a> {
    pub(crate) routing_key: &'a str,
    pub(crate) redelivered: bool,
    pub(crate) properties: &'a BasicProperties,
    pub(crate) body: Bytes,
}

/// How strict [`decode`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strictness {
    /// A header [`Headers`] cannot hold fails the delivery (it is dead-lettered).
    Strict,
    /// Such headers are skipped (reading dead letters, which may be there for that very
    /// reason).
    Lenient,
}

/// Reads a delivery back into a [`Received`].
///
/// Header values of other AMQP types than strings (numbers, booleans, timestamps) are
/// carried as their decimal text, except the `time` attribute, which the AMQP binding
/// lets travel as a timestamp: there a timestamp is seconds since the epoch (AMQP
/// 0-9-1's unit, as pika writes a `datetime`), an integer milliseconds (AMQP 1.0's
/// timestamp, as the CloudEvents SDK's AMQP binding writes it), and either becomes
/// RFC 3339. Tables and arrays
/// (`x-death`) are not carried. The `content_type` property becomes the
/// [`CONTENT_TYPE`] header.
/// `skip` names headers left out (the transport's own).
pub(crate) fn decode(
    format: &WireFormat,
    incoming: Incoming<'_>,
    skip: impl Fn(&str) -> bool,
    strictness: Strictness,
) -> Result<Received, InvalidMessage> {
    let mut fields: Vec<(&[u8], Cow<'_, [u8]>)> = Vec::new();
    if let Some(headers) = incoming.properties.headers() {
        for (name, value) in headers {
            let name = name.as_str();
            if name == DELIVERY_COUNT_HEADER || skip(name) {
                continue;
            }
            let time = matches!(name, "cloudEvents_time" | "cloudEvents:time" | "ce-time")
                .then(|| native_time(value))
                .flatten();
            if let Some(time) = time {
                fields.push((name.as_bytes(), Cow::Owned(format_time(time).into_bytes())));
                continue;
            }
            let Some(text) = text_of(value) else {
                tracing::debug!(header = name, "header of a table or array type not carried");
                continue;
            };
            if strictness == Strictness::Lenient
                && Headers::new()
                    .insert_bytes(name.as_bytes(), text.as_ref())
                    .is_err()
            {
                continue;
            }
            fields.push((name.as_bytes(), text));
        }
    }
    let delivery_count = delivery_count(incoming.properties, incoming.redelivered);
    let message_id = incoming
        .properties
        .message_id()
        .as_ref()
        .map(ShortString::as_str);
    let coordinates = Coordinates {
        source: incoming.routing_key.to_owned(),
        partition: None,
        position: message_id.unwrap_or_default().to_owned(),
    };
    let mut received = format.decode(
        incoming.routing_key,
        fields.iter().map(|(name, value)| (*name, value.as_ref())),
        incoming.body,
        coordinates,
        delivery_count,
    )?;
    if received.id.is_none()
        && let Some(message_id) = message_id
    {
        match MessageId::parse(message_id) {
            Ok(id) => received.id = Some(id),
            Err(_) => {
                let kept = received.headers.insert(FOREIGN_ID_HEADER, message_id);
                if strictness == Strictness::Strict {
                    kept?;
                }
            }
        }
    }
    if let Some(content_type) = incoming.properties.content_type()
        && received.headers.get(CONTENT_TYPE).is_none()
    {
        let kept = received.headers.insert(CONTENT_TYPE, content_type.as_str());
        if strictness == Strictness::Strict {
            kept?;
        }
    }
    if received.kind.is_empty()
        && let Some(kind) = incoming.properties.kind()
    {
        kind.as_str().clone_into(&mut received.kind);
    }
    if received.created_at.is_none()
        && let Some(seconds) = incoming.properties.timestamp()
    {
        received.created_at = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(*seconds));
    }
    Ok(received)
}

/// A `time` attribute of a native AMQP type: AMQP 0-9-1's timestamp is seconds since
/// the epoch; an integer is AMQP 1.0's timestamp, milliseconds since the epoch, as the
/// CloudEvents SDKs write it. `None` for a time no RFC 3339 text can hold (beyond the
/// year 9999): it is kept as a header, as any attribute that does not parse.
fn native_time(value: &AMQPValue) -> Option<SystemTime> {
    let since_epoch = match value {
        AMQPValue::Timestamp(seconds) => Duration::from_secs(*seconds),
        other => Duration::from_millis(u64::try_from(integer(other)?).ok()?),
    };
    /// 9999-12-31T23:59:59Z.
    const LAST_WRITABLE: Duration = Duration::from_secs(253_402_300_799);
    (since_epoch <= LAST_WRITABLE).then(|| SystemTime::UNIX_EPOCH + since_epoch)
}

/// How many times a delivery has been delivered, this one included: the quorum queue's
/// `x-delivery-count` (earlier deliveries) plus one, else 2 if it is flagged
/// redelivered, else 1.
pub(crate) fn delivery_count(properties: &BasicProperties, redelivered: bool) -> u32 {
    let previous = properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(DELIVERY_COUNT_HEADER))
        .and_then(integer);
    match previous {
        Some(previous) => u32::try_from(previous.max(0))
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        None if redelivered => 2,
        None => 1,
    }
}

/// The bytes of a header value carried as text, `None` for tables and arrays.
fn text_of(value: &AMQPValue) -> Option<Cow<'_, [u8]>> {
    let text = match value {
        AMQPValue::LongString(s) => return Some(Cow::Borrowed(s.as_bytes())),
        AMQPValue::ShortString(s) => return Some(Cow::Borrowed(s.as_str().as_bytes())),
        AMQPValue::ByteArray(bytes) => return Some(Cow::Owned(bytes.as_slice().to_vec())),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::DecimalValue(d) => {
            let scale = u32::from(d.scale);
            match 10u64.checked_pow(scale) {
                Some(divisor) if scale > 0 => format!(
                    "{}.{:0width$}",
                    u64::from(d.value) / divisor,
                    u64::from(d.value) % divisor,
                    width = usize::from(d.scale)
                ),
                _ => d.value.to_string(),
            }
        }
        AMQPValue::Void => String::new(),
        AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) => return None,
    };
    Some(Cow::Owned(text.into_bytes()))
}

/// An integer header value (`x-delivery-count` is a long or long-long, depending on the
/// broker version).
pub(crate) fn integer(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// A string header value.
pub(crate) fn string(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::DecimalValue;

    use super::*;

    fn incoming<'a>(properties: &'a BasicProperties, redelivered: bool) -> Incoming<'a> {
        Incoming {
            routing_key: "orders",
            redelivered,
            properties,
            body: Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn a_message_round_trips() {
        let message = Message::new("orders", &b"{}"[..])
            .with_key("order-42")
            .with_kind("order.placed")
            .with_header(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .expect("valid header");
        let format = WireFormat::amqp();
        let properties = encode(&format, &message).expect("encodes");
        assert_eq!(
            properties.message_id().as_ref().map(ShortString::as_str),
            Some(message.id.to_string().as_str())
        );
        assert_eq!(properties.delivery_mode(), &Some(2));
        let received = decode(
            &format,
            incoming(&properties, false),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.id, Some(message.id));
        assert_eq!(received.key.as_deref(), Some("order-42"));
        assert_eq!(received.kind, "order.placed");
        assert_eq!(received.headers, message.headers);
        assert_eq!(received.delivery_count, 1);
        assert_eq!(received.coordinates.source, "orders");
    }

    /// The content type travels as the `content_type` property and comes back as the
    /// header.
    #[test]
    fn the_content_type_is_the_amqp_property() {
        let message = Message::json("orders", &1).expect("json");
        let format = WireFormat::amqp();
        let properties = encode(&format, &message).expect("encodes");
        assert_eq!(
            properties.content_type().as_ref().map(ShortString::as_str),
            Some("application/json")
        );
        let in_headers = properties
            .headers()
            .as_ref()
            .is_some_and(|headers| headers.inner().contains_key(CONTENT_TYPE));
        assert!(!in_headers);
        let received = decode(
            &format,
            incoming(&properties, false),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.headers, message.headers);
    }

    /// The AMQP binding lets `time` travel as a timestamp: a receiver must accept one,
    /// or an integer; other native types arrive as text.
    #[test]
    fn attributes_of_native_types_are_read() {
        for time in [
            AMQPValue::Timestamp(1_795_000_000),
            AMQPValue::LongLongInt(1_795_000_000_000),
        ] {
            let mut headers = FieldTable::default();
            headers.insert("cloudEvents_time".into(), time);
            headers.insert("cloudEvents_id".into(), AMQPValue::LongLongInt(42));
            headers.insert("cloudEvents_sequence".into(), AMQPValue::LongInt(7));
            let properties = BasicProperties::default().with_headers(headers);
            let received = decode(
                &WireFormat::amqp(),
                incoming(&properties, false),
                |_| false,
                Strictness::Strict,
            )
            .expect("decodes");
            assert_eq!(
                received.created_at,
                SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(1_795_000_000))
            );
            assert_eq!(received.headers.get("ce_id"), Some("42"));
            assert_eq!(received.headers.get("ce_sequence"), Some("7"));
        }
    }

    /// The RabbitMQ binding's `ce-time` as a timestamp is read as `cloudEvents_time` is;
    /// a timestamp past what RFC 3339 can write stays a header instead of becoming 1970.
    #[test]
    fn native_times_of_the_other_binding_and_out_of_range() {
        let read = |name: &str, time: AMQPValue| {
            let mut headers = FieldTable::default();
            headers.insert(name.into(), time);
            headers.insert("cloudEvents_id".into(), AMQPValue::LongString("a".into()));
            let properties = BasicProperties::default().with_headers(headers);
            decode(
                &WireFormat::amqp(),
                incoming(&properties, false),
                |_| false,
                Strictness::Strict,
            )
            .expect("decodes")
        };
        let received = read("ce-time", AMQPValue::Timestamp(1_795_000_000));
        assert_eq!(
            received.created_at,
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(1_795_000_000))
        );
        let received = read("cloudEvents_time", AMQPValue::Timestamp(u64::MAX / 2));
        assert_eq!(received.created_at, None, "{received:?}");
    }

    /// Found by the fuzz target `message_roundtrip`: a message's own `x-delivery-count`
    /// header was read as the delivery count and dropped.
    #[test]
    fn a_header_named_like_the_delivery_count_is_refused() {
        let message = Message::new("orders", &b"{}"[..])
            .with_header(DELIVERY_COUNT_HEADER, "7")
            .expect("a valid header");
        assert!(matches!(
            encode(&WireFormat::amqp(), &message),
            Err(InvalidMessage::InvalidHeader { .. })
        ));
    }

    #[test]
    fn delivery_count_comes_from_the_quorum_header_or_the_redelivered_flag() {
        let mut headers = FieldTable::default();
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
        let counted = BasicProperties::default().with_headers(headers);
        let received = decode(
            &WireFormat::amqp(),
            incoming(&counted, true),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.delivery_count, 4);
        assert!(
            received.headers.is_empty(),
            "x-delivery-count is not a header"
        );
        let bare = BasicProperties::default();
        let received = decode(
            &WireFormat::amqp(),
            incoming(&bare, true),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.delivery_count, 2);
    }

    #[test]
    fn foreign_messages_keep_their_id_and_typed_headers_as_text() {
        let mut headers = FieldTable::default();
        headers.insert("x-retries".into(), AMQPValue::LongInt(-2));
        headers.insert("x-flag".into(), AMQPValue::Boolean(true));
        headers.insert(
            "x-price".into(),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 1234,
            }),
        );
        headers.insert("x-death".into(), AMQPValue::FieldArray(Vec::new().into()));
        let properties = BasicProperties::default()
            .with_message_id("order-42".into())
            .with_type("OrderPlaced".into())
            .with_timestamp(1_700_000_000)
            .with_headers(headers);
        let received = decode(
            &WireFormat::amqp(),
            incoming(&properties, false),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.id, None);
        assert_eq!(received.headers.get(FOREIGN_ID_HEADER), Some("order-42"));
        assert_eq!(received.headers.get("x-retries"), Some("-2"));
        assert_eq!(received.headers.get("x-flag"), Some("true"));
        assert_eq!(received.headers.get("x-price"), Some("12.34"));
        assert_eq!(received.headers.get("x-death"), None);
        assert_eq!(received.kind, "OrderPlaced");
        assert_eq!(received.coordinates.position, "order-42");
        assert!(received.created_at.is_some());

        let id = MessageId::new();
        let properties = BasicProperties::default().with_message_id(id.to_string().into());
        let received = decode(
            &WireFormat::amqp(),
            incoming(&properties, false),
            |_| false,
            Strictness::Strict,
        )
        .expect("decodes");
        assert_eq!(received.id, Some(id));
        assert!(received.headers.is_empty());
    }

    #[test]
    fn headers_that_are_not_text_fail_strictly_and_are_skipped_leniently() {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-blob".into(),
            AMQPValue::LongString(vec![0xff, 0xfe].into()),
        );
        headers.insert("x-ok".into(), AMQPValue::LongString("fine".into()));
        let properties = BasicProperties::default().with_headers(headers);
        let strict = decode(
            &WireFormat::amqp(),
            incoming(&properties, false),
            |_| false,
            Strictness::Strict,
        );
        assert!(matches!(strict, Err(InvalidMessage::InvalidHeader { .. })));
        let lenient = decode(
            &WireFormat::amqp(),
            incoming(&properties, false),
            |_| false,
            Strictness::Lenient,
        )
        .expect("lenient decode");
        assert_eq!(lenient.headers.get("x-ok"), Some("fine"));
        assert_eq!(lenient.headers.len(), 1);
    }
}
