//! `EXPLAIN` of the claim's reads, for operators and the crate docs.

use oncebox_core::Result;
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use super::SpoolTable;
use crate::error::store_error;
use crate::sql::{MAX_LIST, bind_list, query_owned, sql_limit, with_list};

impl SpoolTable {
    /// The plans of a claim's reads for `limit` rows: the window, the window passing
    /// over the rows of a claim of this process, step 2's locking read of the rows it
    /// picks, and the live claims (`EXPLAIN`; nothing runs, nothing is locked).
    pub(crate) async fn explain_claim(&self, limit: usize) -> Result<String> {
        let mut conn = self.pool.acquire().await.map_err(store_error)?;
        let size = sql_limit(self.window(limit.max(1)));
        let explain = |sql: &str| query_owned(format!("EXPLAIN {sql}"));
        let window = self.scoped(explain(&self.sql.window)).bind(size);
        // The worst cases: a claim of `limit` rows passed over, and `limit` rows picked.
        let seqs: Vec<i64> = (1..=sql_limit(limit.clamp(1, MAX_LIST))).collect();
        let skipping = bind_list(
            self.scoped(explain(&with_list(&self.sql.window_skipping, seqs.len()))),
            &seqs,
        )
        .bind(size);
        let lock = self
            .scoped(bind_list(
                explain(&with_list(&self.sql.lock_rows, seqs.len())),
                &seqs,
            ))
            .bind(0_i64);
        let claims = explain(&self.sql.claims).bind(self.spool());
        let mut plans = String::new();
        let steps = [
            ("window", window),
            ("window, skipping", skipping),
            ("lock", lock),
            ("claims", claims),
        ];
        for (step, statement) in steps {
            let rows = statement.fetch_all(&mut *conn).await.map_err(store_error)?;
            plans.push_str(&format!("-- {step}\n{}", format_plan(&rows)));
        }
        Ok(plans)
    }
}

/// `EXPLAIN` rows as a tab-separated table.
pub(crate) fn format_plan(rows: &[MySqlRow]) -> String {
    use sqlx::{Column, ValueRef};
    let mut text = String::new();
    if let Some(first) = rows.first() {
        let names: Vec<&str> = first.columns().iter().map(|c| c.name()).collect();
        text.push_str(&names.join("\t"));
        text.push('\n');
    }
    for row in rows {
        let cells: Vec<String> = (0..row.len())
            .map(|i| {
                let is_null = row.try_get_raw(i).is_ok_and(|raw| raw.is_null());
                if is_null {
                    return "NULL".to_owned();
                }
                row.try_get::<String, _>(i)
                    .or_else(|_| row.try_get::<i64, _>(i).map(|n| n.to_string()))
                    .or_else(|_| row.try_get::<u64, _>(i).map(|n| n.to_string()))
                    .or_else(|_| {
                        row.try_get::<Vec<u8>, _>(i)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
                    .unwrap_or_else(|_| "?".to_owned())
            })
            .collect();
        text.push_str(&cells.join("\t"));
        text.push('\n');
    }
    text
}
