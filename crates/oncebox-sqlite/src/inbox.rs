//! The transactional inbox on SQLite: its statements, for the inbox written once in
//! `oncebox-sql`.

use std::time::SystemTime;

use oncebox_core::sql::sql_limit;
use oncebox_core::time::to_unix_millis;
use oncebox_sql::{InboxDialect, Query, SqlInbox};
use sqlx::Sqlite;

use crate::dialect::SqliteDialect;

/// `?1` consumer, `?2` id, `?3` now (ms).
const RECORD: &str = "\
INSERT INTO oncebox_inbox (consumer, message_id, processed_at) VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, message_id) DO NOTHING";

/// `?1` consumer, `?2` id → `result`.
const STORED_RESULT: &str = "\
SELECT result FROM oncebox_inbox WHERE consumer = ?1 AND message_id = ?2";

/// `?1` consumer, `?2` id, `?3` result, `?4` now (ms).
const STORE_RESULT: &str = "\
INSERT INTO oncebox_inbox (consumer, message_id, result, processed_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (consumer, message_id) DO UPDATE SET result = excluded.result";

/// `?1` consumer, `?2` processed before (ms), `?3` limit.
const PURGE: &str = "\
DELETE FROM oncebox_inbox WHERE rowid IN (
  SELECT rowid FROM oncebox_inbox WHERE consumer = ?1 AND processed_at < ?2
  ORDER BY processed_at LIMIT ?3)";

/// `?1` consumer, `?2` now (ms): adds one to the consumer's count of skipped duplicates.
const COUNT_DUPLICATE: &str = "\
INSERT INTO oncebox_inbox_duplicates (consumer, skipped, last_at) VALUES (?1, 1, ?2)
ON CONFLICT (consumer) DO UPDATE SET skipped = skipped + 1, last_at = excluded.last_at";

/// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled` (ms) per
/// consumer, in byte order of the name.
const CONSUMERS: &str = "\
SELECT consumer, sum(handled) AS handled, sum(pending) AS pending, sum(dead) AS dead,
  sum(duplicates) AS duplicates, max(last_at) AS last_handled
FROM (
  SELECT consumer, count(*) AS handled, 0 AS pending, 0 AS dead, 0 AS duplicates,
    max(processed_at) AS last_at
  FROM oncebox_inbox GROUP BY consumer
  UNION ALL
  SELECT consumer, sum(status = 'done'), sum(status = 'pending'), sum(status = 'dead'), 0,
    max(CASE WHEN status = 'done' THEN done_at END)
  FROM oncebox_durable_inbox GROUP BY consumer
  UNION ALL
  SELECT consumer, 0, 0, 0, skipped, NULL FROM oncebox_inbox_duplicates
)
GROUP BY consumer
ORDER BY consumer";

/// A durable inbox row for the admin's listing, up to its `WHERE`; the lease is
/// the latest claim's on the row.
const INBOX_ROWS: &str = "\
SELECT d.seq, d.consumer, d.dedup_id, d.status, d.attempts, d.available_at, d.last_error,
       d.done_at, d.dead_at,
       (SELECT max(c.until) FROM oncebox_durable_inbox_claims AS c, json_each(c.seqs) AS j
        WHERE c.consumer = d.consumer AND j.value = d.seq) AS lease_until,
       d.received_at, d.result, d.message_id, d.topic, d.key, d.kind, d.headers,
       CAST(d.payload AS BLOB) AS payload, d.created_at, d.source, d.partition, d.position,
       d.delivery_count
FROM oncebox_durable_inbox AS d";

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `oncebox_inbox`, keyed by consumer and id); and the
/// inbox admin of the database.
///
/// Transactions start with `BEGIN IMMEDIATE`, so handler transactions on one database
/// run one at a time (SQLite has a single writer); keep handlers short. The handler runs
/// its queries on `&mut **tx`.
///
/// The admin's [`consumers`](oncebox_core::consumer::InboxAdmin::consumers) reads, in
/// one statement, every record of the transactional inbox (from its `(consumer,
/// processed_at)` index, which covers them) and every row of the durable inbox, each
/// once: call it at the pace of a dashboard, not per message. Its
/// [`inbox_rows`](oncebox_core::consumer::InboxAdmin::inbox_rows) reads newest first
/// from `before`, on the table (its rowid is the `seq`) or, for a consumer's pending
/// rows, the partial index of pending rows. The other criteria have no index of their
/// own: rows are filtered one by one until `limit` match, which reads every row older
/// than `before` where matches are rare.
pub type SqliteInbox = SqlInbox<SqliteDialect>;

/// Now, in the milliseconds the time columns hold.
fn now() -> i64 {
    to_unix_millis(SystemTime::now())
}

impl InboxDialect for SqliteDialect {
    fn record(&self, consumer: &str, id: &str) -> Query<Sqlite> {
        sqlx::query(RECORD)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(now())
    }

    fn stored_result(&self, consumer: &str, id: &str) -> Query<Sqlite> {
        sqlx::query(STORED_RESULT)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
    }

    fn store_result(&self, consumer: &str, id: &str, result: &[u8]) -> Query<Sqlite> {
        sqlx::query(STORE_RESULT)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(result.to_vec())
            .bind(now())
    }

    fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Query<Sqlite> {
        sqlx::query(PURGE)
            .bind(consumer.to_owned())
            .bind(to_unix_millis(before))
            .bind(sql_limit(limit))
    }

    fn count_duplicate(&self, consumer: &str) -> Query<Sqlite> {
        sqlx::query(COUNT_DUPLICATE)
            .bind(consumer.to_owned())
            .bind(now())
    }

    fn consumers(&self) -> Query<Sqlite> {
        sqlx::query(CONSUMERS)
    }

    fn durable_rows(&self) -> &str {
        INBOX_ROWS
    }

    const DURABLE_KEY: &'static str = "d.key";

    fn inbox_table(&self) -> &str {
        "oncebox_inbox"
    }

    fn durable_table(&self) -> &str {
        "oncebox_durable_inbox"
    }
}
