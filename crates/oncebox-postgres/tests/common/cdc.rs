//! Helpers of the log-tailing relay's tests: a broker that records what it published
//! and refuses topic `refused` until told otherwise, a slot of the test's own, and a
//! relay running on a task.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::{Error, Message, Publisher, Result};
use oncebox_postgres::cdc::{CdcConnection, CdcMode, CdcOptions, CdcRelay};
use sqlx::Connection;
use tokio::task::JoinHandle;

use super::{LONG, TestDb, url};

/// Records what it published; refuses topic `refused` for good (a permanent error)
/// while it is not [`accepting`](Self::accepting) it (at first).
#[derive(Clone, Default)]
pub struct Recorder {
    published: Arc<Mutex<Vec<Message>>>,
    accepting: Arc<AtomicBool>,
}

impl Publisher for Recorder {
    async fn publish(&self, message: &Message) -> Result<()> {
        if message.topic == "refused" && !self.accepting.load(Ordering::SeqCst) {
            return Err(Error::transport_permanent("the broker refuses this topic"));
        }
        self.published
            .lock()
            .expect("the lock is not poisoned")
            .push(message.clone());
        Ok(())
    }
}

impl Recorder {
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

    /// Waits, for at most [`LONG`], until `count` messages were published.
    pub async fn wait_for(&self, count: usize) -> Vec<Message> {
        eventually(&format!("{count} published messages"), || async {
            let published = self.published();
            (published.len() >= count).then_some(published)
        })
        .await
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

    /// Options for `mode` on this slot, with short intervals.
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

/// A relay whose slot exists before the test produces anything, running on a task
/// (aborting the task is a relay that dies).
pub async fn started<P: Publisher + 'static>(
    db: &TestDb,
    publisher: P,
    options: CdcOptions,
) -> JoinHandle<Result<()>> {
    let relay = CdcRelay::new(
        &db.store,
        CdcConnection::from_url(&url()).expect("a valid URL"),
        publisher,
        options,
    )
    .expect("valid options");
    relay
        .prepare()
        .await
        .expect("the slot and publication are ready");
    tokio::spawn(async move { relay.run_until(std::future::pending()).await })
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
