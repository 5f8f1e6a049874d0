//! Options of the Redis Streams transport.

use std::time::Duration;

use oncebox_core::{Error, Result};

/// Redis's own limit on one bulk string (`proto-max-bulk-len`, 512 MB by default): the
/// largest payload a server with default settings accepts.
pub const REDIS_MAX_BULK_BYTES: usize = 512 * 1024 * 1024;

/// How the Redis Streams transport names its keys, publishes, reads and redelivers.
///
/// ```
/// use std::time::Duration;
/// use oncebox_redis::RedisStreamOptions;
///
/// let options = RedisStreamOptions::new()
///     .key_prefix("shop:")
///     .ack_timeout(Duration::from_secs(60))
///     .max_len(1_000_000);
/// options.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStreamOptions {
    pub(crate) key_prefix: String,
    pub(crate) dead_letter_suffix: String,
    pub(crate) source: String,
    pub(crate) max_len: Option<u64>,
    pub(crate) max_payload_bytes: usize,
    pub(crate) ack_timeout: Duration,
    pub(crate) block: Duration,
    pub(crate) batch_size: usize,
    pub(crate) reclaim_interval: Duration,
    pub(crate) max_deliveries: u32,
    pub(crate) consumer: Option<String>,
    pub(crate) response_timeout: Duration,
}

impl RedisStreamOptions {
    /// The defaults, listed with each setter.
    pub fn new() -> Self {
        Self {
            key_prefix: String::new(),
            dead_letter_suffix: ":dead".to_owned(),
            source: oncebox_core::wire::DEFAULT_SOURCE.to_owned(),
            max_len: None,
            max_payload_bytes: REDIS_MAX_BULK_BYTES,
            ack_timeout: Duration::from_secs(30),
            block: Duration::from_secs(5),
            batch_size: 32,
            reclaim_interval: Duration::from_secs(1),
            max_deliveries: 20,
            consumer: None,
            response_timeout: Duration::from_secs(5),
        }
    }

    /// Prefix of every key: the stream of topic `orders` is the key `{prefix}orders`.
    /// Default: none, so the stream is named like the topic.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Suffix of the dead-letter stream's key: `{prefix}{topic}{suffix}`. Default:
    /// `":dead"`.
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_suffix = suffix.into();
        self
    }

    /// The CloudEvents `source` attribute written on every message (a URI reference
    /// naming the producing service). Default: `"oncebox"`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Trims each stream to about `entries` entries on every publish (`XADD MAXLEN ~`).
    /// Default: no trimming.
    ///
    /// Trimming drops the oldest entries whether or not every group has read and acked
    /// them: an entry trimmed while still unread by a slow or stopped group is lost for
    /// that group (a pending one is reported deleted and dropped when reclaimed). Size
    /// it well above the backlog any group may build up.
    pub fn max_len(mut self, entries: u64) -> Self {
        self.max_len = Some(entries);
        self
    }

    /// Largest payload published, in bytes; larger messages fail with a permanent error
    /// before reaching Redis. Default and upper bound: 512 MB, Redis's
    /// `proto-max-bulk-len`. Set it to the server's value if that was lowered: Redis
    /// answers an oversized bulk string by closing the connection, which looks like a
    /// transient failure.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// How long a delivery may stay unsettled before another member of its group (or the
    /// same subscriber) claims it again (`XAUTOCLAIM`'s min-idle-time); also the longest
    /// nack delay honoured without parking (see the crate docs). Default: 30 s.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How long one `XREADGROUP` waits on the server for new entries before it is sent
    /// again. Default: 5 s.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Most entries read (`XREADGROUP COUNT`) or reclaimed (`XAUTOCLAIM COUNT`) at once.
    /// Default: 32.
    pub fn batch_size(mut self, entries: usize) -> Self {
        self.batch_size = entries;
        self
    }

    /// How often a subscriber looks for deliveries other members left unsettled (crashed
    /// consumers); its own unsettled deliveries and nacks are reclaimed on time without
    /// waiting for this. Default: 1 s.
    pub fn reclaim_interval(mut self, interval: Duration) -> Self {
        self.reclaim_interval = interval;
        self
    }

    /// Deliveries after which a reclaimed entry is dead-lettered by the subscriber
    /// instead of being delivered again (a message that crashes every consumer). Keep it
    /// above the consumer's own attempt limit, which dead-letters with the handler's
    /// error first. Default: 20.
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = deliveries;
        self
    }

    /// The consumer name of subscribers in their group. Default: a new unique name per
    /// subscriber (`oncebox-` and a UUID), so that members never share one.
    ///
    /// Two live subscribers must never use the same name: Redis would treat them as one
    /// consumer.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// How long a command other than the blocking read may take before it fails with a
    /// transient error; also the connection timeout. Default: 5 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The ack timeout set by [`RedisStreamOptions::ack_timeout`].
    pub fn ack_timeout_duration(&self) -> Duration {
        self.ack_timeout
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        let fail = |what: &str| Err(Error::InvalidOptions(format!("Redis Streams: {what}")));
        if self.dead_letter_suffix.is_empty() {
            return fail("dead_letter_suffix must not be empty");
        }
        if self.max_len == Some(0) {
            return fail("max_len must be at least 1");
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > REDIS_MAX_BULK_BYTES {
            return fail("max_payload_bytes must be between 1 and 512 MB");
        }
        if self.ack_timeout < Duration::from_millis(10) {
            return fail("ack_timeout must be at least 10 ms");
        }
        if self.block < Duration::from_millis(1) {
            return fail("block must be at least 1 ms (0 would block forever)");
        }
        if self.batch_size == 0 {
            return fail("batch_size must be at least 1");
        }
        if self.reclaim_interval.is_zero() {
            return fail("reclaim_interval must not be zero");
        }
        if self.max_deliveries == 0 {
            return fail("max_deliveries must be at least 1");
        }
        if self.consumer.as_deref() == Some("") {
            return fail("consumer must not be empty");
        }
        if self.response_timeout.is_zero() {
            return fail("response_timeout must not be zero");
        }
        Ok(())
    }
}

impl Default for RedisStreamOptions {
    /// [`RedisStreamOptions::new`].
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert!(RedisStreamOptions::new().validate().is_ok());
        let cases = [
            (RedisStreamOptions::new().batch_size(0), "batch_size"),
            (RedisStreamOptions::new().block(Duration::ZERO), "block"),
            (RedisStreamOptions::new().max_len(0), "max_len"),
            (
                RedisStreamOptions::new().dead_letter_suffix(""),
                "dead_letter_suffix",
            ),
            (
                RedisStreamOptions::new().max_deliveries(0),
                "max_deliveries",
            ),
            (
                RedisStreamOptions::new().max_payload_bytes(REDIS_MAX_BULK_BYTES + 1),
                "max_payload_bytes",
            ),
            (RedisStreamOptions::new().consumer(""), "consumer"),
        ];
        for (options, name) in cases {
            let error = options.validate().expect_err(name);
            assert!(
                error.is_invalid_input() && error.to_string().contains(name),
                "{error}"
            );
        }
    }
}
