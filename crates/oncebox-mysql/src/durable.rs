//! The durable inbox on MySQL / MariaDB.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::store::{Accepted, DurableInboxStore, Transactional};
use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Received, Result};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, Transaction};

use crate::dialect::MySqlDialect;
use crate::error::{
    RowDecodeError, RowReader, check_bytes, check_chars, is_duplicate_key, store_error,
};
use crate::inbox::{MAX_CONSUMER_BYTES, MAX_ID_BYTES};
use crate::outbox::{LOCK_KEY, MAX_KEY_BYTES, MAX_NAME_CHARS};
use crate::spool::{Layout, SpoolRow, SpoolSql, SpoolTable};
use crate::sql::{now_ms, query, uuid_bytes};
use crate::wake::{Seen, Wakeup};

const TABLE: &str = "oncebox_durable_inbox";

/// `?` consumer, `?` dedup id, `?` message id, `?` topic, `?` key, `?` kind, `?` headers,
/// `?` payload, `?` created at (ms), `?` source, `?` partition, `?` position, `?` delivery
/// count.
const ACCEPT: &str = concat!(
    "INSERT INTO oncebox_durable_inbox (
    consumer, dedup_id, message_id, topic, `key`, kind, headers, payload, created_at,
    source, `partition`, `position`, delivery_count, received_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ",
    now_ms!(),
    ")"
);

/// `?` result, `?` seq, `?` consumer.
const COMPLETE: &str = concat!(
    "UPDATE oncebox_durable_inbox
SET status = 1, done_at = ",
    now_ms!(),
    ", result = ?
WHERE seq = ? AND status = 0 AND consumer = ?"
);

static SPOOL: LazyLock<SpoolSql> = LazyLock::new(|| {
    SpoolSql::build(&Layout {
        table: TABLE,
        scope: Some("consumer"),
        item: "t.message_id, t.topic, t.`key`, t.kind, t.headers, t.payload, t.created_at, \
               t.source, t.`partition`, t.`position`, t.delivery_count",
    })
});

/// The durable inbox of one consumer: deliveries are stored first (and acked to the
/// broker), then processed from the table by a [`Spool`](oncebox_core::spool::Spool)
/// built with [`DurableInbox::processor`](oncebox_core::consumer::DurableInbox::processor).
///
/// Table `oncebox_durable_inbox`, shared by all consumers, each seeing only its rows;
/// claims follow the outbox's design (see the crate docs), scoped to the consumer. A row
/// is unique per consumer and dedup id, and stays a duplicate guard while it is kept
/// (pending, dead, or done until retention purges it): make the spool's retention at
/// least the dedup window.
///
/// Cheap to clone. [`accept`](DurableInboxStore::accept) wakes the processors of the same
/// consumer waiting in this process; processors elsewhere poll.
#[derive(Debug, Clone)]
pub struct MySqlDurableInbox {
    table: SpoolTable,
    consumer: Arc<str>,
    wakeup: Arc<Wakeup>,
    seen: Seen,
}

impl MySqlDurableInbox {
    pub(crate) fn new(pool: MySqlPool, consumer: &str, wakeup: Arc<Wakeup>) -> Self {
        let consumer: Arc<str> = Arc::from(consumer);
        Self {
            table: SpoolTable::new(pool, &SPOOL, Some(Arc::clone(&consumer))),
            consumer,
            seen: wakeup.seen(),
            wakeup,
        }
    }

    /// The consumer whose rows this store sees.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

impl SpoolStore for MySqlDurableInbox {
    type Item = Received;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Received>>> {
        self.seen.mark();
        self.table.claim(request).await
    }

    async fn extend(&self, token: LeaseToken, _rows: &[i64], lease: Duration) -> Result<()> {
        self.table.extend(token, lease).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.table.settle(token, settlements, false).await
    }

    /// Settles and claims as the outbox does: two transactions, with one request
    /// between them.
    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Received>>> {
        self.seen.mark();
        self.table
            .settle_and_claim(token, settlements, false, request)
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.table.purge(before, limit).await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.seen.wait(timeout).await;
    }
}

impl Transactional for MySqlDurableInbox {
    type Tx = Transaction<'static, MySql>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.table.pool().begin().await.map_err(store_error)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl DurableInboxStore for MySqlDurableInbox {
    /// Stores the delivery; for a delivery with a key, in a transaction that first locks
    /// the key's slot, as the outbox's enqueue does, so that each key's rows are
    /// processed in the order they were accepted.
    async fn accept(&self, id: &str, received: &Received) -> Result<Accepted> {
        check_bytes("consumer", &self.consumer, MAX_CONSUMER_BYTES)?;
        check_bytes("dedup id", id, MAX_ID_BYTES)?;
        check_chars("topic", &received.topic, MAX_NAME_CHARS)?;
        check_chars("kind", &received.kind, MAX_NAME_CHARS)?;
        let mut tx = self.table.pool().begin().await.map_err(store_error)?;
        if let Some(key) = &received.key {
            check_bytes("key", key, MAX_KEY_BYTES)?;
            query(LOCK_KEY)
                .bind(key.as_bytes().to_vec())
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        let inserted = query(ACCEPT)
            .bind(self.consumer.as_bytes().to_vec())
            .bind(id.as_bytes().to_vec())
            .bind(received.id.map(|id| uuid_bytes(id.as_uuid())))
            .bind(received.topic.clone())
            .bind(received.key.as_ref().map(|key| key.as_bytes().to_vec()))
            .bind(received.kind.clone())
            .bind(received.headers.to_json())
            .bind(received.payload.to_vec())
            .bind(received.created_at.map(to_unix_millis))
            .bind(received.coordinates.source.clone())
            .bind(received.coordinates.partition)
            .bind(received.coordinates.position.clone())
            .bind(i32::try_from(received.delivery_count).unwrap_or(i32::MAX))
            .execute(&mut *tx)
            .await;
        match inserted {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => return Ok(Accepted::Duplicate),
            Err(e) => return Err(store_error(e)),
        }
        tx.commit().await.map_err(store_error)?;
        self.wakeup.wake();
        Ok(Accepted::New)
    }

    async fn complete(
        &self,
        tx: &mut Self::Tx,
        token: LeaseToken,
        seq: i64,
        result: &[u8],
    ) -> Result<()> {
        if !self.table.holds(tx, token, seq).await? {
            return Err(Error::LeaseLost);
        }
        // Rows matched (sqlx sets CLIENT_FOUND_ROWS): 0 means the row was settled.
        let updated = query(COMPLETE)
            .bind(result.to_vec())
            .bind(seq)
            .bind(self.consumer.as_bytes().to_vec())
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        if updated.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }
    async fn count_duplicate(&self) -> Result<()> {
        oncebox_sql::count_duplicate(self.table.pool(), &MySqlDialect, &self.consumer).await
    }
}

impl SpoolRow for Received {
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError> {
        oncebox_sql::decode_received::<MySqlDialect, _>(row)
    }
}
