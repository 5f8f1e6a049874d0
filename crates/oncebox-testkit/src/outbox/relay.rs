//! The relay end to end over the in-process broker, and the failing publisher that
//! injects its faults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{Relay, SpoolOptions, SpoolStore};
use oncebox_core::{Backoff, Error, Message, MessageId, Publisher, Result};
use tokio::time::Instant;

use super::{OutboxHarness, RowStatus, STEP, TOPIC, assert_state, label, message, state};
use crate::support::{ok, within};

/// Whether a [`FailingPublisher`] fails a message as a broker outage or as a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A transient transport error: the relay retries with backoff.
    Transient,
    /// A permanent transport error: the relay dead-letters at once.
    Permanent,
}

/// One publish attempt seen by a [`FailingPublisher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The message.
    pub id: MessageId,
    /// When the attempt started.
    pub at: Instant,
    /// Whether it failed on purpose.
    pub failed: bool,
}

/// A [`Publisher`] that fails chosen messages and passes every other one to `inner`,
/// recording every attempt: fault injection for relays over any transport.
///
/// Clones share their rules and records.
#[derive(Clone)]
pub struct FailingPublisher<P> {
    inner: P,
    state: Arc<Mutex<FailState>>,
}

#[derive(Default)]
struct FailState {
    rules: HashMap<MessageId, Failure>,
    attempts: Vec<Attempt>,
}

impl<P> FailingPublisher<P> {
    /// Wraps `inner`; nothing fails until [`FailingPublisher::fail`] says so.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            state: Arc::default(),
        }
    }

    /// Fails every publish of message `id` from now on, in the way `failure` says.
    pub fn fail(&self, id: MessageId, failure: Failure) {
        self.lock().rules.insert(id, failure);
    }

    /// Lets message `id` through again.
    pub fn heal(&self, id: MessageId) {
        self.lock().rules.remove(&id);
    }

    /// Every attempt so far, in the order they started.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.lock().attempts.clone()
    }

    /// The start times of the attempts to publish message `id`.
    pub fn attempts_of(&self, id: MessageId) -> Vec<Instant> {
        self.lock()
            .attempts
            .iter()
            .filter(|a| a.id == id)
            .map(|a| a.at)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FailState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<P: Publisher> Publisher for FailingPublisher<P> {
    async fn publish(&self, message: &Message) -> Result<()> {
        let rule = {
            let mut state = self.lock();
            let rule = state.rules.get(&message.id).copied();
            state.attempts.push(Attempt {
                id: message.id,
                at: Instant::now(),
                failed: rule.is_some(),
            });
            rule
        };
        match rule {
            None => self.inner.publish(message).await,
            Some(Failure::Transient) => {
                Err(Error::transport_transient("injected: broker unavailable"))
            }
            Some(Failure::Permanent) => {
                Err(Error::transport_permanent("injected: message refused"))
            }
        }
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

pub(super) fn relay_options(name: &str) -> SpoolOptions {
    SpoolOptions::new()
        .name(name)
        .batch_size(8)
        .concurrency(8)
        .lease(Duration::from_secs(10))
        .dispatch_timeout(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(5), Duration::from_millis(40))
}

/// Runs `relays` until `done()` holds or `limit` passes, then shuts them down and waits
/// for them to finish their round.
pub(super) async fn run_relays_until<S, P>(
    what: &str,
    relays: &[Relay<S, P>],
    limit: Duration,
    done: impl Fn() -> bool,
) where
    S: SpoolStore<Item = Message>,
    P: Publisher,
{
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runs = relays.iter().map(|relay| {
        let mut stopped = stopped.clone();
        relay.run_until(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })
    });
    let watcher = async {
        let deadline = Instant::now() + limit;
        while !done() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
    };
    let (results, ()) = within(what, limit + STEP, async {
        tokio::join!(futures_util::future::join_all(runs), watcher)
    })
    .await;
    for result in results {
        ok("relay run", result);
    }
    assert!(done(), "{what}: not finished within {limit:?}");
}

/// Two relays over the same table drain 100 messages on 5 keys (plus keyless ones),
/// committed in several transactions, into the [`MemoryBroker`]: every message is
/// published exactly once, each key's messages in commit order, and every row ends done.
pub async fn relay_keeps_commit_order<H: OutboxHarness>(harness: &H) {
    const KEYS: usize = 5;
    const PER_KEY: usize = 16;
    let mut messages = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            messages.push(message(
                Some(&format!("order-{k}")),
                &format!("order-{k}/{i}"),
            ));
        }
        if i % 4 == 0 {
            messages.push(message(None, &format!("free/{i}")));
        }
    }
    for chunk in messages.chunks(9) {
        ok("enqueue", harness.enqueue(chunk).await);
    }
    let broker = MemoryBroker::new();
    let relays = [
        ok(
            "relay a",
            Relay::new(
                harness.store(),
                broker.publisher(),
                relay_options("relay-a"),
            ),
        ),
        ok(
            "relay b",
            Relay::new(
                harness.store(),
                broker.publisher(),
                relay_options("relay-b"),
            ),
        ),
    ];
    let total = messages.len();
    run_relays_until(
        "two relays draining the outbox",
        &relays,
        Duration::from_secs(20),
        || broker.published(TOPIC).len() >= total,
    )
    .await;

    let published = broker.published(TOPIC);
    let mut counts: HashMap<MessageId, usize> = HashMap::new();
    for m in &published {
        *counts.entry(m.id).or_default() += 1;
    }
    for m in &messages {
        assert_eq!(
            counts.get(&m.id).copied(),
            Some(1),
            "{} must be published exactly once",
            label(m)
        );
    }
    assert_eq!(
        published.len(),
        total,
        "the broker holds messages that were never enqueued"
    );
    for k in 0..KEYS {
        let key = Some(format!("order-{k}"));
        let sent: Vec<String> = messages
            .iter()
            .filter(|m| m.key == key)
            .map(label)
            .collect();
        let got: Vec<String> = published
            .iter()
            .filter(|m| m.key == key)
            .map(label)
            .collect();
        assert_eq!(
            got, sent,
            "key order-{k}: publish order differs from commit order"
        );
    }
    for m in &messages {
        assert_state(
            &format!("row {}", label(m)),
            &state(harness, m).await,
            RowStatus::Done,
            0,
        );
    }
}

/// Failing publishes are retried with backoff (the delay between attempts grows as the
/// backoff says) and dead-lettered after `max_attempts`, with the reason stored and the
/// dead-letter hook called; a permanent failure is dead-lettered at once. A failing
/// message holds back only the later messages of its key, which follow once it is dead.
pub async fn relay_backs_off_then_dead_letters<H: OutboxHarness>(harness: &H) {
    let [poison, after_poison, other, refused, after_refused] = [
        (Some("k"), "k1-poison"),
        (Some("k"), "k2"),
        (Some("j"), "j1"),
        (Some("q"), "q1-refused"),
        (Some("q"), "q2"),
    ]
    .map(|(key, name)| message(key, name));
    ok(
        "enqueue",
        harness
            .enqueue(&[
                poison.clone(),
                after_poison.clone(),
                other.clone(),
                refused.clone(),
                after_refused.clone(),
            ])
            .await,
    );
    let broker = MemoryBroker::new();
    let publisher = FailingPublisher::new(broker.publisher());
    publisher.fail(poison.id, Failure::Transient);
    publisher.fail(refused.id, Failure::Permanent);
    let backoff = Backoff::new()
        .initial(Duration::from_millis(100))
        .multiplier(2.0)
        .jitter(0.0);
    let options = relay_options("relay").max_attempts(3).backoff(backoff);
    let dead: Arc<Mutex<Vec<(MessageId, String)>>> = Arc::default();
    let hook = Arc::clone(&dead);
    let relay = ok(
        "relay",
        Relay::new(harness.store(), publisher.clone(), options),
    )
    .on_dead_letter(move |m, reason| {
        hook.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((m.id, reason.to_owned()));
    });
    let expected = [after_poison.id, other.id, after_refused.id];
    run_relays_until(
        "relay with failing messages",
        std::slice::from_ref(&relay),
        Duration::from_secs(10),
        || {
            let published = broker.published(TOPIC);
            expected
                .iter()
                .all(|id| published.iter().any(|m| m.id == *id))
        },
    )
    .await;

    let tries = publisher.attempts_of(poison.id);
    assert_eq!(
        tries.len(),
        3,
        "a transiently failing message is attempted max_attempts = 3 times"
    );
    let tolerance = Duration::from_millis(5);
    for (gap, (pair, delay)) in tries.windows(2).zip([100u64, 200]).enumerate() {
        let waited = pair[1] - pair[0];
        assert!(
            waited + tolerance >= Duration::from_millis(delay),
            "retry {} came after {waited:?}; the backoff asks for {delay} ms",
            gap + 1
        );
    }
    let found = state(harness, &poison).await;
    assert_state("the poison message", &found, RowStatus::Dead, 3);
    let reason = found.last_error.unwrap_or_default();
    assert!(
        reason.contains("gave up after 3 attempts")
            && reason.contains("injected: broker unavailable"),
        "the dead-letter reason must name the attempts and the error, found {reason:?}"
    );
    assert_eq!(
        publisher.attempts_of(refused.id).len(),
        1,
        "a permanent failure is not retried"
    );
    let found = state(harness, &refused).await;
    assert_state("the refused message", &found, RowStatus::Dead, 1);
    let refused_reason = found.last_error.unwrap_or_default();
    assert!(
        refused_reason.contains("permanent failure")
            && refused_reason.contains("injected: message refused"),
        "the dead-letter reason of a permanent failure, found {refused_reason:?}"
    );

    let mut hooked = dead.lock().unwrap_or_else(PoisonError::into_inner).clone();
    hooked.sort_by_key(|(id, _)| *id == refused.id);
    assert_eq!(
        hooked,
        [(poison.id, reason), (refused.id, refused_reason)],
        "the dead-letter hook is called once per dead message, with the stored reason"
    );

    let first_attempt = |m: &Message| publisher.attempts_of(m.id).first().copied();
    let (Some(k2_at), Some(j1_at)) = (first_attempt(&after_poison), first_attempt(&other)) else {
        panic!("k2 and j1 were never attempted");
    };
    assert!(
        k2_at > tries[2],
        "k2 was published before k1 was given up: per-key order broken"
    );
    assert!(
        j1_at < tries[1],
        "j1 waited for k1's retries: a failing message must block only its own key"
    );
    let published = broker.published(TOPIC);
    for m in [&poison, &refused] {
        assert!(
            published.iter().all(|p| p.id != m.id),
            "{} was published though it always failed",
            label(m)
        );
    }
    for m in [&after_poison, &other, &after_refused] {
        assert_state(
            &format!("row {}", label(m)),
            &state(harness, m).await,
            RowStatus::Done,
            0,
        );
    }
}

/// [`Relay::cleanup`] keeps published rows within the retention, and with a zero
/// retention deletes all of them, in batches of `cleanup_batch`; dead and pending rows
/// stay.
pub async fn relay_cleanup_purges_published<H: OutboxHarness>(harness: &H) {
    let published: Vec<Message> = (0..23)
        .map(|i| message(Some(&format!("c{}", i % 3)), &format!("p{i}")))
        .collect();
    let refused = message(Some("x"), "refused");
    let mut all = published.clone();
    all.push(refused.clone());
    ok("enqueue", harness.enqueue(&all).await);
    let broker = MemoryBroker::new();
    let publisher = FailingPublisher::new(broker.publisher());
    publisher.fail(refused.id, Failure::Permanent);
    let relay = ok(
        "relay",
        Relay::new(harness.store(), publisher.clone(), relay_options("relay")),
    );
    let deadline = Instant::now() + STEP;
    let mut settled = 0;
    while settled < all.len() {
        assert!(
            Instant::now() < deadline,
            "the relay did not settle {} rows within {STEP:?}",
            all.len()
        );
        let report = ok("run_once", relay.run_once().await);
        settled += report.done + report.dead;
    }
    let pending = message(None, "pending");
    ok(
        "enqueue after the relay ran",
        harness.enqueue_one(&pending).await,
    );

    let keep = ok(
        "relay with 1 h retention",
        Relay::new(
            harness.store(),
            publisher.clone(),
            relay_options("relay").retention(Duration::from_secs(3600)),
        ),
    );
    assert_eq!(
        ok("cleanup within retention", keep.cleanup().await),
        0,
        "cleanup deleted rows within the retention"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let options = relay_options("relay")
        .retention(Duration::ZERO)
        .cleanup_batch(5);
    let purge = ok(
        "relay with zero retention",
        Relay::new(harness.store(), publisher, options),
    );
    let deleted = ok("cleanup with zero retention", purge.cleanup().await);
    assert_eq!(
        deleted,
        published.len() as u64,
        "cleanup deletes every published row"
    );
    for m in &published {
        assert_eq!(
            ok("row_state", harness.row_state(m.id).await),
            None,
            "published row {} survived cleanup",
            label(m)
        );
    }
    assert_state(
        "dead row after cleanup",
        &state(harness, &refused).await,
        RowStatus::Dead,
        1,
    );
    assert_state(
        "pending row after cleanup",
        &state(harness, &pending).await,
        RowStatus::Pending,
        0,
    );
    assert_eq!(
        ok("second cleanup", purge.cleanup().await),
        0,
        "nothing is left to clean up"
    );
}
