//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use std::fmt;

use oncebox_core::Error;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// SQLSTATE codes worth retrying, exactly.
const TRANSIENT_CODES: &[&str] = &[
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "55P03", // lock_not_available (lock_timeout)
    "57014", // query_canceled (statement_timeout)
    "25P03", // idle_in_transaction_session_timeout
    "57P01", // admin_shutdown
    "57P02", // crash_shutdown
    "57P03", // cannot_connect_now (starting up, recovering)
    "57P05", // idle_session_timeout
];

/// SQLSTATE classes worth retrying: connection exceptions (`08`) and insufficient
/// resources (`53`: too many connections, out of memory, disk full).
const TRANSIENT_CLASSES: &[&str] = &["08", "53"];

/// Unique violation.
const UNIQUE_VIOLATION: &str = "23505";

/// Classifies a sqlx error: serialization failures, deadlocks, lock and statement
/// timeouts, server shutdowns, connection errors, resource exhaustion, I/O errors and pool
/// timeouts are transient; a closed pool is [`Error::Closed`]; everything else
/// (constraints, schema, SQL) is permanent.
pub(crate) fn store_error(error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::PoolClosed => Error::Closed,
        sqlx::Error::PoolTimedOut
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::store_transient(error),
        sqlx::Error::Database(db) if is_transient_code(db.code().as_deref()) => {
            Error::store_transient(error)
        }
        _ => Error::store_permanent(error),
    }
}

fn is_transient_code(code: Option<&str>) -> bool {
    let Some(code) = code else {
        return false;
    };
    TRANSIENT_CODES.contains(&code)
        || TRANSIENT_CLASSES
            .iter()
            .any(|class| code.starts_with(class))
}

/// Whether `error` reports a unique violation.
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    has_code(error, UNIQUE_VIOLATION)
}

/// Whether `error` is the server's, with SQLSTATE `code`.
pub(crate) fn has_code(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|found| found == code)
}

pub use oncebox_core::RowDecodeError;

/// Reads columns of one row, turning every failure into a [`RowDecodeError`] that names
/// the row.
pub(crate) struct RowReader<'r> {
    row: &'r PgRow,
    table: &'r str,
    name: String,
}

impl<'r> RowReader<'r> {
    pub(crate) fn new(row: &'r PgRow, table: &'r str, name: impl fmt::Display) -> Self {
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
        T: for<'a> sqlx::Decode<'a, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        self.row
            .try_get::<T, _>(column)
            .map_err(|e| self.error(column, e))
    }

    /// A non-negative `integer` column as `u32`.
    pub(crate) fn count(&self, column: &'static str) -> Result<u32, RowDecodeError> {
        let value: i32 = self.get(column)?;
        u32::try_from(value)
            .map_err(|_| self.error(column, format!("{value} is not a valid count")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        for code in [
            "40001", "40P01", "55P03", "57014", "57P01", "08006", "08001", "53300", "53100",
        ] {
            assert!(is_transient_code(Some(code)), "{code}");
        }
        for code in ["23505", "42P01", "42601", "22P02", "3D000", "XX000"] {
            assert!(!is_transient_code(Some(code)), "{code}");
        }
        assert!(!is_transient_code(None));
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
        let error = RowDecodeError::new("\"oncebox\".\"outbox\"", "seq 42", "headers", "not JSON");
        let text = Error::from(error).to_string();
        assert!(text.contains("seq 42") && text.contains("outbox") && text.contains("headers"));
    }
}
