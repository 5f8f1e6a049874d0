//! The database handle that hands out the stores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::Result;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

use crate::error::store_error;
use crate::wake::Wakeup;
use crate::{MySqlDedupStore, MySqlDialect, MySqlDurableInbox, MySqlInbox, MySqlOutbox};

/// Connections in the pool [`MySqlStore::connect`] opens.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// A MySQL or MariaDB database holding oncebox's tables; hands out the stores.
///
/// The tables live in the connection's database (the one the URL names), all named
/// `oncebox_*`. Cheap to clone: clones share the pool and the in-process wake-ups, so an
/// outbox obtained from one clone wakes a relay running on another.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    outbox_wake: Arc<Wakeup>,
    inbox_wakes: Arc<Mutex<HashMap<String, Arc<Wakeup>>>>,
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user:password@host/database`) with a pool of
    /// [`DEFAULT_MAX_CONNECTIONS`] connections. Does not migrate: call
    /// [`MySqlStore::migrate`].
    ///
    /// # Errors
    ///
    /// A store error if the URL is invalid or no connection can be opened (transient for
    /// network errors and a server refusing more connections).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the call closes what it opened.
    pub async fn connect(url: &str) -> Result<Self> {
        // No ping before each checkout: a connection that died fails its first statement
        // with a transient error instead, which callers retry anyway; the ping would cost
        // a round trip on every transaction.
        let pool = MySqlPoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(store_error)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (for example the application's own, so that the outbox can
    /// join its transactions).
    ///
    /// The stores rely on sqlx's connection settings: `CLIENT_FOUND_ROWS` (an `UPDATE`
    /// reports the rows it matched, which is how a stale lease or token is told apart),
    /// which sqlx always sets, and a strict `sql_mode` (the default of MySQL 8 and
    /// MariaDB 10.2.4+), under which a value too long for its column is an error, never
    /// silently cut.
    pub fn from_pool(pool: MySqlPool) -> Self {
        Self {
            pool,
            outbox_wake: Arc::new(Wakeup::new()),
            inbox_wakes: Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Creates or upgrades oncebox's tables in the connection's database, recording
    /// applied migrations in `_oncebox_migrations`. Idempotent; safe to run from several
    /// processes at once (sqlx's migration lock, `GET_LOCK`, serialises them).
    ///
    /// # Errors
    ///
    /// A store error if a migration fails or the recorded migrations do not match the
    /// embedded ones. MySQL commits each DDL statement on its own, so a migration that
    /// failed half way is left marked as failed ("dirty"); its statements are all
    /// idempotent: fix the cause, delete its row from `_oncebox_migrations` and migrate
    /// again.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the strict sense: a dropped call may leave the current
    /// migration half applied (see above).
    pub async fn migrate(&self) -> Result<()> {
        crate::migrator()
            .run(&self.pool)
            .await
            .map_err(|e| store_error(sqlx::Error::Migrate(Box::new(e))))
    }

    /// The transactional outbox, table `oncebox_outbox`.
    pub fn outbox(&self) -> MySqlOutbox {
        MySqlOutbox::new(self.pool.clone(), Arc::clone(&self.outbox_wake))
    }

    /// The transactional inbox (records of processed ids, for every consumer), table
    /// `oncebox_inbox`.
    pub fn inbox(&self) -> MySqlInbox {
        MySqlInbox::new(self.pool.clone(), MySqlDialect)
    }

    /// The durable inbox of `consumer`, table `oncebox_durable_inbox`.
    pub fn durable_inbox(&self, consumer: &str) -> MySqlDurableInbox {
        let wake = {
            let mut wakes = self
                .inbox_wakes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Arc::clone(
                wakes
                    .entry(consumer.to_owned())
                    .or_insert_with(|| Arc::new(Wakeup::new())),
            )
        };
        MySqlDurableInbox::new(self.pool.clone(), consumer, wake)
    }

    /// The dedup store of the idempotent receiver (and of `oncebox-http`'s
    /// Idempotency-Key layer), table `oncebox_dedup`.
    pub fn dedup(&self) -> MySqlDedupStore {
        MySqlDedupStore::new(self.pool.clone(), MySqlDialect)
    }
}
