//! The transactional inbox: dedup record, handler effect and result in one transaction.

use std::time::SystemTime;

use super::process::{reject_unidentified, settle_failure};
use super::{ConsumerOptions, Outcome, Process, TxHandler};
use crate::store::{InboxStore, Recorded};
use crate::{Delivery, Error, Received, Result};

/// Processes each message exactly once per consumer: in one transaction it records
/// `(consumer, id)` under a unique constraint, runs the handler with the transaction,
/// stores the result and commits; only then does it ack.
///
/// A duplicate (redelivery, concurrent copy on another worker, a crash after commit and
/// before ack) finds the record, skips the handler and is acked. A failure rolls
/// everything back and nacks with backoff; after the attempt limit, or at once for a
/// permanent failure, the message goes to the broker's dead-letter destination.
pub struct TransactionalInbox<S, H> {
    store: S,
    handler: H,
    options: ConsumerOptions,
}

impl<S: InboxStore, H: TxHandler<S::Tx>> TransactionalInbox<S, H> {
    /// An inbox over `store` running `handler`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` fail validation.
    pub fn new(store: S, handler: H, options: ConsumerOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            store,
            handler,
            options,
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The options.
    pub fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    /// Runs the handler for `received` unless its id was processed before; commits the
    /// record, the effect and the result together.
    ///
    /// # Errors
    ///
    /// The handler's or the store's error; nothing was committed then.
    pub async fn handle(&self, received: &Received) -> Result<(Outcome, bytes::Bytes)> {
        let id = self.options.id_strategy.id_of(received)?;
        let consumer = &self.options.consumer;
        let (mut tx, recorded) = self.store.begin_recorded(consumer, &id).await?;
        if let Recorded::Duplicate { result } = recorded {
            return Ok((Outcome::Duplicate, result));
        }
        let result = self.handler.handle(received, &mut tx).await?;
        // A record without a stored result reads back as empty: save the round trip.
        if !result.is_empty() {
            self.store
                .store_result(&mut tx, consumer, &id, &result)
                .await?;
        }
        self.store.commit(tx).await?;
        Ok((Outcome::Handled, result))
    }

    /// Deletes dedup records older than `age`, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `age` is shorter than the dedup window (a duplicate
    /// arriving within the window would be processed again); a store error.
    pub async fn purge_older_than(&self, age: std::time::Duration, limit: usize) -> Result<u64> {
        if age < self.options.dedup_window {
            return Err(Error::InvalidOptions(format!(
                "refusing to purge inbox records younger than the dedup window ({:?} < {:?})",
                age, self.options.dedup_window
            )));
        }
        self.store.purge(SystemTime::now() - age, limit).await
    }
}

impl<S, H, D> Process<D> for TransactionalInbox<S, H>
where
    S: InboxStore,
    H: TxHandler<S::Tx>,
    D: Delivery,
{
    async fn process(&self, delivery: D) -> Result<Outcome> {
        match self.handle(delivery.received()).await {
            Ok((outcome, _result)) => {
                delivery.ack().await?;
                Ok(outcome)
            }
            Err(Error::InvalidMessage(e)) => reject_unidentified(delivery, e, &self.options).await,
            Err(error) => settle_failure(delivery, error, &self.options).await,
        }
    }
}
