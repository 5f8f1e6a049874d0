//! Publishing: one `XADD` per message, its reply the confirmation; the `XADD`s of
//! concurrent publishes leave together ([`Batcher`]).

use std::fmt;
use std::sync::Arc;

use crate::connection::RedisConnection;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, InvalidMessage, Limits, Message, Publisher, Result};
use redis::Value;

use super::batcher::Batcher;
use super::entry::{DATA_FIELD, shape};
use super::options::RedisStreamOptions;
use crate::error::{StreamError, transport_error};

/// Publishes messages to Redis streams, one stream per topic. Cheap to clone; clones
/// share the connection.
///
/// Each publish is one `XADD`. The `XADD`s of concurrent publishes are sent together, as
/// one pipeline, by a task the publisher starts on its first publish; while a pipeline
/// is out, the next one gathers. The relay's throughput comes from this. Each publish
/// still gets its own reply: a command that Redis refuses fails alone. The publishes of
/// one key, which the relay never runs concurrently, reach the stream in order.
///
/// Redis has no broker-side deduplication: a message published twice (a relay that
/// crashed between the `XADD` reply and marking the row) is two entries. Consumers
/// deduplicate on the `ce_id` field.
#[derive(Clone)]
pub struct RedisStreamPublisher {
    batcher: Arc<Batcher>,
    config: Arc<PublishConfig>,
}

struct PublishConfig {
    format: WireFormat,
    prefix: String,
    max_len: Option<u64>,
    limits: Limits,
}

impl RedisStreamPublisher {
    pub(crate) fn new(connection: RedisConnection, options: &RedisStreamOptions) -> Self {
        Self {
            batcher: Arc::new(Batcher::new(connection)),
            config: Arc::new(PublishConfig {
                format: WireFormat::redis().with_source(options.source.clone()),
                prefix: options.key_prefix.clone(),
                max_len: options.max_len,
                limits: Limits::new().max_payload_bytes(options.max_payload_bytes),
            }),
        }
    }

    /// The `XADD` command that publishes `message` to stream `key`.
    fn command(&self, key: &str, message: &Message) -> redis::Cmd {
        let mut command = redis::cmd("XADD");
        command.arg(key);
        if let Some(entries) = self.config.max_len {
            command.arg("MAXLEN").arg("~").arg(entries);
        }
        command.arg("*");
        for (name, value) in self.config.format.encode(message) {
            command.arg(name).arg(value);
        }
        command.arg(DATA_FIELD).arg(&message.payload[..]);
        command
    }
}

/// Checks what Redis would refuse, or what would not read back: the limits, and a header
/// named like the payload's field.
fn check(message: &Message, limits: &Limits) -> Result<(), InvalidMessage> {
    message.validate(limits)?;
    if message.headers.get(DATA_FIELD).is_some() {
        return Err(InvalidMessage::InvalidHeader {
            name: DATA_FIELD.to_owned(),
            reason: "reserved: the Redis Streams transport carries the payload in this field",
        });
    }
    Ok(())
}

impl Publisher for RedisStreamPublisher {
    /// Appends `message` to the stream `{prefix}{topic}` (created if missing) and returns
    /// once Redis replied with the entry id.
    ///
    /// # Errors
    ///
    /// - permanent: a message over the size limit (512 MB, Redis's
    ///   `proto-max-bulk-len`, or the configured
    ///   [`max_payload_bytes`](RedisStreamOptions::max_payload_bytes)), an empty topic, a
    ///   header named `data`; a key that holds something other than a stream
    ///   (`WRONGTYPE`);
    /// - transient: Redis unreachable, timed out, loading, read-only, out of memory.
    ///
    /// # Cancel safety
    ///
    /// The entry may or may not have been added: the relay publishes it again, and
    /// consumers deduplicate.
    async fn publish(&self, message: &Message) -> Result<()> {
        check(message, &self.config.limits).map_err(Error::transport_permanent)?;
        let key = format!("{}{}", self.config.prefix, message.topic);
        let reply = self
            .batcher
            .send(self.command(&key, message), &key)
            .await
            .map_err(|e| transport_error(e, &key))?;
        match reply {
            Value::BulkString(_) | Value::SimpleString(_) => Ok(()),
            other => Err(Error::transport_permanent(StreamError::UnexpectedReply {
                command: "XADD",
                shape: shape(&other),
            })),
        }
    }

    fn messaging_system(&self) -> &'static str {
        "redis"
    }
}

impl fmt::Debug for RedisStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamPublisher")
            .field("prefix", &self.config.prefix)
            .field("max_len", &self.config.max_len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_redis_would_refuse_or_could_not_read_back() {
        let limits = Limits::new().max_payload_bytes(4);
        assert!(check(&Message::new("t", "1234"), &limits).is_ok());
        assert!(matches!(
            check(&Message::new("t", "12345"), &limits),
            Err(InvalidMessage::PayloadTooLarge { size: 5, limit: 4 })
        ));
        assert!(matches!(
            check(&Message::new("", "1"), &limits),
            Err(InvalidMessage::EmptyTopic)
        ));
        let data = Message::new("t", "1")
            .with_header("data", "x")
            .expect("valid header");
        assert!(matches!(
            check(&data, &limits),
            Err(InvalidMessage::InvalidHeader { .. })
        ));
    }
}
