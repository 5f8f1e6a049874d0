//! Several statements in one round trip.
//!
//! A relay's batch runs a dozen short statements, most of which need nothing from the
//! one before: the settlement's updates, the claim's lock, the read of the live claims.
//! Sent one by one, each costs a round trip to the server, about 0.1 ms on a loaded
//! host, more than most of them take to run. A [`Script`] sends them together, as one
//! text-protocol request, and hands back each statement's rows.
//!
//! The text protocol takes no parameters, so values are written into the text as
//! literals ([`Value`]): integers in decimal, bytes in hexadecimal (`X'…'`), neither of
//! which can end the literal it is in. Nothing else is ever written into a script.
//!
//! A [`ScriptTx`] goes one step further: its transaction starts in the request of its
//! first script and commits in the request of its last.

use std::fmt::Write as _;
use std::ops::{Deref, DerefMut};

use futures_util::TryStreamExt as _;
use oncebox_core::Result;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{Either, MySql};

use crate::error::store_error;
use crate::sql::{LIST, start_read_committed};

/// A value written into a script.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    /// An integer, in decimal.
    Int(i64),
    /// Bytes, in hexadecimal.
    Bytes(&'a [u8]),
    /// Row numbers as a JSON array, a string literal of digits, signs and commas.
    Seqs(&'a [i64]),
}

/// Statements to run together, in order, in the connection's transaction.
#[derive(Debug, Default)]
pub(super) struct Script {
    sql: String,
    /// Statements pushed: the results [`run`](Self::run) returns.
    len: usize,
}

impl Script {
    /// The number of statements pushed so far: the index, in [`run`](Self::run)'s
    /// results, of the next one's rows.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Appends `statement` with its `{list}` (if any) filled with `list`, and its `?`
    /// places, in order, with `values`. The statement may be several, separated by `;`
    /// (`COMMIT; SET TRANSACTION ...`): the crate's statements have no `;` elsewhere,
    /// and the values written into them none at all.
    ///
    /// # Panics
    ///
    /// If the statement's places and `values` differ in number: the statements are the
    /// crate's own, so that is a bug here, never bad input.
    pub(super) fn push(&mut self, statement: &str, list: &[i64], values: &[Value<'_>]) {
        if !self.sql.is_empty() {
            self.sql.push_str(";\n");
        }
        self.len += 1 + statement.matches(';').count();
        // A statement has at most one list, between its two parts.
        let mut values = values.iter();
        for (n, part) in statement.split(LIST).enumerate() {
            if n > 0 {
                write_seqs(&mut self.sql, list);
            }
            for (n, piece) in part.split('?').enumerate() {
                if n > 0 {
                    let value = values.next().expect("a value for every `?`");
                    write_value(&mut self.sql, *value);
                }
                self.sql.push_str(piece);
            }
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

/// A `READ COMMITTED` transaction on a pool connection, started in the request of its
/// first script and committed in the request of its last.
///
/// Dropped before it commits (after an error, or with its future), it closes its
/// connection instead of returning it to the pool: the server rolls the transaction
/// back, and no other task is handed a connection in the middle of it.
pub(super) struct ScriptTx {
    conn: PoolConnection<MySql>,
    open: bool,
}

impl ScriptTx {
    /// Starts a transaction on a connection of `pool` and runs `script` in it, in one
    /// request; returns the transaction and the rows of `script`'s statements.
    ///
    /// The request starts with a `ROLLBACK`, for the reason
    /// [`begin_read_committed`](crate::sql::begin_read_committed) gives.
    pub(super) async fn begin(
        pool: &MySqlPool,
        script: Script,
    ) -> Result<(Self, Vec<Vec<MySqlRow>>)> {
        let conn = pool.acquire().await.map_err(store_error)?;
        let mut tx = Self { conn, open: true };
        let mut begin = Script {
            sql: concat!("ROLLBACK; ", start_read_committed!()).to_owned(),
            len: 3,
        };
        if !script.sql.is_empty() {
            begin.sql.push_str(";\n");
            begin.sql.push_str(&script.sql);
            begin.len += script.len;
        }
        let mut results = begin.run(&mut tx.conn).await?;
        // Those of `ROLLBACK`, `SET TRANSACTION` and `START TRANSACTION`.
        results.drain(..3);
        Ok((tx, results))
    }

    /// Runs `script`, then commits, in one request; returns the rows of `script`'s
    /// statements.
    pub(super) async fn commit(mut self, mut script: Script) -> Result<Vec<Vec<MySqlRow>>> {
        script.push("COMMIT", &[], &[]);
        let mut results = script.run(&mut self.conn).await?;
        results.pop();
        self.open = false;
        Ok(results)
    }

    /// A transaction of `script` alone: starts, runs it and commits, in one request;
    /// returns the rows of `script`'s statements.
    pub(super) async fn once(pool: &MySqlPool, mut script: Script) -> Result<Vec<Vec<MySqlRow>>> {
        script.push("COMMIT", &[], &[]);
        let (mut tx, mut results) = Self::begin(pool, script).await?;
        results.pop();
        tx.open = false;
        Ok(results)
    }

    /// Rolls the transaction back.
    pub(super) async fn rollback(mut self) -> Result<()> {
        let mut script = Script::default();
        script.push("ROLLBACK", &[], &[]);
        script.run(&mut self.conn).await?;
        self.open = false;
        Ok(())
    }
}

impl Deref for ScriptTx {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        &self.conn
    }
}

impl DerefMut for ScriptTx {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }
}

impl Drop for ScriptTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

fn write_value(sql: &mut String, value: Value<'_>) {
    match value {
        Value::Int(value) => {
            let _ = write!(sql, "{value}");
        }
        Value::Bytes(bytes) => {
            sql.push_str("X'");
            for byte in bytes {
                let _ = write!(sql, "{byte:02X}");
            }
            sql.push('\'');
        }
        Value::Seqs(seqs) => {
            sql.push_str("'[");
            write_seqs(sql, seqs);
            sql.push_str("]'");
        }
    }
}

/// `seqs` in decimal, separated by commas.
fn write_seqs(sql: &mut String, seqs: &[i64]) {
    for (n, seq) in seqs.iter().enumerate() {
        let _ = write!(sql, "{}{seq}", if n == 0 { "" } else { "," });
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row as _;

    use super::*;

    #[test]
    fn values_become_literals_in_order() {
        let mut script = Script::default();
        script.push(
            "SELECT ? FROM t WHERE a = ?",
            &[],
            &[Value::Int(-7), Value::Bytes(b"a'\x00")],
        );
        script.push(
            "DELETE FROM t WHERE seq IN ({list}) AND k = ? AND s = ?",
            &[3, -4],
            &[Value::Bytes(b""), Value::Seqs(&[1, -2])],
        );
        assert_eq!(
            script.sql,
            "SELECT -7 FROM t WHERE a = X'612700';\n\
             DELETE FROM t WHERE seq IN (3,-4) AND k = X'' AND s = '[1,-2]'"
        );
    }

    #[test]
    #[should_panic(expected = "a `?` for every value")]
    fn values_without_places_are_a_bug() {
        Script::default().push("SELECT 1", &[], &[Value::Int(1)]);
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
        let mut conn = connect().await;
        let mut script = Script::default();
        script.push(
            "SELECT seq FROM (SELECT 5 AS seq UNION ALL SELECT 6 UNION ALL SELECT 7) AS t
             WHERE seq IN ({list}) ORDER BY seq",
            &[7, 5],
            &[],
        );
        script.push("SELECT JSON_LENGTH(?) AS n", &[], &[Value::Seqs(&[3, -1])]);
        script.push(
            "SELECT ? AS b UNION ALL SELECT ?",
            &[],
            &[Value::Bytes(b"it's"), Value::Bytes(b"")],
        );
        script.push("DO 1; DO 2", &[], &[]);
        let statements = script.len();
        let results = script.run(&mut conn).await.expect("the script runs");
        assert_eq!(statements, 5, "`DO 1; DO 2` counts as two");
        assert_eq!(results.len(), statements, "a result per statement counted");
        let seqs: Vec<i64> = results[0].iter().map(|row| row.get("seq")).collect();
        let bytes: Vec<Vec<u8>> = results[2].iter().map(|row| row.get("b")).collect();
        assert_eq!(seqs, [5, 7]);
        assert_eq!(results[1][0].get::<i64, _>("n"), 2, "a JSON array");
        assert_eq!(bytes, [b"it's".to_vec(), Vec::new()]);
    }

    #[tokio::test]
    async fn a_transaction_commits_with_its_last_script_or_rolls_back_when_dropped() {
        use sqlx::mysql::MySqlPoolOptions;
        let url = std::env::var("ONCEBOX_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("the test server");
        let table = format!("oncebox_script_{:016x}", fastrand::u64(..));
        let run = |sql: String| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await.expect("a connection");
                let mut script = Script::default();
                script.push(&sql, &[], &[]);
                script.run(&mut conn).await.expect("the statement runs")
            }
        };
        let count = || run(format!("SELECT COUNT(*) AS n FROM {table}"));
        run(format!("CREATE TABLE {table} (n INT)")).await;
        let insert = |n: i64| {
            let mut script = Script::default();
            script.push(
                &format!("INSERT INTO {table} VALUES (?)"),
                &[],
                &[Value::Int(n)],
            );
            script
        };

        let (dropped, _) = ScriptTx::begin(&pool, insert(1)).await.expect("begins");
        drop(dropped);
        let after_drop: i64 = count().await[0][0].get("n");
        let (tx, _) = ScriptTx::begin(&pool, Script::default())
            .await
            .expect("begins");
        tx.commit(insert(2)).await.expect("commits");
        let after_commit: i64 = count().await[0][0].get("n");
        run(format!("DROP TABLE {table}")).await;

        assert_eq!(after_drop, 0, "a dropped transaction is rolled back");
        assert_eq!(after_commit, 1, "the last script commits with it");
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
