//! The idempotent receiver's dedup store, once for every SQL database.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use oncebox_core::sql::fenced;
use oncebox_core::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use oncebox_core::{Bytes, Error, Result, RowDecodeError};
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Type};

use crate::dialect::{Dialect, Field, Query, RowReader};

/// Attempts of `begin` when the record it found held disappears before it can be read
/// (abandoned, expired, purged): each attempt is one [`DedupDialect::take`] and one read.
const BEGIN_ATTEMPTS: usize = 3;

/// The statements of the dedup store (table `dedup`: id, state, token, lease end,
/// result, expiry) on one database, and its way of taking an id.
///
/// An expired record (its expiry passed) counts as absent everywhere: the statements
/// that read or fence skip it.
pub trait DedupDialect: Dialect {
    /// Takes `id` for `lease` if it is absent or its record expired: a new record in
    /// progress with the next token, a lease and an expiry both `lease` from now;
    /// returns that token, or `None` if a live record holds the id. Of concurrent calls
    /// for one id, at most one takes it. Tokens only grow, even for an id whose record
    /// was purged.
    ///
    /// # Errors
    ///
    /// A store error.
    fn take(
        &self,
        pool: &Pool<Self::Db>,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Option<FencingToken>>> + Send;

    /// Reads `id`'s record unless it expired: `state` (`in_progress` or `completed`),
    /// `result` (bytes or `NULL`) and `lease_left_ms`, the milliseconds left on the
    /// lease (at least 0; `NULL` once completed).
    fn held(&self, id: &str) -> Query<Self::Db>;

    /// Reads `id`'s record unless it expired: `state`, `token`, `result`, and
    /// `lease_until` (`NULL` once completed) and `expires_at`, as
    /// [`instant`](Self::instant) reads them.
    fn inspect(&self, id: &str) -> Query<Self::Db>;

    /// A time column of [`inspect`](Self::inspect) as a time on the caller's clock;
    /// `now` is the caller's now when the statement returned.
    fn instant(now: SystemTime, stored: i64) -> SystemTime;

    /// The `token` column of [`inspect`](Self::inspect).
    ///
    /// # Errors
    ///
    /// The column is missing or holds a value no token has.
    fn token(row: &RowReader<'_, Self>) -> Result<u64, RowDecodeError>;

    /// Completes `id` held by `token` with `result`, expiring `ttl` from now; changes no
    /// row unless `token` holds `id` in progress with its lease not ended.
    fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Query<Self::Db>;

    /// Moves the end of the lease (and the expiry) of `id` held by `token` to `lease`
    /// from now; fenced as [`complete`](Self::complete).
    fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Query<Self::Db>;

    /// Deletes `id` held by `token`; fenced as [`complete`](Self::complete).
    fn abandon(&self, id: &str, token: FencingToken) -> Query<Self::Db>;

    /// Deletes at most `limit` expired records, the oldest expiry first; run by
    /// [`Dialect::delete`].
    fn purge(&self, limit: usize) -> Query<Self::Db>;

    /// The dedup table's name in errors.
    fn dedup_table(&self) -> &str;
}

/// The dedup store of the idempotent receiver: `absent → in progress (token, lease) →
/// completed (result, TTL) → expired`.
///
/// [`begin`](DedupStore::begin) takes the id as the dialect does; when a live record
/// holds it, it reads the record (and tries again if it disappeared in between). Expired
/// records answer as absent; [`purge_expired`](DedupStore::purge_expired) deletes them
/// in bounded batches.
///
/// Each backend crate names it for its dialect (`PgDedupStore`, `MySqlDedupStore`,
/// `SqliteDedupStore`) and documents there how its statements behave.
pub struct SqlDedupStore<D: Dialect> {
    pool: Pool<D::Db>,
    dialect: D,
}

impl<D: Dialect> SqlDedupStore<D> {
    /// The dedup store of the database behind `pool`, with the statements of `dialect`.
    pub fn new(pool: Pool<D::Db>, dialect: D) -> Self {
        Self { pool, dialect }
    }
}

// Not derived: a derive would ask for `D::Db: Clone`, which no sqlx database is.
impl<D: Dialect> Clone for SqlDedupStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            dialect: self.dialect.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlDedupStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlDedupStore")
            .field("pool", &self.pool)
            .field("dialect", &self.dialect)
            .finish()
    }
}

impl<D, DB> DedupStore for SqlDedupStore<D>
where
    D: DedupDialect<Db = DB>,
    DB: Database<Arguments: IntoArguments<DB>>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        D::check(Field::DedupId, id)?;
        for _ in 0..BEGIN_ATTEMPTS {
            if let Some(token) = self.dialect.take(&self.pool, id, lease).await? {
                return Ok(Begin::Started(token));
            }
            // Held and not expired when the take looked; a new statement sees the record.
            let Some(row) = self.dialect.held(id).fetch_optional(&self.pool).await? else {
                // It expired or was abandoned in between: try to take it again.
                continue;
            };
            let reader =
                RowReader::<D>::new(&row, self.dialect.dedup_table(), format_args!("id {id}"));
            return match self.state(&reader, |row| row.get("lease_left_ms"))? {
                Held::InProgress(left) => Ok(Begin::InProgress {
                    retry_after: Duration::from_millis(
                        u64::try_from(left.unwrap_or(0)).unwrap_or(0),
                    ),
                }),
                Held::Completed(result) => Ok(Begin::Completed(result)),
            };
        }
        Err(Error::store_transient(format!(
            "dedup id {id:?} changed hands {BEGIN_ATTEMPTS} times during begin"
        )))
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        let query = self.dialect.complete(id, token, result, ttl);
        fenced(D::rows_affected(&query.execute(&self.pool).await?))
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        let query = self.dialect.extend(id, token, lease);
        fenced(D::rows_affected(&query.execute(&self.pool).await?))
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let query = self.dialect.abandon(id, token);
        fenced(D::rows_affected(&query.execute(&self.pool).await?))
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let Some(row) = self.dialect.inspect(id).fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        let now = SystemTime::now();
        let reader = RowReader::<D>::new(&row, self.dialect.dedup_table(), format_args!("id {id}"));
        let token = D::token(&reader)?;
        let expires_at: i64 = reader.get("expires_at")?;
        let state = match self.state(&reader, |row| row.get("lease_until"))? {
            // An in-progress record expires with its lease.
            Held::InProgress(until) => DedupState::InProgress {
                lease_until: D::instant(now, until.unwrap_or(expires_at)),
            },
            Held::Completed(result) => DedupState::Completed { result },
        };
        Ok(Some(DedupRecord::new(
            state,
            FencingToken(token),
            Some(D::instant(now, expires_at)),
        )))
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        D::delete(&self.pool, self.dialect.purge(limit)).await
    }
}

/// A live record's state, as [`DedupDialect::held`] and [`DedupDialect::inspect`]
/// read it.
enum Held {
    /// In progress: the lease column's value.
    InProgress(Option<i64>),
    /// Completed, with its result.
    Completed(Bytes),
}

impl<D: Dialect> SqlDedupStore<D>
where
    for<'r> String: Decode<'r, D::Db> + Type<D::Db>,
    for<'r> Vec<u8>: Decode<'r, D::Db> + Type<D::Db>,
    &'static str: ColumnIndex<<D::Db as Database>::Row>,
{
    /// The `state` of a record, with the lease column `lease` reads when in progress and
    /// the `result` when completed.
    fn state(
        &self,
        row: &RowReader<'_, D>,
        lease: impl FnOnce(&RowReader<'_, D>) -> Result<Option<i64>, RowDecodeError>,
    ) -> Result<Held, RowDecodeError> {
        let state: String = row.get("state")?;
        match state.as_str() {
            "in_progress" => Ok(Held::InProgress(lease(row)?)),
            "completed" => {
                let result: Option<Vec<u8>> = row.get("result")?;
                Ok(Held::Completed(result.map(Bytes::from).unwrap_or_default()))
            }
            other => Err(row.error("state", format_args!("unknown state {other:?}"))),
        }
    }
}
