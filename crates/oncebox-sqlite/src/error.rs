//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use std::fmt;

use oncebox_core::Error;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// A sqlx error as a oncebox error, classified by result code (see the core's
/// `From<sqlx::Error>`).
pub(crate) fn store_error(error: sqlx::Error) -> Error {
    Error::from(error)
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
    fn decode_errors_name_the_row() {
        let error = RowDecodeError::new("oncebox_outbox", "seq 42", "headers", "not JSON");
        let text = Error::from(error).to_string();
        assert!(
            text.contains("seq 42") && text.contains("oncebox_outbox") && text.contains("headers")
        );
    }
}
