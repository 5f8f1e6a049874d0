//! Helpers shared by the backend's tests: a fresh database per test on the real server.
//!
//! Tests read the server's URL from `ONCEBOX_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`). Each test creates a database of its own
//! (`oncebox_t_<random>`), migrates it, and drops it when its [`TestDb`] is dropped,
//! within the bounds of `oncebox_testkit::fresh` (a few tests of one binary at once,
//! each with a small pool, far below the server's `max_connections`).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use oncebox_core::Message;
use oncebox_mysql::{MySqlOutbox, MySqlStore};
use oncebox_testkit::fresh::{self, Cleanup};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::SemaphorePermit;

#[allow(unused_imports)] // each test binary uses some of them
pub use oncebox_testkit::fixtures::{claim, done, label, labels, msg, settle_all};

pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

pub fn url() -> String {
    std::env::var("ONCEBOX_MYSQL_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

pub fn options() -> MySqlConnectOptions {
    url().parse().expect("a valid ONCEBOX_MYSQL_URL")
}

/// A migrated database of its own, dropped (best effort) with this value.
pub struct TestDb {
    pub store: MySqlStore,
    pub name: String,
    // Dropped in this order, after the store: the database goes, then the slot frees.
    _drop: Cleanup,
    _slot: SemaphorePermit<'static>,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::with_connections(6).await
    }

    pub async fn with_connections(connections: u32) -> Self {
        let slot = fresh::slot().await;
        let name = create_database("oncebox_t").await;
        let pool = MySqlPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options().database(&name))
            .await
            .expect("connect to MariaDB (set ONCEBOX_MYSQL_URL)");
        let db = Self {
            store: MySqlStore::from_pool(pool),
            _drop: drop_database(name.clone()),
            name,
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
    ) -> oncebox_core::Result<sqlx::Transaction<'static, sqlx::MySql>> {
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

    /// Runs `sql` (no parameters, several statements allowed) on the pool.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Creates an empty database `<prefix>_<random>` and returns its name.
pub async fn create_database(prefix: &str) -> String {
    let name = fresh::unique_name(prefix);
    let mut conn = options()
        .connect()
        .await
        .expect("connect to MariaDB (set ONCEBOX_MYSQL_URL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&mut conn)
        .await
        .expect("create the test database");
    let _ = conn.close().await;
    name
}

/// Drops database `name` when the value returned is dropped, on a connection of its
/// own, waiting at most a few seconds for locks.
pub fn drop_database(name: String) -> Cleanup {
    Cleanup::new(format!("test database {name}"), move || async move {
        let mut conn = MySqlConnection::connect_with(&options()).await?;
        let sql = format!("SET SESSION lock_wait_timeout = 5; DROP DATABASE IF EXISTS `{name}`");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await
    })
}

/// Enqueues `messages` in one committed transaction.
pub async fn enqueue(outbox: &MySqlOutbox, store: &MySqlStore, messages: &[Message]) {
    let mut tx = store.pool().begin().await.expect("begin");
    for message in messages {
        outbox.enqueue(&mut tx, message).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
}

/// A lease that outlives any test.
pub const LONG: Duration = Duration::from_secs(60);
