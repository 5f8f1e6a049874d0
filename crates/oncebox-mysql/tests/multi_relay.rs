//! Four relays over one outbox, killed and restarted at random while producers enqueue
//! 20,000 messages on 500 keys: every message is published, each key's messages reach
//! the broker in commit order, and no key is ever being published by two relays at once.
//!
//! Relays are killed (their task aborted, as a crash drops everything in flight) after a
//! random 150–1500 ms, and also right after one publish in a thousand, before their batch
//! is settled: their rows stay leased for the 1 s lease, then other relays take them over
//! and publish them again (duplicates, which the test expects, never out of order).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::memory::{MemoryBroker, MemoryPublisher};
use oncebox_core::spool::{Spool, SpoolOptions};
use oncebox_core::{Error, Message, MessageId, Publisher, Result};
use oncebox_mysql::{MySqlOutbox, MySqlStore};
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
/// settled, so that another relay must take the rows over when the lease ends).
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

/// One producer transaction: enqueues `messages`, then takes the versions of `keys`
/// (row locks held to the commit, so versions follow commit order), and commits.
async fn produce(
    store: &MySqlStore,
    outbox: &MySqlOutbox,
    messages: &[Message],
    keys: &[String],
) -> Result<HashMap<String, i64>> {
    let mut tx = store.pool().begin().await.map_err(Error::store_transient)?;
    for message in messages {
        outbox.enqueue(&mut tx, message).await?;
    }
    let mut versions = HashMap::new();
    for key in keys {
        sqlx::query("UPDATE key_versions SET n = n + 1 WHERE `key` = ?")
            .bind(key.clone())
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        let n: i64 = sqlx::query_scalar("SELECT n FROM key_versions WHERE `key` = ?")
            .bind(key.clone())
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        versions.insert(key.clone(), n);
    }
    tx.commit().await.map_err(classify)?;
    Ok(versions)
}

/// Deadlocks (1213) are transient: the transaction was rolled back and may be retried.
fn classify(error: sqlx::Error) -> Error {
    let deadlock = error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|db| db.number() == 1213);
    if deadlock {
        Error::store_transient(error)
    } else {
        Error::store_permanent(error)
    }
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
    let db = TestDb::with_connections(14).await;
    db.exec(
        "CREATE TABLE key_versions (`key` VARBINARY(64) PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)",
    )
    .await;
    db.exec(&format!(
        "INSERT INTO key_versions (`key`)
         WITH RECURSIVE i (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < {})
         SELECT CONCAT('key-', n) FROM i",
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
                let spool = Spool::relay(store.outbox(), publisher, relay_options(relay))
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

    // Producers: transactions of 10 messages on random keys, enqueued in key order, each
    // taking its keys' versions after enqueueing. Keys share the outbox's lock slots, so
    // two transactions may now and then deadlock on slots taken in different orders:
    // InnoDB rolls one back (1213, transient), and the producer retries it, as an
    // application does.
    let per_producer = MESSAGES / PRODUCERS / PER_TX;
    let retries = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (store, committed, retries) = (
            db.store.clone(),
            Arc::clone(&committed),
            Arc::clone(&retries),
        );
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
                let mut distinct = keys.clone();
                distinct.dedup();
                let versions = loop {
                    match produce(&store, &outbox, &messages, &distinct).await {
                        Ok(versions) => break versions,
                        Err(error) if error.is_transient() => {
                            retries.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(error) => panic!("producer: {error}"),
                    }
                };
                outbox.wake();
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
