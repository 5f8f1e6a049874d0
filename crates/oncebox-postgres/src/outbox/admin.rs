//! What operators ask of the outbox: counts, dead letters, replay, one row's state.

use std::time::SystemTime;

use oncebox_core::{Error, Message, MessageId, Result};
use sqlx::Row;

use super::PgOutbox;
use crate::error::{RowDecodeError, RowReader, store_error};
use crate::spool::{SpoolRow, query, sql_limit};
use crate::time::{from_micros, micros_duration};

use oncebox_core::spool::{Backlog, MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

impl PgOutbox {
    /// Counts rows by status and measures the oldest pending age, in one statement. Each
    /// count walks a partial index of its status, so on tables with millions of done
    /// rows call it at the pace of a dashboard, not per message.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn stats(&self) -> Result<OutboxStats> {
        self.counts(&self.sql().stats, true).await
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
        let rows = query(&self.sql().dead_letters)
            .bind(sql_limit(limit))
            .bind(after.unwrap_or(i64::MIN))
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                let reader = RowReader::new(row, self.spool().display(), format_args!("seq {seq}"));
                decode_dead_letter(seq, &reader).map_err(Error::from)
            })
            .collect()
    }

    /// Puts the dead message `id` back in line to be published again. Returns whether a
    /// dead message with that id was found (and replayed).
    ///
    /// What that does depends on the relay that gave it up:
    ///
    /// - **the polling relay** (and every Debezium-style table): the row becomes pending,
    ///   due now, attempts reset to 0, its last error kept, in its place (below);
    /// - **the log-tailing relay, table source** (`cdc_source = 'table'`): it reads
    ///   inserts only, so the row is deleted and inserted again as a new pending row
    ///   (same id and message, a new `seq`, attempts 0, its last error kept): the relay
    ///   publishes it and deletes it;
    /// - **the log-tailing relay, message source** (`cdc_source = 'messages'`): the row
    ///   is deleted and its message emitted again as a logical decoding message
    ///   (`<schema>.emit_message`: the same id and creation time), which the relay
    ///   publishes. Content the relay could not read (kept under an empty topic, with
    ///   an id of its own) is emitted again as it is: a message that was emitted with
    ///   `transactional = false` is then published under the id in its content, and
    ///   content that is not an oncebox message becomes a dead letter again.
    ///
    /// The log-tailing relay publishes a replayed message after what it read before the
    /// replay committed (it does not hold a key back behind a dead message, so nothing
    /// of its key waits for it), and only if its slot exists: a message emitted while
    /// the slot does not exist is never read. If the broker refuses it again, the relay
    /// writes a new dead letter of it.
    ///
    /// A row of the polling relay keeps its place in commit order, so it is published
    /// before the later pending messages of its key, which wait for it; later messages
    /// of its key that were published while it was dead stay published before it. The
    /// key is never on two relays at once:
    ///
    /// - the replay takes the hold lock exclusively, so it waits for every held claim on
    ///   the table in flight (each until its rows are settled, at most its lease) and
    ///   the held claims after it see the replayed row: a claim whose snapshot still
    ///   showed the row dead could otherwise take later rows of its key beside a claim
    ///   that takes the row;
    /// - it takes the claim lock too, and if a leased claim holds later messages of its
    ///   key, gives the row a lease without a holder until that claim's lease ends.
    ///
    /// So the call can take as long as the longest batch in flight takes to publish.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one transaction, applied entirely or not at all.
    pub async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        let mut tx = self.pool().begin().await.map_err(store_error)?;
        query(&self.sql().lock)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let id = id.to_string();
        let mut replayed = query(&self.sql().replay)
            .bind(&id)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?
            .rows_affected()
            > 0;
        if let (false, Some(cdc)) = (replayed, &self.sql().replay_cdc) {
            replayed = query(&cdc.table)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?
                .rows_affected()
                > 0;
            if !replayed {
                let emitted = query(&cdc.messages)
                    .bind(&id)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(store_error)?;
                replayed = !emitted.is_empty();
            }
        }
        tx.commit().await.map_err(store_error)?;
        if replayed {
            self.wake();
        }
        Ok(replayed)
    }

    /// The state of the row of message `id`, or `None` if there is none (never
    /// enqueued, purged after publishing, or deleted on publish).
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
        let row = query(&self.sql().status)
            .bind(id.to_string())
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, self.spool().display(), format_args!("id {id}"));
        Ok(Some(decode_state(&reader)?))
    }
}

impl PgOutbox {
    /// The backlog: [`stats`](Self::stats) without the count of published rows, which
    /// grows with retention.
    pub(super) async fn read_backlog(&self) -> Result<Backlog> {
        self.counts(&self.sql().backlog, false)
            .await
            .map(Backlog::from)
    }

    /// Reads the counts of `sql`'s one row: `waiting` (pending rows, scheduled ones
    /// included), `scheduled`, `dead`, `done` if `with_done`, and the oldest pending row's
    /// age in `oldest_pending_us`.
    async fn counts(&self, sql: &std::sync::Arc<str>, with_done: bool) -> Result<OutboxStats> {
        let row = query(sql)
            .fetch_one(self.pool())
            .await
            .map_err(store_error)?;
        let count = |column: &str| -> Result<u64> {
            let n: i64 = row.try_get(column).map_err(store_error)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let oldest: Option<i64> = row.try_get("oldest_pending_us").map_err(store_error)?;
        let scheduled = count("scheduled")?;
        Ok(OutboxStats {
            pending: count("waiting")?.saturating_sub(scheduled),
            scheduled,
            done: if with_done { count("done")? } else { 0 },
            dead: count("dead")?,
            oldest_pending_age: oldest.map(micros_duration),
        })
    }
}

impl OutboxAdmin for PgOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        PgOutbox::stats(self).await
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        let row = query(&self.sql().row)
            .bind(id.to_string())
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, self.spool().display(), format_args!("id {id}"));
        Ok(Some(OutboxRow {
            state: decode_state(&reader)?,
            message: Message::decode(&reader)?,
        }))
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_after(after, limit).await
    }

    /// See [`PgOutbox::rows`] for the indexes each filter reads.
    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        PgOutbox::rows(self, filter, before, limit).await
    }

    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        PgOutbox::published_per_minute(self, since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        PgOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        let result = query(&self.sql().purge_dead)
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
        dead_at: from_micros(dead_at.unwrap_or(0)),
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
        available_at: from_micros(row.get("available_at")?),
        leased_until: row.get::<Option<i64>>("lease_until")?.map(from_micros),
        settled_at: done_at.or(dead_at).map(from_micros),
    })
}
