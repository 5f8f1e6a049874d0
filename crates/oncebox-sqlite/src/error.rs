//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use oncebox_core::Error;
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

/// Reads columns of one row, naming the row and column in every failure.
pub(crate) type RowReader<'r> = oncebox_core::sql::RowReader<'r, SqliteRow>;

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
