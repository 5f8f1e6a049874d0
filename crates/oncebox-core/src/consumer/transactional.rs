//! The transactional inbox: dedup record, handler effect and result in one transaction.

use super::process::{count_duplicate, run_handler};
use super::{ConsumerOptions, HandlerOutput, Outcome, Process, TxHandler};
use crate::store::{InboxStore, Recorded};
use crate::{Error, Received, Result};

/// Processes each message exactly once per consumer: in one transaction it records
/// `(consumer, id)` under a unique constraint, runs the handler with the transaction,
/// stores the result and commits; only then does it ack.
///
/// A duplicate (redelivery, concurrent copy on another worker, a crash after commit and
/// before ack) finds the record, skips the handler and is acked. A failure (an error or
/// a panic of the handler) rolls everything back; the [`Consumer`](super::Consumer)
/// then settles the delivery by the error's [`Fault`](crate::Fault).
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
    /// [`Error::InvalidMessage`] if the id strategy finds no id; the handler's error (a
    /// panic of the handler is a transient [`Error::Handler`]) or the store's; nothing
    /// was committed then.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future rolls the transaction back.
    pub async fn handle(&self, received: &Received) -> Result<(Outcome, bytes::Bytes)> {
        let id = self.options.id_strategy.id_of(received)?;
        let consumer = &self.options.consumer;
        let (mut tx, recorded) = self.store.begin_recorded(consumer, &id).await?;
        if let Recorded::Duplicate { result } = recorded {
            drop(tx);
            count_duplicate(consumer, self.store.count_duplicate(consumer)).await;
            return Ok((Outcome::Duplicate, result));
        }
        let handled = self.handler.handle(received, &mut tx);
        let result = run_handler(self.options.handler_timeout, handled)
            .await?
            .into_bytes()?;
        // A record without a stored result reads back as empty: save the round trip.
        if !result.is_empty() {
            self.store
                .store_result(&mut tx, consumer, &id, &result)
                .await?;
        }
        self.store.commit(tx).await?;
        Ok((Outcome::Handled, result))
    }

    /// Deletes this consumer's dedup records older than `age`, at most `limit`; the
    /// records of other consumers sharing the table are left alone.
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
        self.store
            .purge(&self.options.consumer, crate::time::ago(age), limit)
            .await
    }
}

impl<S, H> Process for TransactionalInbox<S, H>
where
    S: InboxStore,
    H: TxHandler<S::Tx>,
{
    fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    async fn process(&self, received: &Received) -> Result<Outcome> {
        let (outcome, _result) = self.handle(received).await?;
        Ok(outcome)
    }

    /// Deletes this consumer's records older than the dedup window.
    async fn cleanup(&self, limit: usize) -> Result<u64> {
        self.purge_older_than(self.options.dedup_window, limit)
            .await
    }
}
