//! What the fuzz targets share: messages made from the fuzzer's bytes, and the broker
//! encodings the targets build their inputs with.

use std::time::{Duration, SystemTime};

use arbitrary::{Arbitrary, Unstructured};
use oncebox_core::{Headers, Limits, Message, MessageId};

/// A message that passes [`Message::validate`], its fields chosen by the fuzzer: what a
/// producer can enqueue and a relay publishes.
#[derive(Debug)]
pub struct AnyMessage(pub Message);

impl<'a> Arbitrary<'a> for AnyMessage {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut topic: String = u.arbitrary()?;
        if topic.is_empty() {
            topic.push('t');
        }
        let mut message = Message::new(topic, u.arbitrary::<Vec<u8>>()?)
            .with_id(MessageId::from_uuid(uuid::Uuid::from_bytes(u.arbitrary()?)));
        message.key = u.arbitrary()?;
        message.kind = u.arbitrary()?;
        let pairs: Vec<(String, String)> = u.arbitrary()?;
        let mut headers = Headers::new();
        for (name, value) in pairs {
            // Headers that break the rules are not part of a valid message.
            let _ = headers.insert(name, value);
        }
        message.headers = headers;
        message.created_at = time_of_micros(u.int_in_range(MIN_MICROS..=MAX_MICROS)?);
        if message.validate(&Limits::default()).is_err() {
            return Err(arbitrary::Error::IncorrectFormat);
        }
        Ok(Self(message))
    }
}

/// The range of times RFC 3339 can write (years 0000 to 9999), in microseconds since the
/// Unix epoch.
const MIN_MICROS: i64 = -62_167_219_200_000_000;
const MAX_MICROS: i64 = 253_402_300_799_999_999;

/// The time `micros` microseconds after the Unix epoch (messages' times are whole
/// microseconds, what the wire format carries).
pub fn time_of_micros(micros: i64) -> SystemTime {
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// A RESP2 reply: what the targets hand to the Redis client's parser.
#[derive(Debug, Clone)]
pub enum Resp {
    /// `$n\r\n...\r\n`
    Bulk(Vec<u8>),
    /// `*n\r\n...`
    Array(Vec<Resp>),
    /// `$-1\r\n`
    Nil,
    /// `:n\r\n`
    Int(i64),
}

impl Resp {
    /// The reply as Redis sends it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Resp::Bulk(bytes) => {
                out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Resp::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.write(out);
                }
            }
            Resp::Nil => out.extend_from_slice(b"$-1\r\n"),
            Resp::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        }
    }

    /// An `XREADGROUP` reply holding one entry of `stream` with `fields`.
    pub fn read_reply(stream: &str, id: &str, fields: &[(Vec<u8>, Vec<u8>)]) -> Self {
        let fields = fields
            .iter()
            .flat_map(|(name, value)| [Resp::Bulk(name.clone()), Resp::Bulk(value.clone())])
            .collect();
        let entry = Resp::Array(vec![
            Resp::Bulk(id.as_bytes().to_vec()),
            Resp::Array(fields),
        ]);
        Resp::Array(vec![Resp::Array(vec![
            Resp::Bulk(stream.as_bytes().to_vec()),
            Resp::Array(vec![entry]),
        ])])
    }
}

/// The parts of `data` framed as the targets frame several inputs in one: each a
/// big-endian `u16` length and that many bytes (a length past the end takes the rest).
pub fn frames(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let (length, after) = rest.split_first_chunk::<2>()?;
        let length = usize::from(u16::from_be_bytes(*length)).min(after.len());
        let (frame, after) = after.split_at(length);
        rest = after;
        Some(frame)
    })
}

/// `parts` framed as [`frames`] reads them.
pub fn framed<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        let length = u16::try_from(part.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&part[..usize::from(length)]);
    }
    out
}

/// `properties` as lapin writes them in an AMQP content header.
pub fn amqp_properties(properties: &oncebox_rabbitmq::lapin::BasicProperties) -> Vec<u8> {
    use oncebox_rabbitmq::lapin::protocol::basic::gen_properties;
    // Past any message's properties: headers are at most 64 KiB, attributes far less.
    let mut buffer = vec![0; 1 << 20];
    let cursor = std::io::Cursor::new(&mut buffer[..]);
    let written = cookie_factory::r#gen(gen_properties(properties), cursor)
        .map(|(_, written)| written)
        .expect("properties fit the buffer");
    buffer.truncate(usize::try_from(written).unwrap_or(0));
    buffer
}
