//! The consumer loop: pull deliveries, process them in key-ordered lanes.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Outcome, Process};
use crate::{Delivery, Error, Result, Subscriber};

/// Pulls deliveries from a [`Subscriber`] and runs a [`Process`] on each, in `lanes`
/// concurrent lanes. Deliveries with the same key always go to the same lane, so they are
/// processed in the order the broker delivered them.
pub struct Consumer<Sub, P> {
    subscriber: Sub,
    processor: Arc<P>,
    lanes: usize,
}

impl<Sub, P> Consumer<Sub, P>
where
    Sub: Subscriber,
    P: Process<Sub::Delivery> + 'static,
{
    /// A consumer with 16 lanes.
    pub fn new(subscriber: Sub, processor: Arc<P>) -> Self {
        Self {
            subscriber,
            processor,
            lanes: 16,
        }
    }

    /// Sets the number of concurrent lanes (at least 1). Default: 16.
    #[must_use]
    pub fn lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
        self
    }

    /// Consumes until `shutdown` completes or the subscription closes, then lets the
    /// lanes finish the deliveries they hold.
    ///
    /// Each outcome is passed to `observe` (for metrics, progress, tests).
    ///
    /// # Errors
    ///
    /// None at present: transport errors are logged and retried; the subscription
    /// closing ends the loop normally.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: unsettled deliveries are redelivered after the
    /// broker's ack timeout.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
        observe: impl Fn(&Outcome) + Send + Sync + 'static,
    ) -> Result<()> {
        let observe = Arc::new(observe);
        let mut lanes = JoinSet::new();
        let mut senders = Vec::with_capacity(self.lanes);
        for _ in 0..self.lanes {
            let (tx, mut rx) = mpsc::channel::<Sub::Delivery>(64);
            senders.push(tx);
            let processor = Arc::clone(&self.processor);
            let observe = Arc::clone(&observe);
            lanes.spawn(async move {
                while let Some(delivery) = rx.recv().await {
                    match processor.process(delivery).await {
                        Ok(outcome) => observe(&outcome),
                        Err(error) => tracing::warn!(%error, "could not settle a delivery; the broker will redeliver it"),
                    }
                }
            });
        }
        let mut round_robin = 0usize;
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let delivery = tokio::select! {
                () = &mut shutdown => break,
                next = self.subscriber.next() => next,
            };
            let delivery = match delivery {
                Ok(delivery) => delivery,
                Err(Error::Closed) => break,
                Err(error) => {
                    tracing::warn!(%error, "receiving failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let lane = match &delivery.received().key {
                Some(key) => {
                    let mut hasher = DefaultHasher::new();
                    key.hash(&mut hasher);
                    (hasher.finish() % senders.len() as u64) as usize
                }
                None => {
                    round_robin = round_robin.wrapping_add(1);
                    round_robin % senders.len()
                }
            };
            if senders[lane].send(delivery).await.is_err() {
                break;
            }
        }
        drop(senders);
        while lanes.join_next().await.is_some() {}
        Ok(())
    }
}
