//! The database handle that hands out the stores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::Result;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::Notify;

use crate::dialect::PgDialect;
use crate::durable::DurableSql;
use crate::error::store_error;
use crate::ident;
use crate::notify::Wakeup;
use crate::outbox::sql::{self as outbox_sql, OutboxSql};
use crate::{DEFAULT_SCHEMA, DebeziumLayout, PgDedupStore, PgDurableInbox, PgInbox, PgOutbox};

/// Connections in the pool [`PgStore::connect`] opens.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// A PostgreSQL database holding oncebox's tables in one schema; hands out the stores.
///
/// Every statement is built once, here, with the schema formatted in; the stores run
/// them as prepared statements. Cheap to clone: clones share the pool, the statements
/// and the wake-ups, so an outbox obtained from one clone wakes a relay running on
/// another.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    schema: Arc<str>,
    sql: Arc<Statements>,
    inbox_wakes: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

/// The statements of every store of one schema, and the outbox's wake-up channel.
#[derive(Debug)]
struct Statements {
    outbox: Arc<OutboxSql>,
    outbox_wakeup: Arc<Wakeup>,
    dialect: PgDialect,
    durable: Arc<DurableSql>,
}

impl Statements {
    fn new(pool: &PgPool, schema: &str) -> Self {
        let outbox = outbox_sql::native(schema);
        let outbox_wakeup = Arc::new(Wakeup::new(pool.clone(), outbox.channel.clone()));
        Self {
            outbox: Arc::new(outbox),
            outbox_wakeup,
            dialect: PgDialect::new(schema),
            durable: Arc::new(DurableSql::new(schema)),
        }
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host/database`) with a pool of
    /// [`DEFAULT_MAX_CONNECTIONS`] connections, schema [`DEFAULT_SCHEMA`]. Does not
    /// migrate: call [`PgStore::migrate`].
    ///
    /// # Errors
    ///
    /// A store error if the URL is invalid or no connection can be opened (transient for
    /// network errors and a server that is starting up).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the call closes what it opened.
    pub async fn connect(url: &str) -> Result<Self> {
        // No ping before each checkout: a connection that died fails its first statement
        // with a transient error instead, which callers retry anyway; the ping would cost
        // a round trip on every transaction.
        let pool = PgPoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(store_error)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (for example the application's own, so that the outbox can
    /// join its transactions), with schema [`DEFAULT_SCHEMA`].
    pub fn from_pool(pool: PgPool) -> Self {
        let sql = Arc::new(Statements::new(&pool, DEFAULT_SCHEMA));
        Self {
            pool,
            schema: Arc::from(DEFAULT_SCHEMA),
            sql,
            inbox_wakes: Arc::default(),
        }
    }

    /// Puts oncebox's tables in schema `schema` instead (several applications or tenants
    /// can then share a database, each with its own tables and migrations record).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) unless `schema`
    /// matches `[a-z_][a-z0-9_]*`, is at most 63 bytes long and does not start with
    /// `pg_`.
    pub fn with_schema(self, schema: &str) -> Result<Self> {
        ident::validate("schema", schema)?;
        Ok(Self {
            sql: Arc::new(Statements::new(&self.pool, schema)),
            schema: Arc::from(schema),
            inbox_wakes: Arc::default(),
            pool: self.pool,
        })
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema holding oncebox's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Creates the schema if needed and creates or upgrades oncebox's tables in it,
    /// recording applied migrations in `<schema>._oncebox_migrations`. Idempotent; safe
    /// to run from several processes at once (sqlx's migration lock serialises them).
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
        crate::migrator(&self.schema)?
            .run(&self.pool)
            .await
            .map_err(|e| store_error(sqlx::Error::Migrate(Box::new(e))))
    }

    /// Adds the relay's bookkeeping to an existing Debezium-style outbox table; see
    /// [`DebeziumLayout`] for what it adds and how to switch relays. Idempotent. The
    /// table's schema is not this store's schema: it is the layout's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) for invalid names; a
    /// store error if the table does not exist or lacks Debezium's columns.
    ///
    /// # Cancel safety
    ///
    /// The statements run in one transaction: all of them apply, or none.
    pub async fn migrate_debezium(&self, layout: &DebeziumLayout) -> Result<()> {
        let sql = layout.migration_sql()?;
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)
    }

    /// The transactional outbox, table `<schema>.outbox`.
    pub fn outbox(&self) -> PgOutbox {
        PgOutbox::new(
            self.pool.clone(),
            Arc::clone(&self.sql.outbox),
            Arc::clone(&self.sql.outbox_wakeup),
        )
    }

    /// A relay's view of the existing Debezium-style outbox table `table` (`name` in
    /// schema `public`, or `schema.name`), with [`DebeziumLayout`]'s defaults: `jsonb`
    /// payload, no timestamp column, no topic prefix. Run
    /// [`PgStore::migrate_debezium`] (or apply [`DebeziumLayout::migration_sql`]) once
    /// first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) for an invalid name.
    pub fn debezium_outbox(&self, table: &str) -> Result<PgOutbox> {
        self.debezium_outbox_with(&DebeziumLayout::new(table))
    }

    /// A relay's view of a Debezium-style outbox table described by `layout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) if `layout` fails
    /// [`DebeziumLayout::validate`].
    pub fn debezium_outbox_with(&self, layout: &DebeziumLayout) -> Result<PgOutbox> {
        layout.validate()?;
        let sql = outbox_sql::debezium(layout);
        let wakeup = Arc::new(Wakeup::new(self.pool.clone(), sql.channel.clone()));
        Ok(PgOutbox::new(self.pool.clone(), Arc::new(sql), wakeup))
    }

    /// The transactional inbox (records of processed ids, for every consumer).
    pub fn inbox(&self) -> PgInbox {
        PgInbox::new(self.pool.clone(), self.sql.dialect.clone())
    }

    /// The durable inbox of `consumer`.
    pub fn durable_inbox(&self, consumer: &str) -> PgDurableInbox {
        let wake = {
            let mut wakes = self
                .inbox_wakes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Arc::clone(wakes.entry(consumer.to_owned()).or_default())
        };
        PgDurableInbox::new(
            self.pool.clone(),
            Arc::clone(&self.sql.durable),
            self.sql.dialect.clone(),
            consumer,
            wake,
        )
    }

    /// The dedup store of the idempotent receiver.
    pub fn dedup(&self) -> PgDedupStore {
        PgDedupStore::new(self.pool.clone(), self.sql.dialect.clone())
    }
}
