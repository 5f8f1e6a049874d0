//! What the dashboard reads of the outbox: rows newest first, filtered and paged, and
//! the messages published per minute.

use std::sync::LazyLock;
use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxRow, RowFilter, RowStatus};
use oncebox_core::sql::{Conditions, ListingStart};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Message, Result};
use sqlx::{MySql, QueryBuilder, Row};

use super::admin::{SQL, decode_state};
use super::{MySqlOutbox, TABLE};
use crate::error::{RowReader, store_error};
use crate::spool::SpoolRow;
use crate::spool::explain::format_plan;
use crate::spool::sql::{DEAD, DONE, PENDING};
use crate::sql::{NOW_MS, ms_since, query, sql_limit, uuid_bytes};

/// `?` seq → the row's `created_at`.
const CREATED: &str = "SELECT created_at FROM oncebox_outbox WHERE seq = ?";

/// `?` age ms → `minute` (minutes since the Unix epoch) and `published`, per minute of
/// `done_at` since the database's now less the age.
static PUBLISHED_PER_MINUTE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT done_at DIV 60000 AS minute, COUNT(*) AS published
FROM {TABLE}
WHERE status = {DONE} AND done_at >= {NOW_MS} - ?
GROUP BY done_at DIV 60000 ORDER BY minute"
    )
});

impl MySqlOutbox {
    /// Up to `limit` rows that match `filter`, newest first, from the row before `before`
    /// (see [`OutboxAdmin::rows`](oncebox_core::spool::OutboxAdmin::rows)).
    ///
    /// One statement, which reads an index in descending commit order from `before` on,
    /// so a page costs the same at any depth: with no status, the primary key; with a
    /// status, the `(status, seq)` index (for done rows too); with a status and a key,
    /// the `(status, key, seq)` index; with an id, the unique index of ids; with a
    /// creation-time window, the `(created_at, seq)` index, in descending creation time.
    /// Topic and key (without a status) have no index of their own: rows are filtered
    /// one by one until `limit` match, which reads every row older than `before` where
    /// matches are rare or none are left.
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
        let rows = listing("", filter, start, limit)
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                let reader = RowReader::new(row, TABLE, format_args!("seq {seq}"));
                Ok(OutboxRow {
                    state: decode_state(&reader)?,
                    message: Message::decode(&reader)?,
                })
            })
            .collect()
    }

    /// The plan of [`rows`](Self::rows) for the same arguments (`EXPLAIN`; nothing
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
        let Some(start) = self.start(filter, before).await? else {
            return Ok("the row at `before` is gone: nothing is read".to_owned());
        };
        let rows = listing("EXPLAIN ", filter, start, limit)
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        Ok(format_plan(&rows))
    }

    /// Where a page starts: the newest row, or the row before `before` in the listing's
    /// order. In creation order the row at `before` is read for its time: `None` if it
    /// is gone (purged since the page before), which ends the listing.
    async fn start(&self, filter: &RowFilter, before: Option<i64>) -> Result<Option<ListingStart>> {
        let Some(seq) = before else {
            return Ok(Some(ListingStart::Newest));
        };
        if !ListingStart::by_creation(filter) {
            return Ok(Some(ListingStart::Before { seq }));
        }
        let created: Option<i64> = sqlx::query_scalar(CREATED)
            .bind(seq)
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        Ok(created.map(|created| ListingStart::BeforeCreated { created, seq }))
    }

    /// Messages published per minute since `since`, by the database's clock, oldest
    /// minute first (see
    /// [`OutboxAdmin::published_per_minute`](oncebox_core::spool::OutboxAdmin::published_per_minute)).
    /// Reads the `(status, done_at)` index (the retention's) over the rows published
    /// since `since` only.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        let rows = query(&PUBLISHED_PER_MINUTE)
            .bind(ms_since(since))
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        rows.iter()
            .map(|row| {
                let minute: i64 = row.try_get("minute").map_err(store_error)?;
                let published: i64 = row.try_get("published").map_err(store_error)?;
                Ok(MinuteCount {
                    minute: from_unix_millis(minute.saturating_mul(60_000)),
                    published: u64::try_from(published).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// The listing statement after `prefix`, with a condition for each criterion of
/// `filter` that is set: the status as a literal, as in every other statement on the
/// table, every value bound; with a status, the index of the status read from `before`.
fn listing(
    prefix: &str,
    filter: &RowFilter,
    start: ListingStart,
    limit: usize,
) -> QueryBuilder<MySql> {
    let by_creation = ListingStart::by_creation(filter);
    let mut query = QueryBuilder::new(prefix);
    query.push(&SQL.listing);
    if by_creation && filter.id.is_none() {
        query.push(" FORCE INDEX (oncebox_outbox_created)");
    } else if filter.status.is_some() && filter.id.is_none() {
        // Left to itself, MariaDB reads the rows of a status by the index's first
        // column only, and walks every row of the status after `before` to reach it.
        query.push(if filter.key.is_some() {
            " FORCE INDEX (oncebox_outbox_pending_key)"
        } else {
            " FORCE INDEX (oncebox_outbox_pending)"
        });
    }
    let mut conditions = Conditions::new(&mut query);
    if let Some(status) = filter.status {
        conditions.and("t.status = ").push(status_literal(status));
    }
    if let Some(topic) = &filter.topic {
        conditions.and("t.topic = ").push_bind(topic.clone());
    }
    if let Some(key) = &filter.key {
        conditions
            .and("t.`key` = ")
            .push_bind(key.as_bytes().to_vec());
    }
    if let Some(id) = filter.id {
        conditions
            .and("t.id = ")
            .push_bind(uuid_bytes(id.as_uuid()));
    }
    if let Some(from) = filter.created_from {
        conditions
            .and("t.created_at >= ")
            .push_bind(to_unix_millis(from));
    }
    if let Some(until) = filter.created_until {
        conditions
            .and("t.created_at < ")
            .push_bind(to_unix_millis(until));
    }
    match start {
        ListingStart::Newest => {}
        ListingStart::Before { seq } => {
            conditions.and("t.seq < ").push_bind(seq);
        }
        // Spelled out rather than as a row comparison, which MySQL does not read as a
        // range of the index.
        ListingStart::BeforeCreated { created, seq } => {
            conditions
                .and("t.created_at <= ")
                .push_bind(created)
                .push(" AND (t.created_at < ")
                .push_bind(created)
                .push(" OR t.seq < ")
                .push_bind(seq)
                .push(")");
        }
    }
    query.push(if by_creation {
        " ORDER BY t.created_at DESC, t.seq DESC LIMIT "
    } else {
        " ORDER BY t.seq DESC LIMIT "
    });
    query.push_bind(sql_limit(limit));
    query
}

/// The stored value of `status`, as SQL.
pub(crate) fn status_literal(status: RowStatus) -> String {
    match status {
        RowStatus::Pending => PENDING.to_string(),
        RowStatus::Done => DONE.to_string(),
        RowStatus::Dead => DEAD.to_string(),
        // A status this version does not store: no row has it.
        _ => "NULL".to_owned(),
    }
}
