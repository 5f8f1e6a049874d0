//! What the dashboard reads of the outbox: rows newest first, filtered and paged, and
//! the messages published per minute.

use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxRow, RowFilter, RowStatus};
use oncebox_core::sql::{Conditions, ListingStart};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Message, Result};
use sqlx::{QueryBuilder, Row, Sqlite};

use super::admin::decode_state;
use super::{SqliteOutbox, sql};
use crate::error::{RowReader, store_error};
use crate::spool::{SpoolRow, sql_limit};

impl SqliteOutbox {
    /// Up to `limit` rows that match `filter`, newest first, from the row before `before`
    /// (see [`OutboxAdmin::rows`](oncebox_core::spool::OutboxAdmin::rows)).
    ///
    /// One statement, which reads an index in descending commit order from `before` on,
    /// so a page costs the same at any depth: with no status or status done, the table
    /// itself (its rowid is the `seq`); with status pending or dead, the partial index of
    /// that status; with an id, the unique index of ids; pending rows of one key, the
    /// partial index of pending keys; a creation-time window, the index by creation time
    /// (`oncebox_outbox_created`), in descending creation time. Topic and key (of other
    /// statuses) have no index of their own: rows are filtered one by one until `limit`
    /// match, which reads every row older than `before` where matches are rare or none
    /// are left.
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
                let reader = RowReader::new(row, sql::TABLE, format_args!("seq {seq}"));
                Ok(OutboxRow {
                    state: decode_state(&reader)?,
                    message: Message::decode(&reader)?,
                })
            })
            .collect()
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
        let created: Option<i64> = sqlx::query_scalar(sql::CREATED)
            .bind(seq)
            .fetch_optional(self.pool())
            .await
            .map_err(store_error)?;
        Ok(created.map(|created| ListingStart::BeforeCreated { created, seq }))
    }

    /// Messages published per minute since `since`, oldest minute first (see
    /// [`OutboxAdmin::published_per_minute`](oncebox_core::spool::OutboxAdmin::published_per_minute)).
    /// SQLite has no clock of its own: publication times are those of the relays'
    /// hosts. Reads the partial index of done rows by publication time (the
    /// retention's), over the rows published since `since` only.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        let rows = sqlx::query(sql::PUBLISHED_PER_MINUTE)
            .bind(to_unix_millis(since))
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
/// `filter` that is set: the status as a literal (which the planner needs to read the
/// status's partial index), every value bound.
fn listing(
    prefix: &str,
    filter: &RowFilter,
    start: ListingStart,
    limit: usize,
) -> QueryBuilder<Sqlite> {
    let mut query = QueryBuilder::new(prefix);
    query.push(sql::LISTING);
    let mut conditions = Conditions::new(&mut query);
    if let Some(status) = filter.status {
        conditions.and("o.status = ").push(status_literal(status));
    }
    if let Some(topic) = &filter.topic {
        conditions.and("o.topic = ").push_bind(topic.clone());
    }
    if let Some(key) = &filter.key {
        conditions.and("o.key = ").push_bind(key.clone());
    }
    if let Some(id) = filter.id {
        conditions.and("o.id = ").push_bind(id.to_string());
    }
    if let Some(from) = filter.created_from {
        conditions
            .and("o.created_at >= ")
            .push_bind(to_unix_millis(from));
    }
    if let Some(until) = filter.created_until {
        conditions
            .and("o.created_at < ")
            .push_bind(to_unix_millis(until));
    }
    match start {
        ListingStart::Newest => {}
        ListingStart::Before { seq } => {
            conditions.and("o.seq < ").push_bind(seq);
        }
        ListingStart::BeforeCreated { created, seq } => {
            conditions
                .and("(o.created_at, o.seq) < (")
                .push_bind(created)
                .push(", ")
                .push_bind(seq)
                .push(")");
        }
    }
    query.push(if ListingStart::by_creation(filter) {
        " ORDER BY o.created_at DESC, o.seq DESC LIMIT "
    } else {
        " ORDER BY o.seq DESC LIMIT "
    });
    query.push_bind(sql_limit(limit));
    query
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

#[cfg(test)]
mod tests {
    use oncebox_core::MessageId;

    use super::*;
    use crate::SqliteStore;

    /// The listings the dashboard pages through read an index from the page's start:
    /// no sort, no scan of the table in another order, on an empty database and with
    /// statistics taken on a large one.
    #[tokio::test]
    async fn listings_read_an_index_in_their_order() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = SqliteStore::connect(dir.path().join("listing.db"))
            .await
            .expect("open the database");
        store.migrate().await.expect("migrate");
        assert_listings_indexed(&store).await;
        for statement in [
            "INSERT INTO oncebox_outbox
               (id, topic, key, payload, created_at, available_at, status, done_at, dead_at)
             WITH RECURSIVE n (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 19999)
             SELECT 'id-' || i, 't' || (i % 3), 'k' || (i % 200), x'', i, 0,
                    CASE WHEN i % 500 = 0 THEN 'dead' WHEN i > 19000 THEN 'pending'
                         ELSE 'done' END, i, i
             FROM n",
            "ANALYZE",
        ] {
            sqlx::query(statement)
                .execute(store.pool())
                .await
                .expect("fill the outbox");
        }
        assert_listings_indexed(&store).await;
    }

    async fn assert_listings_indexed(store: &SqliteStore) {
        let with = |status, key: Option<&str>, id| RowFilter {
            status,
            key: key.map(str::to_owned),
            id,
            ..RowFilter::default()
        };
        let cases = [
            ("no filter", with(None, None, None), "INTEGER PRIMARY KEY"),
            (
                "pending",
                with(Some(RowStatus::Pending), None, None),
                "oncebox_outbox_pending",
            ),
            (
                "dead",
                with(Some(RowStatus::Dead), None, None),
                "oncebox_outbox_dead",
            ),
            (
                "done",
                with(Some(RowStatus::Done), None, None),
                "INTEGER PRIMARY KEY",
            ),
            (
                "pending of a key",
                with(Some(RowStatus::Pending), Some("k7"), None),
                "oncebox_outbox_pending_key",
            ),
            (
                "id",
                with(Some(RowStatus::Dead), None, Some(MessageId::new())),
                "sqlite_autoindex_oncebox_outbox",
            ),
            (
                "created in a window",
                RowFilter {
                    created_from: Some(from_unix_millis(5_000)),
                    created_until: Some(from_unix_millis(15_000)),
                    ..RowFilter::default()
                },
                "oncebox_outbox_created",
            ),
            (
                "done, created before a time",
                RowFilter {
                    status: Some(RowStatus::Done),
                    created_until: Some(from_unix_millis(15_000)),
                    ..RowFilter::default()
                },
                "oncebox_outbox_created",
            ),
        ];
        for (name, filter, index) in cases {
            let start = if ListingStart::by_creation(&filter) {
                ListingStart::BeforeCreated {
                    created: 12_000,
                    seq: 10_000,
                }
            } else {
                ListingStart::Before { seq: 10_000 }
            };
            let plan: Vec<String> = listing("EXPLAIN QUERY PLAN ", &filter, start, 50)
                .build()
                .fetch_all(store.pool())
                .await
                .expect("explain the listing")
                .iter()
                .map(|row| row.get::<String, _>("detail"))
                .collect();
            let outer = plan
                .iter()
                .find(|step| step.contains(" o "))
                .unwrap_or_else(|| panic!("{name}: no step reads the outbox: {plan:?}"));
            assert!(
                outer.starts_with("SEARCH o USING") && outer.contains(index),
                "{name} does not read {index}: {plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{name} sorts: {plan:?}"
            );
        }
    }
}
