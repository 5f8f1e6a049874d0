//! Settling a spool table's claims: every settlement of a claim at once (a held
//! claim's in its transaction, a leased claim's in one statement), lease extension, and
//! the retention's purge.

use oncebox_core::Result;
use oncebox_core::spool::{LeaseToken, Settle, Settlement};
use oncebox_core::sql::last_error;

use super::held::Taken;
use super::{PgQuery, SpoolTable, query, sql, sql_limit};
use crate::error::store_error;
use crate::time::{duration_ms, ms_since, ms_until};

impl SpoolTable {
    /// Applies every settlement of claim `token` at once: a held claim's in its
    /// transaction, which then commits; a leased claim's in one statement (atomic on its
    /// own), each row filtered by `token`. With `delete_done`, done rows are deleted
    /// instead of marked.
    pub(crate) async fn settle(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Result<()> {
        match self.held.take(token) {
            Taken::Held(held) => self.settle_held(held, settlements, delete_done).await,
            Taken::Expired => Ok(()),
            Taken::Unknown => {
                if let Some(settle) = self.settle_query(token, settlements, delete_done) {
                    settle.execute(&self.pool).await.map_err(store_error)?;
                }
                Ok(())
            }
        }
    }

    /// Extends the lease of claim `token`, which holds `rows`: a held claim's transaction
    /// gets a statement (which restarts the server's idle timeout, its lease), a leased
    /// claim's rows a later lease end.
    pub(crate) async fn extend(
        &self,
        token: LeaseToken,
        rows: &[i64],
        lease: std::time::Duration,
    ) -> Result<()> {
        match self.held.take(token) {
            Taken::Held(held) => self.extend_held(token, held, lease).await,
            Taken::Expired => Err(oncebox_core::Error::LeaseLost),
            Taken::Unknown => {
                let extended = self
                    .scoped(
                        query(&self.sql.extend)
                            .bind(token.to_string())
                            .bind(rows.to_vec())
                            .bind(duration_ms(lease).max(1)),
                    )
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)?;
                if extended.rows_affected() == 0 && !rows.is_empty() {
                    return Err(oncebox_core::Error::LeaseLost);
                }
                Ok(())
            }
        }
    }

    /// A leased claim's settle statement for `settlements`, or `None` if there are none.
    pub(super) fn settle_query(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
    ) -> Option<PgQuery> {
        let arrays = SettleArrays::new(settlements.iter())?;
        let statement = if delete_done {
            &self.sql.settle_delete
        } else {
            &self.sql.settle
        };
        Some(self.scoped(arrays.bind(query(statement).bind(token.to_string()))))
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

/// The settlements of a claim as the settle statements' arrays.
pub(super) struct SettleArrays {
    seqs: Vec<i64>,
    ops: Vec<i32>,
    delays: Vec<i64>,
    errors: Vec<String>,
}

impl SettleArrays {
    /// The arrays of `settlements`, or `None` if there are none.
    pub(super) fn new<'a>(
        settlements: impl ExactSizeIterator<Item = &'a Settlement>,
    ) -> Option<Self> {
        if settlements.len() == 0 {
            return None;
        }
        let mut arrays = Self {
            seqs: Vec::with_capacity(settlements.len()),
            ops: Vec::with_capacity(settlements.len()),
            delays: Vec::with_capacity(settlements.len()),
            errors: Vec::with_capacity(settlements.len()),
        };
        for settlement in settlements {
            let (op, delay, error) = match &settlement.outcome {
                Settle::Done => (sql::OP_DONE, 0, String::new()),
                Settle::Retry { at, error } => (sql::OP_RETRY, ms_until(*at), last_error(error)),
                Settle::Dead { reason } => (sql::OP_DEAD, 0, last_error(reason)),
                // `Release`, and any outcome added to the core later: end the lease and
                // count nothing, the one settlement that can never lose a row.
                _ => (sql::OP_RELEASE, 0, String::new()),
            };
            arrays.seqs.push(settlement.seq);
            arrays.ops.push(op);
            arrays.delays.push(delay);
            arrays.errors.push(error);
        }
        Some(arrays)
    }

    /// Binds the arrays, in order, after the parameters `query` has.
    pub(super) fn bind(self, query: PgQuery) -> PgQuery {
        query
            .bind(self.seqs)
            .bind(self.ops)
            .bind(self.delays)
            .bind(self.errors)
    }
}
