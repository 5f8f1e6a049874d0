//! What operators ask of the outbox: figures, one row's state, dead letters and their
//! replay, the listing the dashboard pages through. The statements are MySQL's; what
//! runs them is `oncebox-sql`'s, once for every database.

use std::sync::LazyLock;
use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
use oncebox_core::{Message, MessageId, Result};
use oncebox_sql::{OutboxColumns, OutboxStatements, Query, RowReader, SqlOutboxAdmin};
use sqlx::{MySql, QueryBuilder, Row};

pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

use super::{MySqlOutbox, TABLE};
use crate::MySqlDialect;
use crate::error::{RowDecodeError, store_error};
use crate::spool::SpoolRow;
use crate::spool::explain::format_plan;
use crate::spool::sql::{DEAD, DONE, PENDING};
use crate::sql::{NOW_MS, begin_read_committed, ms_since, query, uuid_bytes};

pub(super) struct AdminSql {
    stats: String,
    backlog: String,
    /// `?` id.
    purge_dead: String,
    /// The listing, up to its `WHERE`: a row's state and its message, from
    /// `oncebox_outbox AS t`.
    listing: OutboxColumns,
    /// `?` age ms.
    published_per_minute: String,
    /// `?` id → `seq`, `key` of the dead row, locked.
    find_dead: String,
    /// `?` key → the latest live lease of the key's pending rows.
    key_lease: String,
    /// `?` seq.
    replay: String,
}

/// The columns of a row and its message, from `oncebox_outbox AS t`.
fn listed_row() -> String {
    format!(
        "SELECT t.seq, t.status, t.attempts, t.last_error, t.available_at, t.done_at, t.dead_at,
  COALESCE((
    SELECT MAX(c.lease_until)
    FROM oncebox_claims AS c
      CROSS JOIN JSON_TABLE(c.seqs, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j
    WHERE c.spool = '{TABLE}' AND j.seq = t.seq), 0) AS lease_until,
  t.id, t.topic, t.`key`, t.kind, t.headers, t.payload, t.created_at
FROM {TABLE} AS t"
    )
}

/// The columns of the figures of rows waiting: `waiting` (every pending row), `scheduled`
/// (pending, never attempted, due later: a scheduled message), `dead`, and
/// `oldest_pending`, how long the first pending row in commit order that is not
/// scheduled ahead has waited: since it became due if it was scheduled, else since its
/// creation. Counting the scheduled rows reads each pending row.
fn waiting() -> String {
    let scheduled = format!("attempts = 0 AND available_at > {NOW_MS}");
    format!(
        "(SELECT COUNT(*) FROM {TABLE} WHERE status = {PENDING}) AS waiting,
  (SELECT COUNT(*) FROM {TABLE} WHERE status = {PENDING} AND {scheduled}) AS scheduled,
  (SELECT COUNT(*) FROM {TABLE} WHERE status = {DEAD}) AS dead,
  (SELECT {NOW_MS} - IF(attempts = 0, GREATEST(created_at, available_at), created_at)
   FROM {TABLE} WHERE status = {PENDING} AND NOT ({scheduled}) ORDER BY seq LIMIT 1)
    AS oldest_pending"
    )
}

pub(super) static SQL: LazyLock<AdminSql> = LazyLock::new(|| AdminSql {
    stats: format!(
        "SELECT
  (SELECT COUNT(*) FROM {TABLE} WHERE status = {DONE}) AS done,
  {}",
        waiting()
    ),
    backlog: format!("SELECT {}", waiting()),
    purge_dead: format!("DELETE FROM {TABLE} WHERE id = ? AND status = {DEAD}"),
    listing: OutboxColumns::named(TABLE, listed_row(), "`key`", "t.created_at"),
    published_per_minute: format!(
        "SELECT done_at DIV 60000 AS minute, COUNT(*) AS published
FROM {TABLE}
WHERE status = {DONE} AND done_at >= {NOW_MS} - ?
GROUP BY done_at DIV 60000 ORDER BY minute"
    ),
    find_dead: format!(
        "SELECT seq, `key` FROM {TABLE} WHERE id = ? AND status = {DEAD} FOR UPDATE"
    ),
    key_lease: format!(
        "SELECT MAX(c.lease_until)
FROM oncebox_claims AS c
  CROSS JOIN JSON_TABLE(c.seqs, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j
  JOIN {TABLE} AS t ON t.seq = j.seq
WHERE c.spool = '{TABLE}' AND c.lease_until > {NOW_MS}
  AND t.status = {PENDING} AND t.`key` = ?"
    ),
    replay: format!(
        "UPDATE {TABLE}
SET status = {PENDING}, attempts = 0, available_at = {NOW_MS}, dead_at = 0
WHERE seq = ? AND status = {DEAD}"
    ),
});

// The statements are built once, in `SQL`, the one value of this type.
impl OutboxStatements for AdminSql {
    type Dialect = MySqlDialect;

    fn columns(&self) -> &OutboxColumns {
        &self.listing
    }

    fn display(&self) -> &str {
        TABLE
    }

    fn message(row: &RowReader<'_, MySqlDialect>) -> Result<Message, RowDecodeError> {
        Message::decode(row)
    }

    fn push_id(query: &mut QueryBuilder<MySql>, id: MessageId) {
        query.push_bind(uuid_bytes(id.as_uuid()));
    }

    fn counts(&self, with_done: bool, _now: SystemTime) -> Query<MySql> {
        query(if with_done { &SQL.stats } else { &SQL.backlog })
    }

    fn published_per_minute(&self, since: SystemTime) -> Query<MySql> {
        query(&SQL.published_per_minute).bind(ms_since(since))
    }

    fn purge_dead(&self, id: MessageId) -> Query<MySql> {
        query(&SQL.purge_dead).bind(uuid_bytes(id.as_uuid()))
    }

    /// Left to itself, MariaDB reads the rows of a status by the index's first column
    /// only, and walks every row of the status after `before` to reach it; and it reads
    /// a creation-time window in commit order.
    fn index_hint(&self, filter: &RowFilter) -> &'static str {
        if filter.id.is_some() {
            ""
        } else if filter.created_from.is_some() || filter.created_until.is_some() {
            " FORCE INDEX (oncebox_outbox_created)"
        } else if filter.status.is_none() {
            ""
        } else if filter.key.is_some() {
            " FORCE INDEX (oncebox_outbox_pending_key)"
        } else {
            " FORCE INDEX (oncebox_outbox_pending)"
        }
    }
}

impl MySqlOutbox {
    pub(super) fn admin(&self) -> SqlOutboxAdmin<'_, AdminSql> {
        SqlOutboxAdmin::new(self.pool(), &SQL)
    }

    /// Counts rows by status and measures the oldest pending age, in one statement. Each
    /// count walks the `(status, seq)` index over its status, so on tables with millions
    /// of done rows call it at the pace of a dashboard, not per message.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn stats(&self) -> Result<OutboxStats> {
        self.admin().stats().await
    }

    /// The first `limit` dead letters, in commit order.
    ///
    /// # Errors
    ///
    /// A store error; a permanent store error with a
    /// [`RowDecodeError`] source naming the row if a dead row
    /// cannot be decoded (written by something other than oncebox: fix or delete it
    /// with SQL).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        self.admin().dead_letters(None, limit).await
    }

    /// Puts the dead message `id` back in line: pending, due now, attempts reset to 0
    /// (its last error is kept). Returns whether a dead message with that id was found.
    ///
    /// The row keeps its place in commit order, so it is published before the later
    /// pending messages of its key, which wait for it. If a relay holds later messages
    /// of its key right now, the replayed row waits until that relay's lease ends, so
    /// that the key is never on two relays at once: the replay takes the claim lock, and
    /// records a claim of the row that no relay holds, ending with the key's lease.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one transaction, applied entirely or not at all.
    pub async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        let mut tx = begin_read_committed(self.pool()).await?;
        query(&super::SPOOL.lock)
            .bind(self.table.spool())
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let found = query(&SQL.find_dead)
            .bind(uuid_bytes(id.as_uuid()))
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some(found) = found else {
            return Ok(false);
        };
        let seq: i64 = found.try_get("seq").map_err(store_error)?;
        let key: Option<Vec<u8>> = found.try_get("key").map_err(store_error)?;
        let held_until: Option<i64> = match key {
            Some(key) => sqlx::query_scalar(SQL.key_lease.as_str())
                .bind(key)
                .fetch_one(&mut *tx)
                .await
                .map_err(store_error)?,
            None => None,
        };
        query(&SQL.replay)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        if let Some(until) = held_until {
            let token = uuid_bytes(&uuid::Uuid::new_v4());
            self.table
                .record_claim_in(&mut tx, &token, until, &[seq])
                .await?;
        }
        tx.commit().await.map_err(store_error)?;
        self.wake();
        Ok(true)
    }

    /// The state of the row of message `id`, or `None` if there is none (never
    /// enqueued, purged after publishing, or deleted on publish).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one with a [`RowDecodeError`]
    /// source if the row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn status(&self, id: MessageId) -> Result<Option<RowState>> {
        self.admin().state(id).await
    }

    /// The plan of [`rows`](OutboxAdmin::rows) for the same arguments (`EXPLAIN`; nothing
    /// runs), as a tab-separated table. For operators asking why a listing is slow.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn explain_rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<String> {
        let plan = self
            .admin()
            .explain_rows("EXPLAIN ", filter, before, limit)
            .await?;
        Ok(plan.map_or_else(
            || "the row at `before` is gone: nothing is read".to_owned(),
            |rows| format_plan(&rows),
        ))
    }
}

impl OutboxAdmin for MySqlOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        self.admin().stats().await
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        self.admin().row(id).await
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.admin().dead_letters(after, limit).await
    }

    /// One statement, which reads an index in descending commit order from `before` on,
    /// so a page costs the same at any depth: with no status, the primary key; with a
    /// status, the `(status, seq)` index (for done rows too); with a status and a key,
    /// the `(status, key, seq)` index; with an id, the unique index of ids; with a
    /// creation-time window, the `(created_at, seq)` index, in descending creation time.
    /// Topic and key (without a status) have no index of their own: rows are filtered
    /// one by one until `limit` match, which reads every row older than `before` where
    /// matches are rare or none are left.
    ///
    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        self.admin().rows(filter, before, limit).await
    }

    /// Messages published per minute since `since`, by the database's clock, oldest
    /// minute first.
    /// Reads the `(status, done_at)` index (the retention's) over the rows published
    /// since `since` only.
    ///
    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        self.admin().published_per_minute(since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        MySqlOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        self.admin().purge_dead(id).await
    }
}
