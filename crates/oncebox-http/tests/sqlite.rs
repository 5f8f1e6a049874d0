//! The layer over a real HTTP server, on the SQLite dedup store (a fresh database file
//! per test).

#[macro_use]
mod common;

use common::Fresh;
use oncebox_sqlite::{SqliteDedupStore, SqliteStore};

async fn sqlite() -> Fresh<SqliteDedupStore> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::connect(dir.path().join("idempotency.db"))
        .await
        .expect("open the database");
    store.migrate().await.expect("migrate");
    Fresh {
        store: store.dedup(),
        keep: Box::new(dir),
    }
}

scenarios!(sqlite().await);
