//! One delivery from a Redis stream, and the state it shares with its subscriber.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::connection::RedisConnection;
use oncebox_core::{Delivery, Received, Result};
use redis::{Script, Value};

use super::wakeups::{Wakeup, Wakeups};
use crate::error::{StreamError, has_code, transport_error};
use crate::streams::entry::shape;

static NACK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/nack.lua")));
static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dead_letter.lua")));

/// The keys of one topic.
#[derive(Debug, Clone)]
pub(crate) struct TopicKeys {
    pub(crate) stream: String,
    pub(crate) dead: String,
    /// Nacks whose delay is longer than the ack timeout (see `lua/nack.lua`).
    pub(crate) parked: String,
}

impl TopicKeys {
    /// The keys of `topic`. On a cluster the dead-letter stream and the parked nacks
    /// must share the stream's slot (a script touches all three): they carry the stream
    /// key as a hash tag, `{<stream>}:dead`, unless it has a hash tag of its own, which
    /// they then share (`{shop}:orders` and `{shop}:orders:dead`).
    pub(crate) fn new(prefix: &str, topic: &str, dead_suffix: &str, cluster: bool) -> Self {
        let stream = format!("{prefix}{topic}");
        let base = if cluster && !has_hash_tag(&stream) {
            format!("{{{stream}}}")
        } else {
            stream.clone()
        };
        Self {
            dead: format!("{base}{dead_suffix}"),
            parked: format!("{base}:parked"),
            stream,
        }
    }

    /// Whether the three keys hash to one slot. Only a stream key with braces but no
    /// hash tag (`a}b`, `x{}`) makes them differ; on a single server they may.
    pub(crate) fn check_one_slot(&self) -> oncebox_core::Result<()> {
        use redis::cluster_routing::Slot;
        let slot = Slot::for_key(&self.stream);
        if Slot::for_key(&self.dead) == slot && Slot::for_key(&self.parked) == slot {
            return Ok(());
        }
        Err(oncebox_core::Error::InvalidOptions(format!(
            "Redis Streams on a cluster: the stream key {:?} has braces but no hash tag, so \
             its dead-letter stream and parked nacks cannot share its slot; use a key \
             prefix and topic without braces, or with a hash tag such as {{shop}}:",
            self.stream
        )))
    }
}

/// Whether Redis Cluster hashes only a part of `key`: a `{` followed later by a `}` with
/// at least one character between the first two.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// What a subscriber and its deliveries share: where they settle, and the wake-up times.
pub(crate) struct Link {
    /// The shared, non-blocking connection (never the subscriber's blocking reader).
    pub(crate) connection: RedisConnection,
    pub(crate) topic: String,
    pub(crate) keys: TopicKeys,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) ack_timeout: Duration,
    pub(crate) wakeups: Wakeups,
}

impl Link {
    /// Moves entry `id` to the dead-letter stream with `reason`. `Ok(false)` if it was no
    /// longer pending (settled meanwhile).
    pub(crate) async fn dead_letter(
        &self,
        id: &str,
        reason: &str,
        deliveries: u32,
    ) -> Result<bool> {
        let mut connection = self.connection.clone();
        let reply: Value = DEAD_LETTER
            .key(&self.keys.stream)
            .key(&self.keys.dead)
            .key(&self.keys.parked)
            .arg(&self.group)
            .arg(id)
            .arg(reason)
            .arg(deliveries)
            .invoke_async(&mut connection)
            .await
            .map_err(|e| transport_error(e, &self.keys.stream))?;
        match reply {
            Value::Int(0) => Ok(false),
            Value::BulkString(_) | Value::SimpleString(_) => Ok(true),
            other => Err(oncebox_core::Error::transport_permanent(
                StreamError::UnexpectedReply {
                    command: "the dead-letter script",
                    shape: shape(&other),
                },
            )),
        }
    }
}

/// Milliseconds for Redis, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One delivery of a stream entry to a member of a consumer group.
///
/// Settling consumes it. Dropped unsettled, the entry stays pending in the group and is
/// delivered again once it has been idle for the ack timeout, like a consumer that
/// crashed. Settling late (after another member claimed the entry again) is harmless:
/// `XACK` of an entry that is no longer pending changes nothing.
pub struct RedisStreamDelivery {
    link: Arc<Link>,
    entry: String,
    received: Received,
    wakeup: Wakeup,
}

impl RedisStreamDelivery {
    pub(crate) fn new(link: Arc<Link>, entry: String, received: Received, wakeup: Wakeup) -> Self {
        Self {
            link,
            entry,
            received,
            wakeup,
        }
    }

    /// The stream entry id (also in [`Received::coordinates`]).
    pub fn entry_id(&self) -> &str {
        &self.entry
    }
}

impl Delivery for RedisStreamDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// `XACK`: the group never delivers the entry again. Acking an entry that is no
    /// longer pending (acked by a redelivery already) succeeds and changes nothing.
    ///
    /// # Errors
    ///
    /// A transient transport error when Redis cannot be reached; the entry is then
    /// delivered again after the ack timeout.
    ///
    /// # Cancel safety
    ///
    /// The `XACK` may or may not have run; if not, the entry is delivered again after the
    /// ack timeout.
    async fn ack(self) -> Result<()> {
        let mut connection = self.link.connection.clone();
        let _acked: i64 = redis::cmd("XACK")
            .arg(&self.link.keys.stream)
            .arg(&self.link.group)
            .arg(&self.entry)
            .query_async(&mut connection)
            .await
            .map_err(|e| transport_error(e, &self.link.keys.stream))?;
        self.link.wakeups.remove(self.wakeup);
        Ok(())
    }

    /// Leaves the entry pending and makes it due again after `delay`: its idle time is
    /// set to the ack timeout less `delay` (`XCLAIM ... IDLE`), so the group's next
    /// reclaim after `delay` delivers it again. A delay longer than the ack timeout is
    /// parked in a hash beside the stream and honoured by every reclaiming subscriber.
    ///
    /// Only the delivery that currently holds the entry can nack it: once the entry was
    /// claimed again (after the ack timeout), a nack changes nothing.
    ///
    /// # Errors
    ///
    /// A transient transport error when Redis cannot be reached; the entry is then
    /// delivered again after the ack timeout.
    ///
    /// # Cancel safety
    ///
    /// The script may or may not have run: the entry comes back after `delay` or after
    /// the ack timeout.
    async fn nack(self, delay: Duration) -> Result<()> {
        let link = &self.link;
        let (ack_timeout, wanted) = (millis(link.ack_timeout), millis(delay));
        // Idle time to set, delay beyond the ack timeout, when to look again here.
        let (idle, parked, due) = if wanted <= ack_timeout {
            (ack_timeout - wanted, 0, delay)
        } else {
            (0, wanted, link.ack_timeout)
        };
        let mut connection = link.connection.clone();
        let result: redis::RedisResult<i64> = NACK
            .key(&link.keys.stream)
            .key(&link.keys.parked)
            .arg(&link.group)
            .arg(&link.consumer)
            .arg(&self.entry)
            .arg(self.received.delivery_count)
            .arg(idle)
            .arg(parked)
            .invoke_async(&mut connection)
            .await;
        match result {
            Ok(held) => {
                link.wakeups.remove(self.wakeup);
                if held == 1 {
                    link.wakeups.add_and_notify(due);
                }
                Ok(())
            }
            // The group is gone (Redis restarted empty, or it was destroyed): nothing
            // is pending any more, so there is nothing to redeliver.
            Err(error) if has_code(&error, "NOGROUP") => {
                link.wakeups.remove(self.wakeup);
                Ok(())
            }
            Err(error) => Err(transport_error(error, &link.keys.stream)),
        }
    }

    /// Moves the entry to the topic's dead-letter stream, with `reason`, and acks it, in
    /// one Lua script (atomic): see the crate docs for the dead letter's fields. A
    /// delivery of an entry that is no longer pending (acked meanwhile) adds nothing.
    ///
    /// # Errors
    ///
    /// A transient transport error when Redis cannot be reached; the entry is then
    /// delivered again after the ack timeout.
    ///
    /// # Cancel safety
    ///
    /// The script is atomic: the entry is either dead-lettered and acked, or still
    /// pending and delivered again after the ack timeout.
    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.link
            .dead_letter(&self.entry, reason, self.received.delivery_count)
            .await?;
        self.link.wakeups.remove(self.wakeup);
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        "redis"
    }
}

impl fmt::Debug for RedisStreamDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamDelivery")
            .field("stream", &self.link.keys.stream)
            .field("group", &self.link.group)
            .field("entry", &self.entry)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}
