//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use std::fmt;

use oncebox_core::Error;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// Primary SQLite result codes worth retrying (the low byte of an extended code).
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_IOERR: i64 = 10;
const SQLITE_FULL: i64 = 13;
const SQLITE_PROTOCOL: i64 = 15;

/// Classifies a sqlx error: busy/locked databases, I/O failures, pool timeouts and
/// crashed connection workers are transient; a closed pool is [`Error::Closed`];
/// everything else (constraints, schema, SQL) is permanent.
pub(crate) fn store_error(error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::PoolClosed => Error::Closed,
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => {
            Error::store_transient(error)
        }
        sqlx::Error::Database(db) if is_transient_code(db.code().as_deref()) => {
            Error::store_transient(error)
        }
        _ => Error::store_permanent(error),
    }
}

fn is_transient_code(code: Option<&str>) -> bool {
    let Some(code) = code.and_then(|c| c.parse::<i64>().ok()) else {
        return false;
    };
    matches!(
        code & 0xff,
        SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR | SQLITE_FULL | SQLITE_PROTOCOL
    )
}

/// Whether `error` reports a unique (or primary key) constraint violation.
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.is_unique_violation())
}

pub use oncebox_core::RowDecodeError;

/// Reads columns of one row, turning every failure into a [`RowDecodeError`] that names
/// the row.
pub(crate) struct RowReader<'r> {
    row: &'r SqliteRow,
    table: &'static str,
    name: String,
}

impl<'r> RowReader<'r> {
    pub(crate) fn new(row: &'r SqliteRow, table: &'static str, name: impl fmt::Display) -> Self {
        Self {
            row,
            table,
            name: name.to_string(),
        }
    }

    /// A decode error for `column` of this row.
    pub(crate) fn error(&self, column: &'static str, reason: impl fmt::Display) -> RowDecodeError {
        RowDecodeError::new(self.table, &self.name, column, reason)
    }

    /// The value of `column`.
    pub(crate) fn get<T>(&self, column: &'static str) -> Result<T, RowDecodeError>
    where
        T: for<'a> sqlx::Decode<'a, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
    {
        self.row
            .try_get::<T, _>(column)
            .map_err(|e| self.error(column, e))
    }

    /// A non-negative integer column as `u32`.
    pub(crate) fn count(&self, column: &'static str) -> Result<u32, RowDecodeError> {
        let value: i64 = self.get(column)?;
        u32::try_from(value)
            .map_err(|_| self.error(column, format!("{value} is not a valid count")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_locked_are_transient_by_primary_code() {
        assert!(is_transient_code(Some("5")));
        assert!(is_transient_code(Some("517"))); // SQLITE_BUSY_SNAPSHOT
        assert!(is_transient_code(Some("262"))); // SQLITE_LOCKED_SHAREDCACHE
        assert!(is_transient_code(Some("3850"))); // SQLITE_IOERR_LOCK
        assert!(!is_transient_code(Some("2067"))); // SQLITE_CONSTRAINT_UNIQUE
        assert!(!is_transient_code(Some("1")));
        assert!(!is_transient_code(None));
        assert!(!is_transient_code(Some("busy")));
    }

    #[test]
    fn pool_errors() {
        assert!(store_error(sqlx::Error::PoolTimedOut).is_transient());
        assert!(matches!(
            store_error(sqlx::Error::PoolClosed),
            Error::Closed
        ));
        assert!(!store_error(sqlx::Error::RowNotFound).is_transient());
    }

    #[test]
    fn decode_errors_name_the_row() {
        let error = RowDecodeError::new("oncebox_outbox", "seq 42", "headers", "not JSON");
        let text = Error::from(error).to_string();
        assert!(
            text.contains("seq 42") && text.contains("oncebox_outbox") && text.contains("headers")
        );
    }
}
