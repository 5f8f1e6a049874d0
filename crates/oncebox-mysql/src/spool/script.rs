//! Several statements in one round trip.
//!
//! A relay's batch runs a dozen short statements, most of which need nothing from the
//! one before: the settlement's updates, the claim's lock, the read of the live claims.
//! Sent one by one, each costs a round trip to the server, about 0.1 ms on a loaded
//! host, more than most of them take to run. A [`Script`] sends them together, as one
//! text-protocol request, and hands back each statement's rows.
//!
//! The text protocol takes no parameters, so values are written into the text as
//! literals: lists of integers in decimal, every other value as bytes in hexadecimal
//! (`X'…'`), neither of which can end the literal it is in. Nothing else is ever
//! written into a script.

use std::fmt::Write as _;

use futures_util::TryStreamExt as _;
use oncebox_core::Result;
use sqlx::Either;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use crate::error::store_error;
use crate::sql::LIST;

/// Statements to run together, in order, in the connection's transaction.
#[derive(Debug, Default)]
pub(super) struct Script {
    sql: String,
}

impl Script {
    /// Appends `statement` with its `{list}` (if any) filled with `list`, and its `?`
    /// places, in order, with `values`, written as hexadecimal literals.
    ///
    /// # Panics
    ///
    /// If the statement's places and `values` differ in number: the statements are the
    /// crate's own, so that is a bug here, never bad input.
    pub(super) fn push(&mut self, statement: &str, list: &[i64], values: &[&[u8]]) {
        if !self.sql.is_empty() {
            self.sql.push_str(";\n");
        }
        let statement = if list.is_empty() {
            statement.to_owned()
        } else {
            let list: Vec<String> = list.iter().map(i64::to_string).collect();
            statement.replace(LIST, &list.join(", "))
        };
        let mut values = values.iter();
        for (n, part) in statement.split('?').enumerate() {
            if n > 0 {
                let value = values.next().expect("a value for every `?`");
                write_hex(&mut self.sql, value);
            }
            self.sql.push_str(part);
        }
        assert!(values.next().is_none(), "a `?` for every value");
    }

    /// Runs the statements, stopping at the first that fails; returns the rows of each,
    /// in order (none for statements that return none).
    pub(super) async fn run(self, conn: &mut MySqlConnection) -> Result<Vec<Vec<MySqlRow>>> {
        let mut results = Vec::new();
        if self.sql.is_empty() {
            return Ok(results);
        }
        let mut rows = Vec::new();
        let mut stream = sqlx::raw_sql(sqlx::AssertSqlSafe(self.sql)).fetch_many(conn);
        while let Some(step) = stream.try_next().await.map_err(store_error)? {
            match step {
                Either::Right(row) => rows.push(row),
                // Every statement's result ends with one of these.
                Either::Left(_) => results.push(std::mem::take(&mut rows)),
            }
        }
        Ok(results)
    }
}

/// `bytes` as a hexadecimal literal, `X'…'`.
fn write_hex(sql: &mut String, bytes: &[u8]) {
    sql.push_str("X'");
    for byte in bytes {
        let _ = write!(sql, "{byte:02X}");
    }
    sql.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_literals_in_order() {
        let mut script = Script::default();
        script.push("SELECT ? FROM t WHERE a = ?", &[], &[b"-7", b"a'\x00"]);
        script.push(
            "DELETE FROM t WHERE seq IN ({list}) AND k = ?",
            &[3, -4],
            &[b""],
        );
        assert_eq!(
            script.sql,
            "SELECT X'2D37' FROM t WHERE a = X'612700';\n\
             DELETE FROM t WHERE seq IN (3, -4) AND k = X''"
        );
    }

    #[test]
    #[should_panic(expected = "a `?` for every value")]
    fn values_without_places_are_a_bug() {
        Script::default().push("SELECT 1", &[], &[b"1"]);
    }

    /// The server of the integration tests (`ONCEBOX_MYSQL_URL`); the scripts below
    /// touch no table.
    async fn connect() -> MySqlConnection {
        use sqlx::Connection as _;
        let url = std::env::var("ONCEBOX_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        MySqlConnection::connect(&url)
            .await
            .expect("the test server")
    }

    #[tokio::test]
    async fn each_statement_returns_its_own_rows() {
        use sqlx::Row as _;
        let mut conn = connect().await;
        let mut script = Script::default();
        script.push(
            "SELECT seq FROM (SELECT 5 AS seq UNION ALL SELECT 6 UNION ALL SELECT 7) AS t
             WHERE seq IN ({list}) ORDER BY seq",
            &[7, 5],
            &[],
        );
        script.push("DO ?", &[], &[b"x"]);
        script.push("SELECT ? AS b UNION ALL SELECT ?", &[], &[b"it's", b""]);
        let results = script.run(&mut conn).await.expect("the script runs");
        let seqs: Vec<i64> = results[0].iter().map(|row| row.get("seq")).collect();
        let bytes: Vec<Vec<u8>> = results[2].iter().map(|row| row.get("b")).collect();
        assert_eq!(results.len(), 3);
        assert_eq!(seqs, [5, 7]);
        assert!(results[1].is_empty(), "a statement without rows");
        assert_eq!(bytes, [b"it's".to_vec(), Vec::new()]);
    }

    #[tokio::test]
    async fn a_failing_statement_fails_the_script() {
        let mut conn = connect().await;
        let mut script = Script::default();
        script.push("DO 1", &[], &[]);
        script.push("SELECT * FROM oncebox_no_such_table", &[], &[]);
        script.push("DO 2", &[], &[]);
        let error = script
            .run(&mut conn)
            .await
            .expect_err("the second statement fails");
        assert!(
            error.to_string().contains("oncebox_no_such_table"),
            "{error}"
        );
    }
}
