//! What operators ask of the outbox: figures, one row's state, dead letters and their
//! replay, the listing the dashboard pages through. The statements are SQLite's; what
//! runs them is `oncebox-sql`'s, once for every database.

use std::sync::LazyLock;
use std::time::SystemTime;

use oncebox_core::spool::{MinuteCount, OutboxAdmin, OutboxRow, RowFilter};
use oncebox_core::time::to_unix_millis;
use oncebox_core::{Message, MessageId, Result};
use oncebox_sql::{OutboxColumns, OutboxStatements, Query, RowReader, SqlOutboxAdmin};
use sqlx::{QueryBuilder, Sqlite};

pub use oncebox_core::spool::{DeadLetter, OutboxStats, RowState, RowStatus};

use super::{SqliteOutbox, sql};
use crate::SqliteDialect;
use crate::error::{RowDecodeError, store_error};
use crate::spool::SpoolRow;

/// The admin statements of `oncebox_outbox`.
pub(crate) struct OutboxSql;

static COLUMNS: LazyLock<OutboxColumns> = LazyLock::new(|| {
    OutboxColumns::named(sql::TABLE, sql::LISTING.to_owned(), "key", "t.created_at")
});

impl OutboxStatements for OutboxSql {
    type Dialect = SqliteDialect;

    fn columns(&self) -> &OutboxColumns {
        &COLUMNS
    }

    fn display(&self) -> &str {
        sql::TABLE
    }

    fn message(row: &RowReader<'_, SqliteDialect>) -> Result<Message, RowDecodeError> {
        Message::decode(row)
    }

    fn push_id(query: &mut QueryBuilder<Sqlite>, id: MessageId) {
        query.push_bind(id.to_string());
    }

    fn counts(&self, with_done: bool, now: SystemTime) -> Query<Sqlite> {
        sqlx::query(if with_done { sql::STATS } else { sql::BACKLOG }).bind(to_unix_millis(now))
    }

    fn published_per_minute(&self, since: SystemTime) -> Query<Sqlite> {
        sqlx::query(sql::PUBLISHED_PER_MINUTE).bind(to_unix_millis(since))
    }

    fn purge_dead(&self, id: MessageId) -> Query<Sqlite> {
        sqlx::query(sql::PURGE_DEAD).bind(id.to_string())
    }

    /// The dead rows alone (the dead letters, and the listing of status dead) name the
    /// partial index of dead rows: with statistics, the planner may otherwise read the
    /// table from `after` on in `seq` order, over every row kept for retention.
    fn index_hint(&self, filter: &RowFilter) -> &'static str {
        let dead = RowFilter {
            status: Some(RowStatus::Dead),
            ..RowFilter::default()
        };
        if *filter == dead {
            " INDEXED BY oncebox_outbox_dead"
        } else {
            ""
        }
    }
}

impl SqliteOutbox {
    pub(super) fn admin(&self) -> SqlOutboxAdmin<'_, OutboxSql> {
        SqlOutboxAdmin::new(self.pool(), &OutboxSql)
    }

    /// Counts rows by status and measures the oldest pending age, in one statement; each
    /// count walks a partial index of its status.
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
        self.admin().state(id).await
    }
}

impl OutboxAdmin for SqliteOutbox {
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
    /// so a page costs the same at any depth: with no status or status done, the table
    /// itself (its rowid is the `seq`); with status pending or dead, the partial index of
    /// that status; with an id, the unique index of ids; pending rows of one key, the
    /// partial index of pending keys; a creation-time window, the index by creation time
    /// (`oncebox_outbox_created`), in descending creation time. Topic and key (of other
    /// statuses) have no index of their own: rows are filtered one by one until `limit`
    /// match, which reads every row older than `before` where matches are rare or none
    /// are left.
    ///
    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        self.admin().rows(filter, before, limit).await
    }

    /// Messages published per minute since `since`, oldest minute first.
    /// SQLite has no clock of its own: publication times are those of the relays'
    /// hosts. Reads the partial index of done rows by publication time (the
    /// retention's), over the rows published since `since` only.
    ///
    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        self.admin().published_per_minute(since).await
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        SqliteOutbox::replay_dead(self, id).await
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        self.admin().purge_dead(id).await
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::sql::ListingStart;
    use oncebox_core::time::from_unix_millis;
    use sqlx::Row;

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
            let plan: Vec<String> = SqlOutboxAdmin::new(store.pool(), &OutboxSql)
                .listing("EXPLAIN QUERY PLAN ", &filter, start, 50)
                .build()
                .fetch_all(store.pool())
                .await
                .expect("explain the listing")
                .iter()
                .map(|row| row.get::<String, _>("detail"))
                .collect();
            let outer = plan
                .iter()
                .find(|step| step.contains(" t "))
                .unwrap_or_else(|| panic!("{name}: no step reads the outbox: {plan:?}"));
            assert!(
                outer.starts_with("SEARCH t USING") && outer.contains(index),
                "{name} does not read {index}: {plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{name} sorts: {plan:?}"
            );
        }
    }
}
