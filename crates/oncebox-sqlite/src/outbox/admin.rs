//! What operators ask of the outbox: counts, dead letters, replay, one row's state.

use std::time::{Duration, SystemTime};

use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Error, Message, MessageId, Result};
use sqlx::Row;

use super::{SqliteOutbox, sql};
use crate::error::{RowDecodeError, RowReader, store_error};
use crate::spool::{SpoolRow, sql_limit};

use oncebox_core::spool::{Backlog, MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

impl SqliteOutbox {
    /// Counts rows by status and measures the oldest pending age. Each count walks a
    /// partial index of its status.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn stats(&self) -> Result<OutboxStats> {
        let backlog = self.read_backlog().await?;
        Ok(OutboxStats {
            pending: backlog.pending,
            scheduled: self.count_scheduled(SystemTime::now()).await?,
            done: self.count(sql::COUNT_DONE).await?,
            dead: backlog.dead,
            oldest_pending_age: backlog.oldest_pending_age,
        })
    }

    async fn count_scheduled(&self, now: SystemTime) -> Result<u64> {
        let count: i64 = sqlx::query_scalar(sql::COUNT_SCHEDULED)
            .bind(to_unix_millis(now))
            .fetch_one(self.pool())
            .await
            .map_err(store_error)?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// The backlog: [`stats`](Self::stats) without the count of published rows, which
    /// grows with retention.
    pub(super) async fn read_backlog(&self) -> Result<Backlog> {
        let now = SystemTime::now();
        let oldest: Option<i64> = sqlx::query_scalar(sql::OLDEST_PENDING)
            .bind(to_unix_millis(now))
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let waiting = self.count(sql::COUNT_PENDING).await?;
        Ok(Backlog {
            pending: waiting.saturating_sub(self.count_scheduled(now).await?),
            dead: self.count(sql::COUNT_DEAD).await?,
            oldest_pending_age: oldest.map(|created| {
                now.duration_since(from_unix_millis(created))
                    .unwrap_or(Duration::ZERO)
            }),
        })
    }

    async fn count(&self, query: &'static str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(query)
            .fetch_one(self.pool())
            .await
            .map_err(store_error)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The first `limit` dead letters, in commit order.
    ///
    /// # Errors
    ///
    /// A store error; a permanent store error with a
    /// [`RowDecodeError`](crate::RowDecodeError) source naming the row if a dead row
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
        let rows = sqlx::query(sql::DEAD_LETTERS)
            .bind(sql_limit(limit))
            .bind(after.unwrap_or(i64::MIN))
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                let reader = RowReader::new(row, sql::TABLE, format_args!("seq {seq}"));
                decode_dead_letter(seq, &reader).map_err(Error::from)
            })
            .collect()
    }

    /// Puts the dead message `id` back in line: pending, due now, attempts reset to 0
    /// (its last error is kept). Returns whether a dead message with that id was found.
    ///
    /// The row keeps its place in commit order, so it is published before the later
    /// pending messages of its key, which wait for it; later messages of its key that
    /// were published while it was dead stay published before it. If a relay holds
    /// later messages of its key right now, the replayed row is due only once that
    /// relay's lease ends, so that the key is never on two relays at once.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one statement, applied entirely or not at all.
    pub async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        let result = sqlx::query(sql::REPLAY_DEAD)
            .bind(id.to_string())
            .bind(to_unix_millis(SystemTime::now()))
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        let replayed = result.rows_affected() > 0;
        if replayed {
            self.wake();
        }
        Ok(replayed)
    }

    /// The state of the row of message `id`, or `None` if there is none (never
    /// enqueued, or purged after publishing).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one with a [`RowDecodeError`](crate::RowDecodeError)
    /// source if the row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn status(&self, id: MessageId) -> Result<Option<RowState>> {
        let row = sqlx::query(sql::STATUS)
            .bind(id.to_string())
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, sql::TABLE, format_args!("id {id}"));
        Ok(Some(decode_state(&reader)?))
    }
}

impl OutboxAdmin for SqliteOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        SqliteOutbox::stats(self).await
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        let row = sqlx::query(sql::ROW)
            .bind(id.to_string())
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, sql::TABLE, format_args!("id {id}"));
        Ok(Some(OutboxRow {
            state: decode_state(&reader)?,
            message: Message::decode(&reader)?,
        }))
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_after(after, limit).await
    }

    /// See [`SqliteOutbox::rows`] for the indexes each filter reads.
    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        SqliteOutbox::rows(self, filter, before, limit).await
    }

    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        SqliteOutbox::published_per_minute(self, since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        SqliteOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        let result = sqlx::query(sql::PURGE_DEAD)
            .bind(id.to_string())
            .execute(self.pool())
            .await
            .map_err(store_error)?;
        Ok(result.rows_affected() > 0)
    }
}

fn decode_dead_letter(seq: i64, row: &RowReader<'_>) -> Result<DeadLetter, RowDecodeError> {
    let message = Message::decode(row)?;
    let dead_at: Option<i64> = row.get("dead_at")?;
    Ok(DeadLetter {
        seq,
        id: message.id,
        message,
        attempts: row.count("attempts")?,
        reason: row.get::<Option<String>>("last_error")?.unwrap_or_default(),
        dead_at: from_unix_millis(dead_at.unwrap_or(0)),
    })
}

pub(crate) fn decode_state(row: &RowReader<'_>) -> Result<RowState, RowDecodeError> {
    let status: String = row.get("status")?;
    let status = match status.as_str() {
        "pending" => RowStatus::Pending,
        "done" => RowStatus::Done,
        "dead" => RowStatus::Dead,
        other => return Err(row.error("status", format!("unknown status {other:?}"))),
    };
    let done_at: Option<i64> = row.get("done_at")?;
    let dead_at: Option<i64> = row.get("dead_at")?;
    Ok(RowState {
        seq: row.get("seq")?,
        status,
        attempts: row.count("attempts")?,
        last_error: row.get("last_error")?,
        available_at: from_unix_millis(row.get("available_at")?),
        leased_until: row.get::<Option<i64>>("lease_until")?.map(from_unix_millis),
        settled_at: done_at.or(dead_at).map(from_unix_millis),
    })
}
