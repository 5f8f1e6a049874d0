//! The transactional outbox on MySQL / MariaDB.

pub(crate) mod admin;
mod batch;
mod schedule;

use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{Backlog, ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Error, Headers, Limits, Message, MessageId, Result, Schedule, trace};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use tracing::Instrument;

pub use admin::{DeadLetter, OutboxStats, RowState, RowStatus};

use crate::error::{
    RowDecodeError, RowReader, check_bytes, check_chars, is_duplicate_key, store_error,
};
use crate::spool::{Layout, SpoolRow, SpoolSql, SpoolTable};
use crate::sql::{query, uuid_bytes};
use crate::wake::{Seen, Wakeup};

/// The outbox table.
pub(crate) const TABLE: &str = "oncebox_outbox";

/// Longest key, in bytes (`VARBINARY(512)`).
pub(crate) const MAX_KEY_BYTES: usize = 512;
/// Longest topic and kind, in characters (`VARCHAR(255)`).
pub(crate) const MAX_NAME_CHARS: usize = 255;

/// The statement that locks a key's slot in `oncebox_key_locks` to the end of the
/// transaction: `?` key.
pub(crate) const LOCK_KEY: &str =
    "SELECT slot FROM oncebox_key_locks WHERE slot = CRC32(?) & 65535 FOR UPDATE";

/// `?` id, `?` topic, `?` key, `?` kind, `?` headers, `?` payload, `?` created at (ms).
const ENQUEUE: &str =
    "INSERT INTO oncebox_outbox (id, topic, `key`, kind, headers, payload, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?)";

pub(crate) static SPOOL: LazyLock<SpoolSql> = LazyLock::new(|| {
    SpoolSql::build(&Layout {
        table: TABLE,
        scope: None,
        item: "t.id, t.topic, t.`key`, t.kind, t.headers, t.payload, t.created_at",
    })
});

/// The transactional outbox: [`MySqlOutbox::enqueue`] writes a message in the caller's
/// transaction, and the [`SpoolStore`] implementation lets any number of
/// [`Relay`](oncebox_core::spool::Relay)s claim, publish and settle it, each key's
/// messages in commit order and no key on two relays at once.
///
/// Table `oncebox_outbox`. Cheap to clone; clones share the in-process wake-ups. See the
/// [crate docs](crate) for how ordering and claiming work.
#[derive(Debug, Clone)]
pub struct MySqlOutbox {
    table: SpoolTable,
    limits: Limits,
    delete_on_publish: bool,
    wakeup: Arc<Wakeup>,
    seen: Seen,
}

impl MySqlOutbox {
    pub(crate) fn new(pool: MySqlPool, wakeup: Arc<Wakeup>) -> Self {
        Self {
            table: SpoolTable::new(pool, &SPOOL, None),
            limits: Limits::new(),
            delete_on_publish: false,
            seen: wakeup.seen(),
            wakeup,
        }
    }

    /// Sets the limits messages are checked against at enqueue. Default:
    /// [`Limits::new`]. Whatever the limits, a topic or kind longer than 255 characters
    /// or a key longer than 512 bytes does not fit its column and is refused.
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
    /// Saves the cleanup's work; the price is that [`status`](Self::status) no longer
    /// finds published messages and a re-enqueue of a published id is no longer refused
    /// as a duplicate.
    #[must_use]
    pub fn delete_on_publish(mut self, on: bool) -> Self {
        self.delete_on_publish = on;
        self
    }

    /// How many pending rows, in commit order, the first step of a claim reads. Default:
    /// adaptive, a quarter more than the last claim needed, between 1.25 times the
    /// claim's limit (at least 128) and four times it (at least 1024), and the upper
    /// bound again when a window comes back short. With a fixed window, keys beyond it are
    /// found by the claim's second step at once (see the crate docs, "Claiming").
    #[must_use]
    pub fn with_claim_window(mut self, rows: usize) -> Self {
        self.table.set_window(rows);
        self
    }

    /// The outbox table's name, for raw SQL such as benchmarks.
    pub fn table(&self) -> &str {
        self.table.table()
    }

    pub(crate) fn pool(&self) -> &MySqlPool {
        self.table.pool()
    }

    /// Writes `message` into the outbox on `conn`, which is normally the caller's open
    /// transaction (`&mut *tx`): the message is published if and only if that
    /// transaction commits. Never opens a transaction of its own.
    ///
    /// For a message with a key, `enqueue` first locks the key's slot in
    /// `oncebox_key_locks` (`SELECT ... FOR UPDATE`, held to the end of the transaction),
    /// then inserts the row, which gets its `seq` then: transactions enqueueing the same
    /// key commit in `seq` order, which is the order relays publish them in. Such
    /// transactions wait for each other from their enqueue to their commit, so enqueue
    /// late in long transactions. Keys share 65,536 slots: two keys in one slot only wait
    /// for each other, and a transaction enqueueing several keys may, rarely, deadlock
    /// with another that enqueues keys sharing their slots in the other order. InnoDB
    /// then rolls one of them back with a transient error (1213): retry the transaction,
    /// as every InnoDB application must be ready to. Messages without a key take no lock.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &oncebox_mysql::MySqlOutbox, pool: &sqlx::MySqlPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use oncebox_core::Message;
    ///
    /// let mut tx = pool.begin().await?;
    /// // ... the business change, on &mut *tx ...
    /// let message = Message::json("orders", &"order 42 placed")?.with_key("order-42");
    /// outbox.enqueue(&mut tx, &message).await?;
    /// tx.commit().await?;
    /// outbox.wake(); // relays of this process look now, not at their next poll
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidMessage`] if the message breaks the [limits](Self::with_limits);
    ///   nothing is written.
    /// - A permanent store error whose source is a [`ValueTooLong`](crate::ValueTooLong)
    ///   if the topic, kind or key does not fit its column; nothing is written.
    /// - [`Error::Duplicate`] if a message with the same id is in the outbox (pending,
    ///   done within retention, or dead). MySQL fails only the statement: the
    ///   transaction stays usable.
    /// - A store error otherwise (a deadlock, 1213, has rolled the transaction back).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue(&self, conn: &mut MySqlConnection, message: &Message) -> Result<()> {
        self.enqueue_when(conn, message, None).await
    }

    /// [`enqueue`](Self::enqueue), due at once or as `when` says.
    async fn enqueue_when(
        &self,
        conn: &mut MySqlConnection,
        message: &Message,
        when: Option<Schedule>,
    ) -> Result<()> {
        message.validate(&self.limits)?;
        check_chars("topic", &message.topic, MAX_NAME_CHARS)?;
        check_chars("kind", &message.kind, MAX_NAME_CHARS)?;
        if let Some(key) = &message.key {
            check_bytes("key", key, MAX_KEY_BYTES)?;
        }
        let (span, headers) = trace::creation(message);
        let enqueued = self
            .insert(conn, message, &headers, when)
            .instrument(span.clone())
            .await;
        if let Err(error) = &enqueued {
            trace::record_error(&span, error);
        }
        enqueued
    }

    /// The statements of [`enqueue`](Self::enqueue): the key's lock, then the row, due
    /// at once or as `when` says.
    async fn insert(
        &self,
        conn: &mut MySqlConnection,
        message: &Message,
        headers: &Headers,
        when: Option<Schedule>,
    ) -> Result<()> {
        if let Some(key) = &message.key {
            query(LOCK_KEY)
                .bind(key.as_bytes().to_vec())
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error)?;
        }
        let statement = if when.is_some() {
            schedule::ENQUEUE_SCHEDULED.as_str()
        } else {
            ENQUEUE
        };
        let mut insert = query(statement)
            .bind(uuid_bytes(message.id.as_uuid()))
            .bind(message.topic.clone())
            .bind(message.key.as_ref().map(|key| key.as_bytes().to_vec()))
            .bind(message.kind.clone())
            .bind(headers.to_json())
            .bind(message.payload.to_vec())
            .bind(to_unix_millis(message.created_at));
        if let Some(when) = when {
            let (at, delay) = schedule::binds(when);
            insert = insert.bind(at).bind(delay);
        }
        let inserted = insert.execute(&mut *conn).await;
        match inserted {
            Ok(_) => Ok(()),
            Err(e) if is_duplicate_key(&e) => Err(Error::Duplicate { id: message.id }),
            Err(e) => Err(store_error(e)),
        }
    }

    /// The plans of a claim's reads for `limit` rows on this table's data: the window
    /// read (plain, and passing over the rows of a claim), step 2's locking read of the
    /// rows picked and the read of the live claims, under `EXPLAIN` (nothing runs and
    /// nothing is locked). For operators asking why claims are slow.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn explain_claim(&self, limit: usize) -> Result<String> {
        self.table.explain_claim(limit).await
    }

    /// Wakes the relays of this process waiting in
    /// [`wait_for_work`](SpoolStore::wait_for_work) on this table, so that messages
    /// committed just now are published without waiting for the next poll. Relays in
    /// other processes find them at their next poll.
    pub fn wake(&self) {
        self.wakeup.wake();
    }
}

impl SpoolStore for MySqlOutbox {
    type Item = Message;

    /// Claims due rows; see the crate docs ("Claiming").
    ///
    /// One short `READ COMMITTED` transaction: the table's claim lock (a row of
    /// `oncebox_claim_locks`, which serialises the claims of all relays on the table);
    /// the table's live claims; step 1, a read of the first pending rows in commit
    /// order, in full, passing over the rows of this process's own live claims, and
    /// the claim rule decided on them; only if that window held fewer free rows than
    /// asked for while more rows are pending, step 2, which finds free keys one index
    /// probe per key and locks the rows it picks `FOR UPDATE SKIP LOCKED`; and, with the
    /// commit, the lock of step 1's rows (`FOR UPDATE SKIP LOCKED`) and the claim's row
    /// in `oncebox_claims`, written only if every one of those rows was locked still
    /// pending (else, rarely, when a [`cancel`](MySqlOutbox::cancel) in flight holds one,
    /// the claim is made again, locking step 1's rows before taking them).
    ///
    /// The window is the head of the `(status, seq)` index, read in order and stopped by
    /// the `LIMIT` (`rows` estimates the whole range of pending rows, not what is read);
    /// the rows it passes over (`seq NOT IN (...)`) are left out by the index
    /// condition, before their primary-key lookups. Step 2's locking read finds the
    /// picked rows by primary key, as does step 1's lock of its rows (the same range
    /// read on `seq`), and the claims are one primary-key range. Nothing
    /// sorts, nothing scans the table. The test `claim_plans_use_the_indexes` checks
    /// these plans; [`MySqlOutbox::explain_claim`] shows them on your data.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Message>>> {
        self.seen.mark();
        self.table.claim(request).await
    }

    async fn extend(&self, token: LeaseToken, _rows: &[i64], lease: Duration) -> Result<()> {
        self.table.extend(token, lease).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.table
            .settle(token, settlements, self.delete_on_publish)
            .await
    }

    /// Settles, then claims as [`claim`](Self::claim) does, in two transactions with one
    /// request between them: the settlement's updates and commit, and the claim's lock,
    /// read of the live claims and window (see the crate docs, "Claiming").
    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Message>>> {
        self.seen.mark();
        self.table
            .settle_and_claim(token, settlements, self.delete_on_publish, request)
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.table.purge(before, limit).await
    }

    /// Returns when [`MySqlOutbox::wake`] is called in this process (a wake-up since the
    /// last claim began ends the wait at once), or after `timeout`.
    async fn wait_for_work(&self, timeout: Duration) {
        self.seen.wait(timeout).await;
    }

    async fn backlog(&self) -> Result<Option<Backlog>> {
        Ok(Some(self.admin().backlog().await?))
    }
}

impl SpoolRow for Message {
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError> {
        let id = row
            .uuid("id")?
            .ok_or_else(|| row.error("id", "NULL is not a message id"))?;
        let headers: String = row.get("headers")?;
        let payload: Vec<u8> = row.get("payload")?;
        Ok(Message {
            id: MessageId::from_uuid(id),
            topic: row.get("topic")?,
            key: row.text("key")?,
            kind: row.get("kind")?,
            headers: Headers::from_json(&headers).map_err(|e| row.error("headers", e))?,
            payload: payload.into(),
            created_at: from_unix_millis(row.get("created_at")?),
        })
    }
}
