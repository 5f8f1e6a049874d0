//! Several relays over one outbox, killed and restarted at random while producers
//! enqueue: every message is published, each key's messages reach the broker in commit
//! order, and no key is ever being published by two relays at once (DESIGN §4).
//!
//! Relays are killed (their task aborted, as a crash drops everything in flight) after a
//! random 150–1500 ms, and also right after one publish in a thousand, before their batch
//! is settled: other relays must take their rows over and publish them again (duplicates,
//! which the scenario expects, never out of order).
//!
//! Commit order is what the producers' transactions say it is: each one enqueues its
//! messages, then takes a version of each of their keys (a counter it increments under a
//! row lock held to its commit, so versions follow commit order). A backend implements
//! [`MultiRelayHarness`] over a table of those counters, one row per key of
//! [`key`]`(0..KEYS)`, and calls [`relays_killed_at_random_keep_per_key_order`]:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! async fn four_relays_killed_at_random_keep_per_key_order() {
//!     let harness = MyHarness::new().await; // creates and fills the counters table
//!     oncebox_testkit::multi_relay::relays_killed_at_random_keep_per_key_order(harness).await;
//! }
//! ```

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::memory::{MemoryBroker, MemoryPublisher};
use oncebox_core::spool::{Relay, SpoolOptions, SpoolStore};
use oncebox_core::{Message, MessageId, Publisher, Result};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::support::ok;

/// Relays running at once.
pub const RELAYS: u64 = 4;
/// Keys the messages are spread over: [`key`]`(0)` to [`key`]`(KEYS - 1)`.
pub const KEYS: usize = 500;
/// Messages enqueued in all.
pub const MESSAGES: usize = 20_000;
/// The relays' lease: how long a killed relay's rows wait where the store leases.
pub const LEASE: Duration = Duration::from_secs(1);

const TOPIC: &str = "multi.orders";
const PRODUCERS: usize = 4;
const PER_TX: usize = 10;
const DEADLINE: Duration = Duration::from_secs(90);

/// The `i`th key: `key-<i>`.
pub fn key(i: usize) -> String {
    format!("key-{i}")
}

/// How a backend gives the scenario its outbox and its producers.
pub trait MultiRelayHarness: Send + Sync + 'static {
    /// The outbox store a relay runs on.
    type Outbox: SpoolStore<Item = Message> + 'static;

    /// The outbox for a new relay instance.
    fn relay_outbox(&self) -> Self::Outbox;

    /// One producer transaction: enqueues `messages` in order, then increments the
    /// counter of each of `keys` (distinct and sorted) and reads it back, then commits;
    /// returns the counters read. A transient error (a deadlock the database rolled
    /// back, say) is retried by the scenario.
    fn produce(
        &self,
        messages: &[Message],
        keys: &[String],
    ) -> impl Future<Output = Result<HashMap<String, i64>>> + Send;

    /// How many outbox rows are still pending.
    fn pending(&self) -> impl Future<Output = Result<u64>> + Send;
}

/// Who is publishing which key right now, and every time two relays were.
#[derive(Default)]
struct InFlight {
    by_key: HashMap<String, u64>,
    overlaps: Vec<String>,
}

/// A publisher that records, per key, which relay instance is publishing it, and now
/// and then asks for its relay to be killed right after a publish (before the batch is
/// settled, so that another relay must take the rows over).
#[derive(Clone)]
struct Tracking {
    inner: MemoryPublisher,
    relay: u64,
    state: Arc<Mutex<InFlight>>,
    kill: Arc<Notify>,
}

/// Takes the key off the in-flight map when the publish ends or its relay is killed.
struct Publishing {
    state: Arc<Mutex<InFlight>>,
    key: String,
    relay: u64,
}

impl Drop for Publishing {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.by_key.get(&self.key) == Some(&self.relay) {
            state.by_key.remove(&self.key);
        }
    }
}

impl Publisher for Tracking {
    async fn publish(&self, message: &Message) -> Result<()> {
        let key = message.key.clone().unwrap_or_default();
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(other) = state.by_key.insert(key.clone(), self.relay)
                && other != self.relay
            {
                let overlap = format!(
                    "key {key} published by relays {other} and {} at once",
                    self.relay
                );
                state.overlaps.push(overlap);
            }
        }
        let _publishing = Publishing {
            state: Arc::clone(&self.state),
            key,
            relay: self.relay,
        };
        // Widen the window in which an overlap would be seen.
        if fastrand::u8(..) < 16 {
            tokio::time::sleep(Duration::from_micros(300)).await;
        } else {
            tokio::task::yield_now().await;
        }
        self.inner.publish(message).await?;
        if fastrand::u32(..1000) == 0 {
            self.kill.notify_one();
        }
        Ok(())
    }
}

/// One committed message and its place in its key's commit order.
struct Committed {
    key: String,
    version: i64,
    position: usize,
    id: MessageId,
}

fn relay_options(relay: u64) -> SpoolOptions {
    SpoolOptions::new()
        .name(format!("relay-{relay}"))
        .batch_size(128)
        .concurrency(32)
        .lease(LEASE)
        .dispatch_timeout(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
}

/// [`RELAYS`] relays over the harness's outbox, killed and restarted at random, while
/// 4 producers commit [`MESSAGES`] messages on [`KEYS`] keys in transactions of 10;
/// panics unless every message is published, each key's first publications are in
/// commit order, no key was ever in flight on two relays at once, and relays were
/// killed. Prints what happened.
pub async fn relays_killed_at_random_keep_per_key_order<H: MultiRelayHarness>(harness: H) {
    let harness = Arc::new(harness);
    let broker = MemoryBroker::new();
    let in_flight = Arc::new(Mutex::new(InFlight::default()));
    let committed: Arc<Mutex<Vec<Committed>>> = Arc::default();
    let started = Instant::now();

    // Relays: each slot runs a relay, kills it after a random while, starts another.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let mut slots = Vec::new();
    for slot in 0..RELAYS {
        let (harness, broker, in_flight) =
            (Arc::clone(&harness), broker.clone(), Arc::clone(&in_flight));
        let (stop, kills) = (Arc::clone(&stop), Arc::clone(&kills));
        slots.push(tokio::spawn(async move {
            let mut generation = 0;
            while !stop.load(Ordering::SeqCst) {
                let relay = slot * 1_000_000 + generation;
                generation += 1;
                let kill = Arc::new(Notify::new());
                let publisher = Tracking {
                    inner: broker.publisher(),
                    relay,
                    state: Arc::clone(&in_flight),
                    kill: Arc::clone(&kill),
                };
                let spool = ok(
                    "relay options",
                    Relay::new(harness.relay_outbox(), publisher, relay_options(relay)),
                );
                let task = tokio::spawn(async move {
                    let _ = spool.run_until(std::future::pending()).await;
                });
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(fastrand::u64(150..1500))) => {}
                    () = kill.notified() => {}
                }
                task.abort();
                let _ = task.await;
                kills.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..300))).await;
            }
        }));
    }

    // Producers: transactions of 10 messages on random keys, enqueued in key order (so
    // that transactions wait for each other's keys in one order), each taking its keys'
    // versions after enqueueing; a transaction rolled back as a deadlock is retried, as
    // an application does.
    let retries = Arc::new(AtomicUsize::new(0));
    let per_producer = MESSAGES / PRODUCERS / PER_TX;
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (harness, committed, retries) = (
            Arc::clone(&harness),
            Arc::clone(&committed),
            Arc::clone(&retries),
        );
        producers.push(tokio::spawn(async move {
            for _ in 0..per_producer {
                let mut keys: Vec<String> =
                    (0..PER_TX).map(|_| key(fastrand::usize(..KEYS))).collect();
                keys.sort();
                let messages: Vec<Message> = keys
                    .iter()
                    .map(|key| Message::new(TOPIC, "x").with_key(key.clone()))
                    .collect();
                keys.dedup();
                let versions = loop {
                    match harness.produce(&messages, &keys).await {
                        Ok(versions) => break versions,
                        Err(error) if error.is_transient() => {
                            retries.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(error) => panic!("producer: {error}"),
                    }
                };
                let mut committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
                for (position, message) in messages.iter().enumerate() {
                    let key = message.key.clone().unwrap_or_default();
                    let version = *versions
                        .get(&key)
                        .unwrap_or_else(|| panic!("produce returned no version of {key}"));
                    committed.push(Committed {
                        key,
                        version,
                        position,
                        id: message.id,
                    });
                }
            }
        }));
    }
    for producer in producers {
        ok("producer task", producer.await);
    }
    let produced = started.elapsed();

    // Wait until every message is published and every row settled.
    loop {
        let published: HashSet<MessageId> = broker.published(TOPIC).iter().map(|m| m.id).collect();
        let pending = ok("counting pending rows", harness.pending().await);
        if published.len() == MESSAGES && pending == 0 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "after {DEADLINE:?}: {} of {MESSAGES} published, {pending} rows pending",
            published.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for slot in slots {
        ok("relay slot task", slot.await);
    }

    let state = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        state.overlaps.is_empty(),
        "keys in flight on two relays at once: {:?}",
        &state.overlaps[..state.overlaps.len().min(10)]
    );

    // Consumer side: each key's first publications in commit order.
    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(committed.len(), MESSAGES);
    let mut expected: HashMap<&str, Vec<(i64, usize, MessageId)>> = HashMap::new();
    for c in committed.iter() {
        expected
            .entry(c.key.as_str())
            .or_default()
            .push((c.version, c.position, c.id));
    }
    let log = broker.published(TOPIC);
    let mut seen = HashSet::new();
    let mut first: HashMap<String, Vec<MessageId>> = HashMap::new();
    for message in &log {
        if seen.insert(message.id) {
            let key = message.key.clone().unwrap_or_default();
            first.entry(key).or_default().push(message.id);
        }
    }
    assert_eq!(seen.len(), MESSAGES, "every message is published");
    for (key, mut rows) in expected {
        rows.sort_by_key(|&(version, position, _)| (version, position));
        let order: Vec<MessageId> = rows.iter().map(|&(.., id)| id).collect();
        assert_eq!(
            first.get(key),
            Some(&order),
            "key {key}: first publications are not in commit order"
        );
    }
    let kills = kills.load(Ordering::SeqCst);
    eprintln!(
        "{MESSAGES} messages on {KEYS} keys: produced in {produced:?}, drained in {drained:?}; \
         {} publishes ({} duplicates), {kills} relay kills, {} producer transactions retried",
        log.len(),
        log.len() - MESSAGES,
        retries.load(Ordering::SeqCst),
    );
    assert!(
        kills >= RELAYS as usize,
        "relays were killed ({kills} kills)"
    );
}
