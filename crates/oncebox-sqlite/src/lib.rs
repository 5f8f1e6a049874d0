//! SQLite stores for [oncebox](https://docs.rs/oncebox): the embedded default backend,
//! with the transactional outbox, the transactional and durable inboxes and the dedup
//! store of the idempotent receiver in one database file.
//!
//! | type | implements | table |
//! |---|---|---|
//! | [`SqliteOutbox`] | `enqueue` (or [`enqueue_batch`](SqliteOutbox::enqueue_batch), many in one statement) on your transaction, [`enqueue_scheduled`](SqliteOutbox::enqueue_scheduled) for a later delivery and [`cancel`](SqliteOutbox::cancel) before it; [`SpoolStore`](oncebox_core::spool::SpoolStore) for the relay | `oncebox_outbox` |
//! | [`SqliteInbox`] | [`InboxStore`](oncebox_core::store::InboxStore) + [`Transactional`](oncebox_core::store::Transactional); [`InboxAdmin`](oncebox_core::consumer::InboxAdmin) for both inboxes | `oncebox_inbox` |
//! | [`SqliteDurableInbox`] | [`DurableInboxStore`](oncebox_core::store::DurableInboxStore) (a spool store too) | `oncebox_durable_inbox` |
//! | [`SqliteDedupStore`] | [`DedupStore`](oncebox_core::store::DedupStore) | `oncebox_dedup` |
//!
//! [`SqliteStore`] opens the database (WAL, `synchronous = NORMAL`, a 10 s busy
//! timeout), runs the embedded migrations ([`SqliteStore::migrate`], recorded in
//! `_oncebox_migrations`, apart from your own `_sqlx_migrations`) and hands out the
//! stores. The schema's raw SQL is [`SCHEMA_V1`] to [`SCHEMA_V5`], in order, for teams
//! with their own migration tool.
//!
//! # Example
//!
//! Enqueue a message in the same transaction as the business change, then let a relay
//! publish it:
//!
//! ```
//! use oncebox_core::Message;
//! use oncebox_core::memory::MemoryBroker;
//! use oncebox_core::spool::{Relay, SpoolOptions};
//! use oncebox_sqlite::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("app.db");
//! let store = SqliteStore::connect(&path).await?;
//! store.migrate().await?;
//! let outbox = store.outbox();
//! # sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)").execute(store.pool()).await?;
//!
//! // The order and its event commit together, or not at all.
//! let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
//! let event = Message::new("orders", r#"{"order":"order-42"}"#)
//!     .with_key("order-42")
//!     .with_kind("OrderPlaced");
//! outbox.enqueue(&mut *tx, &event).await?;
//! tx.commit().await?;
//! outbox.wake(); // an in-process relay picks it up now, not at its next poll
//!
//! // The relay publishes committed messages, in commit order per key. A service runs
//! // `relay.run_until(shutdown)`; here one round is enough.
//! let broker = MemoryBroker::new();
//! let relay = Relay::new(outbox.clone(), broker.publisher(), SpoolOptions::new())?;
//! let round = relay.run_once().await?;
//! assert_eq!(round.done, 1);
//! assert_eq!(outbox.stats().await?.pending, 0);
//! # Ok(()) }
//! ```
//!
//! # Concurrency
//!
//! SQLite has a single writer. Transactions that write should start with
//! `BEGIN IMMEDIATE` (the inbox stores do): they then queue for the write lock, up to the
//! busy timeout, instead of failing when a read lock cannot be upgraded. A relay claims
//! in one such transaction, together with the settlement of its last batch: it reads the
//! claimable rows (an index walk, about a millisecond for a batch of 256) and leases them
//! by writing one row, a claim (`oncebox_outbox_claims`: the batch's `seq`s and the end
//! of its lease), not a lease into every claimed row. Several relays, in one process or
//! several sharing the file, take turns and keep per-key order. Handler transactions of
//! the inboxes run one at a time per database: keep them short.
//!
//! Errors of the driver reach you as [`oncebox_core::Error::Store`], transient for a busy
//! or locked database, I/O failures and pool timeouts. A row that something other than
//! oncebox wrote and that cannot be read back is a permanent store error whose source is
//! a [`RowDecodeError`] naming the row; a relay that claims such a row marks it dead
//! with that reason instead of stopping.

mod dedup;
mod dialect;
mod durable;
mod error;
mod inbox;
mod migrate;
mod outbox;
mod spool;
mod store;

pub use dedup::SqliteDedupStore;
pub use dialect::SqliteDialect;
pub use durable::SqliteDurableInbox;
pub use error::RowDecodeError;
pub use inbox::SqliteInbox;
pub use migrate::{
    MIGRATIONS_TABLE, SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, migrator,
};
pub use outbox::{DeadLetter, OutboxStats, RowState, RowStatus, SqliteOutbox};
pub use store::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, SqliteStore};

/// Re-exported so that callers name the same sqlx version.
pub use sqlx;
