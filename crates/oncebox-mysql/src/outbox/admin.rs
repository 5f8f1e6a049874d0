//! What operators ask of the outbox: counts, dead letters, replay, one row's state.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use oncebox_core::time::from_unix_millis;
use oncebox_core::{Error, Message, MessageId, Result};
use sqlx::Row;

use super::{MySqlOutbox, TABLE};
use crate::error::{RowDecodeError, RowReader, store_error};
use crate::spool::SpoolRow;
use crate::spool::sql::{DEAD, DONE, PENDING};
use crate::sql::{NOW_MS, begin_read_committed, query, sql_limit, uuid_bytes};

use oncebox_core::spool::{Backlog, MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

pub(super) struct AdminSql {
    stats: String,
    backlog: String,
    /// `?` after, `?` limit.
    dead_letters: String,
    /// `?` id.
    purge_dead: String,
    /// `?` id: [`status`](Self::status) with the message.
    row: String,
    /// The listing, up to its `WHERE`: the columns of `row`, from `oncebox_outbox AS t`.
    pub(super) listing: String,
    /// `?` id → `seq`, `key` of the dead row, locked.
    find_dead: String,
    /// `?` key → the latest live lease of the key's pending rows.
    key_lease: String,
    /// `?` seq.
    replay: String,
    /// `?` id.
    status: String,
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
/// `oldest_pending_ms`, how long the first pending row in commit order that is not
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
    AS oldest_pending_ms"
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
    dead_letters: format!(
        "SELECT t.seq, t.attempts, t.id, t.topic, t.`key`, t.kind, t.headers, t.payload,
       t.created_at, t.last_error, t.dead_at
FROM {TABLE} AS t WHERE t.status = {DEAD} AND t.seq > ? ORDER BY t.seq LIMIT ?"
    ),
    purge_dead: format!("DELETE FROM {TABLE} WHERE id = ? AND status = {DEAD}"),
    row: format!("{} WHERE t.id = ?", listed_row()),
    listing: listed_row(),
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
    status: format!(
        "SELECT t.seq, t.status, t.attempts, t.last_error, t.available_at, t.done_at, t.dead_at,
  COALESCE((
    SELECT MAX(c.lease_until)
    FROM oncebox_claims AS c
      CROSS JOIN JSON_TABLE(c.seqs, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j
    WHERE c.spool = '{TABLE}' AND j.seq = t.seq), 0) AS lease_until
FROM {TABLE} AS t WHERE t.id = ?"
    ),
});

impl MySqlOutbox {
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
        self.counts(&SQL.stats, true).await
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
        self.dead_letters_after(None, limit).await
    }

    async fn dead_letters_after(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let rows = query(&SQL.dead_letters)
            .bind(after.unwrap_or(i64::MIN))
            .bind(sql_limit(limit))
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                let reader = RowReader::new(row, TABLE, format_args!("seq {seq}"));
                decode_dead_letter(seq, &reader).map_err(Error::from)
            })
            .collect()
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
        let row = query(&SQL.status)
            .bind(uuid_bytes(id.as_uuid()))
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
        Ok(Some(decode_state(&reader)?))
    }
}

impl MySqlOutbox {
    /// The backlog: [`stats`](Self::stats) without the count of published rows, which
    /// grows with retention.
    pub(super) async fn read_backlog(&self) -> Result<Backlog> {
        self.counts(&SQL.backlog, false).await.map(Backlog::from)
    }

    /// Reads the counts of `sql`'s one row: `waiting` (pending rows, scheduled ones
    /// included), `scheduled`, `dead`, `done` if `with_done`,
    /// and the oldest pending row's age in `oldest_pending_ms`.
    async fn counts(&self, sql: &'static str, with_done: bool) -> Result<OutboxStats> {
        let row = query(sql)
            .fetch_one(self.pool())
            .await
            .map_err(store_error)?;
        let count = |column: &str| -> Result<u64> {
            let n: i64 = row.try_get(column).map_err(store_error)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let oldest: Option<i64> = row.try_get("oldest_pending_ms").map_err(store_error)?;
        let scheduled = count("scheduled")?;
        Ok(OutboxStats {
            pending: count("waiting")?.saturating_sub(scheduled),
            scheduled,
            done: if with_done { count("done")? } else { 0 },
            dead: count("dead")?,
            oldest_pending_age: oldest
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        })
    }
}

impl OutboxAdmin for MySqlOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        MySqlOutbox::stats(self).await
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        let row = query(&SQL.row)
            .bind(uuid_bytes(id.as_uuid()))
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
        Ok(Some(OutboxRow {
            state: decode_state(&reader)?,
            message: Message::decode(&reader)?,
        }))
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_after(after, limit).await
    }

    /// See [`MySqlOutbox::rows`] for the indexes each filter reads.
    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        MySqlOutbox::rows(self, filter, before, limit).await
    }

    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        MySqlOutbox::published_per_minute(self, since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        MySqlOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        let result = query(&SQL.purge_dead)
            .bind(uuid_bytes(id.as_uuid()))
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        Ok(result.rows_affected() > 0)
    }
}

fn decode_dead_letter(seq: i64, row: &RowReader<'_>) -> Result<DeadLetter, RowDecodeError> {
    let message = Message::decode(row)?;
    let dead_at: i64 = row.get("dead_at")?;
    Ok(DeadLetter {
        seq,
        id: message.id,
        message,
        attempts: row.count("attempts")?,
        reason: row.get::<Option<String>>("last_error")?.unwrap_or_default(),
        dead_at: from_unix_millis(dead_at),
    })
}

pub(crate) fn decode_state(row: &RowReader<'_>) -> Result<RowState, RowDecodeError> {
    let status: i8 = row.get("status")?;
    let status = match status {
        PENDING => RowStatus::Pending,
        DONE => RowStatus::Done,
        DEAD => RowStatus::Dead,
        other => return Err(row.error("status", format!("unknown status {other}"))),
    };
    // 0 is "never" in the settlement and lease columns.
    let time = |column: &'static str| -> Result<Option<SystemTime>, RowDecodeError> {
        let ms: i64 = row.get(column)?;
        Ok((ms != 0).then(|| from_unix_millis(ms)))
    };
    Ok(RowState {
        seq: row.get("seq")?,
        status,
        attempts: row.count("attempts")?,
        last_error: row.get("last_error")?,
        available_at: from_unix_millis(row.get("available_at")?),
        leased_until: time("lease_until")?,
        settled_at: time("done_at")?.or(time("dead_at")?),
    })
}
