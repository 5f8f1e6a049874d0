//! Options of the consumer engines.

use std::time::Duration;

use super::IdStrategy;
use crate::{Backoff, Error, Result};

/// What the idempotent receiver does when its dedup store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreFailure {
    /// Do not process: nack the delivery and retry later. No duplicate effect, at the
    /// price of latency while the store is down. The default.
    #[default]
    FailClosed,
    /// Process without the dedup check: the message keeps flowing, and a duplicate
    /// arriving meanwhile has its effect again.
    FailOpen,
}

/// How a consumer identifies, retries and deduplicates messages.
///
/// ```
/// use std::time::Duration;
/// use oncebox_core::consumer::{ConsumerOptions, IdStrategy};
///
/// let options = ConsumerOptions::new("payments")
///     .id_strategy(IdStrategy::Header("Idempotency-Key".into()))
///     .max_attempts(8)
///     .dedup_window(Duration::from_secs(14 * 24 * 3600));
/// options.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ConsumerOptions {
    pub(crate) consumer: String,
    pub(crate) id_strategy: IdStrategy,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) dedup_window: Duration,
    pub(crate) lease: Duration,
    pub(crate) on_store_failure: StoreFailure,
    pub(crate) handler_timeout: Duration,
    pub(crate) cleanup_interval: Duration,
    pub(crate) cleanup_batch: usize,
}

impl ConsumerOptions {
    /// Options for the consumer named `consumer` (the scope of its dedup records: two
    /// consumers of one message each process it once).
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
            id_strategy: IdStrategy::MessageId,
            max_attempts: 5,
            backoff: Backoff::new().max(Duration::from_secs(60)),
            dedup_window: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(30),
            on_store_failure: StoreFailure::FailClosed,
            handler_timeout: Duration::from_secs(5 * 60),
            cleanup_interval: Duration::from_secs(60),
            cleanup_batch: 1000,
        }
    }

    /// How the dedup id is found. Default: [`IdStrategy::MessageId`].
    pub fn id_strategy(mut self, strategy: IdStrategy) -> Self {
        self.id_strategy = strategy;
        self
    }

    /// Deliveries of a failing message before it is dead-lettered. Default: 5.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Redelivery delay after a failure. Default: 1 s doubling to 60 s.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long dedup records are kept: a duplicate arriving later than this is processed
    /// again. It must outlast the longest redelivery your brokers can make (a rebalance
    /// after downtime, an operator's replay). The [`Consumer`](super::Consumer)'s cleanup
    /// deletes records once they are older than this (see
    /// [`cleanup_interval`](Self::cleanup_interval)), and a purge of younger ones is
    /// refused. Default: 7 days.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Idempotent receiver only: how long one worker holds an id while processing it; a
    /// worker that dies frees it after this. Default: 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Idempotent receiver only: what to do when the dedup store fails. Default:
    /// [`StoreFailure::FailClosed`].
    pub fn on_store_failure(mut self, mode: StoreFailure) -> Self {
        self.on_store_failure = mode;
        self
    }

    /// How long one run of the handler may take. A handler still running then is
    /// dropped and the attempt fails as a transient [`Error::Handler`] (its message says
    /// it timed out): the transactional inbox rolls its transaction back and returns the
    /// connection, the idempotent receiver frees the id, the durable inbox's processor
    /// releases the row for a later attempt; after
    /// [`max_attempts`](Self::max_attempts) the message is dead-lettered like any other
    /// failure. Dropping stops the handler at its next `.await`: work it does without
    /// yielding (a blocking call) is not interrupted, and a statement it was waiting for
    /// runs on in the database (holding its locks, the inbox record's among them, and
    /// its connection) until it ends: bound those with the database's own limits
    /// (PostgreSQL's `statement_timeout` and `lock_timeout`, MySQL's
    /// `max_execution_time` and `innodb_lock_wait_timeout`). Default: 5 minutes.
    ///
    /// A durable inbox's processor also bounds each whole delivery (begin, handler,
    /// commit) by its [`SpoolOptions::dispatch_timeout`](crate::spool::SpoolOptions::dispatch_timeout);
    /// the shorter of the two applies.
    pub fn handler_timeout(mut self, limit: Duration) -> Self {
        self.handler_timeout = limit;
        self
    }

    /// Time between the [`Consumer`](super::Consumer)'s cleanup passes, which delete the
    /// dedup records that outlived the [dedup window](Self::dedup_window): the
    /// transactional inbox's records of this consumer, the idempotent receiver's expired
    /// records (stores that expire records by themselves, such as Redis, have nothing to
    /// delete). A durable inbox's rows are cleaned by its processor's spool instead.
    /// Every process of a consumer cleans; the passes are idempotent. Default: 60 s.
    pub fn cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Most records deleted per cleanup statement; a pass repeats statements until one
    /// deletes fewer. Default: 1000.
    pub fn cleanup_batch(mut self, records: usize) -> Self {
        self.cleanup_batch = records;
        self
    }

    /// The consumer name.
    pub fn name(&self) -> &str {
        &self.consumer
    }

    /// The dedup window.
    pub fn window(&self) -> Duration {
        self.dedup_window
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        if self.consumer.is_empty() {
            return Err(Error::InvalidOptions("consumer name is empty".into()));
        }
        if self.max_attempts == 0 {
            return Err(Error::InvalidOptions(
                "max_attempts must be at least 1".into(),
            ));
        }
        if self.lease.is_zero() {
            return Err(Error::InvalidOptions("lease must be positive".into()));
        }
        if self.handler_timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "handler_timeout must be positive".into(),
            ));
        }
        if self.cleanup_interval.is_zero() {
            return Err(Error::InvalidOptions(
                "cleanup_interval must be positive".into(),
            ));
        }
        if self.cleanup_batch == 0 {
            return Err(Error::InvalidOptions(
                "cleanup_batch must be at least 1".into(),
            ));
        }
        self.backoff.validate()
    }
}
