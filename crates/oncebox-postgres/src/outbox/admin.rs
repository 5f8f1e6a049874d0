//! What operators ask of the outbox: figures, one row's state, dead letters and their
//! replay, the listing the dashboard pages through. The statements are PostgreSQL's (for
//! oncebox's own table and Debezium-style ones); what runs them is `oncebox-sql`'s, once
//! for every database.

use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
use oncebox_core::{Message, MessageId, Result};
use oncebox_sql::{OutboxColumns, OutboxStatements, Query, RowReader, SqlOutboxAdmin};
use sqlx::{PgPool, Postgres, QueryBuilder, Row, Transaction};

pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

use super::PgOutbox;
use super::sql::OutboxSql;
use crate::PgDialect;
use crate::error::{RowDecodeError, store_error};
use crate::spool::{SpoolRow, query};
use crate::time::ms_since;

impl OutboxStatements for OutboxSql {
    type Dialect = PgDialect;

    fn columns(&self) -> &OutboxColumns {
        &self.listing
    }

    fn display(&self) -> &str {
        &self.spool.display
    }

    fn message(row: &RowReader<'_, PgDialect>) -> Result<Message, RowDecodeError> {
        Message::decode(row)
    }

    fn push_id(query: &mut QueryBuilder<Postgres>, id: MessageId) {
        query.push_bind(id.to_string()).push("::uuid");
    }

    fn counts(&self, with_done: bool, _now: SystemTime) -> Query<Postgres> {
        query(if with_done {
            &self.stats
        } else {
            &self.backlog
        })
    }

    fn published_per_minute(&self, since: SystemTime) -> Query<Postgres> {
        query(&self.published_per_minute).bind(ms_since(since))
    }

    fn purge_dead(&self, id: MessageId) -> Query<Postgres> {
        query(&self.purge_dead).bind(id.to_string())
    }

    /// A Debezium-style table holds only topics under its prefix, as aggregate types.
    fn topic(&self, topic: &str) -> Option<String> {
        self.aggregate_type(topic).ok()
    }

    /// A Debezium-style table (the one layout with a topic prefix) stores "no key" as an
    /// empty aggregate id: none of its rows has the empty key.
    fn has_key(&self, key: &str) -> bool {
        !(key.is_empty() && self.topic_prefix.is_some())
    }

    /// Read only, with JIT compilation off, which cost more than the counting it would
    /// speed up.
    async fn begin_read(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
        pool.begin_with("BEGIN READ ONLY; SET LOCAL jit = off")
            .await
            .map_err(store_error)
    }
}

impl PgOutbox {
    pub(super) fn admin(&self) -> SqlOutboxAdmin<'_, OutboxSql> {
        SqlOutboxAdmin::new(self.pool(), self.sql())
    }

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
        self.admin().stats().await
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
        self.admin().dead_letters(None, limit).await
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
        self.admin().state(id).await
    }

    /// Explains [`rows`](OutboxAdmin::rows) on this table's data: runs its statement for the
    /// same arguments under `EXPLAIN (ANALYZE, BUFFERS)` and returns the plan. For
    /// operators asking why a listing is slow, and for benchmarks.
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
            .explain_rows("EXPLAIN (ANALYZE, BUFFERS) ", filter, before, limit)
            .await?;
        let Some(plan) = plan else {
            return Ok("the row at `before` is gone: nothing is read".to_owned());
        };
        let lines = plan
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        Ok(lines.join("\n"))
    }
}

impl OutboxAdmin for PgOutbox {
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
    /// so a page costs the same at any depth:
    ///
    /// - no status: the primary key;
    /// - status pending or dead: the partial index of that status (`outbox_pending`,
    ///   `outbox_dead`), which holds only those rows;
    /// - status done: the primary key (done rows are most of the table);
    /// - an id: the unique index of ids, at most one row;
    /// - pending rows of one key: the partial index of pending keys;
    /// - a creation-time window: the index by creation time (`outbox_created`), read
    ///   newest first from the window's end (or from the row at `before`, read first for
    ///   its time), in descending creation time, then position.
    ///
    /// Topic and key (of other statuses) have no index of their own, and adding one
    /// would cost every enqueue: the index the statement reads is filtered row by row
    /// until `limit` rows match, which is quick where matches are common (a topic among
    /// a few, a key among hundreds) and reads every row older than `before` where they
    /// are rare or none are left (a key with few rows, the last page of any filter).
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
    ///
    /// One count per minute over its range of the partial index of done rows by
    /// publication time (`outbox_done`, the retention's): every row published since
    /// `since` is read once, in the index only, so the cost grows with the rows
    /// published: an hour at 1,000 messages a second (3.6 million rows) took 0.5 s on a
    /// 2-core machine. Call it at the pace of a dashboard, over the window it shows.
    /// Runs in a read-only transaction with JIT compilation off, which cost more than
    /// the counting it would speed up.
    ///
    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        self.admin().published_per_minute(since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        PgOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        self.admin().purge_dead(id).await
    }
}
