//! Scheduled messages: enqueued now, published when due; cancelled before they go out.

use oncebox_core::{Message, MessageId, Result, Schedule};
use sqlx::postgres::PgConnection;

use super::PgOutbox;
use crate::error::store_error;
use crate::spool::query;
use crate::time::to_micros;

impl PgOutbox {
    /// Writes `message` into the outbox on `conn` (normally the caller's open
    /// transaction), to be published once `when` comes, by the database's clock; see
    /// [`Schedule`]. Everything [`enqueue`](Self::enqueue) says holds: the message is
    /// published if and only if the transaction commits, ids are unique, and the key's
    /// lock orders it among the key's messages, so a later message of its key waits
    /// behind it even when that one is due first. Until it is due,
    /// [`stats`](Self::stats) counts it as `scheduled`, not `pending`, and
    /// [`cancel`](Self::cancel) can take it back.
    ///
    /// Two statements: the enqueue, then the delivery time. A relay cannot see the row
    /// between them (it is not committed).
    ///
    /// Delivery times are kept by the polling [`Relay`](oncebox_core::spool::Relay). The
    /// log-tailing relay (feature `cdc`) publishes each row as its transaction commits
    /// and does not wait for them: do not schedule messages on a table it tails.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &oncebox_postgres::PgOutbox, pool: &sqlx::PgPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use oncebox_core::{Message, Schedule};
    ///
    /// let mut tx = pool.begin().await?;
    /// let reminder = Message::json("carts", &"cart 42 abandoned?")?.with_key("cart-42");
    /// outbox
    ///     .enqueue_scheduled(&mut tx, &reminder, Schedule::After(Duration::from_secs(3600)))
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); a store error from the second statement aborts the
    /// transaction: roll it back.
    ///
    /// # Cancel safety
    ///
    /// As [`enqueue`](Self::enqueue): if the future is dropped, roll the transaction back.
    pub async fn enqueue_scheduled(
        &self,
        conn: &mut PgConnection,
        message: &Message,
        when: Schedule,
    ) -> Result<()> {
        self.enqueue(conn, message).await?;
        let (at, delay) = match when {
            Schedule::At(at) => (Some(to_micros(at)), 0),
            Schedule::After(delay) => (None, i64::try_from(delay.as_micros()).unwrap_or(i64::MAX)),
        };
        query(&self.sql().schedule)
            .bind(message.id.to_string())
            .bind(at)
            .bind(delay)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Takes back the message `id` if it has not gone out: deletes its row, in `conn`'s
    /// transaction, if it is pending and no relay holds it. Returns whether it did; the
    /// message is then never published (once the transaction commits).
    ///
    /// `false` when there is no such pending message: it was published (or is being
    /// published right now: a relay holding it in a claim's transaction makes this wait
    /// for that claim's end, then find it published), it is dead, it was cancelled, or it
    /// was never enqueued. Meant for scheduled messages, it cancels any pending one. A
    /// relay whose lease on the row ran out while it was still publishing it may have
    /// published it all the same (leases bound the outbox's guarantees, as for any
    /// duplicate).
    ///
    /// # Errors
    ///
    /// A store error; the transaction is then aborted: roll it back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be deleted in the transaction;
    /// roll it back.
    pub async fn cancel(&self, conn: &mut PgConnection, id: MessageId) -> Result<bool> {
        let deleted = query(&self.sql().cancel)
            .bind(id.to_string())
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected() > 0)
    }
}
