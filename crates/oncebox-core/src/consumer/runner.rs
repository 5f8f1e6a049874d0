//! The consumer loop: pull deliveries, process them in key-ordered lanes, settle them.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::ConsumerHealthHandle;
use super::metrics::ConsumerMetrics;
use super::process::unwind_as_error;
use super::{Outcome, Process};
use crate::retry::{Decision, Retries};
use crate::{Delivery, Error, Received, Result, Subscriber, trace};

/// Called with each delivery and its outcome (metrics, progress, tests).
type Observer = Arc<dyn Fn(&Received, &Outcome) + Send + Sync>;

/// Pulls deliveries from a [`Subscriber`] and runs a [`Process`] (a
/// [`TransactionalInbox`](super::TransactionalInbox), [`DurableInbox`](super::DurableInbox)
/// or [`IdempotentReceiver`](super::IdempotentReceiver)) on each, in concurrent lanes.
/// Deliveries with the same key always go to the same lane, so they are processed in the
/// order the broker delivered them.
///
/// Each delivery is settled by what processing returned:
///
/// | processing | the delivery |
/// |---|---|
/// | handled, a duplicate, stored | acked |
/// | in progress on another worker | nacked until that worker's lease ends |
/// | a permanent failure | dead-lettered with the reason |
/// | a transient failure (a panic of the handler, a handler past its `handler_timeout`) | nacked with backoff; dead-lettered once the broker's delivery count reaches the attempt limit |
/// | an outage of the store (connection lost, server down) | held, and processed again with backoff until the store answers; no attempt is spent |
///
/// While it runs, it also deletes the dedup records that outlived the dedup window,
/// every [`cleanup_interval`](super::ConsumerOptions::cleanup_interval)
/// ([`Process::cleanup`]).
pub struct Consumer<Sub, P> {
    subscriber: Sub,
    processor: Arc<P>,
    lanes: usize,
    observer: Option<Observer>,
    health: ConsumerHealthHandle,
}

impl<Sub, P> Consumer<Sub, P>
where
    Sub: Subscriber,
    P: Process + 'static,
{
    /// A consumer with 16 lanes running `processor` on what `subscriber` receives.
    pub fn new(subscriber: Sub, processor: P) -> Self {
        Self {
            subscriber,
            processor: Arc::new(processor),
            lanes: 16,
            observer: None,
            health: ConsumerHealthHandle::default(),
        }
    }

    /// Sets the number of concurrent lanes (at least 1). Default: 16.
    #[must_use]
    pub fn lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
        self
    }

    /// A view of how the receiving loop fares (its last delivery, its receive errors),
    /// to take before [`run_until`](Self::run_until) consumes the consumer: a readiness
    /// check reads it while the consumer runs.
    pub fn health(&self) -> ConsumerHealthHandle {
        self.health.clone()
    }

    /// Calls `observer` with every delivery and its outcome, once it is settled.
    #[must_use]
    pub fn on_outcome(
        mut self,
        observer: impl Fn(&Received, &Outcome) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Consumes until `shutdown` completes or the subscription closes, then stops: each
    /// lane finishes the delivery it is processing (bounded by the
    /// [`handler_timeout`](super::ConsumerOptions::handler_timeout)) and hands back the
    /// ones queued behind it without starting them (up to 64 a lane), nacked with no
    /// delay so that the broker delivers them again at once (to another member of the
    /// group, or to the next run). A handed back delivery is no outcome and no failure;
    /// a broker that counts deliveries counts its redelivery in
    /// [`Received::delivery_count`] as it counts any. A stop thus takes about one
    /// handler's time, not the time of every queued delivery. A delivery held through an
    /// outage of the store is nacked at shutdown instead of waiting for the store.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the store was closed under the consumer; an error naming
    /// the lane when a lane ended for another reason than shutdown (a panic outside the
    /// handler, in a transport's settle call or the observer). The other lanes finish
    /// the deliveries they hold first. Transport errors while receiving are logged and
    /// retried; the subscription closing ends the loop normally.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: unsettled deliveries are redelivered after the
    /// broker's ack timeout.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let (stop, stopped) = watch::channel(false);
        let mut lanes = JoinSet::new();
        let mut senders = Vec::with_capacity(self.lanes);
        for _ in 0..self.lanes {
            let (tx, rx) = mpsc::channel::<Sub::Delivery>(64);
            senders.push(tx);
            let lane = Lane {
                metrics: ConsumerMetrics::new(&self.processor.options().consumer),
                processor: Arc::clone(&self.processor),
                observer: self.observer.clone(),
                stopped: stopped.clone(),
            };
            lanes.spawn(lane.run(rx));
        }
        // In a set of its own, so that dropping this future stops it too.
        let mut cleanup = JoinSet::new();
        cleanup.spawn(cleanup_loop(Arc::clone(&self.processor)));
        let mut round_robin = 0usize;
        let mut shutdown = std::pin::pin!(shutdown);
        let mut failure = None;
        loop {
            let delivery = tokio::select! {
                () = &mut shutdown => break,
                ended = lanes.join_next() => {
                    failure = Some(lane_lost(ended));
                    break;
                }
                next = self.subscriber.next() => next,
            };
            let delivery = match delivery {
                Ok(delivery) => {
                    self.health.delivered();
                    delivery
                }
                Err(Error::Closed) => break,
                Err(error) => {
                    self.health.failed(&error);
                    tracing::warn!(%error, "receiving failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
            // Waiting for room in a full lane must not delay the stop: the delivery in
            // hand is then handed back, not started.
            let room = tokio::select! {
                () = &mut shutdown => Err(()),
                room = senders[lane].reserve() => room.map_err(drop),
            };
            match room {
                Ok(room) => room.send(delivery),
                Err(()) => {
                    // Stopping, or the lane ended (its join below reports why).
                    hand_back(delivery).await;
                    break;
                }
            }
        }
        let _ = stop.send(true);
        // Each cleanup statement is bounded and cancel safe: stop between any two.
        cleanup.abort_all();
        drop(senders);
        while let Some(ended) = lanes.join_next().await {
            if let Err(error) = flatten(ended) {
                failure.get_or_insert(error);
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// One lane: processes its deliveries one at a time and settles each.
struct Lane<P> {
    processor: Arc<P>,
    metrics: ConsumerMetrics,
    observer: Option<Observer>,
    stopped: watch::Receiver<bool>,
}

impl<P: Process> Lane<P> {
    async fn run<D: Delivery>(mut self, mut deliveries: mpsc::Receiver<D>) -> Result<()> {
        let mut handed_back = 0u64;
        while let Some(delivery) = deliveries.recv().await {
            if *self.stopped.borrow() {
                // Stopping: what waits behind the delivery that was running is not
                // started, but handed back to the broker at once.
                hand_back(delivery).await;
                handed_back += 1;
                continue;
            }
            // Settling consumes the delivery: keep a copy only for an observer.
            let received = self.observer.as_ref().map(|_| delivery.received().clone());
            let settled = settle(
                &*self.processor,
                delivery,
                Some(&mut self.stopped),
                &self.metrics,
            );
            match settled.await {
                Ok(Some(outcome)) => {
                    if let (Some(observe), Some(received)) = (&self.observer, &received) {
                        observe(received, &outcome);
                    }
                }
                Ok(None) => {}
                Err(Error::Closed) => return Err(Error::Closed),
                Err(error) => {
                    tracing::warn!(%error, "could not settle a delivery; the broker will redeliver it");
                }
            }
        }
        if handed_back > 0 {
            tracing::debug!(
                consumer = %self.processor.options().consumer,
                handed_back,
                "stopping: handed back the deliveries not started"
            );
        }
        Ok(())
    }
}

/// Hands a delivery not started back to the broker, due again at once: nacked without
/// delay, neither processed nor counted as an outcome. If the broker does not take the
/// nack, it redelivers the message after its ack timeout instead.
async fn hand_back<D: Delivery>(delivery: D) {
    if let Err(error) = delivery.nack(Duration::ZERO).await {
        tracing::warn!(%error, "could not hand back a delivery at stop; the broker will redeliver it after its ack timeout");
    }
}

/// Processes one delivery with `processor` and settles it, as each lane of a
/// [`Consumer`] does (see its table), for callers with a receive loop of their own.
///
/// # Errors
///
/// A transport error if the broker did not take the settlement (it then redelivers);
/// [`Error::Closed`] if the store was closed (the delivery is nacked).
///
/// # Cancel safety
///
/// While the store is out the delivery is held and processed again with backoff, until
/// the store answers or the future is dropped; dropping it leaves the delivery
/// unsettled, for the broker to redeliver after its ack timeout.
pub async fn process_delivery<P: Process, D: Delivery>(
    processor: &P,
    delivery: D,
) -> Result<Outcome> {
    let metrics = ConsumerMetrics::new(&processor.options().consumer);
    match settle(processor, delivery, None, &metrics).await? {
        Some(outcome) => Ok(outcome),
        None => unreachable!("only a stop signal leaves a delivery unsettled"),
    }
}

/// Processes `delivery` (again while the store is out) and settles it, in the
/// delivery's `process` span; `None` when it was nacked because `stopped` said so while
/// it was held.
async fn settle<P: Process, D: Delivery>(
    processor: &P,
    delivery: D,
    stopped: Option<&mut watch::Receiver<bool>>,
    metrics: &ConsumerMetrics,
) -> Result<Option<Outcome>> {
    let span = trace::process(
        delivery.messaging_system(),
        &processor.options().consumer,
        delivery.received(),
    );
    let settled = settle_in_span(processor, delivery, stopped, metrics, &span)
        .instrument(span.clone())
        .await;
    match &settled {
        Ok(Some(outcome)) => trace::record_outcome(&span, outcome),
        Ok(None) => {}
        Err(error) => trace::record_error(&span, error),
    }
    settled
}

async fn settle_in_span<P: Process, D: Delivery>(
    processor: &P,
    delivery: D,
    mut stopped: Option<&mut watch::Receiver<bool>>,
    metrics: &ConsumerMetrics,
    span: &tracing::Span,
) -> Result<Option<Outcome>> {
    let options = processor.options();
    let attempts = delivery.received().delivery_count.max(1);
    let mut outages = 0;
    loop {
        let started = tokio::time::Instant::now();
        let processed = unwind_as_error(processor.process(delivery.received())).await;
        let took = started.elapsed();
        let error = match processed {
            Ok(Outcome::InProgress { retry_after }) => {
                delivery.nack(retry_after).await?;
                let outcome = Outcome::InProgress { retry_after };
                metrics.settled(&outcome, took);
                return Ok(Some(outcome));
            }
            Ok(outcome) => {
                delivery.ack().await?;
                metrics.settled(&outcome, took);
                return Ok(Some(outcome));
            }
            Err(error) => error,
        };
        let decided =
            Retries::new(options.max_attempts, &options.backoff).decide(&error, attempts, outages);
        if !matches!(decided, Decision::WaitOut { .. }) {
            // An outage held through is not this delivery's failure.
            trace::record_error(span, &error);
        }
        match decided {
            Decision::Retry { delay } => {
                tracing::debug!(consumer = %options.consumer, %error, ?delay, attempts, "processing failed; nacked");
                delivery.nack(delay).await?;
                let outcome = Outcome::Retrying { delay };
                metrics.settled(&outcome, took);
                return Ok(Some(outcome));
            }
            Decision::DeadLetter { reason } => {
                tracing::warn!(consumer = %options.consumer, message = ?delivery.received(), %reason, "dead-lettered");
                delivery.dead_letter(&reason).await?;
                let outcome = Outcome::DeadLettered { reason };
                metrics.settled(&outcome, took);
                return Ok(Some(outcome));
            }
            Decision::WaitOut { delay } => {
                outages += 1;
                tracing::warn!(consumer = %options.consumer, %error, ?delay, "store unreachable; holding the delivery");
                metrics::counter!("oncebox_consumer_outage_retries_total", "consumer" => options.consumer.clone())
                    .increment(1);
                let stop = async {
                    match stopped.as_deref_mut() {
                        Some(stopped) => {
                            let _ = stopped.wait_for(|stop| *stop).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop => {
                        delivery.nack(delay).await?;
                        return Ok(None);
                    }
                }
            }
            Decision::Stop => {
                tracing::warn!(consumer = %options.consumer, "the store is closed; stopping");
                delivery.nack(Duration::ZERO).await?;
                return Err(Error::Closed);
            }
        }
    }
}

/// Every [`cleanup_interval`](super::ConsumerOptions::cleanup_interval), deletes the
/// processor's records that outlived the dedup window ([`Process::cleanup`]), in
/// statements of at most `cleanup_batch`, until one deletes fewer; counts them in
/// `oncebox_consumer_purged_records_total`. A failed pass is logged and counted, and the
/// next one tries again.
async fn cleanup_loop<P: Process>(processor: Arc<P>) {
    let options = processor.options();
    let consumer = options.consumer.clone();
    let purged =
        metrics::counter!("oncebox_consumer_purged_records_total", "consumer" => consumer.clone());
    let failed =
        metrics::counter!("oncebox_consumer_cleanup_errors_total", "consumer" => consumer.clone());
    let limit = options.cleanup_batch;
    loop {
        tokio::time::sleep(options.cleanup_interval).await;
        loop {
            match processor.cleanup(limit).await {
                Ok(deleted) => {
                    purged.increment(deleted);
                    if deleted < limit as u64 {
                        break;
                    }
                }
                Err(error) => {
                    failed.increment(1);
                    tracing::warn!(%consumer, %error, "cleanup of dedup records failed");
                    break;
                }
            }
        }
    }
}

/// Why a lane ended while deliveries were still coming.
fn lane_lost(ended: Option<Result<Result<()>, tokio::task::JoinError>>) -> Error {
    ended
        .and_then(|ended| flatten(ended).err())
        .unwrap_or_else(|| Error::TaskLost("a consumer lane".to_owned()))
}

/// A lane's result, a panic of the lane being an error that names it.
fn flatten(ended: Result<Result<()>, tokio::task::JoinError>) -> Result<()> {
    match ended {
        Ok(result) => result,
        Err(join) => Err(Error::TaskLost(format!("a consumer lane ({join})"))),
    }
}
