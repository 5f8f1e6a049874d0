//! The one place where sqlx errors become oncebox errors, typed errors for values that do
//! not fit a column, and for rows that cannot be read back.

use std::fmt;

use oncebox_core::Error;
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};

/// Duplicate entry for a unique key (`ER_DUP_ENTRY`, `ER_DUP_ENTRY_WITH_KEY_NAME`).
const DUPLICATE_KEY: &[u16] = &[1062, 1586];

/// A sqlx error as a oncebox error, classified by error number and SQLSTATE (see the
/// core's `From<sqlx::Error>`).
pub(crate) fn store_error(error: sqlx::Error) -> Error {
    Error::from(error)
}

/// Whether `error` reports a duplicate entry for a unique key. In MySQL this fails the
/// statement only: the transaction stays usable.
pub(crate) fn is_duplicate_key(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .is_some_and(|db| DUPLICATE_KEY.contains(&db.number()))
}

/// A value longer than the column that would hold it: refused before any statement
/// runs, never truncated (a truncated dedup id would collide with another).
///
/// The source of a permanent [`Error::Store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueTooLong {
    what: &'static str,
    len: usize,
    limit: usize,
}

impl ValueTooLong {
    /// What the value is (`"key"`, `"dedup id"`...).
    pub fn what(&self) -> &str {
        self.what
    }

    /// Its length, in the column's unit (bytes, or characters for text columns).
    pub fn length(&self) -> usize {
        self.len
    }

    /// The column's capacity, in the same unit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl fmt::Display for ValueTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} is {} long, over the column's limit of {}",
            self.what, self.len, self.limit
        )
    }
}

impl std::error::Error for ValueTooLong {}

/// Refuses a value of more than `limit` bytes (for `VARBINARY` columns).
pub(crate) fn check_bytes(what: &'static str, value: &str, limit: usize) -> Result<(), Error> {
    if value.len() > limit {
        return Err(Error::store_permanent(ValueTooLong {
            what,
            len: value.len(),
            limit,
        }));
    }
    Ok(())
}

/// Refuses a text of more than `limit` characters (for `VARCHAR` columns).
pub(crate) fn check_chars(what: &'static str, value: &str, limit: usize) -> Result<(), Error> {
    // Cheap first: a text of at most `limit` bytes has at most `limit` characters.
    if value.len() > limit {
        let chars = value.chars().count();
        if chars > limit {
            return Err(Error::store_permanent(ValueTooLong {
                what,
                len: chars,
                limit,
            }));
        }
    }
    Ok(())
}

pub use oncebox_core::RowDecodeError;

/// Reads columns of one row, naming the row and column in every failure.
pub(crate) type RowReader<'r> = oncebox_core::sql::RowReader<'r, MySqlRow>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_refused_not_cut() {
        assert!(check_bytes("key", &"k".repeat(512), 512).is_ok());
        let error = check_bytes("key", &"k".repeat(513), 512).unwrap_err();
        assert!(!error.is_transient());
        assert!(error.to_string().contains("513"), "{error}");
        // 255 characters of 2 bytes each fit a VARCHAR(255); 256 do not.
        assert!(check_chars("topic", &"é".repeat(255), 255).is_ok());
        assert!(check_chars("topic", &"é".repeat(256), 255).is_err());
    }
}
