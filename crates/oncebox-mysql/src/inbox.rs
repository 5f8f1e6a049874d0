//! The transactional inbox on MySQL / MariaDB.

use std::time::SystemTime;

use oncebox_core::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox_core::sql::Conditions;
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Bytes, Received, Result};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{MySql, QueryBuilder, Row, Transaction};

use crate::error::{RowDecodeError, RowReader, check_bytes, is_duplicate_key, store_error};
use crate::outbox::admin::decode_state;
use crate::outbox::listing::status_literal;
use crate::spool::SpoolRow;
use crate::sql::{delete_read_committed, ms_since, now_ms, query, sql_limit};

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

/// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled_ms` per
/// consumer, in byte order of the name. `SUM` is `DECIMAL` in MySQL: the casts make the
/// counts `BIGINT`.
const CONSUMERS: &str = "\
SELECT consumer, CAST(SUM(handled) AS SIGNED) AS handled,
  CAST(SUM(pending) AS SIGNED) AS pending, CAST(SUM(dead) AS SIGNED) AS dead,
  CAST(SUM(duplicates) AS SIGNED) AS duplicates, MAX(last_at) AS last_handled_ms
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

/// A durable inbox row for [`InboxAdmin::inbox_rows`], up to its `WHERE`; the lease is
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

/// Adds one to `consumer`'s count of skipped duplicates, in a statement of its own.
pub(crate) async fn count_duplicate(pool: &MySqlPool, consumer: &str) -> Result<()> {
    check_bytes("consumer", consumer, MAX_CONSUMER_BYTES)?;
    query(COUNT_DUPLICATE)
        .bind(consumer.as_bytes().to_vec())
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(())
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `oncebox_inbox`, keyed by consumer and id).
///
/// [`record`](InboxStore::record) is a plain `INSERT` under the primary key, never a
/// read first: of concurrent transactions recording the same id, one inserts and the
/// others wait on the key until it commits (then their insert fails with a duplicate
/// key, which MySQL reports for the statement only, and they read its result with a
/// locking read) or rolls back (then one of them inserts). Transactions use the
/// connection's isolation level (InnoDB's default is `REPEATABLE READ`); the handler
/// runs its queries on `&mut **tx`.
///
/// Ids are compared byte for byte and hold at most 1024 bytes; consumer names at most
/// 255.
#[derive(Debug, Clone)]
pub struct MySqlInbox {
    pool: MySqlPool,
}

impl MySqlInbox {
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }
}

impl Transactional for MySqlInbox {
    type Tx = Transaction<'static, MySql>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.pool.begin().await.map_err(store_error)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl InboxStore for MySqlInbox {
    async fn record(&self, tx: &mut Self::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        check_bytes("consumer", consumer, MAX_CONSUMER_BYTES)?;
        check_bytes("message id", id, MAX_ID_BYTES)?;
        let inserted = query(RECORD)
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
            .execute(&mut **tx)
            .await;
        match inserted {
            Ok(_) => return Ok(Recorded::New),
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(store_error(e)),
        }
        let result: Option<Option<Vec<u8>>> = sqlx::query_scalar(STORED_RESULT)
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
            .fetch_optional(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok(Recorded::Duplicate {
            result: result.flatten().map(Bytes::from).unwrap_or_default(),
        })
    }

    async fn store_result(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> Result<()> {
        check_bytes("consumer", consumer, MAX_CONSUMER_BYTES)?;
        check_bytes("message id", id, MAX_ID_BYTES)?;
        // The connection reports rows *matched* (sqlx sets CLIENT_FOUND_ROWS), so 0 means
        // the record is missing, never that the result was already this one.
        let updated = query(STORE_RESULT)
            .bind(result.to_vec())
            .bind(consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        if updated.rows_affected() == 0 {
            query(INSERT_RESULT)
                .bind(consumer.as_bytes().to_vec())
                .bind(id.as_bytes().to_vec())
                .bind(result.to_vec())
                .execute(&mut **tx)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let purge = query(PURGE)
            .bind(consumer.as_bytes())
            .bind(ms_since(before))
            .bind(sql_limit(limit));
        delete_read_committed(&self.pool, purge).await
    }
    async fn count_duplicate(&self, consumer: &str) -> Result<()> {
        count_duplicate(&self.pool, consumer).await
    }
}

impl InboxAdmin for MySqlInbox {
    /// Reads, in one statement, every record of the transactional inbox and every row of
    /// the durable inbox, each once, and groups them by consumer; InnoDB can read both
    /// from indexes that cover what is counted (`(consumer, processed_at)` and
    /// `(consumer, status, done_at)`). The cost grows with what retention keeps: call it
    /// at the pace of a dashboard, not per message.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one, with a [`RowDecodeError`] source, for a consumer
    /// name that is not UTF-8 (written by something other than oncebox).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn consumers(&self) -> Result<Vec<ConsumerStats>> {
        let rows = sqlx::query(CONSUMERS)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.iter().map(consumer_stats).collect()
    }

    /// One statement, newest first from `before`, on the primary key or, for one
    /// consumer's rows of a status, the `(consumer, status, seq)` index. The other
    /// criteria have no index of their own: rows are filtered one by one until `limit`
    /// match, which reads every row older than `before` where matches are rare.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inbox_rows(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<InboxRow>> {
        let rows = listing(filter, before, limit)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.iter().map(inbox_row).collect()
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inbox_row(&self, seq: i64) -> Result<Option<InboxRow>> {
        let mut query = QueryBuilder::new(INBOX_ROWS);
        query.push(" WHERE d.seq = ").push_bind(seq);
        let row = query
            .build()
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.as_ref().map(inbox_row).transpose()
    }
}

/// The listing statement: [`INBOX_ROWS`] with a condition for each criterion of
/// `filter` that is set, every value bound, newest first from `before`.
fn listing(filter: &InboxRowFilter, before: Option<i64>, limit: usize) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::new(INBOX_ROWS);
    let mut conditions = Conditions::new(&mut query);
    if let Some(consumer) = &filter.consumer {
        conditions
            .and("d.consumer = ")
            .push_bind(consumer.as_bytes().to_vec());
    }
    if let Some(status) = filter.status {
        conditions.and("d.status = ").push(status_literal(status));
    }
    if let Some(topic) = &filter.topic {
        conditions.and("d.topic = ").push_bind(topic.clone());
    }
    if let Some(key) = &filter.key {
        conditions
            .and("d.`key` = ")
            .push_bind(key.as_bytes().to_vec());
    }
    if let Some(id) = &filter.dedup_id {
        conditions
            .and("d.dedup_id = ")
            .push_bind(id.as_bytes().to_vec());
    }
    if let Some(from) = filter.received_from {
        conditions
            .and("d.received_at >= ")
            .push_bind(to_unix_millis(from));
    }
    if let Some(until) = filter.received_until {
        conditions
            .and("d.received_at < ")
            .push_bind(to_unix_millis(until));
    }
    if let Some(before) = before {
        conditions.and("d.seq < ").push_bind(before);
    }
    query
        .push(" ORDER BY d.seq DESC LIMIT ")
        .push_bind(sql_limit(limit));
    query
}

/// One row of [`INBOX_ROWS`].
fn inbox_row(row: &MySqlRow) -> Result<InboxRow> {
    let seq: i64 = row.try_get("seq").map_err(store_error)?;
    let reader = RowReader::new(row, "oncebox_durable_inbox", format_args!("seq {seq}"));
    let decode = || -> std::result::Result<InboxRow, RowDecodeError> {
        let text = |column: &'static str| -> std::result::Result<String, RowDecodeError> {
            reader
                .text(column)?
                .ok_or_else(|| reader.error(column, "NULL in a NOT NULL column"))
        };
        Ok(InboxRow {
            consumer: text("consumer")?,
            dedup_id: text("dedup_id")?,
            state: decode_state(&reader)?,
            received_at: from_unix_millis(reader.get("received_at")?),
            result: reader.get::<Option<Vec<u8>>>("result")?.map(Bytes::from),
            received: Received::decode(&reader)?,
        })
    };
    Ok(decode()?)
}

/// One row of [`CONSUMERS`].
fn consumer_stats(row: &MySqlRow) -> Result<ConsumerStats> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(store_error)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let name: Vec<u8> = row.try_get("consumer").map_err(store_error)?;
    let consumer = String::from_utf8(name).map_err(|error| {
        let lossy = String::from_utf8_lossy(error.as_bytes()).into_owned();
        RowDecodeError::new(
            "oncebox_inbox",
            format_args!("consumer {lossy}"),
            "consumer",
            error.utf8_error(),
        )
    })?;
    let last: Option<i64> = row.try_get("last_handled_ms").map_err(store_error)?;
    Ok(ConsumerStats {
        consumer,
        handled: count("handled")?,
        pending: count("pending")?,
        dead: count("dead")?,
        duplicates: count("duplicates")?,
        last_handled_at: last.map(from_unix_millis),
    })
}
