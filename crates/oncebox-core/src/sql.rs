//! What the SQL stores share: the classification of `sqlx` errors (so that `?` on a
//! `sqlx::Error` in a handler does the right thing), a reader that names the row and
//! column a value could not be read from, and the conditions of statements built from
//! the criteria a caller set.
//!
//! Compiled with the feature `sqlx` (each SQL store crate turns it on, and the feature of
//! its database: `sqlite`, `postgres`, `mysql`).

use std::fmt;

use sqlx::error::DatabaseError;

use crate::{Error, Fault, RowDecodeError};

/// Classifies a `sqlx` error by what retrying it would do:
///
/// | error | becomes |
/// |---|---|
/// | a closed pool | [`Error::Closed`] |
/// | no connection to be had (I/O, TLS, pool timeout, a crashed SQLite worker); the server shutting down, out of connections, memory or disk | a store [outage](Fault::Outage) |
/// | a deadlock, a serialization failure, a lock wait, an object in use, statement or idle timeout, a busy or locked SQLite database, a protocol error | a [transient](Fault::Transient) store error |
/// | anything else: constraint and data errors, unknown tables, syntax, decoding | a [permanent](Fault::Permanent) store error |
///
/// Database errors are told apart by SQLSTATE (PostgreSQL, MySQL), error number (MySQL)
/// and result code (SQLite).
impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        let fault = match &error {
            sqlx::Error::PoolClosed => return Error::Closed,
            sqlx::Error::PoolTimedOut
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => Fault::Outage,
            sqlx::Error::Protocol(_) => Fault::Transient,
            sqlx::Error::Database(db) => database_fault(db.as_ref()),
            _ => Fault::Permanent,
        };
        Error::store(error, fault)
    }
}

fn database_fault(db: &dyn DatabaseError) -> Fault {
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql_fault(mysql.number(), mysql.code());
    }
    #[cfg(feature = "sqlite")]
    if let Some(sqlite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
        return sqlite_fault(sqlite.code().as_deref());
    }
    sqlstate_fault(db.code().as_deref())
}

/// What retrying a server error with SQLSTATE `code` would do, for PostgreSQL and any
/// server speaking SQLSTATE: the classification of the table above, for errors that do
/// not come through `sqlx` (PostgreSQL's replication protocol, say). No code is
/// permanent.
pub fn sqlstate_fault(code: Option<&str>) -> Fault {
    let Some(code) = code else {
        return Fault::Permanent;
    };
    match code {
        // admin, crash shutdown; cannot connect now (starting up, recovering)
        "57P01" | "57P02" | "57P03" => Fault::Outage,
        // lock not available, an object in use (a replication slot still held by a
        // reader that just died), query canceled (statement timeout), idle timeouts
        "55P03" | "55006" | "57014" | "25P03" | "57P05" => Fault::Transient,
        _ => match &code[..code.len().min(2)] {
            // connection exceptions; insufficient resources (too many connections, out
            // of memory, disk full); system errors (I/O)
            "08" | "53" | "58" => Fault::Outage,
            // transaction rollback: serialization failure, deadlock
            "40" => Fault::Transient,
            _ => Fault::Permanent,
        },
    }
}

/// MySQL and MariaDB, by error number first: many errors share the SQLSTATE `HY000`.
#[cfg(any(feature = "mysql", test))]
fn mysql_fault(number: u16, sqlstate: Option<&str>) -> Fault {
    match number {
        1040 | 1203 // too many (user) connections
        | 1053 | 1077 | 1079 // server shutting down
        | 1927 // connection killed (MariaDB)
        | 1021 | 1041 // disk full, out of resources
        => Fault::Outage,
        1205 // lock wait timeout
        | 1213 // deadlock: the transaction was rolled back
        | 1317 // query interrupted
        | 1969 | 3024 // statement timeout (MariaDB, MySQL)
        | 1637 // too many concurrent transactions
        => Fault::Transient,
        _ => sqlstate_fault(sqlstate),
    }
}

/// SQLite, by the primary result code (the low byte of an extended code).
#[cfg(any(feature = "sqlite", test))]
fn sqlite_fault(code: Option<&str>) -> Fault {
    const BUSY: i64 = 5;
    const LOCKED: i64 = 6;
    const NOMEM: i64 = 7;
    const IOERR: i64 = 10;
    const FULL: i64 = 13;
    const CANTOPEN: i64 = 14;
    const PROTOCOL: i64 = 15;
    match code.and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff) {
        Some(BUSY | LOCKED | PROTOCOL) => Fault::Transient,
        Some(NOMEM | IOERR | FULL | CANTOPEN) => Fault::Outage,
        _ => Fault::Permanent,
    }
}

/// The result of a statement fenced by a token (a lease's, a claim's): `Ok` if it
/// changed a row, [`Error::LeaseLost`] if the token holds nothing any more.
///
/// # Errors
///
/// [`Error::LeaseLost`] when `rows_affected` is 0.
pub fn fenced(rows_affected: u64) -> Result<(), Error> {
    if rows_affected == 0 {
        return Err(Error::LeaseLost);
    }
    Ok(())
}

/// A row count for `LIMIT`, saturating.
pub fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Longest error text a spool row keeps in `last_error`, in characters.
pub const MAX_ERROR_CHARS: usize = 2000;

/// Error text as a spool row keeps it in `last_error`: cut to [`MAX_ERROR_CHARS`] on a
/// character boundary (an ellipsis marks the cut), without NUL bytes, which PostgreSQL's
/// `text` cannot hold.
pub fn last_error(error: &str) -> String {
    let clean: String = error.chars().filter(|c| *c != '\0').collect();
    match clean.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &clean[..cut]),
        None => clean,
    }
}

/// Where a page of an outbox listing ([`OutboxAdmin::rows`](crate::spool::OutboxAdmin::rows))
/// starts, in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListingStart {
    /// At the newest row.
    Newest,
    /// After the row at `seq`, in descending commit order.
    Before {
        /// The position of the last row of the page before.
        seq: i64,
    },
    /// After the row at `seq`, in descending creation time, then position.
    BeforeCreated {
        /// The row's creation time, in the unit the store keeps it in.
        created: i64,
        /// The position of the last row of the page before.
        seq: i64,
    },
}

impl ListingStart {
    /// Whether a listing with `filter` is in creation order: with a creation-time
    /// criterion, rows are read newest first from an index by creation time, which
    /// finds a window at any depth at once; in commit order, every newer row would be
    /// read and filtered out first.
    pub fn by_creation(filter: &crate::spool::RowFilter) -> bool {
        filter.created_from.is_some() || filter.created_until.is_some()
    }
}

/// The conditions of a statement built from the criteria a caller set (an admin
/// listing's filter): ` WHERE ` before the first, ` AND ` before the others. Only the
/// SQL of a condition is pushed as text; its values go in as bound parameters
/// ([`QueryBuilder::push_bind`](sqlx::QueryBuilder::push_bind)).
pub struct Conditions<'q, DB: sqlx::Database> {
    query: &'q mut sqlx::QueryBuilder<DB>,
    any: bool,
}

impl<'q, DB: sqlx::Database> Conditions<'q, DB> {
    /// Conditions appended to `query`, which holds the statement up to its `WHERE`.
    pub fn new(query: &'q mut sqlx::QueryBuilder<DB>) -> Self {
        Self { query, any: false }
    }

    /// Starts a condition with `sql`; the rest of it (an operator, a bound value) is
    /// pushed on the builder returned.
    pub fn and(&mut self, sql: impl fmt::Display) -> &mut sqlx::QueryBuilder<DB> {
        let joint = if std::mem::replace(&mut self.any, true) {
            " AND "
        } else {
            " WHERE "
        };
        self.query.push(joint).push(sql)
    }
}

/// Reads columns of one row, turning every failure into a [`RowDecodeError`] that names
/// the table, the row and the column.
pub struct RowReader<'r, R> {
    row: &'r R,
    table: &'r str,
    name: String,
}

impl<'r, R: sqlx::Row> RowReader<'r, R>
where
    &'static str: sqlx::ColumnIndex<R>,
{
    /// A reader of `row` of `table`, called `name` in errors (`seq 42`, `id X`).
    pub fn new(row: &'r R, table: &'r str, name: impl fmt::Display) -> Self {
        Self {
            row,
            table,
            name: name.to_string(),
        }
    }

    /// A decode error for `column` of this row.
    pub fn error(&self, column: &'static str, reason: impl fmt::Display) -> RowDecodeError {
        RowDecodeError::new(self.table, &self.name, column, reason)
    }

    /// The value of `column`.
    ///
    /// # Errors
    ///
    /// The column is missing or does not decode as `T`.
    pub fn get<T>(&self, column: &'static str) -> Result<T, RowDecodeError>
    where
        T: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    {
        self.row
            .try_get::<T, _>(column)
            .map_err(|e| self.error(column, e))
    }

    /// A non-negative integer column (attempts, delivery counts) as `u32`.
    ///
    /// # Errors
    ///
    /// The column is not an integer, or holds a negative or too large value.
    pub fn count(&self, column: &'static str) -> Result<u32, RowDecodeError>
    where
        R::Database: CountColumn,
    {
        let value: <R::Database as CountColumn>::Int = self.get(column)?;
        value
            .try_into()
            .map_err(|_| self.error(column, format!("{value} is not a valid count")))
    }

    /// A binary column holding UTF-8 text (keys and ids kept as bytes).
    ///
    /// # Errors
    ///
    /// The column is not binary, or its bytes are not UTF-8.
    pub fn text(&self, column: &'static str) -> Result<Option<String>, RowDecodeError>
    where
        Vec<u8>: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    {
        let bytes: Option<Vec<u8>> = self.get(column)?;
        bytes
            .map(|bytes| {
                String::from_utf8(bytes).map_err(|e| self.error(column, format!("not UTF-8: {e}")))
            })
            .transpose()
    }

    /// A 16-byte binary column holding a UUID.
    ///
    /// # Errors
    ///
    /// The column is not binary, or does not hold 16 bytes.
    pub fn uuid(&self, column: &'static str) -> Result<Option<uuid::Uuid>, RowDecodeError>
    where
        Vec<u8>: for<'a> sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    {
        let bytes: Option<Vec<u8>> = self.get(column)?;
        bytes
            .map(|bytes| {
                uuid::Uuid::from_slice(&bytes)
                    .map_err(|_| self.error(column, format!("{} bytes is not a UUID", bytes.len())))
            })
            .transpose()
    }
}

/// The integer type of the count columns (`attempts`, `delivery_count`) in oncebox's
/// schema on each database.
pub trait CountColumn: sqlx::Database {
    /// The Rust type the column decodes as.
    type Int: for<'a> sqlx::Decode<'a, Self> + sqlx::Type<Self> + TryInto<u32> + Copy + fmt::Display;
}

#[cfg(feature = "sqlite")]
impl CountColumn for sqlx::Sqlite {
    type Int = i64;
}

#[cfg(feature = "postgres")]
impl CountColumn for sqlx::Postgres {
    type Int = i32;
}

#[cfg(feature = "mysql")]
impl CountColumn for sqlx::MySql {
    type Int = i32;
}

#[cfg(test)]
mod tests {
    use super::{MAX_ERROR_CHARS, last_error};

    #[test]
    fn error_text_is_capped_on_char_boundaries_without_nul() {
        assert_eq!(last_error("short"), "short");
        assert_eq!(last_error("nul\0byte"), "nulbyte");
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        let kept = last_error(&long);
        assert_eq!(kept.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(kept.ends_with('…'));
    }

    use super::*;

    #[test]
    fn sqlstates() {
        for code in ["40001", "40P01", "55P03", "55006", "57014", "25P03"] {
            assert_eq!(sqlstate_fault(Some(code)), Fault::Transient, "{code}");
        }
        for code in [
            "08006", "08001", "57P01", "57P03", "53300", "53100", "58030",
        ] {
            assert_eq!(sqlstate_fault(Some(code)), Fault::Outage, "{code}");
        }
        for code in [
            "23505", "23502", "22P02", "22021", "42P01", "42601", "XX000",
        ] {
            assert_eq!(sqlstate_fault(Some(code)), Fault::Permanent, "{code}");
        }
        assert_eq!(sqlstate_fault(None), Fault::Permanent);
        assert_eq!(sqlstate_fault(Some("4")), Fault::Permanent);
    }

    #[test]
    fn mysql_numbers_before_sqlstates() {
        assert_eq!(mysql_fault(1205, Some("HY000")), Fault::Transient);
        assert_eq!(mysql_fault(1213, Some("40001")), Fault::Transient);
        assert_eq!(mysql_fault(1927, Some("70100")), Fault::Outage);
        assert_eq!(mysql_fault(1040, Some("08004")), Fault::Outage);
        assert_eq!(mysql_fault(9999, Some("08S01")), Fault::Outage);
        for (number, state) in [(1062, "23000"), (1406, "22001"), (1146, "42S02")] {
            assert_eq!(mysql_fault(number, Some(state)), Fault::Permanent);
        }
    }

    #[test]
    fn sqlite_codes() {
        assert_eq!(sqlite_fault(Some("5")), Fault::Transient);
        assert_eq!(sqlite_fault(Some("517")), Fault::Transient); // BUSY_SNAPSHOT
        assert_eq!(sqlite_fault(Some("3850")), Fault::Outage); // IOERR_LOCK
        assert_eq!(sqlite_fault(Some("13")), Fault::Outage);
        assert_eq!(sqlite_fault(Some("2067")), Fault::Permanent); // CONSTRAINT_UNIQUE
        assert_eq!(sqlite_fault(Some("1299")), Fault::Permanent); // CONSTRAINT_NOTNULL
        assert_eq!(sqlite_fault(None), Fault::Permanent);
    }

    #[test]
    fn errors_without_a_server() {
        assert!(matches!(
            Error::from(sqlx::Error::PoolClosed),
            Error::Closed
        ));
        assert!(Error::from(sqlx::Error::PoolTimedOut).is_outage());
        let not_found = Error::from(sqlx::Error::RowNotFound);
        assert_eq!(not_found.fault(), Fault::Permanent);
        assert!(matches!(not_found, Error::Store { .. }));
    }
}
