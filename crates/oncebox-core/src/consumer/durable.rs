//! The durable inbox: store the delivery, ack at once, process later from the table.

use std::sync::Arc;

use super::process::{count_duplicate, run_handler};
use super::{ConsumerOptions, HandlerOutput, Outcome, Process, TxHandler};
use crate::spool::{Claimed, Sink, Spool, SpoolOptions};
use crate::store::{Accepted, DurableInboxStore};
use crate::{Received, Result, trace};
use tracing::Instrument;

/// The receiving half of the durable inbox: stores each delivery under its dedup id and
/// acks the broker at once, so the broker's redelivery limits and retention no longer
/// matter. Processing happens later, from the table, by the spool that
/// [`DurableInbox::processor`] builds; retries survive broker and process restarts.
///
/// A duplicate delivery finds the stored row and is acked without a second row.
pub struct DurableInbox<S> {
    store: Arc<S>,
    options: ConsumerOptions,
}

impl<S: DurableInboxStore> DurableInbox<S> {
    /// A durable inbox over `store` (already scoped to the consumer).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if `options` fail
    /// validation.
    pub fn new(store: S, options: ConsumerOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            store: Arc::new(store),
            options,
        })
    }

    /// The spool that processes stored deliveries with `handler`, each in one transaction
    /// with the mark that it is done.
    ///
    /// The inbox's dedup window ([`ConsumerOptions::dedup_window`]) is the one setting of
    /// how long deliveries are remembered: processed rows are kept that long (a kept row
    /// is what makes a redelivery a duplicate), unless `options` set a longer retention.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if `options` fail
    /// validation, or set a retention shorter than the dedup window (duplicates arriving
    /// after it would be stored and processed again).
    pub fn processor<H: TxHandler<S::Tx>>(
        &self,
        handler: H,
        mut options: SpoolOptions,
    ) -> Result<Spool<Arc<S>, HandlerSink<S, H>>> {
        let window = self.options.dedup_window;
        match options.retention {
            Some(retention) if retention < window => {
                return Err(crate::Error::InvalidOptions(format!(
                    "the processor's retention ({retention:?}) is shorter than the inbox's \
                     dedup window ({window:?}): duplicates arriving after it would be \
                     processed again"
                )));
            }
            Some(_) => {}
            None => options.retention = Some(window),
        }
        let sink = HandlerSink {
            store: Arc::clone(&self.store),
            handler,
            consumer: self.options.consumer.clone(),
            handler_timeout: self.options.handler_timeout,
        };
        Spool::new(Arc::clone(&self.store), sink, options)
    }
}

impl<S: DurableInboxStore> Process for DurableInbox<S> {
    fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    async fn process(&self, received: &Received) -> Result<Outcome> {
        let id = self.options.id_strategy.id_of(received)?;
        Ok(match self.store.accept(&id, received).await? {
            Accepted::New => Outcome::Stored,
            Accepted::Duplicate => {
                count_duplicate(&self.options.consumer, self.store.count_duplicate()).await;
                Outcome::Duplicate
            }
        })
    }
}

/// The durable inbox's sink: runs the handler and marks the row done in one transaction,
/// fenced by the claim's lease token. A panic of the handler, or a handler past the
/// consumer's [`handler_timeout`](ConsumerOptions::handler_timeout), is a failed attempt.
pub struct HandlerSink<S, H> {
    store: Arc<S>,
    handler: H,
    /// The consumer's name, for its spans.
    consumer: String,
    handler_timeout: std::time::Duration,
}

impl<S: DurableInboxStore, H: TxHandler<S::Tx>> Sink<Received> for HandlerSink<S, H> {
    async fn deliver(&self, claimed: &Claimed<Received>) -> Result<()> {
        let span = trace::process(trace::SYSTEM, &self.consumer, &claimed.item);
        let delivered = self.deliver_in_span(claimed).instrument(span.clone()).await;
        match &delivered {
            Ok(()) => trace::record_outcome(&span, &Outcome::Handled),
            Err(error) => trace::record_error(&span, error),
        }
        delivered
    }
}

impl<S: DurableInboxStore, H: TxHandler<S::Tx>> HandlerSink<S, H> {
    async fn deliver_in_span(&self, claimed: &Claimed<Received>) -> Result<()> {
        let mut tx = self.store.begin().await?;
        let handled = self.handler.handle(&claimed.item, &mut tx);
        let result = run_handler(self.handler_timeout, handled)
            .await?
            .into_bytes()?;
        self.store
            .complete(&mut tx, claimed.token, claimed.seq, &result)
            .await?;
        self.store.commit(tx).await
    }
}
