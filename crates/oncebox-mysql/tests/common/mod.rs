//! Helpers shared by the backend's tests: a fresh database per test on the real server.
//!
//! Tests read the server's URL from `ONCEBOX_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`). Each test creates a database of its own
//! (`oncebox_t_<uuid>`), migrates it, and drops it when its [`TestDb`] is dropped, so
//! tests run in parallel and rerun cleanly. At most [`PARALLEL_TESTS`] tests of one test
//! binary hold a database at once, each with a small pool, so `cargo test` stays far
//! below the server's `max_connections` (151 by default) whatever `--test-threads` says.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use oncebox_core::Message;
use oncebox_mysql::{MySqlOutbox, MySqlStore};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Semaphore, SemaphorePermit};

#[allow(unused_imports)] // each test binary uses some of them
pub use oncebox_testkit::fixtures::{claim, done, label, labels, msg, settle_all};

pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";
pub const PARALLEL_TESTS: usize = 4;

static SLOTS: Semaphore = Semaphore::const_new(PARALLEL_TESTS);

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
    _slot: SemaphorePermit<'static>,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::with_connections(6).await
    }

    pub async fn with_connections(connections: u32) -> Self {
        let slot = SLOTS
            .acquire()
            .await
            .expect("the test semaphore is never closed");
        let name = create_database("oncebox_t").await;
        let pool = MySqlPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options().database(&name))
            .await
            .expect("connect to MariaDB (set ONCEBOX_MYSQL_URL)");
        let store = MySqlStore::from_pool(pool);
        let db = Self {
            store,
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

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_database(self.name.clone());
    }
}

/// Creates an empty database `<prefix>_<uuid>` and returns its name.
pub async fn create_database(prefix: &str) -> String {
    let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
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

/// Drops database `name` on a connection of its own, from a thread of its own (drop
/// cannot await), waiting at most a few seconds for locks.
pub fn drop_database(name: String) {
    let dropper = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            let Ok(mut conn) = MySqlConnection::connect_with(&options()).await else {
                return;
            };
            let sql =
                format!("SET SESSION lock_wait_timeout = 5; DROP DATABASE IF EXISTS `{name}`");
            if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
            {
                eprintln!("could not drop test database {name}: {error}");
            }
            let _ = conn.close().await;
        });
    });
    let _ = dropper.join();
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
