//! Receiving: a consumer-group member reading new entries and reclaiming stuck ones.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::connection::RedisConnection;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, Result, Subscriber};
use redis::{RedisResult, Script, Value};
use tokio::time::{Instant, sleep_until};

use super::delivery::{Link, RedisStreamDelivery, millis};
use super::entry::{RawEntry, items, parse_entry, parse_read_reply, text};
use super::wakeups::Wakeup;
use crate::error::{StreamError, has_code, transport_error};

static RECLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/reclaim.lua")));

/// A command in flight, kept across calls of `next` so that dropping that future never
/// drops entries Redis already handed to this consumer.
type InFlight = Pin<Box<dyn Future<Output = RedisResult<Value>> + Send>>;

/// The start of `XAUTOCLAIM`'s scan of a group's pending entries.
const SCAN_START: &str = "0-0";

/// An entry taken from Redis, not yet handed out.
struct Fetched {
    entry: RawEntry,
    deliveries: u32,
    wakeup: Wakeup,
}

/// A member of a consumer group on one topic's stream.
///
/// It reads new entries with `XREADGROUP ... BLOCK` on a connection of its own (a
/// blocking read would stall every other command on a shared connection), and takes over
/// entries left unsettled for the ack timeout with `XAUTOCLAIM` on the shared one: its
/// own (dropped or nacked deliveries, at the time they become due) and other members'
/// (crashed consumers, every [`reclaim_interval`](super::RedisStreamOptions::reclaim_interval)).
///
/// An entry that cannot be decoded (a field that is not UTF-8, no `data` field), or one
/// delivered more than [`max_deliveries`](super::RedisStreamOptions::max_deliveries)
/// times, is dead-lettered by the subscriber itself with the reason, and logged.
pub struct RedisStreamSubscriber {
    link: Arc<Link>,
    reader: RedisConnection,
    format: WireFormat,
    batch_size: usize,
    block: Duration,
    max_deliveries: u32,
    reclaim_interval: Duration,
    buffer: VecDeque<Fetched>,
    read: Option<InFlight>,
    scan: Option<InFlight>,
    /// Where the reclaim scan goes on, and when its current pass started.
    cursor: String,
    pass_started: Option<Instant>,
    next_scan: Instant,
}

/// What [`RedisStreamSubscriber::new`] needs beyond the link.
pub(crate) struct SubscriberConfig {
    pub(crate) reader: RedisConnection,
    pub(crate) format: WireFormat,
    pub(crate) batch_size: usize,
    pub(crate) block: Duration,
    pub(crate) max_deliveries: u32,
    pub(crate) reclaim_interval: Duration,
}

impl RedisStreamSubscriber {
    pub(crate) fn new(link: Link, config: SubscriberConfig) -> Self {
        Self {
            link: Arc::new(link),
            reader: config.reader,
            format: config.format,
            batch_size: config.batch_size,
            block: config.block,
            max_deliveries: config.max_deliveries,
            reclaim_interval: config.reclaim_interval,
            buffer: VecDeque::new(),
            read: None,
            scan: None,
            cursor: SCAN_START.to_owned(),
            pass_started: None,
            // The first call looks for entries left pending by earlier members.
            next_scan: Instant::now(),
        }
    }

    /// The topic subscribed to.
    pub fn topic(&self) -> &str {
        &self.link.topic
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.link.group
    }

    /// This member's consumer name in the group.
    pub fn consumer(&self) -> &str {
        &self.link.consumer
    }

    /// When the next reclaim scan is due.
    fn scan_at(&self) -> Instant {
        match self.link.wakeups.earliest() {
            Some(due) => due.min(self.next_scan),
            None => self.next_scan,
        }
    }

    fn start_read(&self) -> InFlight {
        let mut command = redis::cmd("XREADGROUP");
        command
            .arg("GROUP")
            .arg(&self.link.group)
            .arg(&self.link.consumer)
            .arg("COUNT")
            .arg(self.batch_size)
            .arg("BLOCK")
            .arg(millis(self.block).max(1))
            .arg("STREAMS")
            .arg(&self.link.keys.stream)
            .arg(">");
        let mut reader = self.reader.clone();
        Box::pin(async move { command.query_async(&mut reader).await })
    }

    fn start_scan(&mut self) -> InFlight {
        if self.cursor == SCAN_START {
            self.pass_started = Some(Instant::now());
        }
        let link = Arc::clone(&self.link);
        let cursor = self.cursor.clone();
        let count = self.batch_size;
        Box::pin(async move {
            let mut connection = link.connection.clone();
            RECLAIM
                .key(&link.keys.stream)
                .key(&link.keys.parked)
                .arg(&link.group)
                .arg(&link.consumer)
                .arg(millis(link.ack_timeout))
                .arg(cursor)
                .arg(count)
                .invoke_async(&mut connection)
                .await
        })
    }

    /// Takes in the entries of a read.
    async fn finish_read(&mut self, result: RedisResult<Value>) -> Result<()> {
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => return self.recover(error).await,
        };
        let entries = parse_read_reply(reply).map_err(Error::transport_permanent)?;
        for entry in entries {
            let wakeup = self.link.wakeups.add(self.link.ack_timeout);
            self.buffer.push_back(Fetched {
                entry,
                deliveries: 1,
                wakeup,
            });
        }
        Ok(())
    }

    /// Takes in the entries of a reclaim scan, and moves the scan on.
    async fn finish_scan(&mut self, result: RedisResult<Value>) -> Result<()> {
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => return self.recover(error).await,
        };
        let malformed = || {
            Error::transport_permanent(StreamError::UnexpectedReply {
                command: "the reclaim script",
                shape: "not {cursor, claimed, parked}".into(),
            })
        };
        let Some([cursor, claimed, parked]) =
            items(reply).and_then(|i| <[Value; 3]>::try_from(i).ok())
        else {
            return Err(malformed());
        };
        let (Some(cursor), Some(claimed), Some(parked)) =
            (text(cursor), items(claimed), items(parked))
        else {
            return Err(malformed());
        };
        for item in claimed {
            let Some([id, fields, deliveries]) =
                items(item).and_then(|i| <[Value; 3]>::try_from(i).ok())
            else {
                return Err(malformed());
            };
            let deliveries = match deliveries {
                Value::Int(n) => u32::try_from(n).unwrap_or(u32::MAX).max(1),
                _ => return Err(malformed()),
            };
            let entry = parse_entry("the reclaim script", Value::Array(vec![id, fields]))
                .map_err(Error::transport_permanent)?;
            if let Some(entry) = entry {
                let wakeup = self.link.wakeups.add(self.link.ack_timeout);
                self.buffer.push_back(Fetched {
                    entry,
                    deliveries,
                    wakeup,
                });
            }
        }
        for item in parked {
            if let Some([_, Value::Int(ms)]) =
                items(item).and_then(|i| <[Value; 2]>::try_from(i).ok())
            {
                let ms = u64::try_from(ms).unwrap_or(0);
                self.link.wakeups.add(Duration::from_millis(ms));
            }
        }
        let now = Instant::now();
        if cursor == SCAN_START {
            if let Some(started) = self.pass_started.take() {
                self.link.wakeups.clear_until(started);
            }
            self.next_scan = now + self.reclaim_interval;
        } else {
            // More of the pending list to look at: go on at once.
            self.next_scan = now;
        }
        self.cursor = cursor;
        Ok(())
    }

    /// After a failed read or scan: recreates the group if Redis lost it, otherwise
    /// reports the error.
    async fn recover(&mut self, error: redis::RedisError) -> Result<()> {
        if !has_code(&error, "NOGROUP") {
            return Err(transport_error(error, &self.link.keys.stream));
        }
        tracing::warn!(
            stream = %self.link.keys.stream,
            group = %self.link.group,
            "the consumer group is gone (Redis restarted without its data, or the group or \
             stream was deleted); creating it again from the start of the stream"
        );
        self.cursor = SCAN_START.to_owned();
        self.pass_started = None;
        create_group(
            &self.link.connection,
            &self.link.keys.stream,
            &self.link.group,
        )
        .await
    }
}

/// Hands out `fetched`, or dead-letters it if it cannot be handed out (it does not
/// decode, or it was delivered too often).
///
/// A free function borrowing only what it needs: the subscriber itself is not `Sync`.
async fn hand_out(
    link: &Arc<Link>,
    format: &WireFormat,
    max_deliveries: u32,
    fetched: Fetched,
) -> Option<RedisStreamDelivery> {
    let reason = if fetched.deliveries > max_deliveries {
        format!(
            "delivered {} times, over the limit of {max_deliveries} (max_deliveries)",
            fetched.deliveries
        )
    } else {
        match fetched
            .entry
            .decode(format, &link.topic, fetched.deliveries)
        {
            Ok(received) => {
                return Some(RedisStreamDelivery::new(
                    Arc::clone(link),
                    fetched.entry.id,
                    received,
                    fetched.wakeup,
                ));
            }
            Err(undecodable) => format!("cannot decode the stream entry: {undecodable}"),
        }
    };
    let (stream, entry) = (&link.keys.stream, &fetched.entry.id);
    match link.dead_letter(entry, &reason, fetched.deliveries).await {
        Ok(moved) => {
            link.wakeups.remove(fetched.wakeup);
            if moved {
                tracing::warn!(%stream, %entry, %reason, "dead-lettered a stream entry");
            }
        }
        Err(error) => tracing::warn!(
            %stream, %entry, %reason, %error,
            "could not dead-letter a stream entry; trying again when it is reclaimed"
        ),
    }
    None
}

/// `XGROUP CREATE {stream} {group} 0 MKSTREAM`: a group that starts at the beginning of
/// the stream, so that it receives entries added before it existed. An existing group is
/// left as it is.
pub(crate) async fn create_group(
    connection: &RedisConnection,
    stream: &str,
    group: &str,
) -> Result<()> {
    let mut connection = connection.clone();
    let result: RedisResult<Value> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut connection)
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(error) if has_code(&error, "BUSYGROUP") => Ok(()),
        Err(error) => Err(transport_error(error, stream)),
    }
}

impl Subscriber for RedisStreamSubscriber {
    type Delivery = RedisStreamDelivery;

    /// The next entry for this member: one read before, one reclaimed (its ack timeout
    /// or nack delay passed), or a new one (`XREADGROUP >`).
    ///
    /// Waits on the server (`BLOCK`) rather than polling, waking for due reclaims. If
    /// Redis lost the group (it restarted without persistence), the group is created
    /// again from the start of the stream and reading goes on.
    ///
    /// # Errors
    ///
    /// A transient transport error while Redis is unreachable (calling again retries,
    /// reconnecting); a permanent one if the stream's key holds another type.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a read or reclaim in flight is kept and finished by the next call,
    /// so entries Redis handed to this consumer are not left behind. Only the
    /// dead-lettering of an undecodable entry can be interrupted; it is then retried
    /// when the entry is reclaimed.
    async fn next(&mut self) -> Result<RedisStreamDelivery> {
        loop {
            if let Some(fetched) = self.buffer.pop_front() {
                let handed = hand_out(&self.link, &self.format, self.max_deliveries, fetched);
                if let Some(delivery) = handed.await {
                    return Ok(delivery);
                }
                continue;
            }
            if self.scan.is_none() && self.scan_at() <= Instant::now() {
                self.scan = Some(self.start_scan());
            }
            if let Some(scan) = self.scan.as_mut() {
                // Short (no blocking); the read, if in flight, stays in flight.
                let result = scan.await;
                self.scan = None;
                self.finish_scan(result).await?;
                continue;
            }

            let link = Arc::clone(&self.link);
            let changed = link.wakeups.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Register before looking, so that a nack after the look wakes us.
            changed.as_mut().enable();
            let scan_at = self.scan_at();
            if scan_at <= Instant::now() {
                continue;
            }
            if self.read.is_none() {
                self.read = Some(self.start_read());
            }
            let Some(read) = self.read.as_mut() else {
                continue;
            };
            tokio::select! {
                result = read => {
                    self.read = None;
                    self.finish_read(result).await?;
                }
                () = sleep_until(scan_at) => {}
                () = changed => {}
            }
        }
    }
}

impl fmt::Debug for RedisStreamSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamSubscriber")
            .field("stream", &self.link.keys.stream)
            .field("group", &self.link.group)
            .field("consumer", &self.link.consumer)
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}
