//! The durable inbox on SQLite.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::store::{Accepted, DurableInboxStore, Transactional};
use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Received, Result};
use sqlx::sqlite::SqlitePool;
use sqlx::{Sqlite, Transaction};
use tokio::sync::Notify;

use crate::dialect::{SqliteDialect, begin_immediate};
use crate::error::{RowDecodeError, RowReader, store_error};
use crate::spool::{SpoolRow, SpoolSql, SpoolTable};

const TABLE: &str = "oncebox_durable_inbox";

const ACCEPT: &str = "\
INSERT INTO oncebox_durable_inbox (
    consumer, dedup_id, message_id, topic, key, kind, headers, payload, created_at,
    source, partition, position, delivery_count, received_at, available_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?14)
ON CONFLICT (consumer, dedup_id) DO NOTHING";

/// The rows held by the consumer's live claims, for a statement whose `?1` is now and
/// whose consumer is `?N`.
macro_rules! live_claimed {
    ($consumer:literal) => {
        concat!(
            "SELECT j.value FROM oncebox_durable_inbox_claims AS c, json_each(c.seqs) AS j
             WHERE c.consumer = ",
            $consumer,
            " AND c.until > ?1"
        )
    };
}

/// The rows the claim `?1` holds.
macro_rules! held_by_token {
    () => {
        "SELECT j.value FROM oncebox_durable_inbox_claims AS c, json_each(c.seqs) AS j
         WHERE c.token = ?1"
    };
}

const COMPLETE: &str = concat!(
    "\
UPDATE oncebox_durable_inbox SET status = 'done', done_at = ?4, result = ?3
WHERE seq = ?2 AND status = 'pending' AND consumer = ?5 AND seq IN (",
    held_by_token!(),
    ")"
);

/// The columns of a claimed row, as `Received`'s `SpoolRow` decodes them, from
/// `oncebox_durable_inbox AS o`.
macro_rules! claimed_columns {
    () => {
        "o.seq, o.attempts, o.message_id, o.topic, o.key, o.kind, o.headers,
       CAST(o.payload AS BLOB) AS payload, o.created_at, o.source, o.partition, o.position,
       o.delivery_count"
    };
}

/// The spool statements; the consumer is always the last parameter.
static SPOOL: SpoolSql = SpoolSql {
    table: TABLE,
    claim: concat!(
        "\
SELECT ",
        claimed_columns!(),
        "
FROM oncebox_durable_inbox AS o INDEXED BY oncebox_durable_inbox_pending
WHERE o.consumer = ?3 AND o.status = 'pending'
  AND o.available_at <= ?1
  AND o.seq NOT IN (",
        live_claimed!("?3"),
        ")
  AND (o.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM oncebox_durable_inbox AS p
      WHERE p.consumer = ?3 AND p.status = 'pending' AND p.key = o.key AND p.seq < o.seq
        AND (p.available_at > ?1 OR p.seq IN (",
        live_claimed!("?3"),
        "))))
ORDER BY o.seq
LIMIT ?2"
    ),
    record_claim: "\
INSERT INTO oncebox_durable_inbox_claims (token, consumer, claimed_at, until, seqs)
VALUES (?3, ?5, ?1, ?2, ?4)",
    extend: "\
UPDATE oncebox_durable_inbox_claims SET until = ?2
WHERE token = ?1 AND until > ?3 AND consumer = ?4",
    done: concat!(
        "\
UPDATE oncebox_durable_inbox SET status = 'done', done_at = ?3
WHERE seq IN (SELECT value FROM json_each(?2)) AND status = 'pending' AND consumer = ?4
  AND seq IN (",
        held_by_token!(),
        ")"
    ),
    delete_done: None,
    retry: concat!(
        "\
UPDATE oncebox_durable_inbox SET attempts = attempts + 1, available_at = ?3, last_error = ?4
WHERE seq = ?2 AND status = 'pending' AND consumer = ?5 AND seq IN (",
        held_by_token!(),
        ")"
    ),
    dead: concat!(
        "\
UPDATE oncebox_durable_inbox
SET attempts = attempts + 1, status = 'dead', dead_at = ?3, last_error = ?4
WHERE seq = ?2 AND status = 'pending' AND consumer = ?5 AND seq IN (",
        held_by_token!(),
        ")"
    ),
    unclaim: "\
UPDATE oncebox_durable_inbox_claims
SET seqs = (SELECT json_group_array(j.value) FROM json_each(seqs) AS j
            WHERE j.value NOT IN (SELECT value FROM json_each(?2)))
WHERE token = ?1 AND consumer = ?3",
    drop_claim: "\
DELETE FROM oncebox_durable_inbox_claims WHERE token = ?1 AND seqs = '[]' AND consumer = ?2",
    purge: "\
DELETE FROM oncebox_durable_inbox WHERE seq IN (
  SELECT seq FROM oncebox_durable_inbox
  WHERE consumer = ?3 AND status = 'done' AND done_at < ?1
  ORDER BY done_at
  LIMIT ?2)",
};

/// The durable inbox of one consumer: deliveries are stored first (and acked to the
/// broker), then processed from the table by a [`Spool`](oncebox_core::spool::Spool)
/// built with [`DurableInbox::processor`](oncebox_core::consumer::DurableInbox::processor).
///
/// Table `oncebox_durable_inbox`, shared by all consumers, each seeing only its rows.
/// A row is unique per consumer and dedup id, and stays a duplicate guard while it is
/// kept (pending, dead, or done until retention purges it): make the spool's retention
/// at least the dedup window. Handler transactions start with `BEGIN IMMEDIATE` and run
/// one at a time per database.
///
/// Cheap to clone. [`SqliteDurableInbox::accept`] wakes a processor of the same consumer
/// waiting in this process.
#[derive(Debug, Clone)]
pub struct SqliteDurableInbox {
    table: SpoolTable,
    consumer: Arc<str>,
}

impl SqliteDurableInbox {
    pub(crate) fn new(pool: SqlitePool, consumer: &str, wake: Arc<Notify>) -> Self {
        let consumer: Arc<str> = Arc::from(consumer);
        Self {
            table: SpoolTable::new(pool, &SPOOL, Some(Arc::clone(&consumer)), wake),
            consumer,
        }
    }

    /// The consumer whose rows this store sees.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

impl SpoolStore for SqliteDurableInbox {
    type Item = Received;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Received>>> {
        self.table.claim(request).await
    }

    async fn extend(&self, token: LeaseToken, _rows: &[i64], lease: Duration) -> Result<()> {
        self.table.extend(token, lease).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.table.settle(token, settlements).await
    }

    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Received>>> {
        self.table
            .settle_and_claim(token, settlements, request)
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.table.purge(before, limit).await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.table.wait_for_work(timeout).await;
    }
}

impl Transactional for SqliteDurableInbox {
    type Tx = Transaction<'static, Sqlite>;

    async fn begin(&self) -> Result<Self::Tx> {
        begin_immediate(self.table.pool()).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl DurableInboxStore for SqliteDurableInbox {
    async fn accept(&self, id: &str, received: &Received) -> Result<Accepted> {
        let now = to_unix_millis(SystemTime::now());
        let inserted = sqlx::query(ACCEPT)
            .bind(self.consumer.to_string())
            .bind(id.to_owned())
            .bind(received.id.map(|id| id.to_string()))
            .bind(received.topic.clone())
            .bind(received.key.clone())
            .bind(received.kind.clone())
            .bind(received.headers.to_json())
            .bind(received.payload.to_vec())
            .bind(received.created_at.map(to_unix_millis))
            .bind(received.coordinates.source.clone())
            .bind(received.coordinates.partition)
            .bind(received.coordinates.position.clone())
            .bind(i64::from(received.delivery_count))
            .bind(now)
            .execute(self.table.pool())
            .await
            .map_err(store_error)?;
        if inserted.rows_affected() == 0 {
            return Ok(Accepted::Duplicate);
        }
        self.table.wake();
        Ok(Accepted::New)
    }

    async fn complete(
        &self,
        tx: &mut Self::Tx,
        token: LeaseToken,
        seq: i64,
        result: &[u8],
    ) -> Result<()> {
        let updated = sqlx::query(COMPLETE)
            .bind(token.to_string())
            .bind(seq)
            .bind(result.to_vec())
            .bind(to_unix_millis(SystemTime::now()))
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
        oncebox_sql::count_duplicate(self.table.pool(), &SqliteDialect, &self.consumer).await
    }
}

impl SpoolRow for Received {
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError> {
        oncebox_sql::decode_received::<SqliteDialect, _>(row)
    }
}
