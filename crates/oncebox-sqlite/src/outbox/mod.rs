//! The transactional outbox on SQLite.

pub(crate) mod admin;
mod batch;
mod schedule;
mod sql;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{Backlog, ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Error, Headers, Limits, Message, MessageId, Result, trace};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tokio::sync::Notify;
use tracing::Instrument;

pub use admin::{DeadLetter, OutboxStats, RowState, RowStatus};

use crate::error::{RowDecodeError, RowReader, is_unique_violation, store_error};
use crate::spool::{SpoolRow, SpoolTable};

/// The transactional outbox: [`SqliteOutbox::enqueue`] writes a message in the caller's
/// transaction, and the [`SpoolStore`] implementation lets a
/// [`Relay`](oncebox_core::spool::Relay) claim, publish and settle it.
///
/// Table `oncebox_outbox`. Rows are claimed in commit order, each key's rows as a prefix
/// of its pending rows, so several relays (in one process or many) keep per-key order.
/// Cheap to clone; clones share the wake-up.
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    table: SpoolTable,
    limits: Limits,
}

impl SqliteOutbox {
    pub(crate) fn new(pool: SqlitePool, wake: Arc<Notify>) -> Self {
        Self {
            table: SpoolTable::new(pool, &sql::SPOOL, None, wake),
            limits: Limits::new(),
        }
    }

    /// Sets the limits messages are checked against at enqueue. Default:
    /// [`Limits::new`].
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits messages are checked against at enqueue.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Deletes a row when its message is published, instead of marking it done and
    /// leaving it to retention cleanup. Default: off.
    ///
    /// After its lease, a published row then costs one write (the delete), not two (the
    /// done mark, and later the cleanup's delete), and the table holds only pending and
    /// dead rows. The price:
    /// [`status`](Self::status) no longer finds published messages, [`stats`](Self::stats)
    /// counts none done, and a re-enqueue of a published id is no longer refused as a
    /// duplicate. Retried and dead rows are kept as always.
    #[must_use]
    pub fn delete_on_publish(mut self, on: bool) -> Self {
        self.table = self.table.delete_done(on);
        self
    }

    fn pool(&self) -> &SqlitePool {
        self.table.pool()
    }

    /// Writes `message` into the outbox on `conn`, which is normally the caller's open
    /// transaction (`&mut *tx`): the message is published if and only if that
    /// transaction commits. Never opens a transaction of its own.
    ///
    /// The relay sees the row once the transaction commits; call
    /// [`SqliteOutbox::wake`] after committing to have an in-process relay pick it up at
    /// once instead of at its next poll.
    ///
    /// Start write transactions with `pool.begin_with("BEGIN IMMEDIATE")`: a deferred
    /// transaction that reads before it writes can fail with a transient "database is
    /// locked" error when another connection wrote in between.
    ///
    /// ```
    /// # async fn demo(outbox: &oncebox_sqlite::SqliteOutbox, pool: &sqlx::SqlitePool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use oncebox_core::Message;
    ///
    /// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    /// // ... the business change, on &mut *tx ...
    /// let message = Message::json("orders", &"order 42 placed")?.with_key("order-42");
    /// outbox.enqueue(&mut *tx, &message).await?;
    /// tx.commit().await?;
    /// outbox.wake();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidMessage`] if the message breaks the [limits](Self::with_limits);
    ///   nothing is written.
    /// - [`Error::Duplicate`] if a message with the same id is in the outbox (pending,
    ///   done within retention, or dead). The transaction stays usable: only this
    ///   statement failed.
    /// - A store error otherwise; roll the transaction back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue(&self, conn: &mut SqliteConnection, message: &Message) -> Result<()> {
        self.insert(conn, message, SystemTime::now()).await
    }

    /// The statement of [`enqueue`](Self::enqueue), the row due at `due`.
    async fn insert(
        &self,
        conn: &mut SqliteConnection,
        message: &Message,
        due: SystemTime,
    ) -> Result<()> {
        message.validate(&self.limits)?;
        let (span, headers) = trace::creation(message);
        let result = sqlx::query(sql::ENQUEUE)
            .bind(message.id.to_string())
            .bind(message.topic.clone())
            .bind(message.key.clone())
            .bind(message.kind.clone())
            .bind(headers.to_json())
            .bind(message.payload.to_vec())
            .bind(to_unix_millis(message.created_at))
            .bind(to_unix_millis(due))
            .execute(&mut *conn)
            .instrument(span.clone())
            .await;
        let enqueued = match result {
            Ok(_) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(Error::Duplicate { id: message.id }),
            Err(e) => Err(store_error(e)),
        };
        if let Err(error) = &enqueued {
            trace::record_error(&span, error);
        }
        enqueued
    }

    /// Wakes a relay of this process waiting in [`SpoolStore::wait_for_work`], or the
    /// next one to wait, so that messages committed just now are published without
    /// waiting for the next poll. Relays in other processes still poll.
    pub fn wake(&self) {
        self.table.wake();
    }
}

impl SpoolStore for SqliteOutbox {
    type Item = Message;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Message>>> {
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
    ) -> Result<Vec<Claimed<Message>>> {
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

    async fn backlog(&self) -> Result<Option<Backlog>> {
        Ok(Some(self.admin().backlog().await?))
    }
}

impl SpoolRow for Message {
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError> {
        let id: String = row.get("id")?;
        let headers: String = row.get("headers")?;
        let payload: Vec<u8> = row.get("payload")?;
        Ok(Message {
            id: MessageId::parse(&id).map_err(|e| row.error("id", e))?,
            topic: row.get("topic")?,
            key: row.get("key")?,
            kind: row.get("kind")?,
            headers: Headers::from_json(&headers).map_err(|e| row.error("headers", e))?,
            payload: payload.into(),
            created_at: from_unix_millis(row.get("created_at")?),
        })
    }
}
