use std::time::Duration;

use super::*;

fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn decode(format: &WireFormat, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<Received, InvalidMessage> {
    format.decode(
        "orders",
        pairs.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
        Bytes::from_static(b"{}"),
        Coordinates::default(),
        1,
    )
}

#[test]
fn every_format_round_trips_a_message() {
    let message = Message::new("orders", &b"{}"[..])
        .with_key("order-42")
        .with_kind("order.placed")
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .expect("valid header");
    for format in [
        WireFormat::kafka(),
        WireFormat::nats(),
        WireFormat::amqp(),
        WireFormat::redis(),
    ] {
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = format
            .encode(&message)
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect();
        let received = decode(&format, &encoded).expect("decodes");
        assert_eq!(received.id, Some(message.id), "{format:?}");
        assert_eq!(received.key.as_deref(), Some("order-42"));
        assert_eq!(received.kind, "order.placed");
        assert_eq!(received.headers, message.headers, "{format:?}");
        let sent = message
            .created_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970");
        let got = received
            .created_at
            .expect("time parsed")
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970");
        assert!(
            sent.abs_diff(got) < Duration::from_micros(1),
            "{sent:?} vs {got:?}"
        );
    }
}

#[test]
fn encode_names_attributes_with_the_broker_prefix() {
    let message = Message::new("orders", &b""[..]);
    let names: Vec<String> = WireFormat::nats()
        .with_source("/shop")
        .encode(&message)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time"]
    );
    let source = WireFormat::amqp().with_source("/shop").encode(&message);
    assert!(source.contains(&("cloudEvents_source".to_owned(), "/shop".to_owned())));
}

#[test]
fn foreign_messages_keep_what_does_not_parse() {
    let pairs = fields(&[
        ("ce_id", "order-42-v1"),
        ("ce_time", "yesterday"),
        ("ce_partitionkey", "p7"),
        ("ce_type", "order.placed"),
        ("x-tenant", "acme"),
    ]);
    let received = decode(&WireFormat::kafka(), &pairs).expect("decodes");
    assert_eq!(received.id, None);
    assert_eq!(received.created_at, None);
    assert_eq!(received.kind, "order.placed");
    assert_eq!(received.headers.get("ce_id"), Some("order-42-v1"));
    assert_eq!(received.headers.get("ce_time"), Some("yesterday"));
    assert_eq!(received.headers.get("ce_partitionkey"), Some("p7"));
    assert_eq!(received.headers.get("x-tenant"), Some("acme"));
}

#[test]
fn a_message_without_attributes_arrives_bare() {
    let received = decode(&WireFormat::redis(), &[]).expect("decodes");
    assert_eq!(
        (received.id, received.key, received.kind.as_str()),
        (None, None, "")
    );
    assert!(received.headers.is_empty());
}

/// NATS's binary mode percent-encodes attribute values (space, `"`, `%`, non-ASCII)
/// and carries the content type as `ce-datacontenttype`; both come back as sent.
#[test]
fn nats_percent_encodes_attributes_and_carries_the_content_type() {
    let message = Message::json("orders", &"x")
        .expect("json")
        .with_key("Zürich 100% \"fresh\"")
        .with_kind("order.placed");
    let encoded = WireFormat::nats().encode(&message);
    let get = |name: &str| {
        encoded
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        get("ce-subject"),
        Some("Z%C3%BCrich%20100%25%20%22fresh%22")
    );
    assert_eq!(get("ce-datacontenttype"), Some(JSON));
    assert_eq!(
        get(CONTENT_TYPE),
        None,
        "content-type means structured mode on NATS"
    );
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = encoded
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
        .collect();
    let received = decode(&WireFormat::nats(), &pairs).expect("decodes");
    assert_eq!(received.key.as_deref(), Some("Zürich 100% \"fresh\""));
    assert_eq!(received.headers.get(CONTENT_TYPE), Some(JSON));
    // A spec-following producer's encoded time and subject are decoded.
    let foreign = fields(&[
        ("ce-time", "2026-11-21T13%3A05%3A09Z"),
        ("ce-subject", "caf%C3%A9"),
    ]);
    let received = decode(&WireFormat::nats(), &foreign).expect("decodes");
    assert!(received.created_at.is_some());
    assert_eq!(received.key.as_deref(), Some("café"));
    let broken = fields(&[("ce-subject", "caf%E9")]);
    assert!(decode(&WireFormat::nats(), &broken).is_err());
}

/// Kafka's binding carries the content type in the `content-type` header, the
/// message's own header.
#[test]
fn kafka_carries_the_content_type_as_its_header() {
    let message = Message::json("orders", &1).expect("json");
    let encoded = WireFormat::kafka().encode(&message);
    assert!(encoded.contains(&(CONTENT_TYPE.to_owned(), JSON.to_owned())));
    assert!(!encoded.iter().any(|(n, _)| n.contains("datacontenttype")));
}

/// Every event carries the `type` CloudEvents requires; an empty kind goes out as
/// the default type and comes back empty.
#[test]
fn an_empty_kind_travels_as_the_default_type() {
    let message = Message::new("orders", &b""[..]);
    let encoded = WireFormat::kafka().encode(&message);
    assert!(encoded.contains(&("ce_type".to_owned(), DEFAULT_TYPE.to_owned())));
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = encoded
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
        .collect();
    assert_eq!(
        decode(&WireFormat::kafka(), &pairs).expect("decodes").kind,
        ""
    );
}

#[test]
fn amqp_reads_the_colon_spelling_too() {
    let id = MessageId::new();
    let pairs = fields(&[("cloudEvents:id", &id.to_string())]);
    assert_eq!(
        decode(&WireFormat::amqp(), &pairs).expect("decodes").id,
        Some(id)
    );
}

/// The RabbitMQ binding the CloudEvents SDKs ship (Knative's) names attributes `ce-id`,
/// ...: a producer using it is read on RabbitMQ like one using the AMQP binding.
#[test]
fn amqp_reads_the_rabbitmq_binding_too() {
    let pairs = fields(&[
        ("ce-id", "order-42-v1"),
        ("ce-type", "order.placed"),
        ("ce-time", "2026-11-21T13:05:09.123Z"),
    ]);
    let received = decode(&WireFormat::amqp(), &pairs).expect("decodes");
    assert_eq!(received.headers.get("ce_id"), Some("order-42-v1"));
    assert_eq!(received.kind, "order.placed");
    assert!(received.created_at.is_some());
}

#[test]
fn times_with_offsets_are_read() {
    let utc = parse_time("2026-11-21T13:05:09Z").expect("utc");
    let offset = parse_time("2026-11-21T15:05:09+02:00").expect("offset");
    assert_eq!(utc, offset);
    assert_eq!(format_time(utc), "2026-11-21T13:05:09.000000Z");
}

/// Found by the fuzz target `message_roundtrip`: a header `cloudEvents_sub` came back
/// from RabbitMQ as `ce_sub`, and a header `ce_id` would replace the id.
#[test]
fn headers_named_like_attributes_are_refused() {
    for name in [
        "ce_id",
        "ce_time",
        "ce-id",
        "ce-partitionkey",
        "cloudEvents_sub",
        "cloudEvents_type",
    ] {
        let message = Message::new("orders", &b""[..])
            .with_header(name, "x")
            .expect("a valid header");
        assert!(
            matches!(
                check_headers(&message.headers),
                Err(InvalidMessage::InvalidHeader { .. })
            ),
            "{name}"
        );
        assert!(
            message.validate(&crate::Limits::default()).is_err(),
            "{name}"
        );
    }
    for name in ["ce_partitionkey", "ce_", "ce-", "cloudEvents_", "x-ce-id"] {
        let message = Message::new("orders", &b""[..])
            .with_header(name, "p7")
            .expect("a valid header");
        assert!(check_headers(&message.headers).is_ok(), "{name}");
        for format in [
            WireFormat::kafka(),
            WireFormat::nats(),
            WireFormat::amqp(),
            WireFormat::redis(),
        ] {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = format
                .encode(&message)
                .into_iter()
                .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
                .collect();
            let received = decode(&format, &pairs).expect("decodes");
            assert_eq!(received.headers, message.headers, "{name} {format:?}");
            assert_eq!(received.id, Some(message.id));
        }
    }
}

#[test]
fn headers_that_are_not_text_are_refused() {
    let pairs = vec![(b"x-blob".to_vec(), vec![0xff, 0xfe])];
    assert!(matches!(
        decode(&WireFormat::kafka(), &pairs),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    let pairs = vec![(b"ce_type".to_vec(), vec![0xff])];
    assert!(decode(&WireFormat::kafka(), &pairs).is_err());
}
