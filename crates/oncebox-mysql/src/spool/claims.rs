//! The table of claims: which rows each live claim holds.
//!
//! A claim is one row of `oncebox_claims`: its spool (the table's name in
//! `oncebox_claim_locks`), its token, the end of its lease and the `seq`s it holds, as a
//! JSON array. Claims are recorded only under the spool's claim lock, and each claim
//! first deletes the claims whose lease ended; so the live claims of a spool never hold
//! the same row, and a claim that is gone holds nothing.
//!
//! A settlement locks its claim's row first ([`SpoolTable::held`]) and applies only to
//! the rows the claim still holds: a relay whose lease ended and whose claim another
//! relay deleted changes nothing. The claimer's delete waits for a settlement in flight,
//! so it never takes rows that settlement is about to change.
//!
//! A process also remembers the rows and keys of the claims it made ([`OwnClaims`]).
//! Those claims' rows need not be read again by the next claim's window: a pipelining
//! relay claims its next batch while the last one is still held, and would otherwise
//! read every held row only to learn its key. And since the process knows which rows
//! its window will pass over, the window can be read in the same request as the
//! claims (see `ReadAhead`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::spool::LeaseToken;
use oncebox_core::{Error, Result};
use sqlx::Row;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::script::{Script, Value};
use super::{SpoolTable, sql};
use crate::error::{RowReader, store_error};
use crate::sql::{query, uuid_bytes};

/// The rows the live claims of a spool hold, as a claim reads them under the claim lock.
#[derive(Debug, Default)]
pub(super) struct Held {
    seqs: HashSet<i64>,
    /// The rows of this process's own claims, in `seq` order: the window passes over
    /// them, as [`keys`](Self::holds_key) stands in for what reading them would tell.
    skip: Vec<i64>,
    /// Those claims, whose keys stand for the rows passed over.
    own: Vec<Arc<OwnClaim>>,
}

impl Held {
    pub(super) fn contains(&self, seq: i64) -> bool {
        self.seqs.contains(&seq)
    }

    /// Whether a row of `key` is held by one of this process's claims, whose rows the
    /// window did not read.
    pub(super) fn holds_key(&self, key: &[u8]) -> bool {
        self.own.iter().any(|claim| claim.keys.contains(key))
    }

    /// The held rows the window need not read, in `seq` order.
    pub(super) fn skip(&self) -> &[i64] {
        &self.skip
    }

    pub(super) fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Counts `seqs` as held: rows this claim has taken.
    pub(super) fn add(&mut self, seqs: impl IntoIterator<Item = i64>) {
        self.seqs.extend(seqs);
    }
}

/// The live claims this process made on one spool, by token; shared by the clones of a
/// [`SpoolTable`].
///
/// Only the process that made a claim records rows in it, so what it remembers covers
/// every row the claim holds. A claim that failed to commit, or that ended, is
/// forgotten at the next claim, which no longer finds it among the live claims.
#[derive(Debug, Default)]
pub(super) struct OwnClaims(Mutex<ClaimsByToken>);

/// Claims this process made, by token.
type ClaimsByToken = HashMap<Vec<u8>, Arc<OwnClaim>>;

/// What a process remembers of a claim it made.
#[derive(Debug, Clone)]
pub(super) struct OwnClaim {
    /// The rows the claim holds, as far as this process knows: those it took, less those
    /// settled since.
    seqs: Vec<i64>,
    /// The keys of the rows it took (a superset after a settlement: a claim only loses
    /// rows after it is made).
    keys: HashSet<Vec<u8>>,
}

impl OwnClaims {
    /// Remembers that the claim `token` holds `seqs`, whose keys are `keys` (rows
    /// without a key add none).
    pub(super) fn remember(&self, token: Vec<u8>, seqs: Vec<i64>, keys: HashSet<Vec<u8>>) {
        self.lock().insert(token, Arc::new(OwnClaim { seqs, keys }));
    }

    /// Forgets the claim `token`, which was not recorded.
    pub(super) fn forget(&self, token: &[u8]) {
        self.lock().remove(token);
    }

    /// After a settlement of claim `token`: it holds only the `remaining` rows.
    pub(super) fn settled(&self, token: &[u8], remaining: &[i64]) {
        let mut own = self.lock();
        if remaining.is_empty() {
            own.remove(token);
        } else if let Some(claim) = own.get_mut(token) {
            Arc::make_mut(claim).seqs = remaining.to_vec();
        }
    }

    /// The rows the claim `token` holds as this process remembers them, in the order it
    /// wrote them; `None` if it does not remember the claim.
    pub(super) fn seqs(&self, token: &[u8]) -> Option<Vec<i64>> {
        self.lock().get(token).map(|claim| claim.seqs.clone())
    }

    /// The rows of the claims this process believes live, in `seq` order: what the next
    /// window passes over if the claims read under the claim lock agree.
    pub(super) fn skip(&self) -> Vec<i64> {
        let mut skip: Vec<i64> = self
            .lock()
            .values()
            .flat_map(|claim| claim.seqs.iter().copied())
            .collect();
        skip.sort_unstable();
        skip
    }

    /// Forgets every claim but the `live` ones; returns those it remembers, by token.
    fn keep(&self, live: &HashSet<&[u8]>) -> ClaimsByToken {
        let mut own = self.lock();
        own.retain(|token, _| live.contains(token.as_slice()));
        own.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClaimsByToken> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SpoolTable {
    /// Takes the claim lock and reads the spool's claims: appended to `script`, which
    /// [`live_claims`](Self::live_claims) reads the result of.
    pub(super) fn lock_and_read_claims(&self, script: &mut Script) {
        let spool = Value::Bytes(self.lock_name.as_bytes());
        script.push(&self.sql.lock, &[], &[spool]);
        script.push(&self.sql.claims, &[], &[spool]);
    }

    /// From the `rows` of the spool's claims, read under the claim lock: deletes those
    /// whose lease has ended and returns the rows the others hold.
    pub(super) async fn live_claims(
        &self,
        conn: &mut MySqlConnection,
        rows: &[MySqlRow],
    ) -> Result<Held> {
        let mut held = Held::default();
        let mut live = Vec::with_capacity(rows.len());
        for row in rows {
            let token: Vec<u8> = row.try_get("token").map_err(store_error)?;
            let until: i64 = row.try_get("lease_until").map_err(store_error)?;
            let now: i64 = row.try_get("now_ms").map_err(store_error)?;
            if until > now {
                live.push((token, claim_seqs(row)?));
            } else {
                // Waits for a settlement of this claim in flight, which may still apply.
                query(&self.sql.drop_ended)
                    .bind(self.spool())
                    .bind(token)
                    .execute(&mut *conn)
                    .await
                    .map_err(store_error)?;
            }
        }
        let tokens: HashSet<&[u8]> = live.iter().map(|(token, _)| token.as_slice()).collect();
        let own = self.own.keep(&tokens);
        for (token, seqs) in &live {
            if let Some(claim) = own.get(token) {
                held.skip.extend(seqs);
                held.own.push(Arc::clone(claim));
            }
            held.seqs.extend(seqs);
        }
        held.skip.sort_unstable();
        Ok(held)
    }

    /// Records the claim `token` of `seqs` until `until` (ms, the database's clock), or
    /// adds `seqs` to it; appended to `script`, which must run under the claim lock.
    pub(super) fn record_claim(&self, script: &mut Script, token: &[u8], until: i64, seqs: &[i64]) {
        script.push(
            &self.sql.record_claim,
            &[],
            &[
                Value::Bytes(self.lock_name.as_bytes()),
                Value::Bytes(token),
                Value::Int(until),
                Value::Seqs(seqs),
            ],
        );
    }

    /// As [`record_claim`](Self::record_claim), if the rows `as_read` (some of `seqs`,
    /// those step 1 took as it read them, unlocked) can all be locked still pending;
    /// else nothing is recorded. Appended to `script`, which must run under the claim
    /// lock. Returns the index, in the script's results, of the row that says whether
    /// the claim was recorded ([`recorded`]); `None`, with a plain record, if `as_read`
    /// is empty.
    ///
    /// The rows are locked `SKIP LOCKED`, so the claim never waits for a transaction
    /// that holds one of them: a cancel in a transaction its caller keeps open
    /// (see `MySqlOutbox::cancel`). Their locks last the little that is left of the
    /// claim's transaction, which commits in the same request.
    pub(super) fn record_claim_if_locked(
        &self,
        script: &mut Script,
        token: &[u8],
        until: i64,
        seqs: &[i64],
        as_read: &[i64],
    ) -> Option<usize> {
        if as_read.is_empty() {
            self.record_claim(script, token, until, seqs);
            return None;
        }
        let lock = self
            .sql
            .lock_taken
            .replace(sql::SEQ_RUNS, &sql::seq_runs(as_read));
        script.push(&lock, &[], &[]);
        script.push(
            &self.sql.record_claim_if_locked,
            &[],
            &[
                Value::Bytes(self.lock_name.as_bytes()),
                Value::Bytes(token),
                Value::Int(until),
                Value::Seqs(seqs),
                Value::Int(i64::try_from(as_read.len()).unwrap_or(i64::MAX)),
            ],
        );
        let flag = script.len();
        script.push(sql::READ_RECORDED, &[], &[]);
        Some(flag)
    }

    /// [`record_claim`](Self::record_claim) at once, in `conn`'s transaction.
    pub(crate) async fn record_claim_in(
        &self,
        conn: &mut MySqlConnection,
        token: &[u8],
        until: i64,
        seqs: &[i64],
    ) -> Result<()> {
        let mut script = Script::default();
        self.record_claim(&mut script, token, until, seqs);
        script.run(conn).await?;
        Ok(())
    }

    /// Locks the claim `token` for a settlement; appended to `script`, whose rows
    /// [`held`](Self::held) reads.
    pub(super) fn lock_claim(&self, script: &mut Script, token: &[u8]) {
        script.push(
            &self.sql.held,
            &[],
            &[Value::Bytes(self.lock_name.as_bytes()), Value::Bytes(token)],
        );
    }

    /// The rows the claim locked by [`lock_claim`](Self::lock_claim) holds, from the
    /// `rows` that statement returned; `None` if the claim is gone (its lease ended and
    /// another claim took its place).
    pub(super) fn held(rows: &[MySqlRow]) -> Result<Option<HashSet<i64>>> {
        rows.first()
            .map(|row| claim_seqs(row).map(|seqs| seqs.into_iter().collect()))
            .transpose()
    }

    /// Whether the claim `token` holds row `seq`, the claim's row locked in share mode
    /// to the end of the transaction: concurrent completions of one claim's rows do not
    /// wait for each other, and a claimer deleting the claim once its lease ended waits
    /// for the transaction (for the durable inbox's `complete`).
    pub(crate) async fn holds(
        &self,
        conn: &mut MySqlConnection,
        token: LeaseToken,
        seq: i64,
    ) -> Result<bool> {
        let row = query(&self.sql.holds)
            .bind(self.spool())
            .bind(uuid_bytes(token.as_uuid()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        match row {
            Some(row) => Ok(claim_seqs(&row)?.contains(&seq)),
            None => Ok(false),
        }
    }

    /// After a settlement: keeps the claim `token` for the rows it still holds, or
    /// deletes it when it holds none; appended to `script`.
    pub(super) fn keep_claim(&self, script: &mut Script, token: &[u8], remaining: &[i64]) {
        let spool = self.lock_name.as_bytes();
        if remaining.is_empty() {
            script.push(
                &self.sql.drop_claim,
                &[],
                &[Value::Bytes(spool), Value::Bytes(token)],
            );
        } else {
            script.push(
                &self.sql.shrink_claim,
                &[],
                &[
                    Value::Seqs(remaining),
                    Value::Bytes(spool),
                    Value::Bytes(token),
                ],
            );
        }
    }

    /// As [`keep_claim`](Self::keep_claim), if the claim `token` holds exactly the rows
    /// `written`, as this process wrote them; followed by the record of whether it did
    /// ([`sql::SETTLED`]).
    pub(super) fn keep_claim_if(
        &self,
        script: &mut Script,
        token: &[u8],
        written: &[i64],
        remaining: &[i64],
    ) {
        let spool = Value::Bytes(self.lock_name.as_bytes());
        let token = Value::Bytes(token);
        if remaining.is_empty() {
            script.push(
                &self.sql.drop_claim_if,
                &[],
                &[spool, token, Value::Seqs(written)],
            );
        } else {
            script.push(
                &self.sql.shrink_claim_if,
                &[],
                &[Value::Seqs(remaining), spool, token, Value::Seqs(written)],
            );
        }
        script.push(sql::SETTLED, &[], &[]);
    }
}

/// Whether the claim of a [`SpoolTable::record_claim_if_locked`] was recorded, from the
/// `results` of its script and the index it returned.
pub(super) fn recorded(results: &[Vec<MySqlRow>], flag: usize) -> Result<bool> {
    let row = results.get(flag).and_then(|rows| rows.first());
    let recorded: Option<i64> = match row {
        Some(row) => row.try_get("recorded").map_err(store_error)?,
        None => None,
    };
    Ok(recorded.is_some_and(|rows| rows > 0))
}

/// A claim row's `seqs`; a permanent error naming the claim if they are not a JSON
/// array of integers (written by something other than oncebox).
fn claim_seqs(row: &MySqlRow) -> Result<Vec<i64>> {
    let reader = RowReader::new(row, "oncebox_claims", "a claim");
    let seqs: String = reader.get("seqs")?;
    serde_json::from_str(&seqs).map_err(|e| Error::from(reader.error("seqs", e)))
}
