//! Claim, settle and purge over a spool table; shared by the outbox, the durable inbox
//! and Debezium-style outboxes, which differ only in their [`Layout`].

pub(crate) mod sql;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::Result;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, Row};

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::time::{duration_ms, ms_since, ms_until};

pub(crate) use sql::{Layout, SpoolSql};

/// Longest error text kept in `last_error`, in characters.
const MAX_ERROR_CHARS: usize = 2000;

/// Step 1 of a claim examines at most this many pending rows by default...
const MIN_WINDOW: usize = 1024;
/// ...or this many per row asked for, if more.
const WINDOW_PER_ROW: usize = 4;
/// The default window adapts between these bounds (`SpoolTable::window`); it is at
/// least this many rows...
const MIN_SMALL_WINDOW: usize = 512;
/// ...and at least this many per row asked for.
const SMALL_WINDOW_PER_ROW: usize = 2;
/// Step 2 probes at least this many keys...
const MIN_KEY_SCAN: usize = 256;
/// ...and at least this many per row asked for.
const KEYS_PER_ROW: usize = 4;

/// The claim transaction's statement and idle timeouts are its lease, at least this.
const MIN_CLAIM_TIMEOUT_MS: i64 = 1000;

/// A statement built at construction, run without copying its text.
pub(crate) type PgQuery = Query<'static, Postgres, PgArguments>;

/// A prepared query over one of the statements built once per table.
pub(crate) fn query(sql: &Arc<str>) -> PgQuery {
    sqlx::query(AssertSqlSafe(Arc::clone(sql)))
}

/// An item stored in a spool table, read back from a claimed row.
pub(crate) trait SpoolRow: Sized {
    /// Decodes the item from the columns of the table's [`Layout::item`].
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError>;
}

/// Tuning of the claim's two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimTuning {
    /// Pending rows step 1 examines, or `None` for the default.
    pub(crate) window: Option<usize>,
}

/// One spool table, optionally scoped to a consumer.
#[derive(Debug, Clone)]
pub(crate) struct SpoolTable {
    pool: PgPool,
    sql: Arc<SpoolSql>,
    scope: Option<Arc<str>>,
    /// Where step 2's loose scan of keys resumes; shared by clones, so that successive
    /// claims of a process move through the whole key space.
    cursor: Arc<Mutex<String>>,
    /// How much of the window the last step 1 needed, doubled: the next default window
    /// (within its bounds). Shared by clones, like the cursor.
    window_hint: Arc<AtomicUsize>,
    tuning: ClaimTuning,
}

impl SpoolTable {
    pub(crate) fn new(pool: PgPool, sql: Arc<SpoolSql>, scope: Option<Arc<str>>) -> Self {
        Self {
            pool,
            sql,
            scope,
            cursor: Arc::default(),
            window_hint: Arc::default(),
            tuning: ClaimTuning { window: None },
        }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn display(&self) -> &str {
        &self.sql.display
    }

    pub(crate) fn set_window(&mut self, rows: usize) {
        self.tuning.window = Some(rows.max(1));
    }

    /// The window of step 1 for a claim of `limit` rows: the tuned size if set; else
    /// twice as many rows as the last step 1 needed (up to its last picked row), between
    /// `max(512, 2 × limit)` and `max(1024, 4 × limit)`; the upper bound after a step 1
    /// that found too few rows in a full window.
    ///
    /// One relay alone needs only `limit` rows of it, and a window twice that costs
    /// about 0.7 ms less per claim of 256 than the upper bound; with other relays
    /// holding rows at the head, the window grows back, so that step 1 keeps finding
    /// the free rows behind them before step 2 (a loose scan of the keys) is needed.
    fn window(&self, limit: usize) -> usize {
        if let Some(window) = self.tuning.window {
            return window;
        }
        let (low, high) = window_bounds(limit);
        self.window_hint.load(Ordering::Relaxed).clamp(low, high)
    }

    /// Remembers what a step 1 over `window` rows needed (`used`: rows up to its last
    /// picked row), and whether it came back short of `limit` with the window full.
    fn adapt_window(&self, limit: usize, used: usize, short: bool) {
        if self.tuning.window.is_some() {
            return;
        }
        let (low, high) = window_bounds(limit);
        let next = if short {
            high
        } else {
            used.saturating_mul(2).clamp(low, high)
        };
        self.window_hint.store(next, Ordering::Relaxed);
    }

    /// Binds the scope (the consumer), as the last parameter, if the table has one.
    pub(crate) fn scoped(&self, query: PgQuery) -> PgQuery {
        match (&self.scope, self.sql.scoped) {
            (Some(scope), true) => query.bind(scope.to_string()),
            _ => query,
        }
    }

    /// Claims rows; see the crate docs ("Claiming") for the algorithm.
    pub(crate) async fn claim<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        let rows = self.claim_in(&mut tx, request).await?;
        tx.commit().await.map_err(store_error)?;
        self.decode_all(request.token, &rows).await
    }

    /// Settles the rows of claim `token`, then claims, in one transaction: the claim sees
    /// the settlements, and a failure applies neither.
    pub(crate) async fn settle_and_claim<T: SpoolRow>(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        let Some(settle) = self.settle_query(token, settlements, delete_done) else {
            return self.claim(request).await;
        };
        if request.limit == 0 {
            self.settle(token, settlements, delete_done).await?;
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        // Before the claim lock, which other relays wait for: settling takes a while, and
        // it needs no lock (it touches only rows leased to `token`).
        settle.execute(&mut *tx).await.map_err(store_error)?;
        let rows = self.claim_in(&mut tx, request).await?;
        tx.commit().await.map_err(store_error)?;
        self.decode_all(request.token, &rows).await
    }

    /// The claim's statements in `tx`: the lock, step 1 and, if needed, step 2; returns
    /// the claimed rows, not yet decoded.
    async fn claim_in(
        &self,
        tx: &mut sqlx::PgConnection,
        request: &ClaimRequest,
    ) -> Result<Vec<(i64, PgRow)>> {
        let token = request.token.to_string();
        let lease = duration_ms(request.lease).max(1);
        let window = self.window(request.limit);
        let timeout = lease.max(MIN_CLAIM_TIMEOUT_MS).to_string();
        self.scoped(query(&self.sql.lock).bind(timeout))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let first = self
            .scoped(
                query(&self.sql.claim_window)
                    .bind(token.clone())
                    .bind(sql_limit(request.limit))
                    .bind(lease)
                    .bind(sql_limit(window)),
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let (window_full, used) = match first.first() {
            Some(row) => (
                row.try_get::<bool, _>("window_full").map_err(store_error)?,
                row.try_get::<i64, _>("window_used").map_err(store_error)?,
            ),
            None => (false, 0),
        };
        let mut rows = claimed_rows(first)?;
        let want = request.limit.saturating_sub(rows.len());
        self.adapt_window(
            request.limit,
            usize::try_from(used).unwrap_or(0),
            want > 0 && window_full,
        );
        if want > 0 && window_full {
            let cursor = self.lock_cursor().clone();
            let scan = MIN_KEY_SCAN.max(want.saturating_mul(KEYS_PER_ROW));
            let second = self
                .scoped(
                    query(&self.sql.claim_keys)
                        .bind(token)
                        .bind(sql_limit(want))
                        .bind(lease)
                        .bind(cursor)
                        .bind(sql_limit(scan)),
                )
                .fetch_all(&mut *tx)
                .await
                .map_err(store_error)?;
            let next: Option<String> = match second.first() {
                Some(row) => row.try_get("next_cursor").map_err(store_error)?,
                None => None,
            };
            *self.lock_cursor() = next.unwrap_or_default();
            rows.extend(claimed_rows(second)?);
        }
        Ok(rows)
    }

    /// Decodes committed claimed rows, in `seq` order (dead-lettering undecodable ones).
    async fn decode_all<T: SpoolRow>(
        &self,
        token: LeaseToken,
        rows: &[(i64, PgRow)],
    ) -> Result<Vec<Claimed<T>>> {
        let mut claimed = Vec::with_capacity(rows.len());
        for (seq, row) in rows {
            if let Some(item) = self.decode_claimed(token, *seq, row).await {
                claimed.push(item);
            }
        }
        claimed.sort_by_key(|c: &Claimed<T>| c.seq);
        Ok(claimed)
    }

    /// Runs both claim statements under `EXPLAIN (ANALYZE, BUFFERS)` in a transaction
    /// that is rolled back; returns the plans.
    pub(crate) async fn explain_claim(&self, limit: usize) -> Result<String> {
        let limit = sql_limit(limit.max(1));
        let window = self.window(usize::try_from(limit).unwrap_or(0));
        let scan = MIN_KEY_SCAN.max(usize::try_from(limit).unwrap_or(0) * KEYS_PER_ROW);
        let token = LeaseToken::new().to_string();
        let lease = 30_000_i64;
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        self.scoped(query(&self.sql.lock).bind(lease.to_string()))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let step1: Vec<String> = self
            .scoped(
                query(&self.sql.explain_window)
                    .bind(token.clone())
                    .bind(limit)
                    .bind(lease)
                    .bind(sql_limit(window)),
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(store_error)?;
        let cursor = self.lock_cursor().clone();
        let step2: Vec<String> = self
            .scoped(
                query(&self.sql.explain_keys)
                    .bind(token)
                    .bind(limit)
                    .bind(lease)
                    .bind(cursor)
                    .bind(sql_limit(scan)),
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(store_error)?;
        tx.rollback().await.map_err(store_error)?;
        Ok(format!(
            "-- step 1: window of {window} pending rows, limit {limit}\n{}\n\n\
             -- step 2: loose scan of {scan} keys, limit {limit}\n{}\n",
            step1.join("\n"),
            step2.join("\n")
        ))
    }

    fn lock_cursor(&self) -> std::sync::MutexGuard<'_, String> {
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decodes a claimed row; a row that does not decode is marked dead with the reason
    /// (it can never be delivered, and must not stall the spool) and skipped.
    async fn decode_claimed<T: SpoolRow>(
        &self,
        token: LeaseToken,
        seq: i64,
        row: &PgRow,
    ) -> Option<Claimed<T>> {
        let reader = RowReader::new(row, self.display(), format_args!("seq {seq}"));
        let decoded = reader
            .count("attempts")
            .and_then(|attempts| Ok((attempts, T::decode(&reader)?)));
        match decoded {
            Ok((attempts, item)) => Some(Claimed {
                seq,
                token,
                attempts,
                item,
            }),
            Err(error) => {
                tracing::warn!(
                    table = self.display(), seq, %error,
                    "undecodable row: dead-lettered"
                );
                let dead = [Settlement {
                    seq,
                    outcome: Settle::Dead {
                        reason: format!("undecodable row: {error}"),
                    },
                }];
                if let Err(error) = self.settle(token, &dead, false).await {
                    tracing::warn!(
                        table = self.display(), seq, %error,
                        "could not dead-letter an undecodable row; it stays leased until its lease ends"
                    );
                }
                None
            }
        }
    }

    /// Applies every settlement in one statement (atomic on its own), each row filtered
    /// by `token`; with `delete_done`, done rows are deleted instead of marked.
    pub(crate) async fn settle(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<()> {
        if let Some(settle) = self.settle_query(token, settlements, delete_done) {
            settle.execute(&self.pool).await.map_err(store_error)?;
        }
        Ok(())
    }

    /// The settle statement for `settlements`, or `None` if there are none.
    fn settle_query(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Option<PgQuery> {
        if settlements.is_empty() {
            return None;
        }
        let mut seqs = Vec::with_capacity(settlements.len());
        let mut ops = Vec::with_capacity(settlements.len());
        let mut delays = Vec::with_capacity(settlements.len());
        let mut errors = Vec::with_capacity(settlements.len());
        for settlement in settlements {
            let (op, delay, error) = match &settlement.outcome {
                Settle::Done => (sql::OP_DONE, 0, String::new()),
                Settle::Retry { at, error } => (sql::OP_RETRY, ms_until(*at), cap_error(error)),
                Settle::Dead { reason } => (sql::OP_DEAD, 0, cap_error(reason)),
                // `Release`, and any outcome added to the core later: end the lease and
                // count nothing, the one settlement that can never lose a row.
                _ => (sql::OP_RELEASE, 0, String::new()),
            };
            seqs.push(settlement.seq);
            ops.push(op);
            delays.push(delay);
            errors.push(error);
        }
        let statement = if delete_done {
            &self.sql.settle_delete
        } else {
            &self.sql.settle
        };
        Some(
            self.scoped(
                query(statement)
                    .bind(token.to_string())
                    .bind(seqs)
                    .bind(ops)
                    .bind(delays)
                    .bind(errors),
            ),
        )
    }

    /// Deletes at most `limit` done rows settled before `before`.
    pub(crate) async fn purge(&self, before: std::time::SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let result = self
            .scoped(
                query(&self.sql.purge)
                    .bind(ms_since(before))
                    .bind(sql_limit(limit)),
            )
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(result.rows_affected())
    }
}

/// The bounds of the default window for a claim of `limit` rows.
fn window_bounds(limit: usize) -> (usize, usize) {
    let high = MIN_WINDOW.max(limit.saturating_mul(WINDOW_PER_ROW));
    let low = MIN_SMALL_WINDOW
        .max(limit.saturating_mul(SMALL_WINDOW_PER_ROW))
        .min(high);
    (low, high)
}

/// The claimed rows of a claim statement (whose left join yields one row of NULLs when
/// nothing was claimed), with their `seq`.
fn claimed_rows(rows: Vec<PgRow>) -> Result<Vec<(i64, PgRow)>> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let seq: Option<i64> = row.try_get("seq").map_err(store_error)?;
        if let Some(seq) = seq {
            claimed.push((seq, row));
        }
    }
    Ok(claimed)
}

/// A row count for `LIMIT`.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Error text cut to [`MAX_ERROR_CHARS`], on a character boundary, without NUL bytes
/// (which `text` cannot hold).
pub(crate) fn cap_error(error: &str) -> String {
    let clean: String = error.chars().filter(|c| *c != '\0').collect();
    match clean.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &clean[..cut]),
        None => clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_capped_on_char_boundaries() {
        assert_eq!(cap_error("short"), "short");
        assert_eq!(cap_error("nul\0byte"), "nulbyte");
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        assert_eq!(cap_error(&long).chars().count(), MAX_ERROR_CHARS + 1);
    }
}
