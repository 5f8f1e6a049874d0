//! Four relays over one outbox, killed and restarted at random while producers enqueue
//! 20,000 messages on 500 keys: every message is published, each key's messages reach
//! the broker in commit order, and no key is ever being published by two relays at once.
//!
//! Relays are killed (their task aborted, as a crash drops everything in flight) after a
//! random 150–1500 ms, and also right after one publish in a thousand, before their batch
//! is settled: other relays take their rows over (at once with held claims, whose
//! transactions end with the relay; after the 1 s lease with leased claims) and publish
//! them again (duplicates, which the test expects, never out of order). The test runs
//! with held claims (the default) and with leased ones.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::memory::{MemoryBroker, MemoryPublisher};
use oncebox_core::spool::{Spool, SpoolOptions};
use oncebox_core::{Message, MessageId, Publisher, Result};
use tokio::sync::Notify;
use tokio::time::Instant;

use common::TestDb;

const TOPIC: &str = "multi.orders";
const RELAYS: u64 = 4;
const PRODUCERS: usize = 4;
const KEYS: usize = 500;
const MESSAGES: usize = 20_000;
const PER_TX: usize = 10;
const LEASE: Duration = Duration::from_secs(1);
const DEADLINE: Duration = Duration::from_secs(90);

/// Who is publishing which key right now, and every time two relays were.
#[derive(Default)]
struct InFlight {
    by_key: HashMap<String, u64>,
    overlaps: Vec<String>,
    publishes: usize,
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
        let key = message.key.clone().expect("every test message has a key");
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.publishes += 1;
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

/// One committed message and its place in its key's commit order: the transaction's
/// per-key version (taken under a row lock held to commit, so versions follow commit
/// order) and its position within the transaction.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_killed_at_random_keep_per_key_order() {
    four_relays_killed_at_random(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_leasing_relays_killed_at_random_keep_per_key_order() {
    four_relays_killed_at_random(false).await;
}

/// The test, with held claims or leased ones.
async fn four_relays_killed_at_random(held: bool) {
    let db = TestDb::with_connections(14).await;
    db.exec("CREATE TABLE key_versions (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
        .await;
    db.exec(&format!(
        "INSERT INTO key_versions (key) SELECT 'key-' || i FROM generate_series(0, {}) AS i",
        KEYS - 1
    ))
    .await;
    let broker = MemoryBroker::new();
    let in_flight = Arc::new(Mutex::new(InFlight::default()));
    let committed: Arc<Mutex<Vec<Committed>>> = Arc::default();
    let started = Instant::now();

    // Relays: each slot runs a relay, kills it after a random while, starts another.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let mut slots = Vec::new();
    for slot in 0..RELAYS {
        let (store, broker, in_flight) = (db.store.clone(), broker.clone(), Arc::clone(&in_flight));
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
                let outbox = store.outbox().with_held_claims(held);
                let spool = Spool::relay(outbox, publisher, relay_options(relay))
                    .expect("valid relay options");
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
    // that transactions never wait for each other's key locks in a cycle), each taking
    // its keys' versions after enqueueing.
    let per_producer = MESSAGES / PRODUCERS / PER_TX;
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (store, committed) = (db.store.clone(), Arc::clone(&committed));
        producers.push(tokio::spawn(async move {
            let outbox = store.outbox();
            for _ in 0..per_producer {
                let mut keys: Vec<String> = (0..PER_TX)
                    .map(|_| format!("key-{}", fastrand::usize(..KEYS)))
                    .collect();
                keys.sort();
                let messages: Vec<Message> = keys
                    .iter()
                    .map(|key| Message::new(TOPIC, "x").with_key(key.clone()))
                    .collect();
                let mut tx = store.pool().begin().await.expect("begin");
                for message in &messages {
                    outbox.enqueue(&mut tx, message).await.expect("enqueue");
                }
                let mut versions = HashMap::new();
                let mut distinct = keys.clone();
                distinct.dedup();
                for key in &distinct {
                    let n: i64 = sqlx::query_scalar(
                        "UPDATE key_versions SET n = n + 1 WHERE key = $1 RETURNING n",
                    )
                    .bind(key.clone())
                    .fetch_one(&mut *tx)
                    .await
                    .expect("take the key's version");
                    versions.insert(key.clone(), n);
                }
                tx.commit().await.expect("commit");
                let mut committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
                for (position, message) in messages.iter().enumerate() {
                    let key = message.key.clone().expect("keyed");
                    committed.push(Committed {
                        version: versions[&key],
                        key,
                        position,
                        id: message.id,
                    });
                }
            }
        }));
    }
    for producer in producers {
        producer.await.expect("producer");
    }
    let produced = started.elapsed();

    // Wait until every message is published and every row settled.
    let outbox = db.store.outbox();
    loop {
        let published: HashSet<MessageId> = broker.published(TOPIC).iter().map(|m| m.id).collect();
        let pending = outbox.stats().await.expect("stats").pending;
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
        slot.await.expect("relay slot");
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
            let key = message.key.clone().expect("keyed");
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
        "{} claims: {MESSAGES} messages on {KEYS} keys: produced in {produced:?}, drained in {drained:?}; \
         {} publishes ({} duplicates), {kills} relay kills",
        if held { "held" } else { "leased" },
        log.len(),
        log.len() - MESSAGES,
    );
    assert!(
        kills >= RELAYS as usize,
        "relays were killed ({kills} kills)"
    );
}
