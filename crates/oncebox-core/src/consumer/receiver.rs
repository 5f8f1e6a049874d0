//! The idempotent receiver: a lease and a cached result in a [`DedupStore`].

use std::time::Duration;

use super::process::{reject_unidentified, settle_failure};
use super::{ConsumerOptions, Handler, Outcome, Process, StoreFailure};
use crate::store::{Begin, DedupStore};
use crate::{Delivery, Error, Result};

/// Runs a handler at most once at a time per id and answers duplicates with the first
/// result, using a [`DedupStore`] (Redis, memory, a SQL table) beside the handler.
///
/// `begin` takes the id with a lease and a fencing token; the handler runs; `complete`
/// stores the result for `result_ttl`. A duplicate arriving meanwhile is nacked until
/// the lease ends; one arriving after completion is acked.
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

impl<S, H, D> Process<D> for IdempotentReceiver<S, H>
where
    S: DedupStore,
    H: Handler,
    D: Delivery,
{
    async fn process(&self, delivery: D) -> Result<Outcome> {
        let received = delivery.received();
        let id = match self.options.id_strategy.id_of(received) {
            Ok(id) => id,
            Err(e) => return reject_unidentified(delivery, e, &self.options).await,
        };
        let begin = self.store.begin(&id, self.options.lease).await;
        let token = match begin {
            Ok(Begin::Started(token)) => token,
            Ok(Begin::Completed(_)) => {
                delivery.ack().await?;
                return Ok(Outcome::Duplicate);
            }
            Ok(Begin::InProgress { retry_after }) => {
                delivery
                    .nack(retry_after.max(Duration::from_millis(10)))
                    .await?;
                return Ok(Outcome::InProgress);
            }
            Err(error) => return self.store_unavailable(delivery, error).await,
        };
        match self.handler.handle(delivery.received()).await {
            Ok(result) => {
                match self
                    .store
                    .complete(&id, token, &result, self.result_ttl)
                    .await
                {
                    Ok(()) => {}
                    // The effect happened; another worker took the id after our lease
                    // ended and may repeat it. Nothing to undo here: say so loudly.
                    Err(error) => tracing::warn!(
                        consumer = %self.options.consumer, %id, %error,
                        "completed after losing the lease; the effect may repeat"
                    ),
                }
                delivery.ack().await?;
                Ok(Outcome::Handled)
            }
            Err(error) => {
                if let Err(abandon) = self.store.abandon(&id, token).await {
                    tracing::debug!(%id, %abandon, "could not free the id; its lease will");
                }
                settle_failure(delivery, error, &self.options).await
            }
        }
    }
}

impl<S: DedupStore, H: Handler> IdempotentReceiver<S, H> {
    async fn store_unavailable<D: Delivery>(&self, delivery: D, error: Error) -> Result<Outcome> {
        match self.options.on_store_failure {
            StoreFailure::FailClosed => {
                tracing::warn!(consumer = %self.options.consumer, %error, "dedup store failed; not processing (fail-closed)");
                let store_error = match error {
                    e @ Error::Store { .. } => e,
                    other => Error::store_transient(other),
                };
                settle_failure(delivery, store_error, &self.options).await
            }
            StoreFailure::FailOpen => {
                tracing::warn!(consumer = %self.options.consumer, %error, "dedup store failed; processing without dedup (fail-open)");
                metrics::counter!("oncebox_receiver_unguarded_total", "consumer" => self.options.consumer.clone())
                    .increment(1);
                match self.handler.handle(delivery.received()).await {
                    Ok(_) => {
                        delivery.ack().await?;
                        Ok(Outcome::HandledUnguarded)
                    }
                    Err(error) => settle_failure(delivery, error, &self.options).await,
                }
            }
        }
    }
}
