//! The claim's plans, for operators asking why claims are slow.

use oncebox_core::Result;
use oncebox_core::spool::LeaseToken;
use sqlx::{AssertSqlSafe, Row};

use super::{
    Hold, KEYS_PER_ROW, MIN_KEY_SCAN, PgQuery, Previous, SpoolTable, WINDOW_STEP, query, sql_limit,
};
use crate::error::store_error;

impl SpoolTable {
    /// Runs the claim's statements under `EXPLAIN (ANALYZE, BUFFERS)` in a transaction
    /// that is rolled back (a held claim's fast claim, then step 1 and step 2, each after
    /// the one before, as if it had claimed too little); returns the plans.
    pub(crate) async fn explain_claim(&self, limit: usize) -> Result<String> {
        let rows = limit.max(1);
        let limit = sql_limit(rows);
        let window = self.window(rows);
        let scan = MIN_KEY_SCAN.max(rows.saturating_mul(KEYS_PER_ROW));
        let lease = 30_000_i64;
        let cursor = self.lock_cursor().clone();
        let mut plans = Vec::new();
        let tx = match (self.hold, &self.sql.held) {
            (Hold::Transaction, Some(held)) => {
                let begin = held.begin(Previous::None, lease, lease);
                let mut tx = self
                    .pool
                    .begin_with(AssertSqlSafe(begin))
                    .await
                    .map_err(store_error)?;
                let window = window.div_ceil(WINDOW_STEP) * WINDOW_STEP;
                let steps = [
                    (
                        format!("-- fast claim (held), limit {limit}"),
                        sqlx::query(AssertSqlSafe(held.explain_first(limit))),
                    ),
                    (
                        format!("-- step 1 (held): window of {window} pending rows, limit {limit}"),
                        sqlx::query(AssertSqlSafe(held.explain_window(limit, sql_limit(window)))),
                    ),
                    (
                        format!("-- step 2 (held): loose scan of {scan} keys, limit {limit}"),
                        query(&held.explain_keys)
                            .bind(limit)
                            .bind(cursor)
                            .bind(sql_limit(scan)),
                    ),
                ];
                for (title, step) in steps {
                    plans.push(format!("{title}\n{}", plan(step, &mut tx).await?));
                }
                tx
            }
            _ => {
                let token = LeaseToken::new().to_string();
                let mut tx = self.pool.begin().await.map_err(store_error)?;
                self.scoped(query(&self.sql.lock).bind(lease.to_string()))
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
                let steps = [
                    (
                        format!(
                            "-- step 1 (leased): window of {window} pending rows, limit {limit}"
                        ),
                        self.scoped(
                            query(&self.sql.explain_window)
                                .bind(token.clone())
                                .bind(limit)
                                .bind(lease)
                                .bind(sql_limit(window)),
                        ),
                    ),
                    (
                        format!("-- step 2 (leased): loose scan of {scan} keys, limit {limit}"),
                        self.scoped(
                            query(&self.sql.explain_keys)
                                .bind(token)
                                .bind(limit)
                                .bind(lease)
                                .bind(cursor)
                                .bind(sql_limit(scan)),
                        ),
                    ),
                ];
                for (title, step) in steps {
                    plans.push(format!("{title}\n{}", plan(step, &mut tx).await?));
                }
                tx
            }
        };
        tx.rollback().await.map_err(store_error)?;
        Ok(plans.join("\n\n") + "\n")
    }
}

/// The plan an `EXPLAIN` statement returns, as text.
async fn plan(explain: PgQuery, conn: &mut sqlx::PgConnection) -> Result<String> {
    let lines: Vec<String> = explain
        .fetch_all(conn)
        .await
        .map_err(store_error)?
        .iter()
        .map(|row| row.try_get::<String, _>(0))
        .collect::<Result<_, _>>()
        .map_err(store_error)?;
    Ok(lines.join("\n"))
}
