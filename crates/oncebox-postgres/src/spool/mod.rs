//! Claim, settle and purge over a spool table; shared by the outbox, the durable inbox
//! and Debezium-style outboxes, which differ only in their [`Layout`] and in how their
//! claims hold rows ([`Hold`]: leases written into the rows, or the claim's own open
//! transaction, see [`held`]).

mod explain;
mod held;
mod settle;
pub(crate) mod sql;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::Result;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, Row};

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::time::duration_ms;

use held::{HeldClaims, Taken};
use settle::SettleArrays;
pub(crate) use sql::{Hold, Layout, Previous, SpoolSql};

/// Step 1 of a claim examines at most this many pending rows by default...
const MIN_WINDOW: usize = 1024;
/// ...or this many per row asked for, if more.
const WINDOW_PER_ROW: usize = 4;
/// The default window adapts between these bounds (`SpoolTable::window`); it is at
/// least this many rows...
const MIN_SMALL_WINDOW: usize = 512;
/// ...and at least this many per row asked for.
const SMALL_WINDOW_PER_ROW: usize = 2;
/// After a held claim's fast claim was blocked, the next this many held claims of the
/// table (by this handle and its clones) go straight to step 1.
const FAST_BACKOFF: usize = 16;
/// A held claim's window is a multiple of this many rows (each window size is a
/// statement of its own, prepared once per connection; see `HeldSql::claim_window`).
const WINDOW_STEP: usize = 128;
/// Step 2 probes at least this many keys...
const MIN_KEY_SCAN: usize = 256;
/// ...and at least this many per row asked for.
const KEYS_PER_ROW: usize = 4;

/// The claim's statement timeout is its lease, at least this (and so is a leased claim
/// transaction's idle timeout; a held claim's is the lease itself).
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
    /// How claims hold their rows; [`Hold::Transaction`] only where `sql.held` is set.
    hold: Hold,
    /// The open transactions of held claims, by token; shared by clones (a claim may be
    /// settled through any clone), not by other handles on the table.
    held: Arc<HeldClaims>,
    /// Held claims to make before trying the fast claim again; shared by clones.
    fast_backoff: Arc<AtomicUsize>,
}

impl SpoolTable {
    /// A handle on the table whose claims hold rows as `hold` says (a scoped table's
    /// always by lease).
    pub(crate) fn new(
        pool: PgPool,
        sql: Arc<SpoolSql>,
        scope: Option<Arc<str>>,
        hold: Hold,
    ) -> Self {
        let mut table = Self {
            pool,
            sql,
            scope,
            cursor: Arc::default(),
            window_hint: Arc::default(),
            tuning: ClaimTuning { window: None },
            hold: Hold::Lease,
            held: Arc::default(),
            fast_backoff: Arc::default(),
        };
        table.set_hold(hold);
        table
    }

    /// Sets how claims hold their rows from now on; [`Hold::Transaction`] is ignored on a
    /// table without held statements (scoped). Claims held already are settled as they
    /// were made.
    pub(crate) fn set_hold(&mut self, hold: Hold) {
        self.hold = match (hold, &self.sql.held) {
            (Hold::Transaction, Some(_)) => Hold::Transaction,
            _ => Hold::Lease,
        };
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
        if self.hold == Hold::Transaction {
            return self.claim_held(request).await;
        }
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        let rows = self.claim_in(&mut tx, Hold::Lease, request).await?;
        tx.commit().await.map_err(store_error)?;
        let (claimed, dead) = self.decode_all(request.token, &rows);
        self.dead_letter_leased(request.token, &dead).await;
        Ok(claimed)
    }

    /// Settles the rows of claim `token`, then claims, in one transaction: the claim sees
    /// the settlements, and a failure applies neither. A held claim's settlements commit
    /// in its transaction instead, and the new claim's transaction begins on the same
    /// connection in the same round trip.
    pub(crate) async fn settle_and_claim<T: SpoolRow>(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        match self.held.take(token) {
            Taken::Held(held) => {
                return self
                    .settle_and_claim_held(held, settlements, delete_done, request)
                    .await;
            }
            Taken::Expired => return self.claim(request).await,
            Taken::Unknown => {}
        }
        let Some(settle) = self.settle_query(token, settlements, delete_done) else {
            return self.claim(request).await;
        };
        if request.limit == 0 || self.hold == Hold::Transaction {
            // Nothing to claim, or claims are held now (the settled claim was leased
            // before the hold changed): the settlement on its own, then the claim.
            settle.execute(&self.pool).await.map_err(store_error)?;
            return self.claim(request).await;
        }
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        // Before the claim lock, which other relays wait for: settling takes a while, and
        // it needs no lock (it touches only rows leased to `token`).
        settle.execute(&mut *tx).await.map_err(store_error)?;
        let rows = self.claim_in(&mut tx, Hold::Lease, request).await?;
        tx.commit().await.map_err(store_error)?;
        let (claimed, dead) = self.decode_all(request.token, &rows);
        self.dead_letter_leased(request.token, &dead).await;
        Ok(claimed)
    }

    /// Dead-letters a leased claim's undecodable rows, in a statement of its own (the
    /// claim has committed).
    async fn dead_letter_leased(&self, token: LeaseToken, dead: &[Settlement]) {
        if dead.is_empty() {
            return;
        }
        if let Err(error) = self.settle(token, dead, false).await {
            tracing::warn!(
                table = self.display(), %error,
                "could not dead-letter undecodable rows; they stay leased until their lease ends"
            );
        }
    }

    /// The claim's statements in `tx`: for a leased claim the lock, then step 1 and, if
    /// needed, step 2 (a held claim's transaction took its lock when it began); returns
    /// the claimed rows, not yet decoded, in no particular order.
    async fn claim_in(
        &self,
        tx: &mut sqlx::PgConnection,
        hold: Hold,
        request: &ClaimRequest,
    ) -> Result<Vec<(i64, PgRow)>> {
        let token = request.token.to_string();
        let lease = duration_ms(request.lease).max(1);
        let limit = sql_limit(request.limit);
        let window = self.window(request.limit);
        let held = match (hold, &self.sql.held) {
            (Hold::Transaction, Some(held)) => Some(held),
            _ => None,
        };
        if let Some(held) = held
            && let Some(rows) = self.claim_first(tx, held, request).await?
        {
            return Ok(rows);
        }
        let step1 = match held {
            Some(held) => {
                let window = sql_limit(window.div_ceil(WINDOW_STEP) * WINDOW_STEP);
                sqlx::query(AssertSqlSafe(held.claim_window(limit, window)))
            }
            None => {
                let timeout = lease.max(MIN_CLAIM_TIMEOUT_MS).to_string();
                self.scoped(query(&self.sql.lock).bind(timeout))
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
                self.scoped(
                    query(&self.sql.claim_window)
                        .bind(token.clone())
                        .bind(limit)
                        .bind(lease)
                        .bind(sql_limit(window)),
                )
            }
        };
        let first = step1.fetch_all(&mut *tx).await.map_err(store_error)?;
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
            let scan = sql_limit(MIN_KEY_SCAN.max(want.saturating_mul(KEYS_PER_ROW)));
            let step2 = match held {
                Some(held) => query(&held.claim_keys)
                    .bind(sql_limit(want))
                    .bind(cursor)
                    .bind(scan),
                None => self.scoped(
                    query(&self.sql.claim_keys)
                        .bind(token)
                        .bind(sql_limit(want))
                        .bind(lease)
                        .bind(cursor)
                        .bind(scan),
                ),
            };
            let second = step2.fetch_all(&mut *tx).await.map_err(store_error)?;
            let next: Option<String> = match second.first() {
                Some(row) => row.try_get("next_cursor").map_err(store_error)?,
                None => None,
            };
            *self.lock_cursor() = next.unwrap_or_default();
            // A held claim's step 2 may find rows its step 1 locked (its own locks do not
            // stop it); they are claimed once.
            let first_seqs: HashSet<i64> = rows.iter().map(|(seq, _)| *seq).collect();
            rows.extend(
                claimed_rows(second)?
                    .into_iter()
                    .filter(|(seq, _)| !first_seqs.contains(seq)),
            );
        }
        Ok(rows)
    }

    /// A held claim's fast claim (see [`sql`]'s `claim_first`), unless one was blocked
    /// lately: the claimed rows, or `None` if the caller must run step 1. A blocked fast
    /// claim is rolled back, and `tx` begun again, before `None` returns.
    async fn claim_first(
        &self,
        tx: &mut sqlx::PgConnection,
        held: &sql::HeldSql,
        request: &ClaimRequest,
    ) -> Result<Option<Vec<(i64, PgRow)>>> {
        let skip = self
            .fast_backoff
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if skip.is_ok() {
            return Ok(None);
        }
        let rows = sqlx::query(AssertSqlSafe(held.claim_first(sql_limit(request.limit))))
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let blocked = match rows.first() {
            Some(row) => row.try_get::<bool, _>("blocked").map_err(store_error)?,
            None => false,
        };
        if !blocked {
            return Ok(Some(claimed_rows(rows)?));
        }
        self.fast_backoff.store(FAST_BACKOFF, Ordering::Relaxed);
        let again = self.held_begin(held, Previous::Rollback, request);
        sqlx::raw_sql(AssertSqlSafe(again))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        Ok(None)
    }

    /// Decodes claimed rows, in `seq` order; returns them and a dead settlement for
    /// each row that does not decode (it can never be delivered, and must not stall the
    /// spool: the caller dead-letters it with the reason).
    fn decode_all<T: SpoolRow>(
        &self,
        token: LeaseToken,
        rows: &[(i64, PgRow)],
    ) -> (Vec<Claimed<T>>, Vec<Settlement>) {
        let mut claimed = Vec::with_capacity(rows.len());
        let mut dead = Vec::new();
        for (seq, row) in rows {
            let seq = *seq;
            let reader = RowReader::new(row, self.display(), format_args!("seq {seq}"));
            let decoded = reader
                .count("attempts")
                .and_then(|attempts| Ok((attempts, T::decode(&reader)?)));
            match decoded {
                Ok((attempts, item)) => claimed.push(Claimed {
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
                    dead.push(Settlement {
                        seq,
                        outcome: Settle::Dead {
                            reason: format!("undecodable row: {error}"),
                        },
                    });
                }
            }
        }
        claimed.sort_by_key(|c: &Claimed<T>| c.seq);
        (claimed, dead)
    }

    fn lock_cursor(&self) -> std::sync::MutexGuard<'_, String> {
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
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

pub(crate) use oncebox_core::sql::sql_limit;
