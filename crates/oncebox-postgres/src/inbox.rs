//! The transactional inbox on PostgreSQL.

use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::consumer::{ConsumerStats, InboxAdmin};
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Result};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Postgres, Row, Transaction};

use crate::error::store_error;
use crate::ident::qualified;
use crate::spool::{query, sql_limit};
use crate::time::{from_micros, micros_of, millis_param, ms_since};

/// The inbox's statements, built once per schema.
pub(crate) struct InboxSql {
    /// `$1` consumer, `$2` id → a row if inserted.
    record: Arc<str>,
    /// `$1` consumer, `$2` id → `result`.
    stored_result: Arc<str>,
    /// `$1` consumer, `$2` id, `$3` result.
    store_result: Arc<str>,
    /// `$1` age ms, `$2` limit.
    purge: Arc<str>,
    /// `$1` consumer.
    count_duplicate: Arc<str>,
    /// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled_us` per
    /// consumer, in byte order of the name.
    consumers: Arc<str>,
}

/// `$1` consumer: adds one to the consumer's count of skipped duplicates.
pub(crate) fn count_duplicate_sql(schema: &str) -> Arc<str> {
    let t = qualified(schema, "inbox_duplicates");
    format!(
        "INSERT INTO {t} AS d (consumer, skipped, last_at) VALUES ($1, 1, statement_timestamp())
ON CONFLICT (consumer) DO UPDATE SET skipped = d.skipped + 1, last_at = excluded.last_at"
    )
    .into()
}

impl InboxSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = qualified(schema, "inbox");
        let durable = qualified(schema, "durable_inbox");
        let duplicates = qualified(schema, "inbox_duplicates");
        Self {
            record: format!(
                "INSERT INTO {t} (consumer, message_id, processed_at)
VALUES ($1, $2, statement_timestamp())
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING 1"
            )
            .into(),
            stored_result: format!(
                "SELECT result FROM {t} WHERE consumer = $1 AND message_id = $2"
            )
            .into(),
            store_result: format!(
                "INSERT INTO {t} (consumer, message_id, result, processed_at)
VALUES ($1, $2, $3, statement_timestamp())
ON CONFLICT (consumer, message_id) DO UPDATE SET result = excluded.result"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE consumer = $1 AND message_id IN (
  SELECT message_id FROM {t}
  WHERE consumer = $1 AND processed_at < statement_timestamp() - {age}
  ORDER BY processed_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED)",
                age = millis_param(2)
            )
            .into(),
            count_duplicate: count_duplicate_sql(schema),
            consumers: format!(
                "SELECT consumer, sum(handled)::bigint AS handled, sum(pending)::bigint AS pending,
  sum(dead)::bigint AS dead, sum(duplicates)::bigint AS duplicates,
  {last} AS last_handled_us
FROM (
  SELECT consumer, count(*) AS handled, 0 AS pending, 0 AS dead, 0 AS duplicates,
    max(processed_at) AS last_at
  FROM {t} GROUP BY consumer
  UNION ALL
  SELECT consumer,
    count(*) FILTER (WHERE status = 'done'),
    count(*) FILTER (WHERE status = 'pending'),
    count(*) FILTER (WHERE status = 'dead'),
    0,
    max(done_at) FILTER (WHERE status = 'done')
  FROM {durable} GROUP BY consumer
  UNION ALL
  SELECT consumer, 0, 0, 0, skipped, NULL FROM {duplicates}
) AS figures
GROUP BY consumer
ORDER BY consumer COLLATE \"C\"",
                last = micros_of("max(last_at)")
            )
            .into(),
        }
    }
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `<schema>.inbox`, keyed by consumer and id).
///
/// [`record`](InboxStore::record) inserts with `ON CONFLICT DO NOTHING`: of concurrent
/// transactions recording the same id, one inserts and the others wait on the unique key
/// until it commits (then they see a duplicate and its result) or rolls back (then one of
/// them inserts). Transactions are PostgreSQL's default, read committed; the handler
/// runs its queries on `&mut **tx`.
///
/// The consumer name and the message id reach the database as bind parameters only;
/// sqlx prepares each statement once per connection and caches it.
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
    sql: Arc<InboxSql>,
}

impl PgInbox {
    pub(crate) fn new(pool: PgPool, sql: Arc<InboxSql>) -> Self {
        Self { pool, sql }
    }
}

impl Transactional for PgInbox {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.pool.begin().await.map_err(store_error)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl InboxStore for PgInbox {
    async fn record(&self, tx: &mut Self::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        let inserted = query(&self.sql.record)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .fetch_optional(&mut **tx)
            .await
            .map_err(store_error)?;
        if inserted.is_some() {
            return Ok(Recorded::New);
        }
        // Read committed: this statement sees the record the conflicting transaction
        // committed while the insert waited for it.
        let result: Option<Option<Vec<u8>>> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.sql.stored_result)))
                .bind(consumer.to_owned())
                .bind(id.to_owned())
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
        query(&self.sql.store_result)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(result.to_vec())
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = query(&self.sql.purge)
            .bind(consumer)
            .bind(ms_since(before))
            .bind(sql_limit(limit))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected())
    }

    async fn count_duplicate(&self, consumer: &str) -> Result<()> {
        query(&self.sql.count_duplicate)
            .bind(consumer)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

impl InboxAdmin for PgInbox {
    /// Reads, in one statement, every record of the transactional inbox (from the table
    /// or its `(consumer, processed_at)` index, as the planner finds cheaper) and every
    /// row of the durable inbox (from the table: no index holds the dead rows), each
    /// once, and groups them by consumer. The cost grows with what retention keeps:
    /// call it at the pace of a dashboard, not per message.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn consumers(&self) -> Result<Vec<ConsumerStats>> {
        let rows = query(&self.sql.consumers)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.iter().map(consumer_stats).collect()
    }
}

/// One row of [`InboxSql::consumers`].
fn consumer_stats(row: &PgRow) -> Result<ConsumerStats> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(store_error)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let last: Option<i64> = row.try_get("last_handled_us").map_err(store_error)?;
    Ok(ConsumerStats {
        consumer: row.try_get("consumer").map_err(store_error)?,
        handled: count("handled")?,
        pending: count("pending")?,
        dead: count("dead")?,
        duplicates: count("duplicates")?,
        last_handled_at: last.map(from_micros),
    })
}

impl std::fmt::Debug for InboxSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSql").finish_non_exhaustive()
    }
}
