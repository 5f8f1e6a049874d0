//! Helpers shared by the backend's tests: a fresh schema per test on the real server.
//!
//! Tests read the server's URL from `ONCEBOX_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Each test migrates a schema of its own
//! (`t_<random>`) and drops it when its [`TestDb`] is dropped, within the bounds of
//! `oncebox_testkit::fresh` (a few tests of one binary at once, each with a small pool,
//! far below the server's `max_connections`).

#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "cdc")]
pub mod cdc;

use std::time::Duration;

use oncebox_core::Message;
use oncebox_postgres::{PgOutbox, PgStore};
use oncebox_testkit::fresh::{self, Cleanup};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use tokio::sync::SemaphorePermit;

#[allow(unused_imports)] // each test binary uses some of them
pub use oncebox_testkit::fixtures::{claim, done, label, labels, msg};

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const LONG: Duration = Duration::from_secs(60);

pub fn url() -> String {
    std::env::var("ONCEBOX_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

pub fn unique_schema() -> String {
    fresh::unique_name("t")
}

/// A migrated schema of its own, dropped (best effort) with this value. The pool's
/// connections have the schema first on their `search_path`, so test SQL may leave
/// names unqualified.
pub struct TestDb {
    pub store: PgStore,
    pub schema: String,
    // Dropped in this order, after the store: the schema goes, then the slot frees.
    _drop: Cleanup,
    _slot: SemaphorePermit<'static>,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::with_connections(6).await
    }

    pub async fn with_connections(connections: u32) -> Self {
        let slot = fresh::slot().await;
        let schema = unique_schema();
        let options: PgConnectOptions = url().parse().expect("a valid ONCEBOX_PG_URL");
        let options = options.options([("search_path", format!("{schema},public"))]);
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .expect("connect to PostgreSQL (set ONCEBOX_PG_URL)");
        let store = PgStore::from_pool(pool)
            .with_schema(&schema)
            .expect("a valid schema name");
        let db = Self {
            store,
            _drop: drop_schema(schema.clone()),
            schema,
            _slot: slot,
        };
        db.store.migrate().await.expect("migrate");
        db
    }

    /// A transaction on the pool with `messages` enqueued in it, in order, not yet
    /// committed: the start of every producer transaction the tests write.
    ///
    /// # Errors
    ///
    /// The outbox's error for the first message it refused; a transient error if no
    /// transaction could be begun.
    pub async fn enqueued(
        &self,
        messages: &[Message],
    ) -> oncebox_core::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let outbox = self.store.outbox();
        let mut tx = self
            .store
            .pool()
            .begin()
            .await
            .map_err(oncebox_core::Error::store_transient)?;
        for message in messages {
            outbox.enqueue(&mut tx, message).await?;
        }
        Ok(tx)
    }

    /// Runs `sql` (no parameters) on the pool.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Drops `schema` when the value returned is dropped, on a connection of its own,
/// waiting at most a few seconds for locks.
pub fn drop_schema(schema: String) -> Cleanup {
    Cleanup::new(format!("test schema {schema}"), move || async move {
        let mut conn = PgConnection::connect(&url()).await?;
        let sql = format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await
    })
}

/// Enqueues `messages` in one committed transaction.
pub async fn enqueue(outbox: &PgOutbox, store: &PgStore, messages: &[Message]) {
    let mut tx = store.pool().begin().await.expect("begin");
    for message in messages {
        outbox.enqueue(&mut tx, message).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
}
