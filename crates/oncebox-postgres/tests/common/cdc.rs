//! What the log-tailing relay's tests share: a broker that records what it was given,
//! a slot of the test's own, relays on tasks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::{Error, Message, Publisher, Result};
use oncebox_postgres::cdc::{CdcConnection, CdcMode, CdcOptions, CdcRelay};
use sqlx::Connection;
use tokio::task::JoinHandle;

use super::{LONG, TestDb, url};

/// Records what it published, after taking `confirm` to confirm it; refuses topic
/// `refused` for good (a permanent error) while it is not
/// [`accepting`](Self::accepting) it (at first).
#[derive(Clone, Default)]
pub struct Recorder {
    pub published: Arc<Mutex<Vec<Message>>>,
    pub confirm: Duration,
    /// While set, the broker is unreachable: every publish fails with an outage.
    pub down: Arc<AtomicBool>,
    /// Publish attempts, failed ones included.
    pub attempts: Arc<AtomicUsize>,
    /// While set, the publisher is closed (its process stopping): every publish fails
    /// with `Error::Closed`.
    pub closed: Arc<AtomicBool>,
    accepting: Arc<AtomicBool>,
}

impl Publisher for Recorder {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::transport_outage("the broker is down"));
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if message.topic == "refused" && !self.accepting.load(Ordering::SeqCst) {
            return Err(Error::transport_permanent("the broker refuses this topic"));
        }
        tokio::time::sleep(self.confirm).await;
        self.published
            .lock()
            .expect("the lock is not poisoned")
            .push(message.clone());
        Ok(())
    }
}

impl Recorder {
    /// A broker that takes `confirm` for each confirmation.
    pub fn slow(confirm: Duration) -> Self {
        Self {
            confirm,
            ..Self::default()
        }
    }

    /// Whether topic `refused` is published from now on.
    pub fn accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::SeqCst);
    }

    pub fn published(&self) -> Vec<Message> {
        self.published
            .lock()
            .expect("the lock is not poisoned")
            .clone()
    }

    /// Waits, for at most [`LONG`], until a message with `payload` was published.
    pub async fn wait_for_payload(&self, payload: &str) {
        eventually(
            &format!("a message {payload:?} to be published"),
            || async {
                self.published()
                    .iter()
                    .any(|m| m.payload == payload)
                    .then_some(())
            },
        )
        .await;
    }

    pub async fn wait_for(&self, count: usize) -> Vec<Message> {
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let published = self.published();
            if published.len() >= count {
                return published;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "published {} of {count}",
                published.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A slot and publication of the test's own, dropped with this value.
pub struct Slot {
    pub name: String,
}

impl Slot {
    pub fn new() -> Self {
        Self {
            name: format!("t_cdc_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    pub fn options(&self, mode: CdcMode) -> CdcOptions {
        CdcOptions::new(mode, &self.name)
            .status_interval(Duration::from_millis(100))
            .standby_poll(Duration::from_millis(100))
            .stats_interval(Duration::from_millis(200))
            .backoff(oncebox_core::Backoff::new().initial(Duration::from_millis(10)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut conn = sqlx::PgConnection::connect(&url()).await?;
                for _ in 0..50 {
                    // A relay of the test may still be reading it (a failed test does
                    // not stop its tasks): end its session.
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active",
                    )
                    .bind(&name)
                    .execute(&mut conn)
                    .await;
                    let dropped = sqlx::query(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND NOT active",
                    )
                    .bind(&name)
                    .execute(&mut conn)
                    .await;
                    let left: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
                    )
                    .bind(&name)
                    .fetch_one(&mut conn)
                    .await?;
                    if dropped.is_ok() && left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP PUBLICATION IF EXISTS \"{name}\""
                )))
                .execute(&mut conn)
                .await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .join();
    }
}

/// Starts `relay` on a task; aborting the task is a relay that dies.
pub fn spawn<P: Publisher + 'static>(relay: CdcRelay<P>) -> JoinHandle<Result<()>> {
    tokio::spawn(async move { relay.run_until(std::future::pending()).await })
}

pub fn relay(db: &TestDb, publisher: Recorder, options: CdcOptions) -> CdcRelay<Recorder> {
    CdcRelay::new(
        &db.store,
        CdcConnection::from_url(&url()).expect("a valid URL"),
        publisher,
        options,
    )
    .expect("valid options")
}

/// A relay whose slot exists before the test produces anything, running on a task.
pub async fn started(
    db: &TestDb,
    publisher: Recorder,
    options: CdcOptions,
) -> JoinHandle<Result<()>> {
    let relay = relay(db, publisher, options);
    relay
        .prepare()
        .await
        .expect("the slot and publication are ready");
    spawn(relay)
}

/// Polls `check` until it returns `Some`, for at most [`LONG`].
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn keyed(key: &str, n: usize) -> Message {
    Message::new("orders", format!("{key}:{n}")).with_key(key)
}

/// Emits `messages` in one transaction through the message outbox.
pub async fn emit(db: &TestDb, messages: &[Message], commit: bool) {
    let outbox = db.store.message_outbox();
    let mut tx = db.store.pool().begin().await.expect("a transaction begins");
    for message in messages {
        outbox
            .enqueue(&mut tx, message)
            .await
            .expect("the message is enqueued");
    }
    if commit {
        tx.commit().await.expect("the transaction commits");
    } else {
        tx.rollback().await.expect("the transaction rolls back");
    }
}
