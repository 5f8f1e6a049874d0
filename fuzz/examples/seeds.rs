//! Writes the hand-made seeds of the fuzz targets' corpora: real encodings of a message
//! by each broker's codec, real records and replies, and a few foreign ones.
//!
//! Run with (from the repository root; the `fuzzing` modules need the cfg):
//! `RUSTFLAGS="--cfg fuzzing" cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds --target-dir target/fuzz-seeds -- fuzz/corpus`

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Message, MessageId};
use oncebox_fuzz::{Resp, amqp_properties, framed};
use oncebox_rabbitmq::lapin::types::{AMQPValue, DecimalValue, FieldTable, LongString};

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let message = sample();
    let bare = Message::new("orders", &b""[..]).with_id(message.id);

    let mut seeds = Seeds(root);
    for (byte, format) in [
        (0u8, WireFormat::kafka()),
        (1, WireFormat::nats()),
        (2, WireFormat::amqp()),
        (3, WireFormat::redis()),
    ] {
        let name = format
            .prefix()
            .trim_end_matches(['_', '-', ':'])
            .to_lowercase();
        seeds.write(
            "wire_decode",
            &format!("{name}-message"),
            &headers(byte, &format, &message),
        )?;
        seeds.write(
            "wire_decode",
            &format!("{name}-bare"),
            &headers(byte, &format, &bare),
        )?;
    }
    let foreign: [(&[u8], &[u8]); 6] = [
        (b"ce_id", b"order-42-v1"),
        (b"ce_time", b"yesterday"),
        (b"ce_partitionkey", b"p7"),
        (b"ce_type", b"order.placed"),
        (b"cloudEvents:id", b"01936f1e-8a5c-7d2e-9b1a-3f4e5d6c7b8a"),
        (b"x-tenant", b"acme"),
    ];
    let mut input = vec![0];
    input.extend(framed(foreign.iter().flat_map(|(n, v)| [*n, *v])));
    seeds.write("wire_decode", "kafka-foreign", &input)?;

    // AMQP: a flag byte (redelivered), then the content header's properties.
    let properties = oncebox_rabbitmq::fuzzing::encode(&message).expect("encodes");
    seeds.write("amqp_properties", "message", &amqp(&properties))?;
    let mut table = FieldTable::default();
    table.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
    table.insert("x-retries".into(), AMQPValue::LongInt(-2));
    table.insert("x-flag".into(), AMQPValue::Boolean(true));
    let price = DecimalValue {
        scale: 2,
        value: 1234,
    };
    table.insert("x-price".into(), AMQPValue::DecimalValue(price));
    table.insert("x-death".into(), AMQPValue::FieldArray(Vec::new().into()));
    table.insert(
        "x-blob".into(),
        AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
    );
    let foreign = oncebox_rabbitmq::lapin::BasicProperties::default()
        .with_message_id("order-42".into())
        .with_type("OrderPlaced".into())
        .with_timestamp(1_700_000_000)
        .with_headers(table);
    seeds.write("amqp_properties", "foreign", &amqp(&foreign))?;

    // Redis Streams: a read reply holding our entry, a timeout, a deleted entry, a dead
    // letter.
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = WireFormat::redis()
        .encode(&message)
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
        .collect();
    fields.push((b"data".to_vec(), message.payload.to_vec()));
    let reply = Resp::read_reply("orders", "1700000000000-0", &fields);
    seeds.write("redis_stream_reply", "read", &reply.to_bytes())?;
    seeds.write("redis_stream_reply", "timeout", &Resp::Nil.to_bytes())?;
    let deleted = Resp::Array(vec![Resp::Array(vec![
        Resp::Bulk(b"orders".to_vec()),
        Resp::Array(vec![Resp::Array(vec![
            Resp::Bulk(b"2-0".to_vec()),
            Resp::Nil,
        ])]),
    ])]);
    seeds.write("redis_stream_reply", "deleted", &deleted.to_bytes())?;
    let mut dead = vec![
        (b"oncebox_dead_reason".to_vec(), b"handler gave up".to_vec()),
        (b"oncebox_dead_group".to_vec(), b"payments".to_vec()),
        (b"oncebox_dead_entry".to_vec(), b"1700000000000-0".to_vec()),
        (b"oncebox_dead_deliveries".to_vec(), b"5".to_vec()),
    ];
    dead.extend(fields);
    let entry = Resp::Array(vec![
        Resp::Bulk(b"1700000000001-0".to_vec()),
        Resp::Array(
            dead.into_iter()
                .flat_map(|(n, v)| [Resp::Bulk(n), Resp::Bulk(v)])
                .collect(),
        ),
    ]);
    seeds.write(
        "redis_stream_reply",
        "dead-letters",
        &Resp::Array(vec![entry]).to_bytes(),
    )?;
    let resp3 = b"%1\r\n$6\r\norders\r\n*1\r\n*2\r\n$3\r\n3-0\r\n%1\r\n$4\r\ndata\r\n$2\r\n{}\r\n";
    seeds.write("redis_stream_reply", "read-resp3", resp3)?;

    // The dedup store's script replies.
    let replies = [
        ("started", Resp::Array(vec![Resp::Int(0), Resp::Int(7)])),
        (
            "in-progress",
            Resp::Array(vec![Resp::Int(1), Resp::Int(250)]),
        ),
        (
            "completed",
            Resp::Array(vec![Resp::Int(2), Resp::Bulk(b"OBH1...".to_vec())]),
        ),
        (
            "completed-empty",
            Resp::Array(vec![Resp::Int(2), Resp::Nil]),
        ),
        ("finished", Resp::Int(1)),
        ("lease-lost", Resp::Int(0)),
    ];
    for (name, reply) in replies {
        seeds.write("redis_dedup_reply", name, &reply.to_bytes())?;
    }

    // The HTTP layer's stored record.
    let record = oncebox_http::fuzzing::Record {
        fingerprint: [7; 32],
        status: http::StatusCode::CREATED,
        headers: vec![
            (
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            ),
            (http::header::LINK, http::HeaderValue::from_static("</a>")),
            (http::header::LINK, http::HeaderValue::from_static("</b>")),
        ],
        body: Bytes::from_static(b"{\"id\":1}"),
    };
    let encoded = oncebox_http::fuzzing::encode_record(&record);
    seeds.write("http_record", "created", &encoded)?;
    seeds.write(
        "idempotency_key",
        "uuid",
        b"8e03978e-40d5-43e8-bc93-6894a57f9324",
    )?;
    seeds.write("idempotency_key", "quoted", b"\"order-42\"")?;

    // PostgreSQL's log-tailing relay: a logical decoding message, and pgoutput's
    // relation and insert of an outbox row.
    let content = oncebox_postgres::cdc::encode(&message, &message.headers);
    seeds.write("cdc_message", "message", &content)?;
    let minimal = br#"{"id":"0193a0c4-5b1e-7c6f-8d2a-1f0e9b8c7d6e","topic":"t"}"#;
    let mut content = vec![1];
    content.extend_from_slice(&u32::try_from(minimal.len()).unwrap_or(0).to_be_bytes());
    content.extend_from_slice(minimal);
    content.extend_from_slice(b"body");
    seeds.write("cdc_message", "minimal", &content)?;
    let insert = pgoutput_insert(&[
        Some("42"),
        Some(&message.id.to_string()),
        Some("orders"),
        Some("order-42"),
        Some("OrderPlaced"),
        Some(r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#),
        Some("\\x7b7d00ff"),
        Some("2026-11-27 04:39:31.123456+00"),
        Some("pending"),
        Some("0"),
    ]);
    let null_key = pgoutput_insert(&[
        Some("43"),
        Some(&MessageId::new().to_string()),
        Some("orders"),
        None,
        Some(""),
        Some("{}"),
        Some("\\x"),
        Some("2026-11-27 04:39:31+05:30"),
        Some("dead"),
        Some("0"),
    ]);
    let relation = pgoutput_relation();
    seeds.write(
        "cdc_row",
        "relation-insert",
        &framed([&relation[..], &insert[..], &null_key[..]]),
    )?;
    let mut begin = framed([&relation[..], &insert[..]]);
    begin.splice(0..0, 0x0002_d4a8_6f0c_1a40_i64.to_be_bytes());
    seeds.write("cdc_row", "insert-with-time", &begin)?;

    // Ids and times as headers and columns carry them.
    seeds.write("message_id", "uuid", message.id.to_string().as_bytes())?;
    seeds.write(
        "message_id",
        "braced",
        b"{01936f1e-8a5c-7d2e-9b1a-3f4e5d6c7b8a}",
    )?;
    seeds.write("message_id", "time-utc", b"2026-11-21T13:05:09.123456Z")?;
    seeds.write("message_id", "time-offset", b"2026-11-21T15:05:09+02:00")?;

    // The configuration: a file, and a file with environment variables.
    seeds.write("config", "relay", CONFIG.as_bytes())?;
    let with_env = format!(
        "{CONFIG}\0ONCEBOX_RELAY__BATCH_SIZE=64\nONCEBOX_STORE__PASSWORD=secret\nONCEBOX_TOPICS__ORDERS=shop.orders\n"
    );
    seeds.write("config", "relay-environment", with_env.as_bytes())?;
    Ok(())
}

const CONFIG: &str = r#"[store]
url = "postgres://oncebox@127.0.0.1:5432/shop"
schema = "oncebox"
pool_size = 8
connect_timeout = "5s"

[broker]
url = "nats://127.0.0.1:4222"
subject_prefix = "shop."
stream = "SHOP"

[topics]
orders = "orders.placed"

[relay]
mode = "cdc"
name = "orders-relay"
batch_size = 256
lease = "30s"
publish_timeout = "10s"
retention = "1d"

[cdc]
source = "table"
slot = "oncebox_outbox"
heartbeat = "10s"

[receive]
topic = "orders"
consumer = "payments"
dedup_window = "7d"

[http]
listen = "127.0.0.1:9464"
"#;

/// A message with every field set.
fn sample() -> Message {
    let mut message = Message::new("orders", &b"{\"order\":42}"[..])
        .with_key("order-42")
        .with_kind("order.placed")
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .expect("a valid header")
        .with_header("x-tenant", "acme")
        .expect("a valid header");
    message.created_at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_795_784_709_123_456);
    message
}

/// A `wire_decode` input: the format's byte, then `message`'s headers framed.
fn headers(byte: u8, format: &WireFormat, message: &Message) -> Vec<u8> {
    let fields = format.encode(message);
    let mut input = vec![byte];
    input.extend(framed(
        fields
            .iter()
            .flat_map(|(n, v)| [n.as_bytes(), v.as_bytes()]),
    ));
    input
}

/// An `amqp_properties` input: not redelivered, then the properties as lapin writes them.
fn amqp(properties: &oncebox_rabbitmq::lapin::BasicProperties) -> Vec<u8> {
    let mut input = vec![0];
    input.extend(amqp_properties(properties));
    input
}

const RELATION_ID: u32 = 16_385;

/// pgoutput's Relation message for `oncebox.outbox` (protocol version 1).
fn pgoutput_relation() -> Vec<u8> {
    let columns: [(&str, u32); 10] = [
        ("seq", 20),
        ("id", 2950),
        ("topic", 25),
        ("key", 25),
        ("kind", 25),
        ("headers", 3802),
        ("payload", 17),
        ("created_at", 1184),
        ("status", 25),
        ("attempts", 23),
    ];
    let mut out = vec![b'R'];
    out.extend_from_slice(&RELATION_ID.to_be_bytes());
    out.extend_from_slice(b"oncebox\0outbox\0");
    out.push(b'd');
    out.extend_from_slice(&u16::try_from(columns.len()).unwrap_or(0).to_be_bytes());
    for (index, (name, oid)) in columns.iter().enumerate() {
        out.push(u8::from(index == 0));
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(&oid.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes());
    }
    out
}

/// pgoutput's Insert message of a row of `oncebox.outbox`, values in text output.
fn pgoutput_insert(values: &[Option<&str>]) -> Vec<u8> {
    let mut out = vec![b'I'];
    out.extend_from_slice(&RELATION_ID.to_be_bytes());
    out.push(b'N');
    out.extend_from_slice(&u16::try_from(values.len()).unwrap_or(0).to_be_bytes());
    for value in values {
        match value {
            None => out.push(b'n'),
            Some(text) => {
                out.push(b't');
                out.extend_from_slice(&u32::try_from(text.len()).unwrap_or(0).to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
    out
}

/// The corpus directory, one directory per target.
struct Seeds(PathBuf);

impl Seeds {
    fn write(&mut self, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir: &Path = &self.0.join(target);
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)
    }
}
