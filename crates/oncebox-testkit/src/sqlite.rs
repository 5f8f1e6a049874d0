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
use oncebox_core::{Error, MessageId, Result};
use oncebox_sqlite::{
    RowStatus, SqliteDedupStore, SqliteDurableInbox, SqliteInbox, SqliteOutbox, SqliteStore,
};
use sqlx::{Sqlite, Transaction};
use tempfile::TempDir;

use crate::outbox::Capabilities;

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

    fn backend(&self) -> &SqliteStore {
        &self.store
    }

    fn outbox(&self) -> SqliteOutbox {
        self.store.outbox()
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

crate::sql_store_harness! {
    harness: SqliteHarness,
    producer: SqliteProducer,
    database: Sqlite,
    stores: SqliteOutbox, SqliteInbox, SqliteDurableInbox, SqliteDedupStore,
    row_status: RowStatus,
    insert_effect: "INSERT INTO conformance_effects (key) VALUES (?1)",
    count_effects: "SELECT COUNT(*) FROM conformance_effects WHERE key = ?1",
    count_records: "SELECT COUNT(*) FROM oncebox_dedup",
    outbox: {
        /// SQLite serialises every producer (one writer at a time), has no claim window
        /// and no held claims, and its replay does not wait for a relay holding the key;
        /// it keeps the enqueue time, and times to the millisecond.
        fn capabilities(&self) -> Capabilities {
            Capabilities::new()
                .keeps_enqueue_time(true)
                .time_resolution(Duration::from_millis(1))
                .publication_times(true)
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
    }
}
