//! The transactional inbox on MySQL / MariaDB: its statements, for the inbox written
//! once in `oncebox-sql`.

use std::time::SystemTime;

use oncebox_sql::{InboxDialect, Query, SqlInbox};
use sqlx::MySql;

use crate::dialect::MySqlDialect;
use crate::sql::{ms_since, now_ms, query, sql_limit};

/// Longest consumer name, in bytes (`VARBINARY(255)`).
pub(crate) const MAX_CONSUMER_BYTES: usize = 255;
/// Longest id, in bytes (`VARBINARY(1024)`).
pub(crate) const MAX_ID_BYTES: usize = 1024;

/// `?` consumer, `?` id.
const RECORD: &str = concat!(
    "INSERT INTO oncebox_inbox (consumer, message_id, processed_at) VALUES (?, ?, ",
    now_ms!(),
    ")"
);

/// `?` consumer, `?` id → `result`; a locking read, so it reads the latest committed
/// record whatever the transaction's isolation level.
const STORED_RESULT: &str = "SELECT result FROM oncebox_inbox
WHERE consumer = ? AND message_id = ? LOCK IN SHARE MODE";

/// `?` result, `?` consumer, `?` id.
const STORE_RESULT: &str =
    "UPDATE oncebox_inbox SET result = ? WHERE consumer = ? AND message_id = ?";

/// `?` consumer, `?` id, `?` result.
const INSERT_RESULT: &str = concat!(
    "INSERT INTO oncebox_inbox (consumer, message_id, result, processed_at) VALUES (?, ?, ?, ",
    now_ms!(),
    ")"
);

/// `?` consumer, `?` age ms, `?` limit: the consumer's oldest records, read in order on
/// `oncebox_inbox_consumer_processed` up to the limit, then deleted by key. The index is
/// forced: given a single-table `DELETE ... ORDER BY processed_at LIMIT ?`, MariaDB
/// reads all of the consumer's records by the primary key and sorts them.
const PURGE: &str = concat!(
    "DELETE i FROM oncebox_inbox AS i JOIN (
  SELECT consumer, message_id FROM oncebox_inbox FORCE INDEX (oncebox_inbox_consumer_processed)
  WHERE consumer = ? AND processed_at < ",
    now_ms!(),
    " - ?
  ORDER BY processed_at
  LIMIT ?) AS old
ON i.consumer = old.consumer AND i.message_id = old.message_id"
);

/// `?` consumer: adds one to the consumer's count of skipped duplicates.
const COUNT_DUPLICATE: &str = concat!(
    "INSERT INTO oncebox_inbox_duplicates (consumer, skipped, last_at) VALUES (?, 1, ",
    now_ms!(),
    ")
ON DUPLICATE KEY UPDATE skipped = skipped + 1, last_at = VALUES(last_at)"
);

/// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled` (ms) per
/// consumer, in byte order of the name. `SUM` is `DECIMAL` in MySQL: the casts make the
/// counts `BIGINT`.
const CONSUMERS: &str = "\
SELECT consumer, CAST(SUM(handled) AS SIGNED) AS handled,
  CAST(SUM(pending) AS SIGNED) AS pending, CAST(SUM(dead) AS SIGNED) AS dead,
  CAST(SUM(duplicates) AS SIGNED) AS duplicates, MAX(last_at) AS last_handled
FROM (
  SELECT consumer, COUNT(*) AS handled, 0 AS pending, 0 AS dead, 0 AS duplicates,
    MAX(processed_at) AS last_at
  FROM oncebox_inbox GROUP BY consumer
  UNION ALL
  SELECT consumer, SUM(status = 1), SUM(status = 0), SUM(status = 2), 0,
    MAX(CASE WHEN status = 1 THEN done_at END)
  FROM oncebox_durable_inbox GROUP BY consumer
  UNION ALL
  SELECT consumer, 0, 0, 0, skipped, NULL FROM oncebox_inbox_duplicates
) AS figures
GROUP BY consumer
ORDER BY consumer";

/// A durable inbox row for the admin's listing, up to its `WHERE`; the lease is
/// the latest live claim's on the row (0 when none).
const INBOX_ROWS: &str = "\
SELECT d.seq, d.consumer, d.dedup_id, d.status, d.attempts, d.last_error, d.available_at,
  d.done_at, d.dead_at,
  COALESCE((
    SELECT MAX(c.lease_until)
    FROM oncebox_claims AS c
      CROSS JOIN JSON_TABLE(c.seqs, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j
    WHERE c.spool = CONCAT('oncebox_durable_inbox:', d.consumer) AND j.seq = d.seq), 0)
    AS lease_until,
  d.received_at, d.result, d.message_id, d.topic, d.`key`, d.kind, d.headers, d.payload,
  d.created_at, d.source, d.`partition`, d.`position`, d.delivery_count
FROM oncebox_durable_inbox AS d";

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `oncebox_inbox`, keyed by consumer and id); and the
/// inbox admin of the database.
///
/// [`record`](oncebox_core::store::InboxStore::record) is a plain `INSERT` under the
/// primary key, never a read first: of concurrent transactions recording the same id,
/// one inserts and the others wait on the key until it commits (then their insert fails
/// with a duplicate key, which MySQL reports for the statement only, and they read its
/// result with a locking read) or rolls back (then one of them inserts). Transactions use
/// the connection's isolation level (InnoDB's default is `REPEATABLE READ`); the handler
/// runs its queries on `&mut **tx`.
///
/// Ids are compared byte for byte and hold at most 1024 bytes; consumer names at most
/// 255.
///
/// The admin's [`consumers`](oncebox_core::consumer::InboxAdmin::consumers) reads, in
/// one statement, every record of the transactional inbox and every row of the durable
/// inbox, each once; InnoDB can read both from indexes that cover what is counted
/// (`(consumer, processed_at)` and `(consumer, status, done_at)`): call it at the pace
/// of a dashboard, not per message. Its
/// [`inbox_rows`](oncebox_core::consumer::InboxAdmin::inbox_rows) reads newest first
/// from `before`, on the primary key or, for one consumer's rows of a status, the
/// `(consumer, status, seq)` index. The other criteria have no index of their own: rows
/// are filtered one by one until `limit` match, which reads every row older than
/// `before` where matches are rare.
pub type MySqlInbox = SqlInbox<MySqlDialect>;

impl InboxDialect for MySqlDialect {
    fn record(&self, consumer: &str, id: &str) -> Query<MySql> {
        query(RECORD)
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
    }

    fn stored_result(&self, consumer: &str, id: &str) -> Query<MySql> {
        query(STORED_RESULT)
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
    }

    /// An update: the connection reports rows *matched* (sqlx sets `CLIENT_FOUND_ROWS`),
    /// so 0 means the record is missing, never that the result was already this one.
    fn store_result(&self, consumer: &str, id: &str, result: &[u8]) -> Query<MySql> {
        query(STORE_RESULT)
            .bind(result.to_vec())
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
    }

    fn insert_result(&self, consumer: &str, id: &str, result: &[u8]) -> Option<Query<MySql>> {
        Some(
            query(INSERT_RESULT)
                .bind(consumer.as_bytes().to_vec())
                .bind(id.as_bytes().to_vec())
                .bind(result.to_vec()),
        )
    }

    fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Query<MySql> {
        query(PURGE)
            .bind(consumer.as_bytes())
            .bind(ms_since(before))
            .bind(sql_limit(limit))
    }

    fn count_duplicate(&self, consumer: &str) -> Query<MySql> {
        query(COUNT_DUPLICATE).bind(consumer.as_bytes().to_vec())
    }

    fn consumers(&self) -> Query<MySql> {
        query(CONSUMERS)
    }

    fn durable_rows(&self) -> &str {
        INBOX_ROWS
    }

    const DURABLE_KEY: &'static str = "d.`key`";

    fn inbox_table(&self) -> &str {
        "oncebox_inbox"
    }

    fn durable_table(&self) -> &str {
        "oncebox_durable_inbox"
    }
}
