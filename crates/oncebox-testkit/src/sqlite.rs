//! A ready SQLite backend for the suites and the end-to-end driver: a migrated database in
//! a temporary directory that implements every store harness.
//!
//! Transport crates use it for their end-to-end test (SQLite outbox → relay → broker →
//! transactional inbox) without writing a store harness of their own:
//!
//! ```ignore
//! let store = oncebox_testkit::sqlite::SqliteHarness::new().await;
//! oncebox_testkit::e2e::outbox_to_inbox(&broker, &store, &store, EndToEnd::new(10_000)).await?;
//! ```

use std::time::{Duration, SystemTime};

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Message, MessageId, Result, Schedule};
use oncebox_sqlite::{
    RowStatus, SqliteDedupStore, SqliteDurableInbox, SqliteInbox, SqliteOutbox, SqliteStore,
};
use sqlx::{Sqlite, Transaction};
use tempfile::TempDir;

use crate::dedup::DedupHarness;
use crate::inbox::{Connections, DurableInboxHarness, InboxHarness, TxOf};
use crate::outbox::{
    Capabilities, OutboxHarness, ProducerTx, RowState as KitRowState, RowStatus as KitRowStatus,
};

/// A migrated database in a temporary directory, plus the suite's effects table
/// (deliberately without a unique constraint, so that a second effect is counted).
pub struct SqliteHarness {
    store: SqliteStore,
    _dir: TempDir,
}

impl SqliteHarness {
    /// A new, migrated database with the suites' effects table.
    ///
    /// # Panics
    ///
    /// If the temporary directory or the database cannot be created (a broken test
    /// machine, not a finding about the code under test).
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let store = SqliteStore::connect(dir.path().join("oncebox.db"))
            .await
            .expect("open the database");
        store.migrate().await.expect("migrate");
        sqlx::query("CREATE TABLE conformance_effects (key TEXT NOT NULL)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        Self { store, _dir: dir }
    }

    /// The SQLite store, for anything the harness traits do not cover.
    pub fn sqlite(&self) -> &SqliteStore {
        &self.store
    }

    /// A transaction that takes the database's write lock at once, as every writer to
    /// SQLite should (a deferred one may fail to upgrade its lock).
    async fn begin_tx(&self) -> Result<Transaction<'static, Sqlite>> {
        self.store
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::store_transient)
    }
}

/// A producer's transaction with the outbox it enqueues into.
pub struct SqliteProducer {
    tx: Transaction<'static, Sqlite>,
    outbox: SqliteOutbox,
}

impl ProducerTx for SqliteProducer {
    async fn enqueue(&mut self, message: &Message) -> Result<()> {
        self.outbox.enqueue(&mut self.tx, message).await
    }

    async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(Error::store_transient)?;
        self.outbox.wake();
        Ok(())
    }

    async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(Error::store_transient)
    }
}

impl OutboxHarness for SqliteHarness {
    type Store = SqliteOutbox;
    type Producer = SqliteProducer;

    fn store(&self) -> SqliteOutbox {
        self.store.outbox()
    }

    /// SQLite serialises every producer (one writer at a time), has no claim window and
    /// no held claims, and its replay does not wait for a relay holding the key; it
    /// keeps the enqueue time, and times to the millisecond.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .keeps_enqueue_time(true)
            .time_resolution(Duration::from_millis(1))
            .publication_times(true)
    }

    async fn begin(&self) -> Result<SqliteProducer> {
        Ok(SqliteProducer {
            tx: self.begin_tx().await?,
            outbox: self.store.outbox(),
        })
    }

    async fn set_published_at(&self, id: MessageId, at: SystemTime) -> Result<()> {
        sqlx::query("UPDATE oncebox_outbox SET done_at = ?1 WHERE id = ?2")
            .bind(to_unix_millis(at))
            .bind(id.to_string())
            .execute(self.store.pool())
            .await
            .map_err(Error::store_transient)?;
        Ok(())
    }

    fn deleting_on_publish(&self) -> Option<SqliteOutbox> {
        Some(self.store.outbox().delete_on_publish(true))
    }

    async fn enqueue_scheduled(&self, message: &Message, when: Schedule) -> Result<()> {
        let outbox = self.store.outbox();
        let mut tx = self.begin_tx().await?;
        outbox.enqueue_scheduled(&mut tx, message, when).await?;
        tx.commit().await.map_err(Error::store_transient)?;
        outbox.wake();
        Ok(())
    }

    async fn cancel(&self, id: MessageId) -> Result<bool> {
        let mut tx = self.begin_tx().await?;
        let cancelled = self.store.outbox().cancel(&mut tx, id).await?;
        tx.commit().await.map_err(Error::store_transient)?;
        Ok(cancelled)
    }

    async fn cancel_kept_open(
        &self,
        id: MessageId,
        open_for: Duration,
        commit: bool,
    ) -> Result<bool> {
        let mut tx = self.begin_tx().await?;
        let cancelled = self.store.outbox().cancel(&mut tx, id).await?;
        tokio::time::sleep(open_for).await;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        Ok(cancelled)
    }

    async fn row_state(&self, id: MessageId) -> Result<Option<KitRowState>> {
        let Some(state) = self.store.outbox().status(id).await? else {
            return Ok(None);
        };
        let status = match state.status {
            RowStatus::Pending => KitRowStatus::Pending,
            RowStatus::Done => KitRowStatus::Done,
            RowStatus::Dead => KitRowStatus::Dead,
            other => {
                return Err(Error::store_permanent(format!(
                    "unknown row status {other:?}"
                )));
            }
        };
        Ok(Some(KitRowState {
            status,
            attempts: state.attempts,
            last_error: state.last_error,
        }))
    }

    async fn enqueue_batch(
        &self,
        business: &str,
        messages: &[Message],
        commit: bool,
    ) -> Result<()> {
        let outbox = self.store.outbox();
        let mut tx = self.begin_tx().await?;
        Self::insert_effect(&mut tx, business).await?;
        let batch = outbox.enqueue_batch(&mut tx, messages).await;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
            outbox.wake();
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        batch
    }

    async fn business_rows(&self, business: &str) -> Result<u64> {
        InboxHarness::count_effects(self, business).await
    }
}

impl InboxHarness for SqliteHarness {
    type Store = SqliteInbox;

    fn store(&self) -> SqliteInbox {
        self.store.inbox()
    }

    async fn insert_effect(tx: &mut TxOf<Self>, key: &str) -> Result<()> {
        sqlx::query("INSERT INTO conformance_effects (key) VALUES (?1)")
            .bind(key.to_owned())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(())
    }

    async fn count_effects(&self, key: &str) -> Result<u64> {
        let count: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM conformance_effects WHERE key = ?1")
                .bind(key.to_owned())
                .fetch_one(self.store.pool())
                .await
                .map_err(Error::store_transient)?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    fn connections(&self) -> Option<Connections> {
        let pool = self.store.pool();
        Some(Connections {
            open: pool.size(),
            idle: pool.num_idle(),
        })
    }
}

impl DurableInboxHarness for SqliteHarness {
    type Durable = SqliteDurableInbox;

    fn durable(&self, consumer: &str) -> SqliteDurableInbox {
        self.store.durable_inbox(consumer)
    }
}

impl DedupHarness for SqliteHarness {
    type Store = SqliteDedupStore;

    fn store(&self) -> SqliteDedupStore {
        self.store.dedup()
    }

    async fn count_records(&self) -> Result<Option<u64>> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_dedup")
            .fetch_one(self.store.pool())
            .await
            .map_err(Error::store_transient)?;
        Ok(Some(u64::try_from(count).unwrap_or_default()))
    }
}
