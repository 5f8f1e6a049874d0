//! Held claims: a claim locks its rows (`FOR UPDATE SKIP LOCKED`) in a transaction that
//! stays open while they are delivered, and their settlements commit in it.
//!
//! Nothing is written at claim time, so each row is written once (its settlement), not
//! twice (a lease, then the settlement): the claim is the lock, held until the
//! transaction ends. What a lease did comes with the transaction:
//!
//! - **Exclusion.** Other claims skip locked rows, and cut each key at its first row they
//!   could not lock (the per-key rule), exactly as at a leased row.
//! - **Expiry and fencing.** The transaction's idle timeout is the lease: a relay that
//!   stops talking for longer loses its connection, the server rolls its transaction
//!   back and another relay claims the rows at once. A relay that dies drops its
//!   connection, with the same effect, without waiting for a lease to end. Locally, a
//!   claim whose lease has passed is rolled back instead of settled; its rows are
//!   delivered again, as after an expired lease.
//! - **Settling and the next claim** take two round trips on the same connection: the
//!   settlement, `COMMIT` and `BEGIN; <settings and lock>` as one simple query (when
//!   every row was delivered, the settlement carries the rows' places written in; else
//!   a prepared settle statement goes first, one more round trip), then the claim.
//!
//! The sqlx [`Transaction`] kept for a claim stays open across those messages: after
//! `COMMIT; BEGIN` the connection is in a transaction again, as sqlx believes, so
//! dropping it (a cancelled call, a relay that goes away) rolls back whatever claim it
//! holds, and returns the connection to the pool clean.
//!
//! The costs: each claim in flight holds a pool connection until it is settled (a
//! pipelining relay holds two), and its transaction is open for the delivery time (its
//! transaction id holds back vacuum's horizon that long, and monitoring shows the
//! session idle in transaction). Claims without rows commit at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use oncebox_core::{Error, Result};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::sql::HeldSql;
use super::{
    Hold, MIN_CLAIM_TIMEOUT_MS, PgQuery, Previous, SettleArrays, SpoolRow, SpoolTable, query,
};
use crate::error::store_error;
use crate::time::duration_ms;

/// The open transactions of held claims, by token.
#[derive(Default)]
pub(crate) struct HeldClaims {
    claims: Mutex<HashMap<LeaseToken, Held>>,
}

/// One held claim: its transaction, the rows it claimed, and when its lease ends.
pub(crate) struct Held {
    tx: Transaction<'static, Postgres>,
    /// The claimed rows' `seq`s, sorted, and where each is: settlements of other rows
    /// are ignored.
    rows: Vec<(i64, Tid)>,
    until: Instant,
}

/// Where a row is (its `ctid`): a block of the table and a line in it. Parsed from the
/// server's text and written back from the two numbers, so that nothing else can get
/// into a statement that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tid {
    block: u32,
    line: u16,
}

impl Tid {
    /// Parses `(block,line)`.
    fn parse(text: &str) -> Option<Self> {
        let (block, line) = text.strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
        Some(Self {
            block: block.parse().ok()?,
            line: line.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Tid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({},{})", self.block, self.line)
    }
}

/// What [`HeldClaims::take`] found for a token.
pub(crate) enum Taken {
    /// The claim, still within its lease; the caller settles it.
    Held(Held),
    /// The claim, past its lease: rolled back (its rows are claimable again).
    Expired,
    /// No held claim by that token: a leased claim, or one settled or expired already.
    Unknown,
}

impl HeldClaims {
    /// Takes the claim `token` out, and rolls back every claim past its lease (they
    /// would be refused by the server's idle timeout anyway, and each holds a pool
    /// connection until dropped).
    pub(crate) fn take(&self, token: LeaseToken) -> Taken {
        let (taken, expired) = {
            let mut claims = self.lock();
            let taken = claims.remove(&token);
            (taken, sweep(&mut claims))
        };
        let now = Instant::now();
        let taken = match taken {
            Some(held) if held.until > now => Taken::Held(held),
            Some(_) => {
                tracing::warn!(
                    %token,
                    "a held claim was settled after its lease ended: rolled back, its rows \
                     will be delivered again"
                );
                Taken::Expired
            }
            None => Taken::Unknown,
        };
        drop(expired);
        taken
    }

    /// Keeps `held` under `token` until it is settled.
    fn insert(&self, token: LeaseToken, held: Held) {
        let expired = {
            let mut claims = self.lock();
            claims.insert(token, held);
            sweep(&mut claims)
        };
        drop(expired);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, Held>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for HeldClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldClaims")
            .field("open", &self.lock().len())
            .finish()
    }
}

/// Removes the claims past their lease, to be dropped (rolled back) after the lock on
/// the map is released.
fn sweep(claims: &mut HashMap<LeaseToken, Held>) -> Vec<Held> {
    let now = Instant::now();
    if claims.values().all(|held| held.until > now) {
        return Vec::new();
    }
    let expired: Vec<LeaseToken> = claims
        .iter()
        .filter(|(_, held)| held.until <= now)
        .map(|(token, _)| *token)
        .collect();
    if !expired.is_empty() {
        tracing::warn!(
            claims = expired.len(),
            "held claims not settled within their lease: rolled back, their rows will be \
             delivered again"
        );
    }
    expired
        .iter()
        .filter_map(|token| claims.remove(token))
        .collect()
}

impl SpoolTable {
    /// The held statements; only called where [`Hold::Transaction`] was accepted.
    fn held_sql(&self) -> Result<&HeldSql> {
        self.sql.held.as_ref().ok_or_else(|| {
            Error::store_permanent(format!(
                "{}: held claims on a table without held statements",
                self.display()
            ))
        })
    }

    /// The statements that open a claim transaction for `request`, after ending the
    /// connection's previous one as `previous` says.
    pub(super) fn held_begin(
        &self,
        held: &HeldSql,
        previous: Previous,
        request: &ClaimRequest,
    ) -> String {
        let lease = duration_ms(request.lease).max(1);
        held.begin(previous, lease.max(MIN_CLAIM_TIMEOUT_MS), lease)
    }

    /// Extends a held claim: a statement in its transaction restarts the server's idle
    /// timeout (the lease), then the claim is kept until `lease` from the statement's
    /// sending. A failed statement ends the transaction, and with it the claim.
    pub(super) async fn extend_held(
        &self,
        token: LeaseToken,
        mut held: Held,
        lease: std::time::Duration,
    ) -> Result<()> {
        let sent = Instant::now();
        match sqlx::query("SELECT 1").execute(&mut *held.tx).await {
            Ok(_) => {
                held.until = sent + lease;
                self.held.insert(token, held);
                Ok(())
            }
            Err(error) => {
                tracing::warn!(%token, %error, "extending a held claim failed: rolled back");
                Err(Error::LeaseLost)
            }
        }
    }

    /// Claims in a new transaction, kept open if it claimed rows.
    pub(super) async fn claim_held<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        let held = self.held_sql()?;
        let begin = self.held_begin(held, Previous::None, request);
        let tx = self
            .pool
            .begin_with(AssertSqlSafe(begin))
            .await
            .map_err(store_error)?;
        self.claim_on(tx, request).await
    }

    /// Runs the claim in `tx`, which has begun as [`HeldSql::begin`] says. Claimed rows
    /// stay locked in `tx`, kept under the request's token; undecodable ones are
    /// dead-lettered in it; without rows `tx` commits at once.
    async fn claim_on<T: SpoolRow>(
        &self,
        mut tx: Transaction<'static, Postgres>,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if request.limit == 0 {
            tx.commit().await.map_err(store_error)?;
            return Ok(Vec::new());
        }
        let rows = self.claim_in(&mut tx, Hold::Transaction, request).await?;
        let mut places = places(&rows)?;
        places.sort_unstable_by_key(|(seq, _)| *seq);
        let (claimed, dead) = self.decode_all::<T>(request.token, &rows);
        if let Some(settle) = self.held_settle_query(&places, &dead, false)? {
            settle.execute(&mut *tx).await.map_err(store_error)?;
        }
        if claimed.is_empty() {
            tx.commit().await.map_err(store_error)?;
            return Ok(claimed);
        }
        // Sorted by `seq`, as `claimed` is.
        let rows: Vec<(i64, Tid)> = places
            .into_iter()
            .filter(|(seq, _)| claimed.binary_search_by_key(seq, |row| row.seq).is_ok())
            .collect();
        let held = Held {
            tx,
            rows,
            until: Instant::now() + request.lease,
        };
        self.held.insert(request.token, held);
        Ok(claimed)
    }

    /// Applies `settlements` in the claim's transaction and commits it.
    pub(super) async fn settle_held(
        &self,
        held: Held,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<()> {
        let mut tx = held.tx;
        match self.held_settlement(&held.rows, settlements, delete_done)? {
            HeldSettlement::None => {}
            HeldSettlement::Inline(sql) => {
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
            }
            HeldSettlement::Prepared(settle) => {
                settle.execute(&mut *tx).await.map_err(store_error)?;
            }
        }
        tx.commit().await.map_err(store_error)
    }

    /// Applies `settlements` in the claim's transaction, commits it and begins the next
    /// claim's (one round trip when every row was delivered, the settlement riding in the
    /// same message; two otherwise), and claims in that.
    pub(super) async fn settle_and_claim_held<T: SpoolRow>(
        &self,
        held: Held,
        settlements: &[Settlement],
        delete_done: bool,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if request.limit == 0 {
            self.settle_held(held, settlements, delete_done).await?;
            return Ok(Vec::new());
        }
        let held_sql = self.held_sql()?;
        let mut tx = held.tx;
        let next = self.held_begin(held_sql, Previous::Commit, request);
        // If a statement fails, the rest of the message is not run, and `tx` is rolled
        // back when dropped (with a warning from the server if the COMMIT was what
        // failed: no transaction is open then).
        let next = match self.held_settlement(&held.rows, settlements, delete_done)? {
            HeldSettlement::None => next,
            HeldSettlement::Inline(sql) => format!("{sql}; {next}"),
            HeldSettlement::Prepared(settle) => {
                settle.execute(&mut *tx).await.map_err(store_error)?;
                next
            }
        };
        sqlx::raw_sql(AssertSqlSafe(next))
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        self.claim_on(tx, request).await
    }

    /// How to settle a held claim's `rows`: with the claim's own settlements only, and
    /// without parameters when every one of them is delivered or released (the common
    /// case: no error text to carry).
    fn held_settlement(
        &self,
        rows: &[(i64, Tid)],
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<HeldSettlement> {
        let own: Vec<Settlement> = settlements
            .iter()
            .filter(|settlement| place(rows, settlement.seq).is_some())
            .cloned()
            .collect();
        let delivered = own
            .iter()
            .all(|s| matches!(s.outcome, Settle::Done | Settle::Release));
        if delivered {
            let done = own
                .iter()
                .filter(|s| s.outcome == Settle::Done)
                .filter_map(|s| place(rows, s.seq));
            return Ok(match self.held_sql()?.settle_done(delete_done, done) {
                Some(sql) => HeldSettlement::Inline(sql),
                None => HeldSettlement::None,
            });
        }
        Ok(match self.held_settle_query(rows, &own, delete_done)? {
            Some(settle) => HeldSettlement::Prepared(settle),
            None => HeldSettlement::None,
        })
    }

    /// The held settle statement for `settlements` of `rows`, or `None` if there are
    /// none.
    fn held_settle_query(
        &self,
        rows: &[(i64, Tid)],
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<Option<PgQuery>> {
        let Some(arrays) = SettleArrays::new(settlements.iter()) else {
            return Ok(None);
        };
        let held = self.held_sql()?;
        let statement = if delete_done {
            &held.settle_delete
        } else {
            &held.settle
        };
        let places: Vec<String> = settlements
            .iter()
            .map(|s| place(rows, s.seq).map_or_else(String::new, |tid| tid.to_string()))
            .collect();
        Ok(Some(arrays.bind(query(statement).bind(places))))
    }
}

/// A held claim's settlement statement.
enum HeldSettlement {
    /// Nothing to write (no rows, or only releases).
    None,
    /// Without parameters: may share a message with the `COMMIT`.
    Inline(String),
    Prepared(PgQuery),
}

/// Where the claimed row `seq` is, if the claim holds it (`rows` sorted by `seq`).
fn place(rows: &[(i64, Tid)], seq: i64) -> Option<Tid> {
    rows.binary_search_by_key(&seq, |(s, _)| *s)
        .ok()
        .map(|i| rows[i].1)
}

/// The `seq` and place of each claimed row.
fn places(rows: &[(i64, PgRow)]) -> Result<Vec<(i64, Tid)>> {
    rows.iter()
        .map(|(seq, row)| {
            let text: String = row.try_get("tid").map_err(store_error)?;
            let tid = Tid::parse(&text).ok_or_else(|| {
                Error::store_permanent(format!("unexpected ctid {text:?} of seq {seq}"))
            })?;
            Ok((*seq, tid))
        })
        .collect()
}
