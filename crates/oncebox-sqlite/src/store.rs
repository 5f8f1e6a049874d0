//! The database handle that hands out the stores.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::Result;
use sqlx::Sqlite;
use sqlx::pool::PoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use tokio::sync::Notify;

use crate::error::store_error;
use crate::{SqliteDedupStore, SqliteDialect, SqliteDurableInbox, SqliteInbox, SqliteOutbox};

/// How long a connection waits for the write lock before failing with a transient
/// error.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections in the pool [`SqliteStore::connect`] opens.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// A SQLite database holding oncebox's tables; hands out the stores.
///
/// Cheap to clone: clones share the pool and the in-process wake-ups, so an outbox
/// obtained from one clone wakes the relay running on another.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    outbox_wake: Arc<Notify>,
    inbox_wakes: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

impl SqliteStore {
    /// Opens (creating it if missing) the database file at `path` with the settings
    /// oncebox is tuned for: WAL journal, `synchronous = NORMAL`, a busy timeout of
    /// [`DEFAULT_BUSY_TIMEOUT`], foreign keys on, and a pool of
    /// [`DEFAULT_MAX_CONNECTIONS`] connections. Does not migrate: call
    /// [`SqliteStore::migrate`].
    ///
    /// # Errors
    ///
    /// A store error if the file cannot be opened or created.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the call closes what it opened (the file may exist by then).
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(
            Self::default_connect_options(path),
            PoolOptions::new().max_connections(DEFAULT_MAX_CONNECTIONS),
        )
        .await
    }

    /// The connection settings [`SqliteStore::connect`] uses, to adjust before
    /// [`SqliteStore::connect_with`].
    pub fn default_connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .foreign_keys(true)
    }

    /// Opens a pool with the given settings.
    ///
    /// The stores rely on a busy timeout (concurrent writers wait for SQLite's single
    /// write lock instead of failing at once) and work best in WAL mode, where readers
    /// never block the writer; see [`SqliteStore::default_connect_options`].
    ///
    /// # Errors
    ///
    /// A store error if no connection can be opened.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the call closes what it opened (the file may exist by then).
    pub async fn connect_with(
        options: SqliteConnectOptions,
        pool: PoolOptions<Sqlite>,
    ) -> Result<Self> {
        let pool = pool.connect_with(options).await.map_err(store_error)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (for example the application's own, so that the outbox can
    /// join its transactions).
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            pool,
            outbox_wake: Arc::new(Notify::new()),
            inbox_wakes: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates or upgrades oncebox's tables (all prefixed `oncebox_`), recording applied
    /// migrations in `_oncebox_migrations`. Idempotent.
    ///
    /// # Errors
    ///
    /// A store error if a migration fails or the recorded migrations do not match the
    /// embedded ones.
    ///
    /// # Cancel safety
    ///
    /// Each migration runs in a transaction: a dropped call leaves the schema at the last
    /// complete version, and the next call goes on from there.
    pub async fn migrate(&self) -> Result<()> {
        crate::migrator()
            .run(&self.pool)
            .await
            .map_err(|e| store_error(sqlx::Error::Migrate(Box::new(e))))
    }

    /// The transactional outbox.
    pub fn outbox(&self) -> SqliteOutbox {
        SqliteOutbox::new(self.pool.clone(), Arc::clone(&self.outbox_wake))
    }

    /// The transactional inbox (records of processed ids, for every consumer).
    pub fn inbox(&self) -> SqliteInbox {
        SqliteInbox::new(self.pool.clone(), SqliteDialect)
    }

    /// The durable inbox of `consumer`.
    pub fn durable_inbox(&self, consumer: &str) -> SqliteDurableInbox {
        let wake = {
            let mut wakes = self
                .inbox_wakes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Arc::clone(wakes.entry(consumer.to_owned()).or_default())
        };
        SqliteDurableInbox::new(self.pool.clone(), consumer, wake)
    }

    /// The dedup store of the idempotent receiver.
    pub fn dedup(&self) -> SqliteDedupStore {
        SqliteDedupStore::new(self.pool.clone(), SqliteDialect)
    }
}
