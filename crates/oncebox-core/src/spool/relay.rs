//! The outbox relay: a spool that publishes.

use std::future::Future;

use super::{BatchReport, PublishSink, Spool, SpoolHealth, SpoolOptions, SpoolStore};
use crate::{Message, Publisher, Result};

/// The outbox relay: a [`Spool`] over an outbox table that publishes each message
/// through `P`, in per-key order, marking it published once the broker confirmed.
pub struct Relay<S: SpoolStore<Item = Message>, P> {
    spool: Spool<S, PublishSink<P>>,
}

impl<S: SpoolStore<Item = Message>, P: Publisher> Relay<S, P> {
    /// A relay publishing the outbox `store` through `publisher`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if `options` fail
    /// [`SpoolOptions::validate`].
    pub fn new(store: S, publisher: P, options: SpoolOptions) -> Result<Self> {
        Ok(Self {
            spool: Spool::new(store, PublishSink(publisher), options)?,
        })
    }

    /// Calls `hook` for every message given up on (beside the log line and the metric).
    #[must_use]
    pub fn on_dead_letter(self, hook: impl Fn(&Message, &str) + Send + Sync + 'static) -> Self {
        Self {
            spool: self.spool.on_dead_letter(hook),
        }
    }

    /// The outbox.
    pub fn store(&self) -> &S {
        self.spool.store()
    }

    /// The options.
    pub fn options(&self) -> &SpoolOptions {
        self.spool.options()
    }

    /// How the relay's loop fares: see [`Spool::health`].
    pub fn health(&self) -> SpoolHealth {
        self.spool.health()
    }

    /// One claim → publish → settle round: see [`Spool::run_once`].
    ///
    /// # Errors
    ///
    /// A store error from the claim or the settlement.
    ///
    /// # Cancel safety
    ///
    /// Rows claimed by a cancelled round stay leased until the lease ends and are then
    /// published again.
    pub fn run_once(&self) -> impl Future<Output = Result<BatchReport>> + Send + '_ {
        self.spool.run_once()
    }

    /// Rounds until a claim finds nothing due: see [`Spool::drain`].
    ///
    /// # Errors
    ///
    /// A store error from a claim or a settlement.
    ///
    /// # Cancel safety
    ///
    /// As [`run_once`](Self::run_once).
    pub fn drain(&self) -> impl Future<Output = Result<BatchReport>> + Send + '_ {
        self.spool.drain()
    }

    /// Relays until `shutdown` completes, with retention cleanup beside it: see
    /// [`Spool::run_until`].
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](crate::Error::Closed) or a permanent store error from a claim.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: claimed rows stay leased until their lease ends.
    pub fn run_until<'a>(
        &'a self,
        shutdown: impl Future<Output = ()> + Send + 'a,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        self.spool.run_until(shutdown)
    }

    /// Deletes published rows older than the retention: see [`Spool::cleanup`].
    ///
    /// # Errors
    ///
    /// A store error (rows deleted before it stay deleted).
    pub fn cleanup(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        self.spool.cleanup()
    }
}
