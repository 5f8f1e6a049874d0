//! The transactional inbox on SQLite.

use std::time::SystemTime;

use oncebox_core::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox_core::sql::Conditions;
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Bytes, Received, Result};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::outbox::admin::decode_state;
use crate::outbox::listing::status_literal;
use crate::spool::{SpoolRow, sql_limit};

const RECORD: &str = "\
INSERT INTO oncebox_inbox (consumer, message_id, processed_at) VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, message_id) DO NOTHING";

const STORED_RESULT: &str = "\
SELECT result FROM oncebox_inbox WHERE consumer = ?1 AND message_id = ?2";

const STORE_RESULT: &str = "\
INSERT INTO oncebox_inbox (consumer, message_id, result, processed_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (consumer, message_id) DO UPDATE SET result = excluded.result";

const PURGE: &str = "\
DELETE FROM oncebox_inbox WHERE rowid IN (
  SELECT rowid FROM oncebox_inbox WHERE consumer = ?1 AND processed_at < ?2
  ORDER BY processed_at LIMIT ?3)";

/// `?1` consumer, `?2` now (ms): adds one to the consumer's count of skipped duplicates.
const COUNT_DUPLICATE: &str = "\
INSERT INTO oncebox_inbox_duplicates (consumer, skipped, last_at) VALUES (?1, 1, ?2)
ON CONFLICT (consumer) DO UPDATE SET skipped = skipped + 1, last_at = excluded.last_at";

/// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled_ms` per
/// consumer, in byte order of the name.
const CONSUMERS: &str = "\
SELECT consumer, sum(handled) AS handled, sum(pending) AS pending, sum(dead) AS dead,
  sum(duplicates) AS duplicates, max(last_at) AS last_handled_ms
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

/// A durable inbox row for [`InboxAdmin::inbox_rows`], up to its `WHERE`; the lease is
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

/// Adds one to `consumer`'s count of skipped duplicates, in a statement of its own.
pub(crate) async fn count_duplicate(pool: &SqlitePool, consumer: &str) -> Result<()> {
    sqlx::query(COUNT_DUPLICATE)
        .bind(consumer)
        .bind(to_unix_millis(SystemTime::now()))
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(())
}

/// Starts a transaction that takes SQLite's write lock at once.
///
/// Concurrent transactions on the same database then run one after the other instead of
/// failing on lock upgrade, and a duplicate delivery waits for the first one to commit,
/// then finds its record.
pub(crate) async fn begin_immediate(pool: &SqlitePool) -> Result<Transaction<'static, Sqlite>> {
    pool.begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(store_error)
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `oncebox_inbox`, keyed by consumer and id).
///
/// Transactions start with `BEGIN IMMEDIATE`, so handler transactions on one database
/// run one at a time (SQLite has a single writer); keep handlers short. The handler runs
/// its queries on `&mut **tx`.
#[derive(Debug, Clone)]
pub struct SqliteInbox {
    pool: SqlitePool,
}

impl SqliteInbox {
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }
}

impl Transactional for SqliteInbox {
    type Tx = Transaction<'static, Sqlite>;

    async fn begin(&self) -> Result<Self::Tx> {
        begin_immediate(&self.pool).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl InboxStore for SqliteInbox {
    async fn record(&self, tx: &mut Self::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        let inserted = sqlx::query(RECORD)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(to_unix_millis(SystemTime::now()))
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        if inserted.rows_affected() > 0 {
            return Ok(Recorded::New);
        }
        let result: Option<Vec<u8>> = sqlx::query_scalar(STORED_RESULT)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .fetch_one(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok(Recorded::Duplicate {
            result: result.map(Bytes::from).unwrap_or_default(),
        })
    }

    async fn store_result(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> Result<()> {
        sqlx::query(STORE_RESULT)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(result.to_vec())
            .bind(to_unix_millis(SystemTime::now()))
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = sqlx::query(PURGE)
            .bind(consumer)
            .bind(to_unix_millis(before))
            .bind(sql_limit(limit))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected())
    }

    async fn count_duplicate(&self, consumer: &str) -> Result<()> {
        count_duplicate(&self.pool, consumer).await
    }
}

impl InboxAdmin for SqliteInbox {
    /// Reads, in one statement, every record of the transactional inbox (from its
    /// `(consumer, processed_at)` index, which covers them) and every row of the durable
    /// inbox, each once, and groups them by consumer. The cost grows with what retention
    /// keeps: call it at the pace of a dashboard, not per message.
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

    /// One statement, newest first from `before`, on the table (its rowid is the `seq`)
    /// or, for a consumer's pending rows, the partial index of pending rows. The other
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
fn listing(filter: &InboxRowFilter, before: Option<i64>, limit: usize) -> QueryBuilder<Sqlite> {
    let mut query = QueryBuilder::new(INBOX_ROWS);
    let mut conditions = Conditions::new(&mut query);
    if let Some(consumer) = &filter.consumer {
        conditions.and("d.consumer = ").push_bind(consumer.clone());
    }
    if let Some(status) = filter.status {
        conditions.and("d.status = ").push(status_literal(status));
    }
    if let Some(topic) = &filter.topic {
        conditions.and("d.topic = ").push_bind(topic.clone());
    }
    if let Some(key) = &filter.key {
        conditions.and("d.key = ").push_bind(key.clone());
    }
    if let Some(id) = &filter.dedup_id {
        conditions.and("d.dedup_id = ").push_bind(id.clone());
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
fn inbox_row(row: &SqliteRow) -> Result<InboxRow> {
    let seq: i64 = row.try_get("seq").map_err(store_error)?;
    let reader = RowReader::new(row, "oncebox_durable_inbox", format_args!("seq {seq}"));
    let decode = || -> std::result::Result<InboxRow, RowDecodeError> {
        Ok(InboxRow {
            consumer: reader.get("consumer")?,
            dedup_id: reader.get("dedup_id")?,
            state: decode_state(&reader)?,
            received_at: from_unix_millis(reader.get("received_at")?),
            result: reader.get::<Option<Vec<u8>>>("result")?.map(Bytes::from),
            received: Received::decode(&reader)?,
        })
    };
    Ok(decode()?)
}

/// One row of [`CONSUMERS`].
fn consumer_stats(row: &SqliteRow) -> Result<ConsumerStats> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(store_error)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let last: Option<i64> = row.try_get("last_handled_ms").map_err(store_error)?;
    Ok(ConsumerStats {
        consumer: row.try_get("consumer").map_err(store_error)?,
        handled: count("handled")?,
        pending: count("pending")?,
        dead: count("dead")?,
        duplicates: count("duplicates")?,
        last_handled_at: last.map(from_unix_millis),
    })
}
