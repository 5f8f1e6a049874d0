//! The store a configuration names, connected: [`Database`], and the outbox in it,
//! [`AnyOutbox`]. Each dispatches to the backend crate's type through `each_store!`.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use oncebox::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox::postgres::sqlx::postgres::PgConnectOptions;
use oncebox::postgres::{DebeziumLayout, PgStore};
use oncebox::spool::{
    Backlog, ClaimRequest, Claimed, DeadLetter, LeaseToken, MinuteCount, OutboxAdmin, OutboxRow,
    OutboxStats, RowFilter, Settlement, SpoolStore,
};
use oncebox::sqlite::SqliteStore;
use oncebox::store::{DedupRecord, DedupStore, InboxStore};
use oncebox::{Message, MessageId, Result};

use crate::config::{Config, ConfigError, Layout, Secret, StoreKind};

/// Runs `$body` with `$store` bound to the backend's value, one arm per store of the
/// build, in an `impl` of an enum whose variants are those stores ([`Database`],
/// [`AnyOutbox`]).
macro_rules! each_store {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            Self::Sqlite($store) => $body,
            Self::Postgres($store) => $body,
            #[cfg(feature = "mysql")]
            Self::Mysql($store) => $body,
        }
    };
}

/// A connected database. Its variants are the stores of the build (the features).
#[non_exhaustive]
pub enum Database {
    /// SQLite.
    Sqlite(SqliteStore),
    /// PostgreSQL.
    Postgres(PgStore),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(oncebox::mysql::MySqlStore),
}

impl Database {
    /// Connects to `store.url` with `store.password`. A database that cannot be reached
    /// within `store.connect_timeout` (an outage is tried again meanwhile: a restart or
    /// a failover in progress) is a configuration error (exit status 2), named by its
    /// URL; so is a SQLite file that does not exist (a relay on a new empty file would
    /// wait on it forever).
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] naming the store and the cause.
    pub async fn connect(config: &Config) -> std::result::Result<Self, ConfigError> {
        Self::open(config, false).await
    }

    /// [`connect`](Self::connect), creating a SQLite file that does not exist yet
    /// (`oncebox migrate`).
    pub(crate) async fn connect_creating(
        config: &Config,
    ) -> std::result::Result<Self, ConfigError> {
        Self::open(config, true).await
    }

    async fn open(config: &Config, create: bool) -> std::result::Result<Self, ConfigError> {
        let url = config.store_url()?;
        let unreachable = |error: &dyn std::fmt::Display| {
            ConfigError::key(
                "store.url",
                format!("cannot connect to {}: {error}", url.as_str()),
            )
        };
        let password = config.store.password.as_ref().map(Secret::expose);
        match url.kind() {
            StoreKind::Sqlite => {
                let options = SqliteStore::default_connect_options(url.sqlite_path())
                    .create_if_missing(create);
                let pool = pool(config, options, false)
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::Sqlite(SqliteStore::from_pool(pool)))
            }
            StoreKind::Postgres => {
                let mut options = PgConnectOptions::from_str(url.as_str())
                    .map_err(|error| unreachable(&error))?;
                if let Some(password) = password {
                    options = options.password(password);
                }
                let pool = pool(config, options, true)
                    .await
                    .map_err(|error| unreachable(&error))?;
                let store = PgStore::from_pool(pool)
                    .with_schema(&config.store.schema)
                    .map_err(|error| ConfigError::key("store.schema", error))?;
                Ok(Self::Postgres(store))
            }
            #[cfg(feature = "mysql")]
            StoreKind::Mysql => {
                use oncebox::mysql::sqlx::mysql::MySqlConnectOptions;
                let mut options = MySqlConnectOptions::from_str(url.as_str())
                    .map_err(|error| unreachable(&error))?;
                if let Some(password) = password {
                    options = options.password(password);
                }
                let pool = pool(config, options, true)
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::Mysql(oncebox::mysql::MySqlStore::from_pool(pool)))
            }
            #[cfg(not(feature = "mysql"))]
            StoreKind::Mysql => unreachable!("the URL parser refuses stores not in the build"),
        }
    }

    /// Creates or upgrades oncebox's tables (and the Debezium-style table's columns,
    /// with that layout).
    pub(crate) async fn migrate(&self, config: &Config) -> Result<()> {
        match self {
            Self::Sqlite(store) => store.migrate().await,
            Self::Postgres(store) => {
                store.migrate().await?;
                if config.outbox.layout == Layout::Debezium {
                    store.migrate_debezium(&debezium_layout(config)).await?;
                }
                Ok(())
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(store) => store.migrate().await,
        }
    }

    /// The outbox the configuration describes.
    pub(crate) fn outbox(&self, config: &Config) -> std::result::Result<AnyOutbox, ConfigError> {
        Ok(match self {
            Self::Sqlite(store) => AnyOutbox::Sqlite(store.outbox()),
            Self::Postgres(store) => {
                let outbox = match config.outbox.layout {
                    Layout::Oncebox => store.outbox(),
                    Layout::Debezium => store
                        .debezium_outbox_with(&debezium_layout(config))
                        .map_err(|error| ConfigError::key("outbox.table", error))?,
                };
                AnyOutbox::Postgres(
                    outbox
                        .with_notify(config.outbox.listen)
                        .with_held_claims(config.outbox.held_claims),
                )
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(store) => AnyOutbox::Mysql(store.outbox()),
        })
    }

    /// Deletes inbox records of `consumer` older than `before` (the transactional
    /// inbox's records and the durable inbox's processed rows), in bounded batches;
    /// returns how many.
    pub(crate) async fn purge_inbox(&self, consumer: &str, before: SystemTime) -> Result<u64> {
        const BATCH: usize = 1000;
        let mut total = 0;
        loop {
            let deleted = each_store!(self, store => {
                store.inbox().purge(consumer, before, BATCH).await?
                    + store.durable_inbox(consumer).purge(before, BATCH).await?
            });
            total += deleted;
            if deleted == 0 {
                return Ok(total);
            }
        }
    }

    /// Every inbox consumer's figures across the transactional and the durable inbox, in
    /// byte order of the name: one statement, which reads every record of both inboxes
    /// (each store's [`InboxAdmin`] implementation says how).
    pub(crate) async fn consumers(&self) -> Result<Vec<ConsumerStats>> {
        each_store!(self, store => store.inbox().consumers().await)
    }

    /// Up to `limit` durable inbox rows matching `filter`, newest first from `before`
    /// ([`InboxAdmin::inbox_rows`]).
    pub(crate) async fn inbox_rows(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<InboxRow>> {
        each_store!(self, store => store.inbox().inbox_rows(filter, before, limit).await)
    }

    /// The durable inbox row at position `seq`, if there is one.
    pub(crate) async fn inbox_row(&self, seq: i64) -> Result<Option<InboxRow>> {
        each_store!(self, store => store.inbox().inbox_row(seq).await)
    }

    /// The idempotent receiver's dedup record of `id` in this store, if there is one.
    pub(crate) async fn inspect_key(&self, id: &str) -> Result<Option<DedupRecord>> {
        each_store!(self, store => store.dedup().inspect(id).await)
    }

    /// The store's name, for logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => StoreKind::Sqlite.name(),
            Self::Postgres(_) => StoreKind::Postgres.name(),
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => StoreKind::Mysql.name(),
        }
    }

    /// Whether the database answers a `SELECT 1` within `timeout`; the reason if not.
    pub(crate) async fn ping(&self, timeout: Duration) -> std::result::Result<(), String> {
        let ping = async {
            each_store!(self, store => {
                sqlx::query("SELECT 1").execute(store.pool()).await.map(drop)
            })
        };
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(format!("the store does not answer: {error}")),
            Err(_) => Err(format!("the store does not answer within {timeout:?}")),
        }
    }
}

/// A pool of `store.pool_size` connections made with `options`, waiting at most
/// `store.connect_timeout` for one, and opened with its first connection. No ping before
/// each checkout: a connection that died fails its statement, which the engines retry.
///
/// With `wait_for_server` (a database server, not a file), a server that is not up yet
/// ([`not_up_yet`]: a restart or a failover in progress) is tried again every 250 ms
/// until `store.connect_timeout` has passed since the first attempt; anything else fails
/// at once.
async fn pool<DB: sqlx::Database>(
    config: &Config,
    options: <DB::Connection as sqlx::Connection>::Options,
    wait_for_server: bool,
) -> std::result::Result<sqlx::Pool<DB>, oncebox::Error> {
    let timeout = config.store.connect_timeout.get();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = false;
    loop {
        // sqlx itself retries a refused connection for the acquire timeout: the first
        // attempt gets the whole timeout, the next ones what is left of it.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let opened = sqlx::pool::PoolOptions::<DB>::new()
            .max_connections(config.store.pool_size)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .connect_with(options.clone());
        let opened = match tokio::time::timeout(left.max(Duration::from_millis(100)), opened).await
        {
            Ok(opened) => opened,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        };
        match opened {
            Err(error)
                if wait_for_server
                    && not_up_yet(&error)
                    && tokio::time::Instant::now() < deadline =>
            {
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(%error, ?timeout, "the database is not up yet; trying again for up to store.connect_timeout");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            opened => return opened.map_err(oncebox::Error::from),
        }
    }
}

/// Whether connecting failed because the server is not up yet, which a moment may
/// change: the connection refused, reset or closed at once (a server restarting, an
/// address moving to a promoted standby), no connection in time, or the server saying
/// it is shutting down, starting up or out of connections. Not a name that does not
/// resolve, TLS, authentication or an unknown database.
fn not_up_yet(error: &sqlx::Error) -> bool {
    use std::io::ErrorKind;
    match error {
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::UnexpectedEof
                | ErrorKind::BrokenPipe
        ),
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("57P0") || code.starts_with("08") || code.starts_with("53")
        }),
        _ => false,
    }
}

fn debezium_layout(config: &Config) -> DebeziumLayout {
    DebeziumLayout::new(&config.outbox.table).topic_prefix(&config.outbox.topic_prefix)
}

/// The outbox of any store in the build.
#[derive(Clone)]
pub(crate) enum AnyOutbox {
    Sqlite(oncebox::sqlite::SqliteOutbox),
    Postgres(oncebox::postgres::PgOutbox),
    #[cfg(feature = "mysql")]
    Mysql(oncebox::mysql::MySqlOutbox),
}

impl SpoolStore for AnyOutbox {
    type Item = Message;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Message>>> {
        each_store!(self, outbox => outbox.claim(request).await)
    }

    async fn extend(&self, token: LeaseToken, rows: &[i64], lease: Duration) -> Result<()> {
        each_store!(self, outbox => outbox.extend(token, rows, lease).await)
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        each_store!(self, outbox => outbox.settle(token, settlements).await)
    }

    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Message>>> {
        each_store!(self, outbox => outbox.settle_and_claim(token, settlements, request).await)
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        each_store!(self, outbox => SpoolStore::purge(outbox, before, limit).await)
    }

    async fn wait_for_work(&self, timeout: Duration) {
        each_store!(self, outbox => outbox.wait_for_work(timeout).await);
    }

    async fn backlog(&self) -> Result<Option<Backlog>> {
        each_store!(self, outbox => outbox.backlog().await)
    }
}

impl OutboxAdmin for AnyOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        each_store!(self, outbox => OutboxAdmin::stats(outbox).await)
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        each_store!(self, outbox => outbox.row(id).await)
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        each_store!(self, outbox => OutboxAdmin::dead_letters(outbox, after, limit).await)
    }

    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        each_store!(self, outbox => OutboxAdmin::rows(outbox, filter, before, limit).await)
    }

    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        each_store!(self, outbox => OutboxAdmin::published_per_minute(outbox, since).await)
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        each_store!(self, outbox => OutboxAdmin::replay_dead(outbox, id).await)
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        each_store!(self, outbox => outbox.purge_dead(id).await)
    }
}
