//! Scheduled messages: enqueued now, published when due; cancelled before they go out.

use std::sync::LazyLock;

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Message, MessageId, Result, Schedule};
use sqlx::Row;
use sqlx::mysql::MySqlConnection;

use super::{MySqlOutbox, TABLE};
use crate::error::store_error;
use crate::spool::sql::PENDING;
use crate::sql::{NOW_MS, query, uuid_bytes};

/// As `ENQUEUE`, then `?` due at (ms) or NULL, `?` delay (ms) from the database's now.
pub(super) static ENQUEUE_SCHEDULED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (id, topic, `key`, kind, headers, payload, created_at, available_at)
VALUES (?, ?, ?, ?, ?, ?, ?, COALESCE(?, {NOW_MS} + ?))"
    )
});

/// `?` id → the row's `seq`, locked, if it is pending.
static LOCK_PENDING: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT seq FROM {TABLE} WHERE id = ? AND status = {PENDING} FOR UPDATE")
});

/// The rows held by the outbox's live claims (JSON arrays).
static LIVE_CLAIMS: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT seqs FROM oncebox_claims WHERE spool = '{TABLE}' AND lease_until > {NOW_MS}")
});

/// `?` seq.
static DELETE: LazyLock<String> = LazyLock::new(|| format!("DELETE FROM {TABLE} WHERE seq = ?"));

/// The extra parameters of [`ENQUEUE_SCHEDULED`] for `when`.
pub(super) fn binds(when: Schedule) -> (Option<i64>, i64) {
    match when {
        Schedule::At(at) => (Some(to_unix_millis(at)), 0),
        Schedule::After(delay) => (None, i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
    }
}

impl MySqlOutbox {
    /// Writes `message` into the outbox on `conn` (normally the caller's open
    /// transaction), to be published once `when` comes, by the database's clock; see
    /// [`Schedule`]. Everything [`enqueue`](Self::enqueue) says holds, and the key's lock
    /// orders it among the key's messages: a later message of its key waits behind it
    /// even when that one is due first. Until it is due, [`stats`](Self::stats) counts
    /// it as `scheduled`, not `pending`, and [`cancel`](Self::cancel) can take it back.
    /// The same statements as `enqueue`.
    ///
    /// ```no_run
    /// # async fn demo(store: &oncebox_mysql::MySqlStore)
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
        conn: &mut MySqlConnection,
        message: &Message,
        when: Schedule,
    ) -> Result<()> {
        self.enqueue_when(conn, message, Some(when)).await
    }

    /// Takes back the message `id` if it has not gone out: deletes its row, in `conn`'s
    /// transaction, if it is pending and no live claim holds it. Returns whether it did;
    /// the message is then never published, whatever relays claim while the transaction
    /// stays open: they pass over the row, and the rest of its key, until it ends. If
    /// the transaction rolls back, the message is published as if never cancelled.
    ///
    /// `false` when there is no such pending message: it was published or is being
    /// published right now (a live claim holds it), it is dead, it was cancelled, or it
    /// was never enqueued. Meant for scheduled messages, it cancels any pending one. A
    /// relay whose lease ran out while it was still publishing the message may have
    /// published it all the same (leases bound the outbox's guarantees, as for any
    /// duplicate).
    ///
    /// Three statements: the row is locked (waiting for a claim taking it right now to
    /// commit: a claim locks the rows it takes before it commits), the live claims are
    /// read on a pool connection of their own (a fresh snapshot, which sees that claim,
    /// whatever `conn`'s snapshot; no lock on the claims, which relays write), and the
    /// row is deleted if none holds it. The row lock is held to the end of the
    /// transaction, so that no claim takes the row meanwhile: claims lock the rows they
    /// take `SKIP LOCKED`, and pass over this one and the rest of its key without
    /// waiting for the caller's commit; no relay waits for it. While the transaction is
    /// open and the message due, a claim that picks the row is made twice (the second
    /// locking its rows before taking them): keep the transaction short. The read takes
    /// a second connection of the pool while `conn` is held.
    ///
    /// # Errors
    ///
    /// A store error; a deadlock with a claim (1213) has rolled the transaction back:
    /// run it again.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be deleted in the transaction;
    /// roll it back.
    pub async fn cancel(&self, conn: &mut MySqlConnection, id: MessageId) -> Result<bool> {
        let locked = query(&LOCK_PENDING)
            .bind(uuid_bytes(id.as_uuid()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        let Some(row) = locked else {
            return Ok(false);
        };
        let seq: i64 = row.try_get("seq").map_err(store_error)?;
        let claims = query(&LIVE_CLAIMS)
            .fetch_all(self.pool())
            .await
            .map_err(store_error)?;
        for claim in claims {
            let seqs: String = claim.try_get("seqs").map_err(store_error)?;
            let held: Vec<i64> = serde_json::from_str(&seqs).map_err(|e| {
                oncebox_core::Error::store_permanent(format!("a claim's rows: {e}"))
            })?;
            if held.contains(&seq) {
                return Ok(false);
            }
        }
        query(&DELETE)
            .bind(seq)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(true)
    }
}
