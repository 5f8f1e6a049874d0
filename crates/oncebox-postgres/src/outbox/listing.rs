//! What the dashboard reads of the outbox: rows newest first, filtered and paged, and
//! the messages published per minute.

use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxRow, RowFilter, RowStatus};
use oncebox_core::sql::{Conditions, ListingStart};
use oncebox_core::{Message, Result};
use sqlx::{Postgres, QueryBuilder, Row};

use super::PgOutbox;
use super::admin::decode_state;
use crate::error::{RowReader, store_error};
use crate::spool::{SpoolRow, query, sql_limit};
use crate::time::{from_micros, micros_of, ms_since, to_micros};

impl PgOutbox {
    /// Up to `limit` rows that match `filter`, newest first, from the row before `before`
    /// (see [`OutboxAdmin::rows`](oncebox_core::spool::OutboxAdmin::rows)).
    ///
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
    /// # Errors
    ///
    /// A store error; a permanent one with a [`RowDecodeError`](crate::RowDecodeError)
    /// source if a row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        let Some(start) = self.start(filter, before).await? else {
            return Ok(Vec::new());
        };
        let mut listing = self.listing("", filter, start, limit);
        let rows = listing
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                let reader = RowReader::new(row, self.spool().display(), format_args!("seq {seq}"));
                Ok(OutboxRow {
                    state: decode_state(&reader)?,
                    message: Message::decode(&reader)?,
                })
            })
            .collect()
    }

    /// Explains [`rows`](Self::rows) on this table's data: runs its statement for the
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
        let Some(start) = self.start(filter, before).await? else {
            return Ok("the row at `before` is gone: nothing is read".to_owned());
        };
        let mut listing = self.listing("EXPLAIN (ANALYZE, BUFFERS) ", filter, start, limit);
        let lines = listing
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        Ok(lines.join("\n"))
    }

    /// Messages published per minute since `since`, by the database's clock, oldest
    /// minute first (see
    /// [`OutboxAdmin::published_per_minute`](oncebox_core::spool::OutboxAdmin::published_per_minute)).
    ///
    /// One count per minute over its range of the partial index of done rows by
    /// publication time (`outbox_done`, the retention's): every row published since
    /// `since` is read once, in the index only, so the cost grows with the rows
    /// published: an hour at 1,000 messages a second (3.6 million rows) took 0.5 s on a
    /// 2-core machine. Call it at the pace of a dashboard, over the window it shows.
    /// Runs in a read-only transaction with JIT compilation off, which cost more than
    /// the counting it would speed up.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        let mut tx = self
            .pool()
            .begin_with("BEGIN READ ONLY; SET LOCAL jit = off")
            .await
            .map_err(store_error)?;
        let rows = query(&self.sql().published_per_minute)
            .bind(ms_since(since))
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let minute: i64 = row.try_get("minute").map_err(store_error)?;
                let published: i64 = row.try_get("published").map_err(store_error)?;
                Ok(MinuteCount {
                    minute: from_micros(minute.saturating_mul(60_000_000)),
                    published: u64::try_from(published).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Where a page starts: the newest row, or the row before `before` in the listing's
    /// order. With a creation-time criterion that order is by creation time, and the
    /// row at `before` is read for its time: `None` if it is gone (purged since the
    /// page before), which ends the listing.
    async fn start(&self, filter: &RowFilter, before: Option<i64>) -> Result<Option<ListingStart>> {
        let Some(seq) = before else {
            return Ok(Some(ListingStart::Newest));
        };
        if !ListingStart::by_creation(filter) {
            return Ok(Some(ListingStart::Before { seq }));
        }
        let sql = &self.sql().listing;
        let mut query = QueryBuilder::new("SELECT ");
        query
            .push(micros_of(&sql.created))
            .push(" FROM ")
            .push(&self.sql().table)
            .push(" AS t WHERE ")
            .push(&sql.seq)
            .push(" = ")
            .push_bind(seq);
        let created: Option<i64> = query
            .build_query_scalar()
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        Ok(created.map(|created| ListingStart::BeforeCreated { created, seq }))
    }

    /// The listing statement, after `prefix`, with a condition for each criterion of
    /// `filter` that is set: the status as a literal (the planner then reads the
    /// status's partial index in every plan, cached or not), every value bound.
    fn listing(
        &self,
        prefix: &str,
        filter: &RowFilter,
        start: ListingStart,
        limit: usize,
    ) -> QueryBuilder<Postgres> {
        let sql = &self.sql().listing;
        let mut query = QueryBuilder::new(prefix);
        query.push(&sql.select);
        let mut conditions = Conditions::new(&mut query);
        if let Some(status) = filter.status {
            conditions
                .and(&sql.status)
                .push(" = ")
                .push(status_literal(status));
        }
        if let Some(topic) = &filter.topic {
            // A Debezium-style table holds only topics under its prefix, as aggregate types.
            match self.topic_column(topic) {
                Ok(aggregate) => conditions.and(&sql.topic).push(" = ").push_bind(aggregate),
                Err(_) => conditions.and("false"),
            };
        }
        if let Some(key) = &filter.key {
            // A Debezium-style table (the one layout with a topic prefix) stores "no
            // key" as an empty aggregate id: none of its rows has the empty key.
            if key.is_empty() && self.sql().topic_prefix.is_some() {
                conditions.and("false");
            } else {
                conditions.and(&sql.key).push(" = ").push_bind(key.clone());
            }
        }
        if let Some(id) = filter.id {
            conditions
                .and("t.id = ")
                .push_bind(id.to_string())
                .push("::uuid");
        }
        if let Some(from) = filter.created_from {
            push_time(conditions.and(&sql.created).push(" >= "), from);
        }
        if let Some(until) = filter.created_until {
            push_time(conditions.and(&sql.created).push(" < "), until);
        }
        match start {
            ListingStart::Newest => {}
            ListingStart::Before { seq } => {
                conditions.and(&sql.seq).push(" < ").push_bind(seq);
            }
            ListingStart::BeforeCreated { created, seq } => {
                let row = conditions
                    .and("(")
                    .push(&sql.created)
                    .push(", ")
                    .push(&sql.seq);
                push_micros(row.push(") < ("), created)
                    .push(", ")
                    .push_bind(seq)
                    .push(")");
            }
        }
        query.push(" ORDER BY ");
        if ListingStart::by_creation(filter) {
            query.push(&sql.created).push(" DESC, ");
        }
        query
            .push(&sql.seq)
            .push(" DESC LIMIT ")
            .push_bind(sql_limit(limit));
        query
    }
}

/// Pushes `time` as a `timestamptz` made of a bound count of microseconds (exact).
pub(crate) fn push_time(query: &mut QueryBuilder<Postgres>, time: SystemTime) {
    push_micros(query, to_micros(time));
}

/// Pushes `micros` since the Unix epoch as a `timestamptz`, the count bound.
fn push_micros(query: &mut QueryBuilder<Postgres>, micros: i64) -> &mut QueryBuilder<Postgres> {
    query
        .push("(timestamptz 'epoch' + ")
        .push_bind(micros)
        .push("::bigint * interval '1 microsecond')")
}

/// The stored value of `status`, as SQL.
pub(crate) fn status_literal(status: RowStatus) -> &'static str {
    match status {
        RowStatus::Pending => "'pending'",
        RowStatus::Done => "'done'",
        RowStatus::Dead => "'dead'",
        // A status this version does not store: no row has it.
        _ => "NULL",
    }
}
