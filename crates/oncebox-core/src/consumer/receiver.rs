//! The idempotent receiver: a lease and a cached result in a [`DedupStore`].

use std::time::Duration;

use super::lease::keep_lease;
use super::process::run_handler;
use super::{ConsumerOptions, Handler, HandlerOutput, Outcome, Process, StoreFailure};
use crate::store::{Begin, DedupStore};
use crate::{Error, Received, Result};

/// Runs a handler at most once at a time per id and answers duplicates with the first
/// result, using a [`DedupStore`] (Redis, memory, a SQL table) beside the handler.
///
/// `begin` takes the id with a lease and a fencing token; the handler runs while the
/// lease is kept alive (extended every third of it: see [`keep_lease`]); `complete`
/// stores the result for the dedup window. A duplicate arriving meanwhile is nacked
/// until the holder is done; one arriving after completion is acked. A handler that
/// fails, panics or runs past its [`handler_timeout`](ConsumerOptions::handler_timeout)
/// frees the id at once. If the lease cannot be kept (lost, or the
/// store unreachable until it would end), the handler is stopped before it ends, so two
/// workers never run one id at once.
///
/// **What this does not promise:** the handler's effect lives outside the dedup store, so
/// a crash after the effect and before `complete` lets the effect happen again once the
/// lease ends. Use the [`TransactionalInbox`](super::TransactionalInbox) where the effect
/// is a database write, or make the effect itself idempotent.
pub struct IdempotentReceiver<D, H> {
    store: D,
    handler: H,
    options: ConsumerOptions,
    result_ttl: Duration,
}

impl<D: DedupStore, H: Handler> IdempotentReceiver<D, H> {
    /// A receiver over `store` running `handler`; results are kept for the dedup window
    /// of `options`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` fail validation.
    pub fn new(store: D, handler: H, options: ConsumerOptions) -> Result<Self> {
        options.validate()?;
        let result_ttl = options.dedup_window;
        Ok(Self {
            store,
            handler,
            options,
            result_ttl,
        })
    }

    /// The store.
    pub fn store(&self) -> &D {
        &self.store
    }
}

impl<S: DedupStore, H: Handler> Process for IdempotentReceiver<S, H> {
    fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    async fn process(&self, received: &Received) -> Result<Outcome> {
        let id = self.options.id_strategy.id_of(received)?;
        let lease = self.options.lease;
        let taken_at = tokio::time::Instant::now();
        let token = match self.store.begin(&id, lease).await {
            Ok(Begin::Started(token)) => token,
            Ok(Begin::Completed(_)) => return Ok(Outcome::Duplicate),
            Ok(Begin::InProgress { retry_after }) => {
                return Ok(Outcome::InProgress {
                    retry_after: retry_after.max(Duration::from_millis(10)),
                });
            }
            Err(error) => return self.store_failed(received, error).await,
        };
        let handler = run_handler(self.options.handler_timeout, self.handler.handle(received));
        let handled = match keep_lease(&self.store, &id, token, lease, taken_at, handler).await {
            Ok(output) => output.into_bytes(),
            Err(error) => Err(error),
        };
        match handled {
            Ok(result) => {
                if let Err(error) = self
                    .store
                    .complete(&id, token, &result, self.result_ttl)
                    .await
                {
                    // The effect happened; another worker took the id after our lease
                    // ended and may repeat it. Nothing to undo here: say so loudly.
                    tracing::warn!(
                        consumer = %self.options.consumer, %id, %error,
                        "completed after losing the lease; the effect may repeat"
                    );
                }
                Ok(Outcome::Handled)
            }
            Err(error) => {
                if let Err(abandon) = self.store.abandon(&id, token).await {
                    tracing::debug!(%id, %abandon, "could not free the id; its lease will");
                }
                Err(error)
            }
        }
    }

    /// Deletes expired records ([`DedupStore::purge_expired`]): a completed record
    /// expires a dedup window after its completion, so none younger is deleted.
    async fn cleanup(&self, limit: usize) -> Result<u64> {
        self.store.purge_expired(limit).await
    }
}

impl<S: DedupStore, H: Handler> IdempotentReceiver<S, H> {
    /// The dedup store failed before the handler ran: fail closed (the store's error
    /// settles the delivery: an outage holds it, a permanent error dead-letters it) or
    /// fail open (run the handler unguarded).
    async fn store_failed(&self, received: &Received, error: Error) -> Result<Outcome> {
        match self.options.on_store_failure {
            StoreFailure::FailClosed => {
                tracing::warn!(consumer = %self.options.consumer, %error, "dedup store failed; not processing (fail-closed)");
                Err(error)
            }
            StoreFailure::FailOpen => {
                tracing::warn!(consumer = %self.options.consumer, %error, "dedup store failed; processing without dedup (fail-open)");
                metrics::counter!("oncebox_receiver_unguarded_total", "consumer" => self.options.consumer.clone())
                    .increment(1);
                run_handler(self.options.handler_timeout, self.handler.handle(received)).await?;
                Ok(Outcome::HandledUnguarded)
            }
        }
    }
}
