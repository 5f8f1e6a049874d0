//! What a database supplies to the stores written once: its encodings and idioms
//! ([`Dialect`]); the statements of each store are traits of their own beside their
//! store ([`InboxDialect`](crate::InboxDialect)).

use std::fmt;
use std::future::Future;
use std::time::SystemTime;

use oncebox_core::spool::{RowState, RowStatus};
use oncebox_core::sql::CountColumn;
use oncebox_core::{Error, MessageId, Result, RowDecodeError};
use sqlx::{Database, Decode, Encode, Pool, QueryBuilder, Transaction, Type};

/// A statement of a dialect with its values bound, ready to run.
pub type Query<DB> = sqlx::query::Query<'static, DB, <DB as Database>::Arguments>;

/// Reads the columns of a row of `D`'s database.
pub type RowReader<'r, D> = oncebox_core::sql::RowReader<'r, <<D as Dialect>::Db as Database>::Row>;

/// A value a caller passes that a column may be too small for, named in the error that
/// refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Field {
    /// A consumer name.
    Consumer,
    /// The id the transactional inbox records.
    MessageId,
    /// The id the dedup store keeps.
    DedupId,
}

impl Field {
    /// How errors name the value.
    pub fn name(self) -> &'static str {
        match self {
            Field::Consumer => "consumer",
            Field::MessageId => "message id",
            Field::DedupId => "dedup id",
        }
    }
}

/// How one database keeps oncebox's values and runs what is not one plain statement.
///
/// The stores of this crate are written once over a `Dialect`; each backend crate
/// implements it on one type that also supplies each store's statements. Methods
/// without `&self` are encodings, the same for every schema.
pub trait Dialect: Clone + fmt::Debug + Send + Sync + 'static {
    /// The database.
    type Db: Database;

    /// A consumer name, id or key as bound: text where the columns are text, bytes
    /// where they are binary (compared byte for byte).
    type Key: for<'q> Encode<'q, Self::Db> + Type<Self::Db> + Send + 'static;

    /// Whether the database reads a row-value comparison, `(a, b) < (x, y)`, as a range
    /// of an index on `(a, b)`: where it does not (MySQL), the comparison is spelled out
    /// as `a <= x AND (a < x OR b < y)`, whose first term bounds the range.
    const ROW_VALUE_RANGES: bool = true;

    /// `value` as a [`Key`](Self::Key).
    fn key(value: &str) -> Self::Key;

    /// Refuses `value` if its column cannot hold it whole, with a permanent store error
    /// that names `field`; a value is never cut short (a shortened id would collide with
    /// another). The default refuses nothing: the columns hold any text.
    ///
    /// # Errors
    ///
    /// A permanent store error for a value the column cannot hold.
    fn check(field: Field, value: &str) -> Result<()> {
        let _ = (field, value);
        Ok(())
    }

    /// A time column's value (microseconds or milliseconds since the Unix epoch) as a
    /// time.
    fn time(stored: i64) -> SystemTime;

    /// Pushes `time` on `query` as a value comparable with the time columns, bound.
    fn push_time(query: &mut QueryBuilder<Self::Db>, time: SystemTime);

    /// The stored value of `status`, as SQL; `NULL` for a status this schema does not
    /// store (no row has it).
    fn status_sql(status: RowStatus) -> impl fmt::Display;

    /// A text column: a consumer name, an id or a key, as the columns of
    /// [`Key`](Self::Key) keep it; `None` for `NULL`.
    ///
    /// # Errors
    ///
    /// The column is missing or not text (or bytes that are not UTF-8).
    fn text(
        row: &RowReader<'_, Self>,
        column: &'static str,
    ) -> Result<Option<String>, RowDecodeError>;

    /// The `message_id` column of a durable inbox row: text or 16 bytes; `None` for
    /// `NULL` (a message that came without an id).
    ///
    /// # Errors
    ///
    /// The column is missing or holds no UUID.
    fn message_id(row: &RowReader<'_, Self>) -> Result<Option<MessageId>, RowDecodeError>;

    /// The `status` column of a spool row (outbox or durable inbox): the inverse of
    /// [`status_sql`](Self::status_sql).
    ///
    /// # Errors
    ///
    /// The column is missing or holds a status oncebox does not write.
    fn status(row: &RowReader<'_, Self>) -> Result<RowStatus, RowDecodeError>;

    /// A time column that may hold "never" (a lease, a settlement): `None` where it
    /// does (the default: `NULL`).
    fn optional_time(stored: Option<i64>) -> Option<SystemTime> {
        stored.map(Self::time)
    }

    /// How many rows a statement changed (or, where the connection reports rows
    /// matched, matched).
    fn rows_affected(result: &<Self::Db as Database>::QueryResult) -> u64;

    /// Starts a transaction for a handler (the default: the pool's plain `BEGIN`).
    ///
    /// # Errors
    ///
    /// A store error if no connection could be had.
    fn begin(
        pool: &Pool<Self::Db>,
    ) -> impl Future<Output = Result<Transaction<'static, Self::Db>>> + Send {
        async move { pool.begin().await.map_err(Error::from) }
    }

    /// Runs `delete`, a bounded retention `DELETE`, in the database's way of deleting
    /// old rows without blocking writers; returns how many rows it deleted.
    ///
    /// # Errors
    ///
    /// A store error; nothing was deleted then.
    fn delete(
        pool: &Pool<Self::Db>,
        delete: Query<Self::Db>,
    ) -> impl Future<Output = Result<u64>> + Send;
}

/// Whether an insert `result` inserted a row: one that changed no row (`ON CONFLICT DO
/// NOTHING`) or failed on a unique key (a plain `INSERT`) inserted none.
pub(crate) fn inserted<D: Dialect>(
    result: std::result::Result<<D::Db as Database>::QueryResult, sqlx::Error>,
) -> Result<bool> {
    match result {
        Ok(done) => Ok(D::rows_affected(&done) > 0),
        Err(e) if is_unique_violation(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `error` is the database's refusal of a duplicate key.
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.is_unique_violation())
}

/// A [`Dialect::text`] column that holds no `NULL`.
pub(crate) fn required_text<D: Dialect>(
    row: &RowReader<'_, D>,
    column: &'static str,
) -> Result<String, RowDecodeError>
where
    &'static str: sqlx::ColumnIndex<<D::Db as Database>::Row>,
{
    D::text(row, column)?.ok_or_else(|| row.error(column, "NULL in a NOT NULL column"))
}

/// The state of a spool row (outbox or durable inbox): its `seq`, `status`, `attempts`,
/// `last_error`, `available_at`, `lease_until`, `done_at` and `dead_at` columns.
pub(crate) fn row_state<D, DB>(row: &RowReader<'_, D>) -> Result<RowState, RowDecodeError>
where
    D: Dialect<Db = DB>,
    DB: Database + CountColumn,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
{
    let optional = |column| -> Result<Option<SystemTime>, RowDecodeError> {
        Ok(D::optional_time(row.get(column)?))
    };
    Ok(RowState {
        seq: row.get("seq")?,
        status: D::status(row)?,
        attempts: row.count("attempts")?,
        last_error: row.get("last_error")?,
        available_at: D::time(row.get("available_at")?),
        leased_until: optional("lease_until")?,
        settled_at: optional("done_at")?.or(optional("dead_at")?),
    })
}

/// [`Dialect::status_sql`] for a schema that keeps statuses as text (`'pending'`,
/// `'done'`, `'dead'`: PostgreSQL's and SQLite's).
pub fn text_status_sql(status: RowStatus) -> &'static str {
    match status {
        RowStatus::Pending => "'pending'",
        RowStatus::Done => "'done'",
        RowStatus::Dead => "'dead'",
        // A status this version does not store: no row has it.
        _ => "NULL",
    }
}

/// [`Dialect::status`] for a schema that keeps statuses as text.
///
/// # Errors
///
/// The column is missing, not text, or holds a status oncebox does not write.
pub fn text_status<D, DB>(row: &RowReader<'_, D>) -> Result<RowStatus, RowDecodeError>
where
    D: Dialect<Db = DB>,
    DB: Database,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
{
    match row.get::<String>("status")?.as_str() {
        "pending" => Ok(RowStatus::Pending),
        "done" => Ok(RowStatus::Done),
        "dead" => Ok(RowStatus::Dead),
        other => Err(row.error("status", format!("unknown status {other:?}"))),
    }
}
