//! The durable inbox on PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::store::{Accepted, DurableInboxStore, Transactional};
use oncebox_core::{Error, Received, Result};
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Transaction};
use tokio::sync::Notify;

use crate::dialect::PgDialect;
use crate::error::{RowDecodeError, RowReader, store_error};
use crate::ident::{KEY_CLASS, qualified, table_oid};
use crate::spool::sql::Columns;
use crate::spool::{Hold, Layout, SpoolRow, SpoolSql, SpoolTable, query};
use crate::time::{micros_of, micros_param, to_micros};

/// The durable inbox's statements, built once per schema.
pub(crate) struct DurableSql {
    spool: Arc<SpoolSql>,
    /// `$1` consumer, `$2` dedup id, `$3` message id, `$4` topic, `$5` key, `$6` kind,
    /// `$7` headers, `$8` payload, `$9` created at (µs), `$10` source, `$11` partition,
    /// `$12` position, `$13` delivery count → a row if inserted.
    accept: Arc<str>,
    /// `$1` token, `$2` seq, `$3` result, `$4` consumer.
    complete: Arc<str>,
}

impl DurableSql {
    pub(crate) fn new(schema: &str) -> Self {
        let table = qualified(schema, "durable_inbox");
        let oid = table_oid(schema, "durable_inbox");
        let layout = Layout {
            table: table.clone(),
            display: format!("{schema}.durable_inbox"),
            oid: oid.clone(),
            col: Columns::plain(),
            item: format!(
                "t.message_id::text AS message_id, t.topic AS topic, t.key AS key, \
                 t.kind AS kind, t.headers::text AS headers, t.payload AS payload, \
                 {} AS created_at, t.source AS source, t.partition AS partition, \
                 t.position AS position, t.delivery_count AS delivery_count",
                micros_of("t.created_at")
            ),
            scope: Some("consumer"),
        };
        Self {
            spool: Arc::new(SpoolSql::build(&layout)),
            // Like the outbox's enqueue, the key lock before the seq keeps each key's
            // rows in commit order.
            accept: format!(
                "WITH guard AS MATERIALIZED (
  SELECT CASE WHEN $5::text IS NULL THEN false
         ELSE (SELECT true FROM pg_advisory_xact_lock({KEY_CLASS}, hashtext($5::text) # {oid}))
         END AS keyed
)
INSERT INTO {table} (
    consumer, dedup_id, message_id, topic, key, kind, headers, payload, created_at,
    source, partition, position, delivery_count)
SELECT $1, $2, $3::uuid, $4, $5, $6, $7::jsonb, $8,
       CASE WHEN $9::bigint IS NULL THEN NULL ELSE {created} END,
       $10, $11, $12, $13
FROM guard
ON CONFLICT (consumer, dedup_id) DO NOTHING
RETURNING seq",
                created = micros_param(9),
            )
            .into(),
            complete: format!(
                "UPDATE {table}
SET status = 'done', done_at = statement_timestamp(), result = $3,
    lease_token = NULL, lease_until = NULL
WHERE seq = $2 AND lease_token = $1::uuid AND status = 'pending' AND consumer = $4"
            )
            .into(),
        }
    }
}

/// The durable inbox of one consumer: deliveries are stored first (and acked to the
/// broker), then processed from the table by a [`Spool`](oncebox_core::spool::Spool)
/// built with [`DurableInbox::processor`](oncebox_core::consumer::DurableInbox::processor).
///
/// Table `<schema>.durable_inbox`, shared by all consumers, each seeing only its rows;
/// claims follow the outbox's design (see the crate docs), scoped to the consumer. A row
/// is unique per consumer and dedup id, and stays a duplicate guard while it is kept
/// (pending, dead, or done until retention purges it): make the spool's retention at
/// least the dedup window.
///
/// Cheap to clone. [`PgDurableInbox::accept`](DurableInboxStore::accept) wakes a
/// processor of the same consumer waiting in this process; processors elsewhere poll.
#[derive(Debug, Clone)]
pub struct PgDurableInbox {
    table: SpoolTable,
    sql: Arc<DurableSql>,
    dialect: PgDialect,
    consumer: Arc<str>,
    wake: Arc<Notify>,
}

impl PgDurableInbox {
    pub(crate) fn new(
        pool: PgPool,
        sql: Arc<DurableSql>,
        dialect: PgDialect,
        consumer: &str,
        wake: Arc<Notify>,
    ) -> Self {
        let consumer: Arc<str> = Arc::from(consumer);
        Self {
            // Leased: `complete` updates claimed rows in the handler's transaction, which
            // a claim's own open transaction would block.
            table: SpoolTable::new(
                pool,
                Arc::clone(&sql.spool),
                Some(Arc::clone(&consumer)),
                Hold::Lease,
            ),
            sql,
            dialect,
            consumer,
            wake,
        }
    }

    /// The consumer whose rows this store sees.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

impl SpoolStore for PgDurableInbox {
    type Item = Received;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Received>>> {
        self.table.claim(request).await
    }

    async fn extend(&self, token: LeaseToken, rows: &[i64], lease: Duration) -> Result<()> {
        self.table.extend(token, rows, lease).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.table.settle(token, settlements, false).await
    }

    /// Settles and claims in one transaction, as the outbox does.
    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Received>>> {
        self.table
            .settle_and_claim(token, settlements, false, request)
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.table.purge(before, limit).await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
    }
}

impl Transactional for PgDurableInbox {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.table.pool().begin().await.map_err(store_error)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl DurableInboxStore for PgDurableInbox {
    async fn accept(&self, id: &str, received: &Received) -> Result<Accepted> {
        for (what, text) in [
            ("dedup id", Some(id)),
            ("topic", Some(received.topic.as_str())),
            ("key", received.key.as_deref()),
            ("kind", Some(received.kind.as_str())),
            ("position", Some(received.coordinates.position.as_str())),
            ("source", Some(received.coordinates.source.as_str())),
        ] {
            if text.is_some_and(|t| t.contains('\0')) {
                return Err(Error::store_permanent(format!(
                    "the {what} of a delivery contains a NUL character, which PostgreSQL text cannot hold"
                )));
            }
        }
        let inserted = query(&self.sql.accept)
            .bind(self.consumer.to_string())
            .bind(id.to_owned())
            .bind(received.id.map(|id| id.to_string()))
            .bind(received.topic.clone())
            .bind(received.key.clone())
            .bind(received.kind.clone())
            .bind(received.headers.to_json())
            .bind(received.payload.to_vec())
            .bind(received.created_at.map(to_micros))
            .bind(received.coordinates.source.clone())
            .bind(received.coordinates.partition)
            .bind(received.coordinates.position.clone())
            .bind(i32::try_from(received.delivery_count).unwrap_or(i32::MAX))
            .fetch_optional(self.table.pool())
            .await
            .map_err(store_error)?;
        if inserted.is_none() {
            return Ok(Accepted::Duplicate);
        }
        self.wake.notify_one();
        Ok(Accepted::New)
    }

    async fn complete(
        &self,
        tx: &mut Self::Tx,
        token: LeaseToken,
        seq: i64,
        result: &[u8],
    ) -> Result<()> {
        let updated = query(&self.sql.complete)
            .bind(token.to_string())
            .bind(seq)
            .bind(result.to_vec())
            .bind(self.consumer.to_string())
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        if updated.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    async fn count_duplicate(&self) -> Result<()> {
        oncebox_sql::count_duplicate(self.table.pool(), &self.dialect, &self.consumer).await
    }
}

impl SpoolRow for Received {
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError> {
        oncebox_sql::decode_received::<PgDialect, _>(row)
    }
}

impl std::fmt::Debug for DurableSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableSql")
            .field("table", &self.spool.display)
            .finish_non_exhaustive()
    }
}
