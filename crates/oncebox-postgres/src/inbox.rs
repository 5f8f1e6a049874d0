//! The transactional inbox on PostgreSQL.

use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Result};
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};

use crate::error::store_error;
use crate::ident::qualified;
use crate::spool::{query, sql_limit};
use crate::time::{millis_param, ms_since};

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
}

impl InboxSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = qualified(schema, "inbox");
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
}

impl std::fmt::Debug for InboxSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSql").finish_non_exhaustive()
    }
}
