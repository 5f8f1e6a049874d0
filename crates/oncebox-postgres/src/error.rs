//! The one place where sqlx errors become oncebox errors, and typed errors for rows that
//! cannot be read back.

use oncebox_core::Error;
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

/// Reads columns of one row, naming the row and column in every failure.
pub(crate) type RowReader<'r> = oncebox_core::sql::RowReader<'r, PgRow>;

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
