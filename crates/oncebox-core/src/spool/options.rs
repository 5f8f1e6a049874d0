//! Options of the spool engine (the outbox relay and the durable inbox processor).

use std::time::Duration;

use crate::{Backoff, Error, Result};

/// How long an outbox keeps published rows unless told otherwise: 24 h.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How a [`Spool`](super::Spool) claims, dispatches, retries and cleans up.
///
/// ```
/// use std::time::Duration;
/// use oncebox_core::spool::SpoolOptions;
///
/// let options = SpoolOptions::new()
///     .batch_size(512)
///     .lease(Duration::from_secs(60))
///     .max_attempts(20);
/// options.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct SpoolOptions {
    pub(crate) name: String,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
    pub(crate) dispatch_timeout: Duration,
    pub(crate) concurrency: usize,
    pub(crate) pipeline: bool,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) min_poll: Duration,
    pub(crate) max_poll: Duration,
    /// `None`: [`DEFAULT_RETENTION`], or the dedup window for a durable inbox.
    pub(crate) retention: Option<Duration>,
    pub(crate) cleanup_interval: Duration,
    pub(crate) cleanup_batch: usize,
    pub(crate) stats_interval: Duration,
}

impl SpoolOptions {
    /// The defaults, listed with each setter.
    pub fn new() -> Self {
        Self {
            name: "outbox".to_owned(),
            batch_size: 256,
            lease: Duration::from_secs(30),
            dispatch_timeout: Duration::from_secs(10),
            concurrency: 256,
            pipeline: true,
            max_attempts: 10,
            backoff: Backoff::new(),
            min_poll: Duration::from_millis(10),
            max_poll: Duration::from_secs(1),
            retention: None,
            cleanup_interval: Duration::from_secs(60),
            cleanup_batch: 1000,
            stats_interval: Duration::from_secs(5),
        }
    }

    /// Name used in logs and metric labels. Default: `"outbox"`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Most rows claimed at once. Default: 256.
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }

    /// How long a claim holds its rows. A relay that dies leaves its rows for this long;
    /// a relay that takes longer than this to deliver a batch may see another relay
    /// deliver the same rows (a duplicate, never a loss). Default: 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Deadline of one delivery (one publish); must be below the lease. Default: 10 s.
    pub fn dispatch_timeout(mut self, timeout: Duration) -> Self {
        self.dispatch_timeout = timeout;
        self
    }

    /// Most keys delivered at once (messages of one key always go one at a time).
    /// Default: 256, a whole default batch in flight, as a client that pipelines its
    /// publishes would send it.
    pub fn concurrency(mut self, keys: usize) -> Self {
        self.concurrency = keys;
        self
    }

    /// Whether the next batch is claimed while the current one is delivered, when the
    /// current one was full. Default: on.
    ///
    /// The store's per-key prefix rule makes this safe: rows in flight count as gaps, so
    /// the batch claimed ahead holds none of their keys, and no key is ever delivered by
    /// two batches at once. The store's round trip and the broker's then overlap, so
    /// the relay drains at the pace of the slower of the two rather than their sum. Off,
    /// each batch is claimed after the previous one was delivered.
    pub fn pipeline(mut self, on: bool) -> Self {
        self.pipeline = on;
        self
    }

    /// Attempts before a row is dead-lettered. Default: 10.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Delay between attempts of a failing row. Default: [`Backoff::new`].
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Bounds of the adaptive poll interval: after a full batch the spool claims again at
    /// once, after an empty one it waits, doubling from `min` up to `max` while idle.
    /// Default: 10 ms to 1 s.
    pub fn poll_interval(mut self, min: Duration, max: Duration) -> Self {
        self.min_poll = min;
        self.max_poll = max;
        self
    }

    /// How long done rows are kept before cleanup deletes them. Default: 24 h
    /// ([`DEFAULT_RETENTION`]) for an outbox; for a durable inbox's processor, the
    /// inbox's dedup window, which a retention set here may not be shorter than (a
    /// stored delivery is what recognises its duplicates).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Time between cleanup passes. Default: 60 s.
    pub fn cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Rows deleted per cleanup statement. Default: 1000.
    pub fn cleanup_batch(mut self, rows: usize) -> Self {
        self.cleanup_batch = rows;
        self
    }

    /// Time between readings of the table's backlog (pending and dead rows, the oldest
    /// pending age) for the metrics; each reading is one statement on the indexes of
    /// pending and dead rows. Default: 5 s.
    pub fn stats_interval(mut self, interval: Duration) -> Self {
        self.stats_interval = interval;
        self
    }

    /// The configured lease.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// How long done rows are kept: the retention set, else [`DEFAULT_RETENTION`].
    pub fn retention_duration(&self) -> Duration {
        self.retention.unwrap_or(DEFAULT_RETENTION)
    }

    /// Checks the options for values that cannot work.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        let invalid = |what: &str| Err(Error::InvalidOptions(what.to_owned()));
        if self.batch_size == 0 {
            return invalid("batch_size must be at least 1");
        }
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1");
        }
        if self.max_attempts == 0 {
            return invalid("max_attempts must be at least 1");
        }
        if self.cleanup_batch == 0 {
            return invalid("cleanup_batch must be at least 1");
        }
        if self.dispatch_timeout >= self.lease {
            return invalid("dispatch_timeout must be shorter than the lease");
        }
        if self.stats_interval.is_zero() {
            return invalid("stats_interval must be above zero");
        }
        if self.cleanup_interval.is_zero() {
            return invalid("cleanup_interval must be above zero");
        }
        if self.min_poll.is_zero() || self.min_poll > self.max_poll {
            return invalid("poll interval needs 0 < min <= max");
        }
        self.backoff.validate()
    }
}

impl Default for SpoolOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert!(SpoolOptions::new().validate().is_ok());
        let err = SpoolOptions::new().batch_size(0).validate().unwrap_err();
        assert!(err.to_string().contains("batch_size"));
        let err = SpoolOptions::new()
            .dispatch_timeout(Duration::from_secs(60))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("dispatch_timeout"));
    }
}
