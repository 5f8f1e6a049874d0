//! Property test of the whole path: SQLite outbox → relay → in-process broker →
//! transactional inbox, through random crash points of the relay (after publishing,
//! before marking) and of the consumer (after committing, before acking), with the
//! broker refusing single publishes and duplicating, dropping and delaying deliveries.
//!
//! For every generated history it checks the four promises:
//! nothing committed is lost, nothing rolled back is published, each key's messages are
//! first published in commit order, and each message's effect happens exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use oncebox::consumer::{ConsumerOptions, TransactionalInbox, TxHandler, process_delivery};
use oncebox::memory::{Faults, MemoryBroker};
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::sqlite::SqliteStore;
use oncebox::{Backoff, Bytes, Error, Message, MessageId, Publisher, Received, Result, Subscriber};
use proptest::prelude::*;
use sqlx::{Sqlite, Transaction};
use tokio::sync::Notify;

const TOPIC: &str = "events";
const LEASE: Duration = Duration::from_millis(60);
const ACK_TIMEOUT: Duration = Duration::from_millis(60);

/// One producer transaction: some messages on one key, committed or rolled back.
#[derive(Debug, Clone)]
struct Txn {
    key: u8,
    messages: usize,
    commit: bool,
}

#[derive(Debug, Clone)]
struct History {
    txns: Vec<Txn>,
    /// For each relay incarnation: crash after this many publishes (None: no crash).
    relay_crashes: Vec<Option<usize>>,
    /// For each relay round: this publish attempt (counted from 0) is refused by the
    /// broker, so that message is retried while others of its key wait (None: no refusal).
    refusals: Vec<Option<usize>>,
    /// For each delivery in turn: does the consumer die after its commit, before its ack?
    /// Cycled, and always ending in `false`: a consumer that dies before every ack never
    /// acks anything, which no guarantee is about.
    consumer_crashes: Vec<bool>,
    duplicate: f64,
    drop: f64,
    delay: f64,
    seed: u64,
}

fn history() -> impl Strategy<Value = History> {
    let txn =
        (0u8..4, 1usize..4, prop::bool::weighted(0.8)).prop_map(|(key, messages, commit)| Txn {
            key,
            messages,
            commit,
        });
    (
        prop::collection::vec(txn, 1..16),
        prop::collection::vec(prop::option::weighted(0.6, 0usize..6), 1..6),
        prop::collection::vec(prop::option::weighted(0.5, 0usize..8), 1..6),
        prop::collection::vec(prop::bool::weighted(0.15), 1..12),
        0.0..0.3f64,
        0.0..0.1f64,
        0.0..0.2f64,
        any::<u64>(),
    )
        .prop_map(
            |(txns, relay_crashes, refusals, consumer_crashes, duplicate, drop, delay, seed)| {
                History {
                    txns,
                    relay_crashes,
                    refusals,
                    consumer_crashes: consumer_crashes
                        .into_iter()
                        .chain(std::iter::once(false))
                        .collect(),
                    duplicate,
                    drop,
                    delay,
                    seed,
                }
            },
        )
}

/// Publishes through the broker, but refuses the `refuse`th attempt with a transient
/// error, and after `crash_after` publishes signals a crash and hangs, so the round is
/// dropped before it settles.
struct CrashAfter<P> {
    inner: P,
    crash_after: Option<usize>,
    refuse: Option<usize>,
    attempts: AtomicUsize,
    published: AtomicUsize,
    crashed: Arc<Notify>,
}

impl<P: Publisher> Publisher for CrashAfter<P> {
    async fn publish(&self, message: &Message) -> Result<()> {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.refuse == Some(attempt) {
            return Err(Error::transport_transient("refused by the test"));
        }
        self.inner.publish(message).await?;
        let n = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_after.is_some_and(|limit| n > limit) {
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

/// The consumer's effect: one row per handled message, no unique constraint.
struct RecordEffect;

impl TxHandler<Transaction<'static, Sqlite>> for RecordEffect {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Sqlite>,
    ) -> Result<Bytes> {
        let id = message.id.map(|id| id.to_string()).unwrap_or_default();
        sqlx::query("INSERT INTO effects (message_id) VALUES (?)")
            .bind(&id)
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::from(id))
    }
}

async fn run_history(history: History) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(fail)?;
    let store = SqliteStore::connect(dir.path().join("prop.db"))
        .await
        .map_err(fail)?;
    store.migrate().await.map_err(fail)?;
    sqlx::query("CREATE TABLE effects (message_id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .map_err(fail)?;
    let outbox = store.outbox();

    // Producer: each transaction commits or rolls back its messages together.
    let mut committed: Vec<Message> = Vec::new();
    let mut rolled_back: HashSet<MessageId> = HashSet::new();
    for txn in &history.txns {
        let mut tx = store.pool().begin().await.map_err(fail)?;
        let messages: Vec<Message> = (0..txn.messages)
            .map(|_| Message::new(TOPIC, "x").with_key(format!("key-{}", txn.key)))
            .collect();
        for message in &messages {
            outbox.enqueue(&mut tx, message).await.map_err(fail)?;
        }
        if txn.commit {
            tx.commit().await.map_err(fail)?;
            committed.extend(messages);
        } else {
            tx.rollback().await.map_err(fail)?;
            rolled_back.extend(messages.iter().map(|m| m.id));
        }
    }

    let broker = MemoryBroker::with_ack_timeout(ACK_TIMEOUT);
    broker.set_seed(history.seed);
    broker.set_faults(Faults {
        drop: history.drop,
        duplicate: history.duplicate,
        delay: history.delay,
        max_delay: Duration::from_millis(20),
    });
    let mut subscriber = broker.subscribe(TOPIC, "effects");
    let options = ConsumerOptions::new("effects")
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(5))
                .max(Duration::from_millis(20)),
        )
        .max_attempts(1000);
    let inbox = TransactionalInbox::new(store.inbox(), RecordEffect, options).map_err(fail)?;
    let relay_options = SpoolOptions::new()
        .batch_size(8)
        .lease(LEASE)
        .dispatch_timeout(Duration::from_millis(50))
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(5))
                .max(Duration::from_millis(20)),
        );

    // Each planned relay crash happens once; later incarnations run clean, so the run ends.
    let mut relay_crashes = history
        .relay_crashes
        .iter()
        .copied()
        .chain(std::iter::repeat(None));
    let mut refusals = history
        .refusals
        .iter()
        .copied()
        .chain(std::iter::repeat(None));
    let mut consumer_crashes = history.consumer_crashes.iter().copied().cycle();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // One relay round, possibly crashing between publish and settle.
        let crashed = Arc::new(Notify::new());
        let publisher = CrashAfter {
            inner: broker.publisher(),
            crash_after: relay_crashes.next().flatten(),
            refuse: refusals.next().flatten(),
            attempts: AtomicUsize::new(0),
            published: AtomicUsize::new(0),
            crashed: Arc::clone(&crashed),
        };
        let relay = Relay::new(outbox.clone(), publisher, relay_options.clone()).map_err(fail)?;
        tokio::select! {
            round = relay.run_once() => { round.map_err(fail)?; }
            () = crashed.notified() => {}
        }

        // Consume whatever arrives, dying before some acks, until a pause in the
        // deliveries (or the deadline: redeliveries can keep coming without one).
        while Instant::now() < deadline
            && let Ok(next) =
                tokio::time::timeout(Duration::from_millis(15), subscriber.next()).await
        {
            let delivery = next.map_err(fail)?;
            if consumer_crashes.next().unwrap_or(false) {
                // Commit the effect, then "die" before the ack: the delivery is dropped.
                inbox
                    .handle(oncebox::Delivery::received(&delivery))
                    .await
                    .map_err(fail)?;
                drop(delivery);
            } else {
                process_delivery(&inbox, delivery).await.map_err(fail)?;
            }
        }

        let effects = effect_counts(&store).await?;
        let pending = outbox.stats().await.map_err(fail)?.pending;
        if effects.len() == committed.len() && pending == 0 {
            break;
        }
        prop_assert!(
            Instant::now() < deadline,
            "no progress: {} of {} effects, {} pending",
            effects.len(),
            committed.len(),
            pending
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Each committed message had its effect exactly once; rolled back ones none.
    let effects = effect_counts(&store).await?;
    for message in &committed {
        prop_assert_eq!(
            effects.get(&message.id.to_string()).copied(),
            Some(1),
            "effect count of {}",
            message.id
        );
    }
    prop_assert_eq!(
        effects.len(),
        committed.len(),
        "effects of messages never committed"
    );

    // Nothing rolled back was published; every committed message was.
    let published = broker.published(TOPIC);
    prop_assert!(
        published.iter().all(|m| !rolled_back.contains(&m.id)),
        "a rolled-back message was published"
    );
    let published_ids: HashSet<MessageId> = published.iter().map(|m| m.id).collect();
    prop_assert!(
        committed.iter().all(|m| published_ids.contains(&m.id)),
        "a committed message was lost"
    );

    // Per key, first publications follow commit order.
    let mut first_seen: Vec<&Message> = Vec::new();
    let mut seen = HashSet::new();
    for message in &published {
        if seen.insert(message.id) {
            first_seen.push(message);
        }
    }
    for key in 0..4u8 {
        let key = format!("key-{key}");
        let order = |list: &mut dyn Iterator<Item = &Message>| -> Vec<MessageId> {
            list.filter(|m| m.key.as_deref() == Some(key.as_str()))
                .map(|m| m.id)
                .collect()
        };
        prop_assert_eq!(
            order(&mut first_seen.iter().copied()),
            order(&mut committed.iter()),
            "publish order of {}",
            key
        );
    }
    Ok(())
}

async fn effect_counts(
    store: &SqliteStore,
) -> std::result::Result<HashMap<String, i64>, TestCaseError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT message_id, COUNT(*) FROM effects GROUP BY message_id")
            .fetch_all(store.pool())
            .await
            .map_err(fail)?;
    Ok(rows.into_iter().collect())
}

fn fail(error: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

proptest! {
    // A failing history is shrunk for at most a minute: each try may run into the 20 s
    // no-progress deadline, and unbounded shrinking would outlast any CI time limit.
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 32,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_committed_message_has_its_effect_exactly_once(history in history()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(fail)?;
        runtime.block_on(run_history(history))?;
    }
}
