//! Claim, settle and purge over a spool table; shared by the outbox and the durable
//! inbox, which differ only in their SQL and row type.
//!
//! # Claiming
//!
//! A claim runs in two steps so that the scan never holds SQLite's write lock:
//!
//! 1. **Candidates**, a plain read (WAL readers never block writers): the first `limit`
//!    claimable rows by `seq`. A pending row is claimable if it is due, not under a live
//!    lease, and no earlier pending row of its key is unclaimable. The scan walks the
//!    partial index of pending rows in `seq` order and stops after `limit` hits; rows
//!    queued behind a blocked key are walked over, at index speed.
//! 2. **Lease**, one `UPDATE ... RETURNING` statement (atomic on its own): leases the
//!    candidates that are *still* claimable, and only if every earlier pending row of
//!    their key is a candidate too. So each key's leased rows stay a prefix of its
//!    pending rows even if another relay leased rows, or an operator replayed a dead
//!    row, in between.
//!
//! A relay that loses candidates to a concurrent claim tries again, a few times, for the
//! rest of its batch.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::Result;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use oncebox_core::time::{duration_millis, to_unix_millis};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Row, Sqlite};
use tokio::sync::Notify;

use crate::error::{RowDecodeError, RowReader, store_error};

/// Candidate → lease rounds per claim, when concurrent claims take candidates away.
const CLAIM_ROUNDS: usize = 3;

/// Longest error text kept in `last_error`, in characters.
const MAX_ERROR_CHARS: usize = 2000;

/// The statements of one spool table.
///
/// Parameters are numbered so that tables scoped to a consumer take the consumer as one
/// extra, last parameter (bound only when the table has a scope).
#[derive(Debug)]
pub(crate) struct SpoolSql {
    /// Table name, for error messages.
    pub(crate) table: &'static str,
    /// `?1` now, `?2` limit → one row: the `seq`s of the first claimable rows (a JSON
    /// array), and how many there are.
    pub(crate) candidates: &'static str,
    /// `?1` now, `?2` lease until, `?3` token, `?4` candidates (JSON array) → claimed rows.
    pub(crate) claim: &'static str,
    /// `?1` token, `?2` seqs (JSON array), `?3` now.
    pub(crate) done: &'static str,
    /// `?1` token, `?2` seqs (JSON array): deletes published rows instead of marking
    /// them done, for tables that offer it.
    pub(crate) delete_done: Option<&'static str>,
    /// `?1` token, `?2` seqs (JSON array).
    pub(crate) release: &'static str,
    /// `?1` token, `?2` seq, `?3` available at, `?4` error.
    pub(crate) retry: &'static str,
    /// `?1` token, `?2` seq, `?3` now, `?4` reason.
    pub(crate) dead: &'static str,
    /// `?1` before, `?2` limit.
    pub(crate) purge: &'static str,
}

/// An item stored in a spool table, read back from a claimed row.
pub(crate) trait SpoolRow: Sized {
    /// Decodes the item from the columns the table's claim statement returns.
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError>;
}

/// One spool table, optionally scoped to a consumer, with its in-process wake-up.
#[derive(Debug, Clone)]
pub(crate) struct SpoolTable {
    pool: SqlitePool,
    sql: &'static SpoolSql,
    scope: Option<Arc<str>>,
    wake: Arc<Notify>,
    /// The table's [`SpoolSql::delete_done`] when published rows are deleted, not
    /// marked done.
    delete_done: Option<&'static str>,
}

type SqliteQuery = Query<'static, Sqlite, SqliteArguments>;

impl SpoolTable {
    pub(crate) fn new(
        pool: SqlitePool,
        sql: &'static SpoolSql,
        scope: Option<Arc<str>>,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            pool,
            sql,
            scope,
            wake,
            delete_done: None,
        }
    }

    /// Deletes published rows instead of marking them done, if the table's SQL has
    /// [`SpoolSql::delete_done`].
    pub(crate) fn delete_done(mut self, on: bool) -> Self {
        self.delete_done = self.sql.delete_done.filter(|_| on);
        self
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Binds the consumer, as the last parameter, if the table is scoped.
    fn scoped(&self, query: SqliteQuery) -> SqliteQuery {
        match &self.scope {
            Some(scope) => query.bind(scope.to_string()),
            None => query,
        }
    }

    pub(crate) async fn claim<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        let now = to_unix_millis(SystemTime::now());
        let lease_until = now.saturating_add(duration_millis(request.lease));
        let token = request.token.to_string();
        let mut claimed = Vec::new();
        for _ in 0..CLAIM_ROUNDS {
            let want = request.limit.saturating_sub(claimed.len());
            if want == 0 {
                break;
            }
            // One row, the candidates as a JSON array, passed on as it is: rows cross
            // from SQLite's thread one by one, each at the cost of a thread wake-up.
            let row = self
                .scoped(
                    sqlx::query(self.sql.candidates)
                        .bind(now)
                        .bind(sql_limit(want)),
                )
                .fetch_one(&self.pool)
                .await
                .map_err(store_error)?;
            let candidates: String = row.try_get(0).map_err(store_error)?;
            let count: i64 = row.try_get(1).map_err(store_error)?;
            if count == 0 {
                break;
            }
            let rows = self
                .scoped(
                    sqlx::query(self.sql.claim)
                        .bind(now)
                        .bind(lease_until)
                        .bind(token.clone())
                        .bind(candidates),
                )
                .fetch_all(&self.pool)
                .await
                .map_err(store_error)?;
            let lost_some = i64::try_from(rows.len()).unwrap_or(i64::MAX) < count;
            for row in &rows {
                if let Some(item) = self.decode_claimed(request.token, row).await? {
                    claimed.push(item);
                }
            }
            if !lost_some {
                break;
            }
        }
        claimed.sort_by_key(|c: &Claimed<T>| c.seq);
        Ok(claimed)
    }

    /// Decodes a claimed row; a row that does not decode is marked dead with the reason
    /// (it can never be delivered, and must not stall the spool) and skipped.
    async fn decode_claimed<T: SpoolRow>(
        &self,
        token: LeaseToken,
        row: &SqliteRow,
    ) -> Result<Option<Claimed<T>>> {
        let seq: i64 = row.try_get("seq").map_err(store_error)?;
        let reader = RowReader::new(row, self.sql.table, format_args!("seq {seq}"));
        match decode_row::<T>(&reader) {
            Ok((attempts, item)) => Ok(Some(Claimed {
                seq,
                token,
                attempts,
                item,
            })),
            Err(error) => {
                tracing::warn!(
                    table = self.sql.table, seq, %error,
                    "undecodable row: dead-lettered"
                );
                let reason = format!("undecodable row: {error}");
                let dead = [Settlement {
                    seq,
                    outcome: Settle::Dead { reason },
                }];
                if let Err(error) = self.settle(token, &dead).await {
                    tracing::warn!(
                        table = self.sql.table, seq, %error,
                        "could not dead-letter an undecodable row; it stays leased until its lease ends"
                    );
                }
                Ok(None)
            }
        }
    }

    pub(crate) async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        let ops = SettleOps::plan(token, settlements);
        match ops.statements() {
            0 => Ok(()),
            1 => {
                let mut conn = self.pool.acquire().await.map_err(store_error)?;
                self.apply(&mut conn, &ops).await
            }
            _ => {
                let mut tx = self
                    .pool
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(store_error)?;
                self.apply(&mut tx, &ops).await?;
                tx.commit().await.map_err(store_error)
            }
        }
    }

    async fn apply(&self, conn: &mut SqliteConnection, ops: &SettleOps) -> Result<()> {
        let now = to_unix_millis(SystemTime::now());
        if !ops.done.is_empty() {
            let query = match self.delete_done {
                Some(delete) => sqlx::query(delete)
                    .bind(ops.token.clone())
                    .bind(json_list(&ops.done)),
                None => sqlx::query(self.sql.done)
                    .bind(ops.token.clone())
                    .bind(json_list(&ops.done))
                    .bind(now),
            };
            self.scoped(query)
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        if !ops.release.is_empty() {
            let query = sqlx::query(self.sql.release)
                .bind(ops.token.clone())
                .bind(json_list(&ops.release));
            self.scoped(query)
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        for (seq, at, error) in &ops.retry {
            let query = sqlx::query(self.sql.retry)
                .bind(ops.token.clone())
                .bind(*seq)
                .bind(*at)
                .bind(error.clone());
            self.scoped(query)
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        for (seq, reason) in &ops.dead {
            let query = sqlx::query(self.sql.dead)
                .bind(ops.token.clone())
                .bind(*seq)
                .bind(now)
                .bind(reason.clone());
            self.scoped(query)
                .execute(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    pub(crate) async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let query = sqlx::query(self.sql.purge)
            .bind(to_unix_millis(before))
            .bind(sql_limit(limit));
        let result = self
            .scoped(query)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(result.rows_affected())
    }

    /// Wakes one waiter of [`SpoolTable::wait_for_work`], or the next one if none waits.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) async fn wait_for_work(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
    }
}

fn decode_row<T: SpoolRow>(reader: &RowReader<'_>) -> Result<(u32, T), RowDecodeError> {
    Ok((reader.count("attempts")?, T::decode(reader)?))
}

/// Settlements grouped into statements: one each for all done and all released rows,
/// one per retried or dead row.
struct SettleOps {
    token: String,
    done: Vec<i64>,
    release: Vec<i64>,
    retry: Vec<(i64, i64, String)>,
    dead: Vec<(i64, String)>,
}

impl SettleOps {
    fn plan(token: LeaseToken, settlements: &[Settlement]) -> Self {
        let mut ops = Self {
            token: token.to_string(),
            done: Vec::new(),
            release: Vec::new(),
            retry: Vec::new(),
            dead: Vec::new(),
        };
        for settlement in settlements {
            let seq = settlement.seq;
            match &settlement.outcome {
                Settle::Done => ops.done.push(seq),
                Settle::Retry { at, error } => {
                    ops.retry.push((seq, to_unix_millis(*at), cap_error(error)));
                }
                Settle::Dead { reason } => ops.dead.push((seq, cap_error(reason))),
                // `Release`, and any outcome added to the core later: end the lease and
                // count nothing, the one settlement that can never lose a row.
                _ => ops.release.push(seq),
            }
        }
        ops
    }

    fn statements(&self) -> usize {
        usize::from(!self.done.is_empty())
            + usize::from(!self.release.is_empty())
            + self.retry.len()
            + self.dead.len()
    }
}

/// `[1,2,3]`: a list of row numbers for `json_each`.
fn json_list(seqs: &[i64]) -> String {
    let mut list = String::with_capacity(seqs.len() * 8 + 2);
    list.push('[');
    for (i, seq) in seqs.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{seq}");
    }
    list.push(']');
    list
}

/// A row count for `LIMIT`.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Error text cut to [`MAX_ERROR_CHARS`], on a character boundary.
fn cap_error(error: &str) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &error[..cut]),
        None => error.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lists() {
        assert_eq!(json_list(&[]), "[]");
        assert_eq!(json_list(&[1, -2, 30]), "[1,-2,30]");
    }

    #[test]
    fn errors_are_capped_on_char_boundaries() {
        assert_eq!(cap_error("short"), "short");
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        assert_eq!(cap_error(&long).chars().count(), MAX_ERROR_CHARS + 1);
    }

    #[test]
    fn settlements_group_into_few_statements() {
        let at = SystemTime::now();
        let settlements: Vec<Settlement> = [
            Settle::Done,
            Settle::Done,
            Settle::Release,
            Settle::Retry {
                at,
                error: "e".into(),
            },
            Settle::Dead { reason: "r".into() },
        ]
        .into_iter()
        .enumerate()
        .map(|(i, outcome)| Settlement {
            seq: i as i64,
            outcome,
        })
        .collect();
        let ops = SettleOps::plan(LeaseToken::new(), &settlements);
        assert_eq!(ops.done, vec![0, 1]);
        assert_eq!(ops.release, vec![2]);
        assert_eq!(ops.statements(), 4);
    }
}
