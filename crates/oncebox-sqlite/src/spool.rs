//! Claim, settle and purge over a spool table; shared by the outbox and the durable
//! inbox, which differ only in their SQL and row type.
//!
//! # Claiming
//!
//! A lease is a row of the table's claims table (`oncebox_outbox_claims`,
//! `oncebox_durable_inbox_claims`): a token, the end of the lease, and the `seq`s the
//! claim holds as a JSON array. A pending row is leased while a claim whose lease has not
//! ended holds it. Claiming a batch writes that one row, not every claimed row: the rows
//! are written once more only when they are settled.
//!
//! A pending row is claimable if it is due, no live claim holds it, and no earlier
//! pending row of its key is unclaimable. A claim is one `BEGIN IMMEDIATE` transaction,
//! after the settlements when the relay settles and claims together:
//!
//! 1. **The rows**: the partial index of pending rows walked in `seq` order, each row
//!    tested against the earlier pending rows of its key (an index probe), until `limit`
//!    claimable rows are found, read whole. Rows queued behind a blocked key are walked
//!    over at index speed.
//! 2. **The record**: one row inserted into the claims table. A trigger deletes, in the
//!    same statement, every claim whose lease had ended.
//!
//! No other writer runs between the two, so the rows need no second look, and claims
//! never overlap: several relays, in one process or several sharing the file, take
//! turns. The write lock is held while the rows are read; producers' commits wait for it
//! meanwhile, up to the busy timeout.
//!
//! # Settling
//!
//! One `BEGIN IMMEDIATE` transaction: each settlement applies only to a row its claim
//! still holds (a claim deleted because its lease ended and its rows were claimed again
//! settles nothing), then the settled rows leave the claim, and a claim left empty is
//! deleted.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::Result;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use oncebox_core::sql::{fenced, last_error};
use oncebox_core::time::{duration_millis, to_unix_millis};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Row, Sqlite};
use tokio::sync::Notify;

use crate::error::{RowDecodeError, RowReader, store_error};

/// The statements of one spool table.
///
/// Parameters are numbered so that tables scoped to a consumer take the consumer as one
/// extra, last parameter (bound only when the table has a scope).
#[derive(Debug)]
pub(crate) struct SpoolSql {
    /// Table name, for error messages.
    pub(crate) table: &'static str,
    /// `?1` now, `?2` limit → the first `limit` claimable rows, whole, in `seq` order.
    pub(crate) claim: &'static str,
    /// `?1` now, `?2` lease until, `?3` token, `?4` seqs (JSON array): records a claim
    /// of rows read in the same write transaction.
    pub(crate) record_claim: &'static str,
    /// `?1` token, `?2` lease until, `?3` now: extends a claim whose lease has not ended.
    pub(crate) extend: &'static str,
    /// `?1` token, `?2` seqs (JSON array), `?3` now.
    pub(crate) done: &'static str,
    /// `?1` token, `?2` seqs (JSON array): deletes published rows instead of marking
    /// them done, for tables that offer it.
    pub(crate) delete_done: Option<&'static str>,
    /// `?1` token, `?2` seq, `?3` available at, `?4` error.
    pub(crate) retry: &'static str,
    /// `?1` token, `?2` seq, `?3` now, `?4` reason.
    pub(crate) dead: &'static str,
    /// `?1` token, `?2` seqs (JSON array): takes the settled rows out of the claim.
    pub(crate) unclaim: &'static str,
    /// `?1` token: deletes the claim if it holds no row.
    pub(crate) drop_claim: &'static str,
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

    /// Claims in a write transaction of its own.
    pub(crate) async fn claim<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        self.claim_after(None, request).await
    }

    /// Settles the rows of claim `token`, then claims, in one write transaction: the
    /// claim sees the settlements, and a failure applies neither.
    pub(crate) async fn settle_and_claim<T: SpoolRow>(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        let ops = (!settlements.is_empty()).then(|| SettleOps::plan(token, settlements));
        self.claim_after(ops.as_ref(), request).await
    }

    /// One write transaction: `settle`, if any, then the claim's statements (the rows,
    /// and the claim's record); the claimed rows are decoded after the commit.
    async fn claim_after<T: SpoolRow>(
        &self,
        settle: Option<&SettleOps>,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if settle.is_none() && request.limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(store_error)?;
        if let Some(ops) = settle {
            self.apply(&mut tx, ops).await?;
        }
        let rows = if request.limit == 0 {
            Vec::new()
        } else {
            self.claim_rows(&mut tx, request).await?
        };
        tx.commit().await.map_err(store_error)?;
        let mut claimed = Vec::with_capacity(rows.len());
        for (seq, row) in rows {
            if let Some(item) = self.decode_claimed(seq, request.token, &row).await? {
                claimed.push(item);
            }
        }
        Ok(claimed)
    }

    /// Reads the claimable rows in `conn`'s write transaction and records the claim of
    /// them; returns them with their `seq`s, not yet decoded.
    async fn claim_rows(
        &self,
        conn: &mut SqliteConnection,
        request: &ClaimRequest,
    ) -> Result<Vec<(i64, SqliteRow)>> {
        let now = to_unix_millis(SystemTime::now());
        let rows = self
            .scoped(
                sqlx::query(self.sql.claim)
                    .bind(now)
                    .bind(sql_limit(request.limit)),
            )
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let seqs = rows
            .iter()
            .map(|row| row.try_get::<i64, _>("seq"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        let record = sqlx::query(self.sql.record_claim)
            .bind(now)
            .bind(now.saturating_add(duration_millis(request.lease)))
            .bind(request.token.to_string())
            .bind(json_list(&seqs));
        self.execute(conn, record).await?;
        Ok(seqs.into_iter().zip(rows).collect())
    }

    /// Decodes a claimed row; a row that does not decode is marked dead with the reason
    /// (it can never be delivered, and must not stall the spool) and skipped.
    async fn decode_claimed<T: SpoolRow>(
        &self,
        seq: i64,
        token: LeaseToken,
        row: &SqliteRow,
    ) -> Result<Option<Claimed<T>>> {
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

    /// Extends the lease of claim `token`, if it has not ended.
    pub(crate) async fn extend(&self, token: LeaseToken, lease: Duration) -> Result<()> {
        let now = to_unix_millis(SystemTime::now());
        let query = sqlx::query(self.sql.extend)
            .bind(token.to_string())
            .bind(now.saturating_add(duration_millis(lease)))
            .bind(now);
        let extended = self
            .scoped(query)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(extended.rows_affected())
    }

    pub(crate) async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        if settlements.is_empty() {
            return Ok(());
        }
        let ops = SettleOps::plan(token, settlements);
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(store_error)?;
        self.apply(&mut tx, &ops).await?;
        tx.commit().await.map_err(store_error)
    }

    /// Applies the settlements to the rows the claim holds, then takes those rows out of
    /// the claim.
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
            self.execute(conn, query).await?;
        }
        for (seq, at, error) in &ops.retry {
            let query = sqlx::query(self.sql.retry)
                .bind(ops.token.clone())
                .bind(*seq)
                .bind(*at)
                .bind(error.clone());
            self.execute(conn, query).await?;
        }
        for (seq, reason) in &ops.dead {
            let query = sqlx::query(self.sql.dead)
                .bind(ops.token.clone())
                .bind(*seq)
                .bind(now)
                .bind(reason.clone());
            self.execute(conn, query).await?;
        }
        let unclaim = sqlx::query(self.sql.unclaim)
            .bind(ops.token.clone())
            .bind(json_list(&ops.settled));
        self.execute(conn, unclaim).await?;
        let drop_claim = sqlx::query(self.sql.drop_claim).bind(ops.token.clone());
        self.execute(conn, drop_claim).await
    }

    async fn execute(&self, conn: &mut SqliteConnection, query: SqliteQuery) -> Result<()> {
        self.scoped(query)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
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

/// Settlements grouped into statements: one for all done rows, one per retried or dead
/// row; released rows only leave the claim, as every settled row does.
struct SettleOps {
    token: String,
    done: Vec<i64>,
    retry: Vec<(i64, i64, String)>,
    dead: Vec<(i64, String)>,
    settled: Vec<i64>,
}

impl SettleOps {
    fn plan(token: LeaseToken, settlements: &[Settlement]) -> Self {
        let mut ops = Self {
            token: token.to_string(),
            done: Vec::new(),
            retry: Vec::new(),
            dead: Vec::new(),
            settled: Vec::with_capacity(settlements.len()),
        };
        for settlement in settlements {
            let seq = settlement.seq;
            ops.settled.push(seq);
            match &settlement.outcome {
                Settle::Done => ops.done.push(seq),
                Settle::Retry { at, error } => {
                    ops.retry
                        .push((seq, to_unix_millis(*at), last_error(error)));
                }
                Settle::Dead { reason } => ops.dead.push((seq, last_error(reason))),
                // `Release`, and any outcome added to the core later: end the lease and
                // count nothing, the one settlement that can never lose a row.
                _ => {}
            }
        }
        ops
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

pub(crate) use oncebox_core::sql::sql_limit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lists() {
        assert_eq!(json_list(&[]), "[]");
        assert_eq!(json_list(&[1, -2, 30]), "[1,-2,30]");
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
        assert_eq!(ops.retry.len(), 1);
        assert_eq!(ops.dead.len(), 1);
        assert_eq!(ops.settled, vec![0, 1, 2, 3, 4], "all leave the claim");
    }
}
