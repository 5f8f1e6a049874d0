//! The transactional inbox on PostgreSQL.

use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox_core::sql::Conditions;
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Received, Result};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Postgres, QueryBuilder, Row, Transaction};

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::ident::qualified;
use crate::outbox::admin::decode_state;
use crate::outbox::listing::{push_time, status_literal};
use crate::spool::{SpoolRow, query, sql_limit};
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
    /// `SELECT <a durable inbox row> FROM <durable inbox> AS t`, for the listing to add
    /// its conditions to.
    rows: Arc<str>,
    /// The durable inbox's name in errors.
    durable_display: Arc<str>,
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
            rows: format!(
                "SELECT t.seq AS seq, t.consumer AS consumer, t.dedup_id AS dedup_id,
  t.status AS status, t.attempts AS attempts, t.last_error AS last_error,
  {available} AS available_at, {lease} AS lease_until, {done} AS done_at, {dead} AS dead_at,
  {received_at} AS received_at, t.result AS result,
  t.message_id::text AS message_id, t.topic AS topic, t.key AS key, t.kind AS kind,
  t.headers::text AS headers, t.payload AS payload, {created} AS created_at,
  t.source AS source, t.partition AS partition, t.position AS position,
  t.delivery_count AS delivery_count
FROM {durable} AS t",
                available = micros_of("t.available_at"),
                lease = micros_of("t.lease_until"),
                done = micros_of("t.done_at"),
                dead = micros_of("t.dead_at"),
                received_at = micros_of("t.received_at"),
                created = micros_of("t.created_at"),
            )
            .into(),
            durable_display: format!("{schema}.durable_inbox").into(),
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

    /// One statement, newest first from `before`: on the primary key, or with a
    /// consumer and status pending, on the partial index of the consumer's pending rows.
    /// The other criteria have no index of their own: the rows read are filtered until
    /// `limit` match, which reads every row older than `before` where matches are rare.
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
        let rows = self
            .listing(filter, before, limit)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        rows.iter().map(|row| self.inbox_row_of(row)).collect()
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inbox_row(&self, seq: i64) -> Result<Option<InboxRow>> {
        let mut query = QueryBuilder::new(&*self.sql.rows);
        query.push(" WHERE t.seq = ").push_bind(seq);
        let row = query
            .build()
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.map(|row| self.inbox_row_of(&row)).transpose()
    }
}

impl PgInbox {
    /// The listing statement: [`InboxSql::rows`] with a condition for each criterion of
    /// `filter` that is set, every value bound, newest first from `before`.
    fn listing(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> QueryBuilder<Postgres> {
        let mut query = QueryBuilder::new(&*self.sql.rows);
        let mut conditions = Conditions::new(&mut query);
        if let Some(consumer) = &filter.consumer {
            conditions.and("t.consumer = ").push_bind(consumer.clone());
        }
        if let Some(status) = filter.status {
            conditions.and("t.status = ").push(status_literal(status));
        }
        if let Some(topic) = &filter.topic {
            conditions.and("t.topic = ").push_bind(topic.clone());
        }
        if let Some(key) = &filter.key {
            conditions.and("t.key = ").push_bind(key.clone());
        }
        if let Some(id) = &filter.dedup_id {
            conditions.and("t.dedup_id = ").push_bind(id.clone());
        }
        if let Some(from) = filter.received_from {
            push_time(conditions.and("t.received_at >= "), from);
        }
        if let Some(until) = filter.received_until {
            push_time(conditions.and("t.received_at < "), until);
        }
        if let Some(before) = before {
            conditions.and("t.seq < ").push_bind(before);
        }
        query
            .push(" ORDER BY t.seq DESC LIMIT ")
            .push_bind(sql_limit(limit));
        query
    }

    /// Decodes one row of [`InboxSql::rows`].
    fn inbox_row_of(&self, row: &PgRow) -> Result<InboxRow> {
        let seq: i64 = row.try_get("seq").map_err(store_error)?;
        let reader = RowReader::new(row, &self.sql.durable_display, format_args!("seq {seq}"));
        let decode = || -> std::result::Result<InboxRow, RowDecodeError> {
            Ok(InboxRow {
                consumer: reader.get("consumer")?,
                dedup_id: reader.get("dedup_id")?,
                state: decode_state(&reader)?,
                received_at: from_micros(reader.get("received_at")?),
                result: reader.get::<Option<Vec<u8>>>("result")?.map(Bytes::from),
                received: Received::decode(&reader)?,
            })
        };
        Ok(decode()?)
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
