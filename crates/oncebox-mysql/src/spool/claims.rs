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

use std::collections::HashSet;

use oncebox_core::spool::LeaseToken;
use oncebox_core::{Error, Result};
use sqlx::Row;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::SpoolTable;
use crate::error::{RowReader, store_error};
use crate::sql::{query, uuid_bytes};

/// The rows the live claims of a spool hold, as a claim reads them under the claim lock.
#[derive(Debug, Default)]
pub(super) struct Held {
    seqs: HashSet<i64>,
}

impl Held {
    pub(super) fn contains(&self, seq: i64) -> bool {
        self.seqs.contains(&seq)
    }

    pub(super) fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Counts `seqs` as held: rows this claim has taken.
    pub(super) fn add(&mut self, seqs: impl IntoIterator<Item = i64>) {
        self.seqs.extend(seqs);
    }
}

impl SpoolTable {
    /// Reads the spool's claims and deletes those whose lease has ended; returns the
    /// rows the others hold. Runs under the claim lock.
    pub(super) async fn live_claims(&self, conn: &mut MySqlConnection) -> Result<Held> {
        let rows = query(&self.sql.claims)
            .bind(self.spool())
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error)?;
        let mut held = Held::default();
        for row in &rows {
            let token: Vec<u8> = row.try_get("token").map_err(store_error)?;
            let until: i64 = row.try_get("lease_until").map_err(store_error)?;
            let now: i64 = row.try_get("now_ms").map_err(store_error)?;
            if until > now {
                held.seqs.extend(claim_seqs(row)?);
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
        Ok(held)
    }

    /// Records the claim `token` of `seqs` until `until` (ms, the database's clock), or
    /// adds `seqs` to it. Runs under the claim lock.
    pub(crate) async fn record_claim(
        &self,
        conn: &mut MySqlConnection,
        token: Vec<u8>,
        until: i64,
        seqs: &[i64],
    ) -> Result<()> {
        query(&self.sql.record_claim)
            .bind(self.spool())
            .bind(token)
            .bind(until)
            .bind(seqs_json(seqs))
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Locks the claim `token` for a settlement and returns the rows it holds; `None` if
    /// the claim is gone (its lease ended and another claim took its place).
    pub(super) async fn held(
        &self,
        conn: &mut MySqlConnection,
        token: &[u8],
    ) -> Result<Option<HashSet<i64>>> {
        let row = query(&self.sql.held)
            .bind(self.spool())
            .bind(token.to_vec())
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        row.as_ref()
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
    /// deletes it when it holds none.
    pub(super) async fn keep_claim(
        &self,
        conn: &mut MySqlConnection,
        token: &[u8],
        remaining: &[i64],
    ) -> Result<()> {
        let statement = if remaining.is_empty() {
            query(&self.sql.drop_claim)
        } else {
            query(&self.sql.shrink_claim).bind(seqs_json(remaining))
        };
        statement
            .bind(self.spool())
            .bind(token.to_vec())
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

/// A claim row's `seqs`; a permanent error naming the claim if they are not a JSON
/// array of integers (written by something other than oncebox).
fn claim_seqs(row: &MySqlRow) -> Result<Vec<i64>> {
    let reader = RowReader::new(row, "oncebox_claims", "a claim");
    let seqs: String = reader.get("seqs")?;
    serde_json::from_str(&seqs).map_err(|e| Error::from(reader.error("seqs", e)))
}

/// `seqs` as a JSON array.
fn seqs_json(seqs: &[i64]) -> String {
    serde_json::Value::from(seqs).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqs_are_a_json_array() {
        assert_eq!(seqs_json(&[3, 1, 2]), "[3,1,2]");
        assert_eq!(seqs_json(&[]), "[]");
    }
}
