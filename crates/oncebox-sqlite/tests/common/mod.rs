//! Helpers shared by the backend's own tests: a fresh database per test.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use oncebox_core::Message;
use oncebox_sqlite::SqliteStore;
use tempfile::TempDir;

#[allow(unused_imports)] // each test binary uses some of them
pub use oncebox_testkit::fixtures::{claim, label, labels, msg, settle_all};

pub const LONG: Duration = Duration::from_secs(60);
pub const SHORT: Duration = Duration::from_millis(200);

/// A migrated database in its own temporary directory (dropped with it).
pub struct Db {
    pub store: SqliteStore,
    pub dir: TempDir,
}

pub async fn db() -> Db {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::connect(dir.path().join("test.db"))
        .await
        .expect("open the database");
    store.migrate().await.expect("migrate");
    Db { store, dir }
}

/// Enqueues `messages` in one committed transaction.
pub async fn enqueue(store: &SqliteStore, messages: &[Message]) {
    let outbox = store.outbox();
    let mut tx = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    for message in messages {
        outbox.enqueue(&mut tx, message).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
}
