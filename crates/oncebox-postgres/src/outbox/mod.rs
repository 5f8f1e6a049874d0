//! The transactional outbox on PostgreSQL.

pub(crate) mod admin;
mod batch;
pub(crate) mod debezium;
mod schedule;
pub(crate) mod sql;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{Backlog, ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox_core::{Error, Headers, InvalidMessage, Limits, Message, MessageId, Result, trace};
use sqlx::postgres::{PgConnection, PgPool};
use tracing::Instrument;

pub use admin::{DeadLetter, OutboxStats, RowState, RowStatus};
pub use debezium::{DebeziumLayout, DebeziumPayload};

use crate::error::{RowDecodeError, RowReader, is_unique_violation, store_error};
use crate::notify::{Seen, Wakeup, wait};
use crate::spool::{Hold, SpoolRow, SpoolTable, query};
use crate::time::{from_micros, to_micros};
use sql::OutboxSql;

/// The transactional outbox: [`PgOutbox::enqueue`] writes a message in the caller's
/// transaction, and the [`SpoolStore`] implementation lets any number of
/// [`Relay`](oncebox_core::spool::Relay)s claim, publish and settle it, each key's
/// messages in commit order and no key on two relays at once.
///
/// Table `<schema>.outbox` (or a [Debezium-style table](DebeziumLayout)). Cheap to clone;
/// clones share the wake-ups. See the [crate docs](crate) for how ordering, claiming and
/// wake-ups work.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    table: SpoolTable,
    sql: Arc<OutboxSql>,
    limits: Limits,
    notify: bool,
    delete_on_publish: bool,
    wakeup: Arc<Wakeup>,
    seen: Seen,
}

impl PgOutbox {
    pub(crate) fn new(pool: PgPool, sql: Arc<OutboxSql>, wakeup: Arc<Wakeup>) -> Self {
        Self {
            table: SpoolTable::new(pool, Arc::clone(&sql.spool), None, Hold::Transaction),
            sql,
            limits: Limits::new(),
            notify: false,
            delete_on_publish: false,
            seen: Seen::new(&wakeup),
            wakeup,
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

    /// Turns `LISTEN/NOTIFY` wake-ups on or off. Default: off.
    ///
    /// On, [`enqueue`](Self::enqueue) adds a `pg_notify` to the caller's transaction, and
    /// [`wait_for_work`](SpoolStore::wait_for_work) listens on the table's channel (on a
    /// connection of its own, outside the pool) and returns as soon as a transaction that
    /// enqueued commits, instead of at the end of the relay's poll interval.
    ///
    /// The price: PostgreSQL serialises the commits of transactions that notify (a global
    /// lock held through the commit), which cost about a third of the commit rate of
    /// enqueueing transactions at 16 concurrent clients on a 2-core machine with a fast
    /// disk, and more where fsync is slow. Relays that listen work behind nothing that
    /// breaks `LISTEN`: PgBouncer in transaction pooling mode delivers no notifications,
    /// and a listener that fails or hears nothing leaves the relay polling at its poll
    /// interval, which is also what happens with this option off. Both settings may be
    /// mixed: producers that notify wake relays that listen; others are found by polling.
    #[must_use]
    pub fn with_notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Deletes a row when its message is published, instead of marking it done and
    /// leaving it to retention cleanup. Default: off.
    ///
    /// Saves the dead tuple of the done row's update and the cleanup's work; the price is
    /// that [`status`](Self::status) no longer finds published messages and a re-enqueue
    /// of a published id is no longer refused as a duplicate.
    #[must_use]
    pub fn delete_on_publish(mut self, on: bool) -> Self {
        self.delete_on_publish = on;
        self
    }

    /// Holds claimed rows with the claim's open transaction (on, the default), or with
    /// leases written into them (off). See the crate docs ("Held and leased claims").
    ///
    /// Held, a claim locks its rows and keeps its transaction, and the pool connection
    /// under it, open until the rows are settled: every row is written once, by its
    /// settlement, and a relay that dies frees its rows at once. Leased, a claim writes a
    /// lease into its rows and commits, then the settlement writes them again: twice the
    /// writes, and no connection held while messages are published. Choose leases where
    /// connections are scarce (each relay holds one while it publishes) or deliveries are
    /// slow (a held claim keeps a transaction open that long). Relays of either kind may
    /// share a table.
    #[must_use]
    pub fn with_held_claims(mut self, on: bool) -> Self {
        self.table
            .set_hold(if on { Hold::Transaction } else { Hold::Lease });
        self
    }

    /// How many pending rows, in commit order, the first step of a claim examines.
    /// Default: adaptive, between twice the claim's limit (at least 512) and four times
    /// it (at least 1024): twice what the last claim of this outbox (or a clone) needed,
    /// and the upper bound after a claim that found too few free rows in it. Larger
    /// windows find more
    /// rows when many keys at the head of the table are held by other relays, at the
    /// price of more work per claim; keys beyond the window are found by the claim's
    /// second step anyway (see the crate docs, "Claiming").
    #[must_use]
    pub fn with_claim_window(mut self, rows: usize) -> Self {
        self.table.set_window(rows);
        self
    }

    /// The outbox table, schema-qualified and quoted (`"oncebox"."outbox"`), for raw SQL
    /// such as benchmarks.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The `NOTIFY` channel of this table.
    pub fn channel(&self) -> &str {
        self.wakeup.channel()
    }

    pub(crate) fn pool(&self) -> &PgPool {
        self.table.pool()
    }

    pub(crate) fn sql(&self) -> &OutboxSql {
        &self.sql
    }

    /// Writes `message` into the outbox on `conn`, which is normally the caller's open
    /// transaction (`&mut *tx`): the message is published if and only if that
    /// transaction commits. Never opens a transaction of its own.
    ///
    /// For a message with a key, the statement first takes a transaction-scoped advisory
    /// lock on the key's hash, then allocates the row's `seq`: transactions enqueueing
    /// the same key commit in `seq` order, which is the order relays publish them in.
    /// Such transactions wait for each other from their enqueue to their commit, so
    /// enqueue late in long transactions; a hash collision only makes two keys wait for
    /// each other. Messages without a key take no lock. A transaction that enqueues
    /// several keys holds several locks: enqueue them in one order everywhere (sorted by
    /// key, say), or two such transactions can deadlock, and PostgreSQL then aborts one
    /// of them with a transient error (40P01) that the caller retries.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &oncebox_postgres::PgOutbox, pool: &sqlx::PgPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use oncebox_core::Message;
    ///
    /// let mut tx = pool.begin().await?;
    /// // ... the business change, on &mut *tx ...
    /// let message = Message::json("orders", &"order 42 placed")?.with_key("order-42");
    /// outbox.enqueue(&mut tx, &message).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidMessage`] if the message fails [`Message::validate`] with the
    ///   [limits](Self::with_limits) (a NUL in the topic, key or kind among the rest) or,
    ///   for a Debezium-style table with a JSON payload column, the payload is not JSON;
    ///   nothing is written.
    /// - [`Error::Duplicate`] if a message with the same id is in the outbox (pending,
    ///   done within retention, or dead). The statement does nothing then, so the
    ///   transaction stays usable.
    /// - A store error otherwise; the transaction is then aborted: roll it back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the row may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue(&self, conn: &mut PgConnection, message: &Message) -> Result<()> {
        message.validate(&self.limits)?;
        let topic = self.sql.aggregate_type(&message.topic)?;
        if self.sql.json_payload {
            serde_json::from_slice::<serde::de::IgnoredAny>(&message.payload)
                .map_err(InvalidMessage::Json)?;
        }
        let statement = if self.notify {
            &self.sql.enqueue_notify
        } else {
            &self.sql.enqueue
        };
        let (span, headers) = trace::creation(message);
        let result = query(statement)
            .bind(message.id.to_string())
            .bind(topic)
            .bind(message.key.clone())
            .bind(message.kind.clone())
            .bind(headers.to_json())
            .bind(message.payload.to_vec())
            .bind(to_micros(message.created_at))
            .fetch_optional(&mut *conn)
            .instrument(span.clone())
            .await;
        let enqueued = match result {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::Duplicate { id: message.id }),
            Err(e) if is_unique_violation(&e) => Err(Error::Duplicate { id: message.id }),
            Err(e) => Err(store_error(e)),
        };
        if let Err(error) = &enqueued {
            trace::record_error(&span, error);
        }
        enqueued
    }

    /// Explains the claim on this table's data: runs both of its statements (see the
    /// crate docs, "Claiming") for `limit` rows under `EXPLAIN (ANALYZE, BUFFERS)`, in a
    /// transaction that is rolled back, and returns the plans. Nothing is claimed, but the
    /// statements do run: they take the claim lock and lock rows for as long as they
    /// take. For operators asking why claims are slow, and for benchmarks.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call rolls back.
    pub async fn explain_claim(&self, limit: usize) -> Result<String> {
        self.table.explain_claim(limit).await
    }

    /// Wakes the relays of this process waiting in
    /// [`wait_for_work`](SpoolStore::wait_for_work) on this table, so that messages
    /// committed just now are published without waiting for the next poll. Relays in
    /// other processes learn of them by `NOTIFY` (see [`with_notify`](Self::with_notify))
    /// or by polling.
    pub fn wake(&self) {
        self.wakeup.wake();
    }
}

impl SpoolStore for PgOutbox {
    type Item = Message;

    /// Claims due rows; see the crate docs ("Claiming").
    ///
    /// A held claim (the default) opens a transaction that it keeps until the rows are
    /// settled, and runs the fast claim in it; only if a claimed row's key has an
    /// earlier row the claim could not take does it roll back and run step 1 and, if
    /// needed, step 2 (both locking, not leasing). A leased claim is one short
    /// transaction: a transaction-scoped advisory lock that serialises the leased
    /// claims on this table; step 1, a statement that leases rows from a window of the
    /// first pending rows in commit order; and, only if that window held fewer free rows
    /// than asked for while more rows are pending, step 2, a statement that finds free
    /// keys one index probe per key.
    ///
    /// No statement sorts or scans the table: every step reads the partial indexes of
    /// pending rows. [`PgOutbox::explain_claim`] shows the plans on your data; the plans
    /// and timings measured so far are in the repository's `docs/benchmarks.md`.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Message>>> {
        if self.notify {
            self.wakeup.listen();
        }
        self.seen.mark();
        self.table.claim(request).await
    }

    /// Settles the rows of claim `token`. A held claim's settlements of its own rows
    /// commit in its transaction, which ends the claim; one settled after its lease is
    /// rolled back instead (its rows are delivered again, as after an expired lease) and
    /// `Ok` returns, as for a stale lease token. A token that this outbox handle and its
    /// clones do not hold is settled as a leased claim's: only rows still leased to it.
    async fn extend(&self, token: LeaseToken, rows: &[i64], lease: Duration) -> Result<()> {
        self.table.extend(token, rows, lease).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.table
            .settle(token, settlements, self.delete_on_publish)
            .await
    }

    /// Settles and claims with one commit per batch. A held claim's settlements commit
    /// in its transaction, in the same message as the `BEGIN` of the next claim's, on
    /// the same connection; a leased claim's settle statement and the next claim run in
    /// one transaction. Claims and settlements commit without waiting for the WAL flush
    /// (`synchronous_commit` off for their transactions): a crash may forget the last of
    /// them, which only makes rows claimable again and published again (at least once;
    /// consumers deduplicate), and never loses a message; `enqueue` keeps the server's
    /// setting.
    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Message>>> {
        if self.notify {
            self.wakeup.listen();
        }
        self.seen.mark();
        self.table
            .settle_and_claim(token, settlements, self.delete_on_publish, request)
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.table.purge(before, limit).await
    }

    /// Returns when a transaction that enqueued with [`PgOutbox::with_notify`] commits
    /// (if this outbox listens), when [`PgOutbox::wake`] is called in this process, or
    /// after `timeout`. A wake-up that arrived since the last claim began ends the wait at
    /// once.
    async fn wait_for_work(&self, timeout: Duration) {
        if self.notify {
            self.wakeup.listen();
        }
        let mut seen = self.seen.snapshot();
        wait(&mut seen, timeout).await;
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
            created_at: from_micros(row.get("created_at")?),
        })
    }
}
