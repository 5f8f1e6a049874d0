//! End to end through a real broker: outbox → relay → transport → transactional inbox,
//! with crashes on both sides, and a count of every effect at the end.
//!
//! [`outbox_to_inbox`] enqueues [`EndToEnd::messages`] messages through an
//! [`OutboxHarness`], publishes them with the [`Relay`] to a [`TransportHarness`]'s
//! broker, and consumes them with several [`TransactionalInbox`] workers of one consumer
//! group. Nothing is simulated in the broker: every duplicate the inbox sees is a real
//! redelivery, caused by the clients misbehaving the way crashed processes do:
//!
//! - the relay "crashes" right after the broker confirmed some publishes (the publisher
//!   reports a failure after the confirmation), so the row stays pending and is published
//!   again;
//! - a consumer "crashes" before handling some deliveries (drops them unsettled), so the
//!   broker redelivers them after its ack timeout;
//! - a consumer "crashes" after committing the effect but before the ack, so the
//!   redelivery finds the dedup record;
//! - a consumer nacks some deliveries after committing, so they come straight back.
//!
//! The run passes when every message's effect exists exactly once; it panics with the
//! counts otherwise, or when nothing progresses within [`EndToEnd::deadline`].

use std::collections::HashSet;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::{join, try_join_all};
use oncebox_core::consumer::{ConsumerOptions, Outcome, TransactionalInbox, TxHandler};
use oncebox_core::spool::{Relay, SpoolOptions};
use oncebox_core::{
    Bytes, Delivery, Error, Message, MessageId, Publisher, Received, Result, Subscriber,
};

use tokio::sync::watch;

use crate::inbox::{InboxHarness, TxOf};
use crate::outbox::OutboxHarness;
use crate::transport::TransportHarness;

/// How a run of [`outbox_to_inbox`] misbehaves. Rates are per delivery (or per publish
/// for the relay), decided by a seeded hash of the message and the delivery's number;
/// since deliveries interleave differently from run to run, a seed picks the rates'
/// pattern, not an exact replay.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndToEnd {
    /// Messages enqueued.
    pub messages: usize,
    /// Ordering keys they are spread over.
    pub keys: usize,
    /// Messages per enqueue transaction.
    pub enqueue_batch: usize,
    /// Consumer workers in the one group.
    pub consumers: usize,
    /// Share of publishes the relay reports as failed after the broker confirmed them
    /// (each message at most once).
    pub relay_crash_after_publish: f64,
    /// Share of deliveries dropped unsettled before handling.
    pub crash_before_handling: f64,
    /// Share of deliveries dropped unsettled after the effect committed.
    pub crash_after_commit: f64,
    /// Share of deliveries nacked after the effect committed.
    pub nack_after_commit: f64,
    /// Seed of the misbehaviour.
    pub seed: u64,
    /// The longest the whole run may take.
    pub deadline: Duration,
}

impl EndToEnd {
    /// `messages` messages on 100 keys, 3 consumers, 1 % relay crashes, 2 % crashes
    /// before handling, 2 % after commit, 1 % nacks after commit; seed from
    /// `ONCEBOX_E2E_SEED` or 42; a five-minute deadline.
    pub fn new(messages: usize) -> Self {
        Self {
            messages,
            keys: 100,
            enqueue_batch: 500,
            consumers: 3,
            relay_crash_after_publish: 0.01,
            crash_before_handling: 0.02,
            crash_after_commit: 0.02,
            nack_after_commit: 0.01,
            seed: std::env::var("ONCEBOX_E2E_SEED")
                .ok()
                .and_then(|seed| seed.parse().ok())
                .unwrap_or(42),
            deadline: Duration::from_secs(300),
        }
    }

    /// Sets [`EndToEnd::consumers`].
    #[must_use]
    pub fn consumers(mut self, consumers: usize) -> Self {
        self.consumers = consumers.max(1);
        self
    }

    /// Sets [`EndToEnd::seed`].
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`EndToEnd::deadline`].
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// A number in `[0, 1)` for event `what` of message `label` at occurrence `n`.
    fn roll(&self, what: &str, label: &str, n: u64) -> f64 {
        let mut hasher = DefaultHasher::new();
        (self.seed, what, label, n).hash(&mut hasher);
        // 53 random bits make an exact f64 fraction.
        (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What happened in a run: every count is of real events against the broker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndToEndReport {
    /// Messages enqueued, and effects found exactly once each at the end.
    pub messages: u64,
    /// Publishes the broker confirmed (more than `messages` after relay crashes).
    pub published: u64,
    /// Publishes confirmed and then reported failed by the crashing relay.
    pub relay_crashes: u64,
    /// Deliveries received by the consumers, redeliveries included.
    pub deliveries: u64,
    /// Deliveries dropped unsettled before handling.
    pub crashed_before_handling: u64,
    /// Deliveries dropped unsettled after their effect committed.
    pub crashed_after_commit: u64,
    /// Deliveries nacked after their effect committed.
    pub nacked_after_commit: u64,
    /// Deliveries the inbox recognised as duplicates and skipped.
    pub duplicates_skipped: u64,
    /// Handler failures that were nacked (a store busy, say).
    pub retried: u64,
    /// Time from the first enqueue to the last effect.
    pub elapsed: Duration,
}

impl fmt::Display for EndToEndReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} messages, each effect exactly once, in {:.1} s: {} publishes confirmed ({} \
             relay crashes after confirm), {} deliveries ({} dropped before handling, {} \
             dropped after commit, {} nacked after commit, {} duplicates skipped, {} retried)",
            self.messages,
            self.elapsed.as_secs_f64(),
            self.published,
            self.relay_crashes,
            self.deliveries,
            self.crashed_before_handling,
            self.crashed_after_commit,
            self.nacked_after_commit,
            self.duplicates_skipped,
            self.retried,
        )
    }
}

/// Runs `plan` from `outbox` through `transport` to `inbox` and checks that each
/// message's effect exists exactly once.
///
/// # Errors
///
/// A store or transport error that is not transient.
///
/// # Panics
///
/// When an effect is missing or doubled, or the run passes its deadline.
pub async fn outbox_to_inbox<T, O, I>(
    transport: &T,
    outbox: &O,
    inbox: &I,
    plan: EndToEnd,
) -> Result<EndToEndReport>
where
    T: TransportHarness,
    O: OutboxHarness,
    I: InboxHarness,
{
    let topic = transport.fresh_topic("end-to-end").await?;
    let group = format!("{topic}-inbox");
    let mut subscribers = Vec::with_capacity(plan.consumers);
    for _ in 0..plan.consumers {
        subscribers.push(transport.subscriber(&topic, &group).await?);
    }

    let started = Instant::now();
    let messages: Vec<Message> = (0..plan.messages)
        .map(|n| {
            Message::new(topic.clone(), Bytes::from(n.to_string()))
                .with_key(format!("key-{}", n % plan.keys.max(1)))
                .with_kind("EndToEnd")
        })
        .collect();
    for batch in messages.chunks(plan.enqueue_batch.max(1)) {
        outbox.enqueue(batch).await?;
    }

    let run = Run {
        plan: &plan,
        counts: Counts::default(),
        handled: Mutex::new(HashSet::with_capacity(plan.messages)),
        complete: watch::Sender::new(plan.messages == 0),
        done: watch::Sender::new(false),
    };
    let publisher = CrashingPublisher {
        inner: transport.publisher().await?,
        run: &run,
        crashed: Mutex::new(HashSet::new()),
    };
    let relay = Relay::new(
        outbox.store(),
        publisher,
        SpoolOptions::new()
            .name("end-to-end")
            .poll_interval(Duration::from_millis(5), Duration::from_millis(100)),
    )?;
    let options = ConsumerOptions::new(group.clone());
    let run = &run;
    let consumers = subscribers.into_iter().map(|subscriber| {
        let engine = TransactionalInbox::new(inbox.store(), Effect::<I>::new(), options.clone());
        async move { run.consume(subscriber, engine?).await }
    });

    let relay_run = relay.run_until(run.finished());
    let consumers_run = async {
        let result = try_join_all(consumers).await;
        run.done.send_replace(true);
        result
    };
    let deadline = tokio::time::timeout(plan.deadline, join(relay_run, consumers_run));
    let (relayed, consumed) = match deadline.await {
        Ok(results) => results,
        Err(_) => panic!(
            "[end to end] not done within {:?}: {} of {} messages handled; {:?}",
            plan.deadline,
            run.handled_count(),
            plan.messages,
            run.counts.snapshot(Duration::ZERO, 0),
        ),
    };
    relayed?;
    consumed?;
    let elapsed = started.elapsed();

    let mut wrong = Vec::new();
    for message in &messages {
        let label = effect_key(&message.id);
        let effects = inbox.count_effects(&label).await?;
        if effects != 1 {
            wrong.push(format!("{label}: {effects}"));
        }
    }
    let report = run.counts.snapshot(elapsed, plan.messages as u64);
    assert!(
        wrong.is_empty(),
        "[end to end] {} of {} messages do not have exactly one effect (first: {:?}); {report:?}",
        wrong.len(),
        plan.messages,
        &wrong[..wrong.len().min(5)],
    );
    assert!(
        report.crashed_before_handling + report.crashed_after_commit + report.relay_crashes > 0
            || plan.messages < 100,
        "[end to end] the run misbehaved nowhere, so it proved nothing: {report:?}"
    );
    Ok(report)
}

/// The shared state of one run.
struct Run<'p> {
    plan: &'p EndToEnd,
    counts: Counts,
    /// Effect keys handled so far; the run ends when it holds every message.
    handled: Mutex<HashSet<String>>,
    /// Set once `handled` holds every message; stops the consumers.
    complete: watch::Sender<bool>,
    /// Set once every consumer stopped; ends the relay.
    done: watch::Sender<bool>,
}

impl Run<'_> {
    fn handled_count(&self) -> usize {
        self.handled.lock().map_or(0, |handled| handled.len())
    }

    /// Records that `label`'s effect committed, and ends the run after the last one.
    fn handled(&self, label: String) {
        let count = match self.handled.lock() {
            Ok(mut handled) => {
                handled.insert(label);
                handled.len()
            }
            Err(_) => return,
        };
        if count >= self.plan.messages {
            self.complete.send_replace(true);
        }
    }

    /// Resolves once the consumers stopped.
    async fn finished(&self) {
        // The sender lives as long as `self`, so waiting cannot fail.
        let _ = self.done.subscribe().wait_for(|done| *done).await;
    }

    /// One consumer worker: receives until every message was handled by someone.
    async fn consume<S, I>(
        &self,
        mut subscriber: S,
        engine: TransactionalInbox<I::Store, Effect<I>>,
    ) -> Result<()>
    where
        S: Subscriber,
        I: InboxHarness,
    {
        let counts = &self.counts;
        let mut complete = self.complete.subscribe();
        loop {
            // `next` is cancelled only once, when the run is complete.
            let next = tokio::select! {
                biased;
                _ = complete.wait_for(|complete| *complete) => return Ok(()),
                next = subscriber.next() => next,
            };
            let delivery = match next {
                Ok(delivery) => delivery,
                Err(error) if error.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let n = counts.deliveries.fetch_add(1, Ordering::Relaxed);
            let received: Received = delivery.received().clone();
            let Some(id) = received.id else {
                panic!("[end to end] a delivery without an id: {received:?}");
            };
            let label = effect_key(&id);
            let roll = self.plan.roll("consume", &label, n);
            let before = self.plan.crash_before_handling;
            let after = before + self.plan.crash_after_commit;
            let nack = after + self.plan.nack_after_commit;
            if roll < before {
                counts
                    .crashed_before_handling
                    .fetch_add(1, Ordering::Relaxed);
                drop(delivery);
                continue;
            }
            match engine.handle(&received).await {
                Ok((outcome, _)) => {
                    if outcome == Outcome::Duplicate {
                        counts.duplicates_skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    self.handled(label);
                    if roll < after {
                        counts.crashed_after_commit.fetch_add(1, Ordering::Relaxed);
                        drop(delivery);
                    } else if roll < nack {
                        counts.nacked_after_commit.fetch_add(1, Ordering::Relaxed);
                        settle(delivery.nack(Duration::from_millis(50)).await)?;
                    } else {
                        settle(delivery.ack().await)?;
                    }
                }
                Err(error) if error.is_transient() => {
                    counts.retried.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, "end to end: handling failed, nacking");
                    settle(delivery.nack(Duration::from_millis(20)).await)?;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// A failed settle is the broker's business (it redelivers), unless it is permanent.
fn settle(result: Result<()>) -> Result<()> {
    match result {
        Err(error) if !error.is_transient() => Err(error),
        _ => Ok(()),
    }
}

/// The name of a message's effect row.
fn effect_key(id: &MessageId) -> String {
    format!("e2e-{id}")
}

#[derive(Default)]
struct Counts {
    published: AtomicU64,
    relay_crashes: AtomicU64,
    deliveries: AtomicU64,
    crashed_before_handling: AtomicU64,
    crashed_after_commit: AtomicU64,
    nacked_after_commit: AtomicU64,
    duplicates_skipped: AtomicU64,
    retried: AtomicU64,
}

impl Counts {
    fn snapshot(&self, elapsed: Duration, messages: u64) -> EndToEndReport {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        EndToEndReport {
            messages,
            published: get(&self.published),
            relay_crashes: get(&self.relay_crashes),
            deliveries: get(&self.deliveries),
            crashed_before_handling: get(&self.crashed_before_handling),
            crashed_after_commit: get(&self.crashed_after_commit),
            nacked_after_commit: get(&self.nacked_after_commit),
            duplicates_skipped: get(&self.duplicates_skipped),
            retried: get(&self.retried),
            elapsed,
        }
    }
}

/// The relay's publisher, crashing right after the broker confirmed some messages (once
/// per message): the row stays pending and is published again.
struct CrashingPublisher<'r, P> {
    inner: P,
    run: &'r Run<'r>,
    crashed: Mutex<HashSet<MessageId>>,
}

impl<P: Publisher> Publisher for CrashingPublisher<'_, P> {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.inner.publish(message).await?;
        let counts = &self.run.counts;
        counts.published.fetch_add(1, Ordering::Relaxed);
        let label = effect_key(&message.id);
        let crash = self.run.plan.roll("relay", &label, 0)
            < self.run.plan.relay_crash_after_publish
            && self
                .crashed
                .lock()
                .is_ok_and(|mut crashed| crashed.insert(message.id));
        if crash {
            counts.relay_crashes.fetch_add(1, Ordering::Relaxed);
            return Err(Error::transport_transient(
                "end to end: the relay crashed after the broker confirmed",
            ));
        }
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

/// The handler: one effect row per message, in the inbox's transaction.
struct Effect<I>(std::marker::PhantomData<fn() -> I>);

impl<I> Effect<I> {
    fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<I: InboxHarness> TxHandler<TxOf<I>> for Effect<I> {
    type Output = Bytes;

    async fn handle(&self, message: &Received, tx: &mut TxOf<I>) -> Result<Bytes> {
        let Some(id) = message.id else {
            return Err(Error::handler_permanent(
                "end to end: a message without an id",
            ));
        };
        I::insert_effect(tx, &effect_key(&id)).await?;
        Ok(Bytes::new())
    }
}
