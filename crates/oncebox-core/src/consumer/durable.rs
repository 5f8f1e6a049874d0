//! The durable inbox: store the delivery, ack at once, process later from the table.

use std::sync::Arc;

use super::process::{reject_unidentified, settle_failure};
use super::{ConsumerOptions, Outcome, Process, TxHandler};
use crate::spool::{Claimed, Sink, Spool, SpoolOptions};
use crate::store::{Accepted, DurableInboxStore};
use crate::{Delivery, Received, Result};

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
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if `options` fail
    /// validation.
    pub fn processor<H: TxHandler<S::Tx>>(
        &self,
        handler: H,
        options: SpoolOptions,
    ) -> Result<Spool<Arc<S>, HandlerSink<S, H>>> {
        let sink = HandlerSink {
            store: Arc::clone(&self.store),
            handler,
        };
        Spool::new(Arc::clone(&self.store), sink, options)
    }
}

impl<S: DurableInboxStore, D: Delivery> Process<D> for DurableInbox<S> {
    async fn process(&self, delivery: D) -> Result<Outcome> {
        let id = match self.options.id_strategy.id_of(delivery.received()) {
            Ok(id) => id,
            Err(e) => return reject_unidentified(delivery, e, &self.options).await,
        };
        match self.store.accept(&id, delivery.received()).await {
            Ok(accepted) => {
                delivery.ack().await?;
                Ok(match accepted {
                    Accepted::New => Outcome::Stored,
                    Accepted::Duplicate => Outcome::Duplicate,
                })
            }
            Err(error) => settle_failure(delivery, error, &self.options).await,
        }
    }
}

/// The durable inbox's sink: runs the handler and marks the row done in one transaction,
/// fenced by the claim's lease token.
pub struct HandlerSink<S, H> {
    store: Arc<S>,
    handler: H,
}

impl<S: DurableInboxStore, H: TxHandler<S::Tx>> Sink<Received> for HandlerSink<S, H> {
    async fn deliver(&self, claimed: &Claimed<Received>) -> Result<()> {
        let mut tx = self.store.begin().await?;
        let result = self.handler.handle(&claimed.item, &mut tx).await?;
        self.store
            .complete(&mut tx, claimed.token, claimed.seq, &result)
            .await?;
        self.store.commit(tx).await
    }
}
