//! Settling claimed rows, and retention.

use std::collections::HashSet;
use std::time::SystemTime;

use oncebox_core::Result;
use oncebox_core::spool::{LeaseToken, Settle, Settlement};
use oncebox_core::sql::last_error;
use sqlx::Row as _;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::script::{Script, ScriptTx};
use super::{SpoolTable, sql};
use crate::error::store_error;
use crate::sql::{
    MAX_LIST, delete_read_committed, ms_since, ms_until, query, sql_limit, uuid_bytes,
};

impl SpoolTable {
    /// Applies every settlement in one transaction, to the rows claim `token` still
    /// holds; with `delete_done`, done rows are deleted instead of marked.
    ///
    /// In one request if this process remembers the claim (see
    /// [`settle_remembered`](Self::settle_remembered)), else in two.
    pub(crate) async fn settle(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<()> {
        if settlements.is_empty() {
            return Ok(());
        }
        let token = uuid_bytes(token.as_uuid());
        let mut script = Script::default();
        if let Some(flag) = self.settle_remembered(&mut script, &token, settlements, delete_done) {
            let results = ScriptTx::once(&self.pool, script).await?;
            if settled(&results, flag)? {
                return Ok(());
            }
            script = Script::default();
        }
        let (mut tx, held) = self.begin_settle(&token).await?;
        self.settle_in(&mut tx, &token, held, settlements, delete_done, &mut script)
            .await?;
        tx.commit(script).await?;
        Ok(())
    }

    /// The settle statements of claim `token` as this process remembers it
    /// ([`OwnClaims`](super::claims::OwnClaims)), without reading the claim first:
    /// appended to `script`, for the caller to run in a transaction of their own.
    /// Returns the index, in the script's results, of the row that says whether they
    /// applied ([`settled`]).
    ///
    /// The claim's own statement comes first and applies only if the claim holds exactly
    /// the rows this process last wrote to it, which locks the claim's row as
    /// [`begin_settle`](Self::begin_settle) does; the statements on the rows apply only
    /// if it did. If it did not (the claim is gone, or a settlement of it failed to
    /// commit after this process counted it), nothing changes, and the caller settles
    /// the long way.
    ///
    /// `None`, with nothing appended, if the process does not remember the claim, or if a
    /// row failed: the `fail` statement carries error texts, which are bound, never
    /// written into a script.
    pub(super) fn settle_remembered(
        &self,
        script: &mut Script,
        token: &[u8],
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Option<usize> {
        let written = self.own.seqs(token)?;
        let outcomes = Outcomes::of(written.iter().copied().collect(), settlements);
        if !outcomes.failed.is_empty() {
            return None;
        }
        self.keep_claim_if(script, token, &written, &outcomes.remaining);
        self.publish_done(
            script,
            self.sql.published(delete_done, true),
            &outcomes.done,
        );
        let flag = script.len();
        script.push(sql::READ_SETTLED, &[], &[]);
        // Before the request: the next claim's window may travel in it.
        self.own.settled(token, &outcomes.remaining);
        Some(flag)
    }

    /// Starts a settlement's transaction, with the lock of claim `token`'s row in the
    /// same request; returns the transaction and the rows the claim holds (`None` if the
    /// claim is gone: its lease ended and another claim took its place).
    pub(super) async fn begin_settle(
        &self,
        token: &[u8],
    ) -> Result<(ScriptTx, Option<HashSet<i64>>)> {
        let mut script = Script::default();
        self.lock_claim(&mut script, token);
        let (tx, results) = ScriptTx::begin(&self.pool, script).await?;
        let held = Self::held(results.first().map_or(&[], Vec::as_slice))?;
        Ok((tx, held))
    }

    /// The settle statements of claim `token`, which [`begin_settle`](Self::begin_settle)
    /// locked and found `held`: only the rows it still holds are settled, none if it is
    /// gone. The rows that failed (retried or dead) are updated at once, in one
    /// statement, if there are any. Appended to `script`, for the caller to run: one
    /// statement for the rows published (marked done, or deleted with `delete_done`),
    /// then the claim's own, which keeps the rows not settled or deletes the claim;
    /// released rows only leave the claim.
    pub(super) async fn settle_in(
        &self,
        conn: &mut MySqlConnection,
        token: &[u8],
        held: Option<HashSet<i64>>,
        settlements: &[Settlement],
        delete_done: bool,
        script: &mut Script,
    ) -> Result<()> {
        let Some(held) = held else {
            tracing::debug!(table = self.sql.table, "claim gone: settlements ignored");
            self.own.settled(token, &[]);
            return Ok(());
        };
        let outcomes = Outcomes::of(held, settlements);
        if !outcomes.failed.is_empty() {
            let list = serde_json::Value::from(outcomes.failed).to_string();
            self.scoped(query(&self.sql.fail).bind(list))
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        self.publish_done(
            script,
            self.sql.published(delete_done, false),
            &outcomes.done,
        );
        self.keep_claim(script, token, &outcomes.remaining);
        // Before the commit: the next claim's window may travel in the same request.
        self.own.settled(token, &outcomes.remaining);
        Ok(())
    }

    /// Appends `statement` (one of [`SpoolSql::published`](sql::SpoolSql::published))
    /// over the rows published, `done`, a chunk at a time.
    fn publish_done(&self, script: &mut Script, statement: &str, done: &[i64]) {
        for chunk in done.chunks(MAX_LIST) {
            script.push(statement, chunk, &self.scope_values());
        }
    }

    /// Deletes at most `limit` done rows settled before `before`, oldest first.
    pub(crate) async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let purge = self
            .scoped(query(&self.sql.purge))
            .bind(ms_since(before))
            .bind(sql_limit(limit));
        delete_read_committed(&self.pool, purge).await
    }
}

/// The settlements of a claim, sorted out against the rows it holds: settlements of
/// rows it does not hold are dropped.
struct Outcomes {
    /// The rows published.
    done: Vec<i64>,
    /// The rows retried or dead, as the `fail` statement takes them: `[seq, op,
    /// delay_ms, error]` each.
    failed: Vec<serde_json::Value>,
    /// The rows the claim holds after the settlement, in `seq` order.
    remaining: Vec<i64>,
}

impl Outcomes {
    fn of(mut held: HashSet<i64>, settlements: &[Settlement]) -> Self {
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for settlement in settlements {
            if !held.remove(&settlement.seq) {
                continue;
            }
            match &settlement.outcome {
                Settle::Done => done.push(settlement.seq),
                Settle::Retry { at, error } => failed.push(serde_json::json!([
                    settlement.seq,
                    sql::OP_RETRY,
                    ms_until(*at),
                    last_error(error)
                ])),
                Settle::Dead { reason } => failed.push(serde_json::json!([
                    settlement.seq,
                    sql::OP_DEAD,
                    0,
                    last_error(reason)
                ])),
                // `Release`, and any outcome added to the core later: the row leaves the
                // claim unchanged, the one settlement that can never lose a row.
                _ => {}
            }
        }
        let mut remaining: Vec<i64> = held.into_iter().collect();
        remaining.sort_unstable();
        Self {
            done,
            failed,
            remaining,
        }
    }
}

/// Whether the statements of a [`SpoolTable::settle_remembered`] applied, from the
/// `results` of its script and the index it returned.
pub(super) fn settled(results: &[Vec<MySqlRow>], flag: usize) -> Result<bool> {
    let row = results.get(flag).and_then(|rows| rows.first());
    let settled: Option<i64> = match row {
        Some(row) => row.try_get("settled").map_err(store_error)?,
        None => None,
    };
    Ok(settled.is_some_and(|changed| changed > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a claim and a settlement write to the claim's row is what the next
    /// settlement's guard expects: settling a claim this process made, part of it then
    /// the rest, takes the one-request way both times.
    #[tokio::test(flavor = "multi_thread")]
    async fn settlements_of_remembered_claims_pass_their_guard() {
        use oncebox_core::Message;
        use oncebox_core::spool::{ClaimRequest, Claimed};
        use oncebox_testkit::fixtures::msg;
        use sqlx::Connection as _;
        use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};

        let url = std::env::var("ONCEBOX_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let options: MySqlConnectOptions = url.parse().expect("a MySQL URL");
        let database = format!("oncebox_unit_{:016x}", fastrand::u64(..));
        let mut admin = MySqlConnection::connect_with(&options)
            .await
            .expect("the test server");
        let create = format!("CREATE DATABASE {database}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
            .expect("a new database");
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone().database(&database))
            .await
            .expect("the new database");
        let store = crate::MySqlStore::from_pool(pool.clone());
        store.migrate().await.expect("migrated");
        let mut tx = pool.begin().await.expect("a transaction");
        for (key, label) in [("a", "a1"), ("b", "b1"), ("c", "c1")] {
            let message: Message = msg(Some(key), label);
            store
                .outbox()
                .enqueue(&mut tx, &message)
                .await
                .expect("enqueued");
        }
        tx.commit().await.expect("committed");

        let table = SpoolTable::new(pool.clone(), &crate::outbox::SPOOL, None);
        let request = ClaimRequest {
            token: LeaseToken::new(),
            limit: 10,
            lease: std::time::Duration::from_secs(60),
        };
        let rows = table.claim::<Message>(&request).await.expect("claimed");
        assert_eq!(rows.len(), 3);
        let token = uuid_bytes(request.token.as_uuid());
        let done = |rows: &[Claimed<Message>]| -> Vec<Settlement> {
            rows.iter()
                .map(|row| Settlement {
                    seq: row.seq,
                    outcome: Settle::Done,
                })
                .collect()
        };
        let mut applied = Vec::new();
        for part in [&rows[..1], &rows[1..]] {
            let mut script = Script::default();
            let flag = table
                .settle_remembered(&mut script, &token, &done(part), true)
                .expect("the claim is remembered");
            let results = ScriptTx::once(&pool, script).await.expect("settled");
            applied.push(settled(&results, flag).expect("the flag reads"));
        }
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_outbox")
            .fetch_one(&pool)
            .await
            .expect("counted");
        pool.close().await;
        let drop = format!("DROP DATABASE {database}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&mut admin)
            .await
            .expect("dropped");

        assert_eq!(applied, [true, true], "the shrink, then the drop, applied");
        assert_eq!(left, 0, "every row settled done is deleted");
    }
}
