//! Every encoding a published message travels in, there and back: the CloudEvents
//! headers of each broker (`WireFormat::encode`, then `decode`), the AMQP properties as
//! bytes on the wire (the RabbitMQ transport's codec and lapin's frame parser), a Redis
//! stream entry as a RESP reply (the Redis Streams transport's reader), and the content
//! of a logical decoding message (PostgreSQL's log-tailing relay).
//!
//! Checks: a valid message comes back with its id, key, kind, headers, payload and
//! creation time (to the microsecond).

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::wire::{DEFAULT_TYPE, WireFormat};
use oncebox_core::{Bytes, Coordinates, Message, Received};
use oncebox_fuzz::{AnyMessage, Resp, amqp_properties};

fuzz_target!(|message: AnyMessage| {
    let message = message.0;
    for format in [WireFormat::kafka(), WireFormat::nats(), WireFormat::redis()] {
        let fields = format.encode(&message);
        let received = format
            .decode(
                &message.topic,
                fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
                message.payload.clone(),
                Coordinates::default(),
                1,
            )
            .unwrap_or_else(|error| panic!("{format:?} cannot read its own message: {error}"));
        same(&message, &received, &format!("{format:?}"));
    }
    amqp(&message);
    redis_stream(&message);
    logical_message(&message);
});

/// Through the RabbitMQ codec and the bytes of an AMQP content header.
fn amqp(message: &Message) {
    use oncebox_rabbitmq::lapin::protocol::basic::parse_properties;
    let Ok(properties) = oncebox_rabbitmq::fuzzing::encode(message) else {
        // The codec refuses header names over AMQP's 255 bytes; the publisher does too.
        return;
    };
    let wire = amqp_properties(&properties);
    let (rest, parsed) = parse_properties(&wire[..]).expect("properties parse back");
    assert!(rest.is_empty());
    let received = oncebox_rabbitmq::fuzzing::decode(
        &parsed,
        &message.topic,
        false,
        message.payload.clone(),
        false,
    )
    .expect("the RabbitMQ codec reads its own message");
    same(message, &received, "AMQP");
}

/// As an entry of an `XREADGROUP` reply.
fn redis_stream(message: &Message) {
    if message.headers.get("data").is_some() {
        // The publisher refuses it: the payload's field.
        return;
    }
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = WireFormat::redis()
        .encode(message)
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
        .collect();
    fields.push((b"data".to_vec(), message.payload.to_vec()));
    let reply = Resp::read_reply("stream", "1-0", &fields).to_bytes();
    let value = oncebox_redis::redis::parse_redis_value(&reply).expect("a RESP reply");
    let entries =
        oncebox_redis::fuzzing::read_reply(&message.topic, value).expect("the reply reads");
    assert_eq!(entries.len(), 1);
    let received = entries[0].as_ref().expect("the entry decodes");
    same(message, received, "Redis Streams");
}

/// As the content of a logical decoding message.
fn logical_message(message: &Message) {
    use oncebox_postgres::cdc;
    let content = Bytes::from(cdc::encode(message, &message.headers));
    let decoded = cdc::decode(&content, std::time::SystemTime::UNIX_EPOCH)
        .expect("the relay reads its own encoding");
    assert_eq!(decoded.id, message.id);
    assert_eq!(decoded.topic, message.topic);
    assert_eq!(decoded.key, message.key);
    assert_eq!(decoded.kind, message.kind);
    assert_eq!(decoded.headers, message.headers);
    assert_eq!(decoded.payload, message.payload);
    assert_eq!(decoded.created_at, message.created_at);
}

fn same(message: &Message, received: &Received, through: &str) {
    assert_eq!(received.id, Some(message.id), "{through}: id");
    assert_eq!(received.key, message.key, "{through}: key");
    // The type written for an empty kind reads back as empty: a message whose kind is
    // that very type loses it (documented in oncebox_core::wire).
    let kind = if message.kind == DEFAULT_TYPE {
        ""
    } else {
        &message.kind
    };
    assert_eq!(received.kind, kind, "{through}: kind");
    assert_eq!(received.headers, message.headers, "{through}: headers");
    assert_eq!(received.payload, message.payload, "{through}: payload");
    assert_eq!(
        received.created_at,
        Some(message.created_at),
        "{through}: created_at"
    );
}
