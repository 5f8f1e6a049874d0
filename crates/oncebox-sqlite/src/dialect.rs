//! SQLite's dialect of the stores written once in `oncebox-sql`: times as milliseconds
//! on the callers' clocks, names and ids as text, statuses as text, and transactions
//! that take the write lock at once.

use std::fmt;
use std::time::SystemTime;

use oncebox_core::spool::RowStatus;
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{MessageId, Result};
use oncebox_sql::{Dialect, Query, RowReader};
use sqlx::sqlite::SqliteQueryResult;
use sqlx::{QueryBuilder, Sqlite, SqlitePool, Transaction};

use crate::RowDecodeError;
use crate::error::store_error;

/// SQLite's statements and encodings for the stores of `oncebox-sql`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SqliteDialect;

/// Starts a transaction that takes SQLite's write lock at once.
///
/// Concurrent transactions on the same database then run one after the other instead of
/// failing on lock upgrade, and a duplicate delivery waits for the first one to commit,
/// then finds its record.
pub(crate) async fn begin_immediate(pool: &SqlitePool) -> Result<Transaction<'static, Sqlite>> {
    pool.begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(store_error)
}

impl Dialect for SqliteDialect {
    type Db = Sqlite;
    type Key = String;

    fn key(value: &str) -> String {
        value.to_owned()
    }

    fn time(stored: i64) -> SystemTime {
        from_unix_millis(stored)
    }

    fn push_time(query: &mut QueryBuilder<Sqlite>, time: SystemTime) {
        query.push_bind(to_unix_millis(time));
    }

    fn status_sql(status: RowStatus) -> impl fmt::Display {
        oncebox_sql::text_status_sql(status)
    }

    fn text(
        row: &RowReader<'_, Self>,
        column: &'static str,
    ) -> Result<Option<String>, RowDecodeError> {
        row.get(column)
    }

    fn message_id(row: &RowReader<'_, Self>) -> Result<Option<MessageId>, RowDecodeError> {
        let id: Option<String> = row.get("message_id")?;
        id.map(|id| MessageId::parse(&id))
            .transpose()
            .map_err(|e| row.error("message_id", e))
    }

    fn status(row: &RowReader<'_, Self>) -> Result<RowStatus, RowDecodeError> {
        oncebox_sql::text_status::<Self, _>(row)
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    /// `BEGIN IMMEDIATE`: handler transactions on one database run one at a time.
    async fn begin(pool: &SqlitePool) -> Result<Transaction<'static, Sqlite>> {
        begin_immediate(pool).await
    }

    async fn delete(pool: &SqlitePool, delete: Query<Sqlite>) -> Result<u64> {
        Ok(delete.execute(pool).await?.rows_affected())
    }
}
