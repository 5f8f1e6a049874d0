//! The log-tailing relay (feature `cdc`): reads the outbox through a logical replication
//! slot with PostgreSQL's built-in `pgoutput` plugin, instead of polling the table.
//!
//! Tailing reads each message once, in commit order, with no claim statements, no index
//! on pending rows and no polling load. It has two modes:
//!
//! - **messages** ([`CdcMode::Messages`], the default): producers write no row at all.
//!   [`PgMessageOutbox::enqueue`] (or the SQL function `<schema>.emit(topic, key, kind,
//!   headers, payload)`, or a plain `pg_logical_emit_message(true, prefix, content)`)
//!   writes the message into the WAL of the producer's transaction as a *logical
//!   decoding message*: it is decoded when the transaction commits and never if it
//!   rolls back. Nothing is stored in a table, so nothing bloats and nothing must be
//!   deleted.
//! - **table** ([`CdcMode::Table`]): producers insert into `<schema>.outbox` as they do for
//!   the polling relay ([`PgOutbox::enqueue`](crate::PgOutbox::enqueue), or the `INSERT`
//!   of any language); the relay reads the inserts through a publication on the table
//!   (inserts only) and deletes published rows in batches of
//!   [`CdcOptions::delete_batch`], so producers need no change at all. Rows are deleted
//!   rather than never kept (a producer could insert and delete in one transaction, as
//!   Debezium's outbox router suggests) because that would ask every producer to
//!   change; a deleted row's insert stays in the WAL, so a crash still publishes it
//!   again.
//!
//! # Guarantees
//!
//! - **Commit order.** The slot hands out transactions in commit order. Messages with the
//!   same key are published one at a time in that order; messages of different keys are
//!   published in parallel (up to [`CdcOptions::max_in_flight`]).
//! - **Published only once visible.** Logical decoding hands a commit out as soon as its
//!   record is in the WAL, before other sessions can see the transaction: with
//!   synchronous replication, while its producer still waits for the standby. The relay
//!   reads a commit's changes only once a snapshot of the server shows it ended (one
//!   snapshot covers every commit before it, so a backlog costs one per window, not one
//!   per commit). A commit a failover could still take back (the primary dies while its
//!   producer waits for the synchronous standby) is therefore never published.
//! - **Confirmed only behind the broker, and on every commit.** The slot's confirmed
//!   position moves to the end of a commit once the broker confirmed every message of
//!   that commit and of every commit before it, and at once for a commit with nothing to
//!   publish (another table's transaction, the relay's own heartbeat), so that a quiet
//!   outbox beside a busy database never pins the WAL. After a crash, the next reader
//!   starts from the slot's confirmed position and publishes again at most what was not
//!   confirmed, under the same ids, so broker-side deduplication (`Nats-Msg-Id`,
//!   idempotent producers) and consumers' inboxes absorb the copies.
//! - **One reader.** A relay reads the slot only while it holds a session advisory lock
//!   on it, on a connection of its own. Another relay with the same slot stands by,
//!   polling the lock every [`CdcOptions::standby_poll`], and takes over when the
//!   reader's connection closes (the reader died) or its lock connection fails.
//! - **A lost slot is never re-created silently.** The store remembers each slot its
//!   relays read, and the position last confirmed (`<schema>.cdc_slots`). A slot that
//!   is gone (a failover to a standby: before PostgreSQL 17 no logical slot is carried
//!   over; a drop while a relay stood by) or invalidated holds messages nobody can read
//!   any more: the relay refuses to start and names the range of WAL positions that may
//!   be lost, unless told to create it again ([`CdcOptions::on_lost_slot`]).
//! - **Nothing silently dropped.** A message the broker refuses (a permanent error, or
//!   transient errors [`CdcOptions::max_attempts`] times; an unreachable broker is
//!   retried without counting) becomes a dead outbox row with its reason, where
//!   `oncebox dead-letters` lists, replays and purges it; so does content that is not
//!   an oncebox message (under an id derived from its WAL position, so reading it again
//!   adds no second dead letter), a message that breaks [`CdcOptions::limits`] as
//!   `enqueue` would refuse it (a NUL or a line break in its topic or key: the dead row
//!   stores such text with the NUL replaced, and says so), a message emitted with
//!   `transactional = false` (those are decoded even when their transaction rolls back,
//!   so they are never published), and, for a relay reading the table, a message emitted
//!   under oncebox's prefix (the wrong source for it).
//! - **Failures are retried, stops are bounded.** Errors of the replication connection
//!   are classified by SQLSTATE, as the pool's are: a walsender the server ends
//!   (`57P01`), no connection slot during a takeover (`53300`) start a new session;
//!   authentication and configuration errors end the relay. A stop retries nothing: the
//!   publications under way get their current attempt (at most
//!   [`CdcOptions::publish_timeout`]), what they covered is confirmed, and
//!   [`CdcRelay::run_until`] returns, even while the broker is down.
//!   A replay ([`PgOutbox::replay_dead`](crate::PgOutbox::replay_dead)) hands the message
//!   back to the relay the way it first came, since the relay reads no update: in table
//!   mode the dead row is deleted and inserted again as a new pending row, in message
//!   mode it is deleted and its message emitted again (same id, same creation time;
//!   unreadable content is emitted again as it is). The relay then publishes it after
//!   what it read before the replay, while its slot exists; if the broker refuses it
//!   again, it is dead-lettered again. The outbox's `cdc_source` column says which mode
//!   wrote a dead row.
//! - **Feedback keeps flowing.** The replication connection answers the server's
//!   keepalives and reports the confirmed position every
//!   [`CdcOptions::status_interval`] even while publishing is stalled, so the server's
//!   `wal_sender_timeout` does not cut a slow relay off.
//!
//! # The slot's lifecycle
//!
//! [`CdcRelay::prepare`] (and every session's start) checks that `wal_level` is
//! `logical` (with an error that says how to fix it), warns when `max_slot_wal_keep_size`
//! is unlimited, and creates the publication and the slot (`pgoutput`) when they are
//! absent. A slot only sees what is committed after it was created: create it before
//! producers start. While the relay runs, it emits a heartbeat (an empty logical
//! message of prefix `<schema>.heartbeat`) every [`CdcOptions::heartbeat`], so that an
//! idle outbox still moves the slot past WAL that other tables and databases write. A
//! lost slot is handled by [`CdcOptions::on_lost_slot`]. [`PgStore::drop_cdc`] drops
//! the slot and the publication (the store still remembers the slot: a relay started on
//! it later refuses, as for any lost slot, since what it held is gone); [`PgStore::replication_slots`] lists the database's slots with their
//! retained WAL, which the relay also exports as metrics, every
//! [`CdcOptions::stats_interval`]: `oncebox_cdc_slot_retained_wal_bytes`,
//! `oncebox_cdc_slot_lag_bytes` and `oncebox_cdc_slot_active` (labelled `slot`), beside
//! `oncebox_cdc_messages_total{outcome="published"|"dead"}`,
//! `oncebox_cdc_commit_to_publish_seconds` and `oncebox_cdc_confirmed_lsn`, and, when a
//! lost slot is created again, `oncebox_cdc_lost_slots_total` and
//! `oncebox_cdc_lost_wal_bytes_total`.
//!
//! # The message encoding
//!
//! A logical decoding message of prefix `<schema>.outbox` (`oncebox.outbox` by default)
//! whose content is:
//!
//! ```text
//! byte 0          the encoding's version: 1
//! bytes 1..5      n, the length of the metadata: unsigned 32-bit, big-endian
//! bytes 5..5+n    the metadata: a JSON object in UTF-8
//! bytes 5+n..     the payload, as is
//! ```
//!
//! The metadata's members: `id` (a UUID, required), `topic` (a non-empty string,
//! required), `key` (a string or null), `kind` (a string, default empty), `headers` (an
//! object of strings, default empty; `traceparent` continues the producer's trace) and
//! `created_at` (an RFC 3339 timestamp; default: the transaction's commit time). Other
//! members are ignored. The migrations' `<schema>.emit` function writes exactly this,
//! through `<schema>.emit_message(id, topic, key, kind, headers, payload, created_at)`,
//! which writes a message of a given id and creation time:
//!
//! ```sql
//! BEGIN;
//! INSERT INTO orders (id) VALUES ('order-42');
//! SELECT oncebox.emit('orders', 'order-42', 'OrderPlaced', '{}', '{"order":"order-42"}');
//! COMMIT;
//! ```
//!
//! # Example
//!
//! ```no_run
//! use oncebox_core::Message;
//! use oncebox_core::memory::MemoryBroker;
//! use oncebox_postgres::PgStore;
//! use oncebox_postgres::cdc::{CdcConnection, CdcOptions, CdcRelay};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "postgres://postgres@localhost/app";
//! let store = PgStore::connect(url).await?;
//! store.migrate().await?;
//!
//! let broker = MemoryBroker::new();
//! let relay = CdcRelay::new(
//!     &store,
//!     CdcConnection::from_url(url)?,
//!     broker.publisher(),
//!     CdcOptions::messages("orders_relay"),
//! )?;
//! relay.prepare().await?; // the slot exists before the first message
//!
//! let outbox = store.message_outbox();
//! let mut tx = store.pool().begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
//! outbox.enqueue(&mut tx, &Message::new("orders", "{}").with_key("order-42")).await?;
//! tx.commit().await?;
//!
//! relay.run_until(async { /* a shutdown signal */ }).await?;
//! # Ok(()) }
//! ```

mod connect;
mod dead;
mod encoding;
mod metrics;
mod outbox;
mod progress;
pub(crate) mod relay;
pub(crate) mod row;
pub(crate) mod session;
mod slot;
mod snapshot;

use std::time::Duration;

use oncebox_core::Backoff;
use oncebox_core::{Error, Limits, Result};

pub use connect::CdcConnection;
pub use encoding::{EncodingError, VERSION as ENCODING_VERSION, decode, encode};
pub use outbox::PgMessageOutbox;
pub use relay::CdcRelay;
pub use slot::{LostRange, LostSlot, SlotStats};

use crate::PgStore;

/// Where the relay reads messages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CdcMode {
    /// Logical decoding messages of prefix `<schema>.outbox`, no table.
    #[default]
    Messages,
    /// Inserts into `<schema>.outbox`, through a publication on it.
    Table,
}

/// How a [`CdcRelay`] reads and publishes.
#[derive(Debug, Clone)]
pub struct CdcOptions {
    pub(crate) mode: CdcMode,
    pub(crate) slot: String,
    pub(crate) publication: String,
    pub(crate) max_in_flight: usize,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) publish_timeout: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) status_interval: Duration,
    pub(crate) stats_interval: Duration,
    pub(crate) standby_poll: Duration,
    pub(crate) delete_batch: usize,
    pub(crate) on_lost_slot: LostSlot,
    pub(crate) limits: Limits,
}

impl CdcOptions {
    /// Options for `mode`, reading slot `slot` through a publication of the same name.
    /// Defaults: 1,024 messages in flight, 10 attempts, publish timeout 10 s, heartbeat
    /// every 10 s, status every second, slot metrics every 15 s, standby poll every
    /// second, deletes in batches of 1,000, [`LostSlot::Fail`], the default [`Limits`].
    pub fn new(mode: CdcMode, slot: impl Into<String>) -> Self {
        let slot = slot.into();
        Self {
            mode,
            publication: slot.clone(),
            slot,
            max_in_flight: 1024,
            max_attempts: 10,
            backoff: Backoff::new(),
            publish_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_secs(10),
            status_interval: Duration::from_secs(1),
            stats_interval: Duration::from_secs(15),
            standby_poll: Duration::from_secs(1),
            delete_batch: 1000,
            on_lost_slot: LostSlot::Fail,
            limits: Limits::new(),
        }
    }

    /// [`CdcMode::Messages`] on slot `slot`.
    pub fn messages(slot: impl Into<String>) -> Self {
        Self::new(CdcMode::Messages, slot)
    }

    /// [`CdcMode::Table`] on slot `slot`.
    pub fn table(slot: impl Into<String>) -> Self {
        Self::new(CdcMode::Table, slot)
    }

    /// The publication's name (default: the slot's).
    #[must_use]
    pub fn publication(mut self, name: impl Into<String>) -> Self {
        self.publication = name.into();
        self
    }

    /// Messages published at once, across keys (a key has one at a time).
    #[must_use]
    pub fn max_in_flight(mut self, messages: usize) -> Self {
        self.max_in_flight = messages;
        self
    }

    /// Attempts before a message the broker keeps refusing is dead-lettered.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The delays between attempts.
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long one publish may wait for the broker's confirmation.
    #[must_use]
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How often a heartbeat moves the slot while the outbox is idle.
    #[must_use]
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// How often the confirmed position is reported to the server: after a crash, at
    /// most this much more is published again.
    #[must_use]
    pub fn status_interval(mut self, every: Duration) -> Self {
        self.status_interval = every;
        self
    }

    /// How often the slots' metrics are sampled.
    #[must_use]
    pub fn stats_interval(mut self, every: Duration) -> Self {
        self.stats_interval = every;
        self
    }

    /// How often a standby relay checks whether it may take over.
    #[must_use]
    pub fn standby_poll(mut self, every: Duration) -> Self {
        self.standby_poll = every;
        self
    }

    /// Published rows deleted per statement (table mode).
    #[must_use]
    pub fn delete_batch(mut self, rows: usize) -> Self {
        self.delete_batch = rows;
        self
    }

    /// What to do with a lost slot: invalidated, or gone although this store's relays
    /// read it before.
    #[must_use]
    pub fn on_lost_slot(mut self, policy: LostSlot) -> Self {
        self.on_lost_slot = policy;
        self
    }

    /// The limits a message must keep to be published, as
    /// [`PgMessageOutbox::enqueue`] checks them (default [`Limits::new`]): a message
    /// that breaks them (written by a producer that did not check, such as a direct
    /// `pg_logical_emit_message` or an `INSERT`) is dead-lettered with the rule it
    /// broke. Give the relay the limits its producers use.
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The mode.
    pub fn mode(&self) -> CdcMode {
        self.mode
    }

    /// The slot's name.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad option: a slot name that is not
    /// `[a-z0-9_]`, at most 63 bytes; a publication name that is not a plain
    /// identifier; zero limits or intervals.
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: String| Err(Error::InvalidOptions(why));
        let slot_ok = !self.slot.is_empty()
            && self.slot.len() <= 63
            && self
                .slot
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'));
        if !slot_ok {
            return invalid(format!(
                "invalid replication slot name {:?}: 1 to 63 of a-z, 0-9 and _",
                self.slot
            ));
        }
        crate::ident::validate("publication", &self.publication)?;
        if self.max_in_flight == 0 || self.max_attempts == 0 || self.delete_batch == 0 {
            return invalid("max_in_flight, max_attempts and delete_batch must be positive".into());
        }
        for (name, every) in [
            ("publish_timeout", self.publish_timeout),
            ("heartbeat", self.heartbeat),
            ("status_interval", self.status_interval),
            ("stats_interval", self.stats_interval),
            ("standby_poll", self.standby_poll),
        ] {
            if every.is_zero() {
                return invalid(format!("{name} must not be zero"));
            }
        }
        self.backoff.validate()
    }
}

/// The prefix of the outbox's logical decoding messages: `<schema>.outbox`.
pub fn message_prefix(schema: &str) -> String {
    format!("{schema}.outbox")
}

/// The prefix of the relay's heartbeats: `<schema>.heartbeat`.
pub fn heartbeat_prefix(schema: &str) -> String {
    format!("{schema}.heartbeat")
}

impl PgStore {
    /// The outbox of the message mode: [`PgMessageOutbox::enqueue`] writes a logical
    /// decoding message in your transaction.
    pub fn message_outbox(&self) -> PgMessageOutbox {
        PgMessageOutbox::new(message_prefix(self.schema()))
    }

    /// The database's `pgoutput` replication slots, with the WAL each keeps.
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn replication_slots(&self) -> Result<Vec<SlotStats>> {
        slot::slots(self.pool()).await
    }

    /// Drops a CDC relay's slot and publication (both if present). A slot a relay is
    /// reading cannot be dropped: stop the relay first.
    ///
    /// The store still remembers the slot: a relay started on it later refuses, as for
    /// any lost slot, since what the slot held is gone (a relay that stood by while the
    /// slot was dropped must not create it again silently). To retire the slot for good,
    /// so that a relay started on the name later creates a fresh one, call
    /// [`forget_cdc`](Self::forget_cdc) too.
    ///
    /// # Errors
    ///
    /// A store error, such as the server's refusal to drop an active slot.
    pub async fn drop_cdc(&self, slot: &str, publication: &str) -> Result<()> {
        CdcOptions::messages(slot)
            .publication(publication)
            .validate()?;
        slot::drop_slot(self.pool(), slot).await?;
        slot::drop_publication(self.pool(), publication).await
    }

    /// Forgets that this store's relays read `slot`: a relay started on the name later
    /// creates a fresh slot instead of refusing to. Returns whether the store remembered
    /// it. Call it after [`drop_cdc`](Self::drop_cdc) when a slot is retired on purpose.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a slot name that is not valid; a store error.
    pub async fn forget_cdc(&self, slot: &str) -> Result<bool> {
        CdcOptions::messages(slot).validate()?;
        slot::Records::new(&crate::ident::qualified(self.schema(), "cdc_slots"))
            .forget(self.pool(), slot)
            .await
    }
}
