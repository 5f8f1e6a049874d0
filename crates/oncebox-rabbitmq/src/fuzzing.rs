//! Entry points for the fuzz targets in `fuzz/` at the repository root. Compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets; not part of the crate's API.

use lapin::BasicProperties;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, InvalidMessage, Message, Received};

use crate::codec::{self, Incoming, Strictness};

/// The AMQP properties the publisher sends for `message`.
///
/// # Errors
///
/// As the publisher's encoding: a header name over 255 bytes.
pub fn encode(message: &Message) -> Result<BasicProperties, InvalidMessage> {
    codec::encode(&WireFormat::amqp(), message)
}

/// Decodes a delivery as the subscriber does (`lenient: false`) or as the dead-letter
/// reader does (`lenient: true`).
///
/// # Errors
///
/// A header no [`Headers`](oncebox_core::Headers) may hold, when strict.
pub fn decode(
    properties: &BasicProperties,
    routing_key: &str,
    redelivered: bool,
    body: Bytes,
    lenient: bool,
) -> Result<Received, InvalidMessage> {
    let incoming = Incoming {
        routing_key,
        redelivered,
        properties,
        body,
    };
    let strictness = if lenient {
        Strictness::Lenient
    } else {
        Strictness::Strict
    };
    codec::decode(&WireFormat::amqp(), incoming, |_| false, strictness)
}
