//! Entry points for the fuzz targets in `fuzz/` at the repository root. Compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets; not part of the crate's API.

use oncebox_core::store::Begin;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Received, Result};
use redis::Value;

use crate::streams::RedisDeadLetter;
use crate::streams::entry::{parse_entries, parse_read_reply};

/// What a reply of Redis decodes to: the reply's error, or each entry's message or
/// why it cannot be handed to a consumer, as text.
pub type Entries = Result<Vec<Result<Received, String>>, String>;

/// An `XREADGROUP` reply read as the subscriber reads it, each entry decoded on
/// `topic`.
pub fn read_reply(topic: &str, reply: Value) -> Entries {
    let entries = parse_read_reply(reply).map_err(|error| error.to_string())?;
    Ok(entries
        .iter()
        .map(|entry| {
            entry
                .decode(&WireFormat::redis(), topic, 1)
                .map_err(|error| error.to_string())
        })
        .collect())
}

/// An `XRANGE` reply of a dead-letter stream read as
/// [`RedisStreamSubscriber::dead_letters`](crate::RedisStreamSubscriber::dead_letters)
/// reads it, each dead letter's original message decoded.
pub fn dead_letters(topic: &str, reply: Value) -> Entries {
    let entries = parse_entries("XRANGE", reply).map_err(|error| error.to_string())?;
    Ok(entries
        .into_iter()
        .map(|entry| {
            RedisDeadLetter::from_entry(topic, entry)
                .received()
                .map_err(|error| error.to_string())
        })
        .collect())
}

/// The dedup store's reading of the `begin` script's reply.
///
/// # Errors
///
/// A permanent store error for a reply of another shape.
pub fn begin_reply(reply: Value) -> Result<Begin> {
    crate::dedup::decode_begin(reply)
}

/// The dedup store's reading of the `complete`, `extend` and `abandon` scripts'
/// replies.
///
/// # Errors
///
/// [`Error::LeaseLost`](oncebox_core::Error::LeaseLost) for 0, a permanent store error
/// for a reply of another shape.
pub fn finish_reply(reply: Value) -> Result<()> {
    crate::dedup::decode_finish("complete", reply)
}
