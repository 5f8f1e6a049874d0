//! Settling claimed rows, and retention.

use std::collections::HashSet;
use std::time::SystemTime;

use oncebox_core::Result;
use oncebox_core::spool::{LeaseToken, Settle, Settlement};
use sqlx::mysql::MySqlConnection;

use super::script::{Script, ScriptTx};
use super::{SpoolTable, sql};
use crate::error::store_error;
use crate::sql::{
    MAX_LIST, begin_read_committed, ms_since, ms_until, query, sql_limit, uuid_bytes,
};

/// Longest error text kept in `last_error`, in characters.
const MAX_ERROR_CHARS: usize = 2000;

impl SpoolTable {
    /// Applies every settlement in one transaction, to the rows claim `token` still
    /// holds; with `delete_done`, done rows are deleted instead of marked.
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
        let (mut tx, held) = self.begin_settle(&token).await?;
        let mut script = Script::default();
        self.settle_in(&mut tx, &token, held, settlements, delete_done, &mut script)
            .await?;
        tx.commit(script).await?;
        Ok(())
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
        let Some(mut held) = held else {
            tracing::debug!(table = self.sql.table, "claim gone: settlements ignored");
            self.own.settled(token, &[]);
            return Ok(());
        };
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
                    cap_error(error)
                ])),
                Settle::Dead { reason } => failed.push(serde_json::json!([
                    settlement.seq,
                    sql::OP_DEAD,
                    0,
                    cap_error(reason)
                ])),
                // `Release`, and any outcome added to the core later: the row leaves the
                // claim unchanged, the one settlement that can never lose a row.
                _ => {}
            }
        }
        if !failed.is_empty() {
            let list = serde_json::Value::from(failed).to_string();
            self.scoped(query(&self.sql.fail).bind(list))
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        let done_sql = if delete_done {
            &self.sql.delete_done
        } else {
            &self.sql.done
        };
        for chunk in done.chunks(MAX_LIST) {
            script.push(done_sql, chunk, &self.scope_values());
        }
        let mut remaining: Vec<i64> = held.into_iter().collect();
        remaining.sort_unstable();
        self.keep_claim(script, token, &remaining);
        // Before the commit: the next claim's window may travel in the same request.
        self.own.settled(token, &remaining);
        Ok(())
    }

    /// Deletes at most `limit` done rows settled before `before`, oldest first.
    pub(crate) async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let mut tx = begin_read_committed(&self.pool).await?;
        let deleted = self
            .scoped(query(&self.sql.purge))
            .bind(ms_since(before))
            .bind(sql_limit(limit))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(deleted.rows_affected())
    }
}

/// Error text cut to [`MAX_ERROR_CHARS`], on a character boundary.
pub(crate) fn cap_error(error: &str) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &error[..cut]),
        None => error.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_capped_on_char_boundaries() {
        assert_eq!(cap_error("short"), "short");
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        assert_eq!(cap_error(&long).chars().count(), MAX_ERROR_CHARS + 1);
    }
}
