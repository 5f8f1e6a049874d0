//! Scheduled messages: enqueued now, published when due; cancelled before they go out.

use std::time::SystemTime;

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Message, MessageId, Result, Schedule};
use sqlx::SqliteConnection;

use super::{SqliteOutbox, sql};
use crate::error::store_error;

impl SqliteOutbox {
    /// Writes `message` into the outbox on `conn` (normally the caller's open
    /// transaction), to be published once `when` comes; see [`Schedule`] (SQLite has no
    /// clock of its own: the time is this process's). Everything
    /// [`enqueue`](Self::enqueue) says holds, and the message keeps its place in its
    /// key's order: a later message of its key waits behind it even when that one is due
    /// first. Until it is due, [`stats`](Self::stats) counts it as `scheduled`, not
    /// `pending`, and [`cancel`](Self::cancel) can take it back. One statement, as
    /// `enqueue`.
    ///
    /// ```no_run
    /// # async fn demo(store: &oncebox_sqlite::SqliteStore)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use oncebox_core::{Message, Schedule};
    ///
    /// let mut tx = store.pool().begin().await?;
    /// let reminder = Message::json("carts", &"cart 42 abandoned?")?.with_key("cart-42");
    /// let in_an_hour = Schedule::After(Duration::from_secs(3600));
    /// store.outbox().enqueue_scheduled(&mut tx, &reminder, in_an_hour).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue).
    ///
    /// # Cancel safety
    ///
    /// As [`enqueue`](Self::enqueue): if the future is dropped, roll the transaction back.
    pub async fn enqueue_scheduled(
        &self,
        conn: &mut SqliteConnection,
        message: &Message,
        when: Schedule,
    ) -> Result<()> {
        let due = match when {
            Schedule::At(at) => at,
            Schedule::After(delay) => SystemTime::now().checked_add(delay).ok_or_else(|| {
                Error::InvalidOptions(format!("a delay of {delay:?} is past any clock"))
            })?,
        };
        self.insert(conn, message, due).await
    }

    /// Takes back the message `id` if it has not gone out: deletes its row, in `conn`'s
    /// transaction, if it is pending and no live claim holds it. Returns whether it did;
    /// the message is then never published (once the transaction commits).
    ///
    /// `false` when there is no such pending message: it was published or is being
    /// published right now (a live claim holds it), it is dead, it was cancelled, or it
    /// was never enqueued. Meant for scheduled messages, it cancels any pending one. A
    /// relay whose lease ran out while it was still publishing the message may have
    /// published it all the same (leases bound the outbox's guarantees, as for any
    /// duplicate).
    ///
    /// # Errors
    ///
    /// A store error; roll the transaction back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be deleted in the transaction;
    /// roll it back.
    pub async fn cancel(&self, conn: &mut SqliteConnection, id: MessageId) -> Result<bool> {
        let deleted = sqlx::query(sql::CANCEL)
            .bind(to_unix_millis(SystemTime::now()))
            .bind(id.to_string())
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected() > 0)
    }
}
