//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use std::fmt;

use oncebox_core::Error;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// Unique violation.
const UNIQUE_VIOLATION: &str = "23505";

/// A sqlx error as a oncebox error, classified by SQLSTATE (see the core's
/// `From<sqlx::Error>`).
pub(crate) fn store_error(error: sqlx::Error) -> Error {
    Error::from(error)
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
    fn decode_errors_name_the_row() {
        let error = RowDecodeError::new("\"oncebox\".\"outbox\"", "seq 42", "headers", "not JSON");
        let text = Error::from(error).to_string();
        assert!(text.contains("seq 42") && text.contains("outbox") && text.contains("headers"));
    }
}
