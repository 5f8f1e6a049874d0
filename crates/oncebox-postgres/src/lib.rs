//! PostgreSQL stores for [oncebox](https://docs.rs/oncebox): the transactional outbox,
//! relayed by any number of relays in per-key commit order, with optional
//! `LISTEN/NOTIFY` wake-ups; the transactional and durable inboxes; and the dedup store
//! of the idempotent receiver.
//!
//! | type | implements | table |
//! |---|---|---|
//! | [`PgOutbox`] | `enqueue` (or [`enqueue_batch`](PgOutbox::enqueue_batch), many in one statement) on your transaction, [`enqueue_scheduled`](PgOutbox::enqueue_scheduled) for a later delivery and [`cancel`](PgOutbox::cancel) before it; [`SpoolStore`](oncebox_core::spool::SpoolStore) for the relay | `<schema>.outbox`, or a [Debezium-style table](DebeziumLayout) |
//! | [`PgInbox`] | [`InboxStore`](oncebox_core::store::InboxStore) + [`Transactional`](oncebox_core::store::Transactional); [`InboxAdmin`](oncebox_core::consumer::InboxAdmin) for both inboxes | `<schema>.inbox` |
//! | [`PgDurableInbox`] | [`DurableInboxStore`](oncebox_core::store::DurableInboxStore) (a spool store too) | `<schema>.durable_inbox` |
//! | [`PgDedupStore`] | [`DedupStore`](oncebox_core::store::DedupStore) | `<schema>.dedup` |
//!
//! [`PgStore`] holds the pool and the schema (default [`DEFAULT_SCHEMA`], `oncebox`),
//! runs the embedded migrations and hands out the stores.
//!
//! # Example
//!
//! Enqueue a message in the same transaction as the business change, then let a relay
//! publish it:
//!
//! ```no_run
//! use oncebox_core::Message;
//! use oncebox_core::memory::MemoryBroker;
//! use oncebox_core::spool::{Relay, SpoolOptions};
//! use oncebox_postgres::PgStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://postgres@localhost/app").await?;
//! store.migrate().await?;
//! let outbox = store.outbox().with_notify(true);
//!
//! // The order and its event commit together, or not at all.
//! let mut tx = store.pool().begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
//! let event = Message::new("orders", r#"{"order":"order-42"}"#)
//!     .with_key("order-42")
//!     .with_kind("OrderPlaced");
//! outbox.enqueue(&mut tx, &event).await?;
//! tx.commit().await?;
//!
//! // Any number of relays, in this process or others, publish committed messages in
//! // commit order per key. A service runs `relay.run_until(shutdown)`; here one round.
//! let broker = MemoryBroker::new();
//! let relay = Relay::new(outbox.clone(), broker.publisher(), SpoolOptions::new())?;
//! relay.run_once().await?;
//! # Ok(()) }
//! ```
//!
//! # Schema and migrations
//!
//! All tables live in one schema, `oncebox` unless [`PgStore::with_schema`] says
//! otherwise (validated: `[a-z_][a-z0-9_]*`, at most 63 bytes). [`PgStore::migrate`]
//! creates the schema and applies the embedded migrations, recording them in
//! `<schema>._oncebox_migrations`, apart from your application's `_sqlx_migrations`.
//! Every statement the stores run is built once, when the store is built, with the schema
//! formatted in; nothing is formatted per call.
//!
//! Teams with their own migration tool apply the raw SQL instead: [`SCHEMA_V1`] to
//! [`SCHEMA_V7`] are `migrations/0001_init.sql`, `0002_inbox_by_consumer.sql`,
//! `0003_emit.sql`, `0004_duplicates.sql`, `0005_outbox_by_creation.sql`,
//! `0006_cdc_dead_letters.sql` and `0007_cdc_slots.sql`, with the schema as psql's
//! variable
//! `:"schema"` (`psql -v schema=oncebox -f 0001_init.sql`), and [`schema_sql`] fills it
//! in. Every statement in them is idempotent.
//!
//! # Per-key order with several relays
//!
//! Per-key order means: each key's messages are published in the order their
//! transactions committed, by any number of relays, and no key is ever handled by two
//! relays at once. Three pieces make it so.
//!
//! **Commit order.** A sequence gives allocation order, not commit order: two producers
//! enqueueing the same key can commit in the other order, and a relay could publish
//! `seq` 11 before `seq` 10 even becomes visible. [`PgOutbox::enqueue`] therefore takes
//! a transaction-scoped advisory lock on the key's hash *before* the row gets its `seq`,
//! in the same statement: `pg_advisory_xact_lock(class, hashtext(key) # table_oid)`,
//! with a class of oncebox's own. Producers of one key queue on that lock until the
//! holder commits or rolls back, so for each key `seq` order is commit order. The cost:
//! same-key producers serialise from their enqueue to their commit (enqueue late in long
//! transactions); a hash collision only serialises two keys; messages without a key take
//! no lock; a transaction enqueueing several keys should enqueue them in a fixed order
//! (sorted), as with any locks, or it may deadlock with another one (a transient error
//! to retry).
//!
//! **Claims hold their rows.** By default a claim is *held*: it locks its rows
//! (`FOR UPDATE SKIP LOCKED`) in a transaction that stays open while they are published,
//! and their settlements (deleted or marked done, retried, dead-lettered) commit in that
//! transaction; nothing is written at claim time, so each row is written once, as the
//! raw `DELETE ... RETURNING` loop writes it. A claim that meets a row another claim
//! holds skips it and cuts the row's key there. Held claims need no lock among
//! themselves: a claim whose snapshot still shows another claim's rows free cannot lock
//! them while that claim holds them, and once it committed finds them changed or gone
//! (`FOR UPDATE` rechecks the newest version of a row), so it cuts the key there too.
//! The claim transaction's idle timeout is its lease: a relay that stops talking loses
//! its connection and its rows, and a relay that dies frees its rows at once (the server
//! rolls its transaction back), where a leased claim's rows wait for the lease to end.
//! The price: each claim in flight holds a pool connection, and an open transaction,
//! until its rows are settled. See [`PgOutbox::with_held_claims`].
//!
//! A *leased* claim (the outbox with `with_held_claims(false)`, and the durable inbox,
//! whose handlers complete claimed rows in transactions of their own) writes a lease
//! (`lease_token`, `lease_until`) into its rows and commits at once; its settlement
//! writes them again. `FOR UPDATE SKIP LOCKED` alone does not keep a key on one relay
//! then: two relays' snapshots can both see the first rows of a key unleased and each
//! take part of it. So a leased claim starts with a transaction-scoped advisory lock on
//! the table (`pg_advisory_xact_lock(class, table_oid)`), and its statements take their
//! snapshots after it: each leased claim sees every earlier one's leases. Leased claims
//! are short (under ten milliseconds for 256 rows on a table of two million), so relays
//! queue on the lock briefly and only to claim; publishing and settling run without it.
//! The claim transaction's statement and idle timeouts are its lease, so a claim that
//! stalls (a lost client) cannot hold the lock for longer than that. Held and leased
//! relays may share a table and do not wait for each other: held claims take a lock of
//! another class, shared.
//!
//! Either way, `FOR UPDATE SKIP LOCKED` means a claim never waits on rows being settled,
//! and after locking, a key keeps only the rows before its first row that could not be
//! locked (or had changed since the claim's snapshot): each key's claimed rows stay a
//! prefix even against changes no lock serialises, such as a settle in flight.
//! [`PgOutbox::replay_dead`] takes both locks exclusively, so a replayed row is never
//! published beside later rows of its key that a relay holds.
//!
//! **The claim rule** is the SQLite backend's: a row is claimable if it is due, not held
//! by another claim, and every earlier pending row of its key is claimable in the same
//! claim, so each key's claimed rows are a prefix of its pending rows and a failing row
//! holds back only its own key. A key with a live lease on any of its rows is not claimed
//! at all, and neither is a key whose first row another claim has locked. Leases and due
//! times are read on the database's clock (`statement_timestamp()`), never the relays'
//! clocks; a leased claim's relay that dies leaves its rows until the lease ends, then
//! another claims them (failover), and the dead relay's late settlements are refused by
//! the lease token. A held claim settled after its lease is rolled back instead (its
//! rows are published again, as after an expired lease).
//!
//! # Claiming
//!
//! A claim runs up to two steps: **step 1**, one statement over a *window* of the first
//! pending rows in commit order (adaptive: twice what the last claim needed, between two
//! and four per row asked for, at least 512 and 1024 rows), where the rule is decided
//! with one aggregate per key and the picked rows are locked `FOR UPDATE SKIP LOCKED`;
//! and, only when the window held fewer free rows than asked for and more rows are
//! pending, **step 2**: a loose index scan of the pending keys (one probe per key, from a
//! cursor that moves on with every claim) that takes the free keys with the oldest first
//! rows and a fair share of each one's rows. Step 2 is what keeps claims fast when a few
//! keys hold a large backlog and other relays hold those keys: a claim then finds the
//! free keys behind the backlog in a few probes instead of walking it. A leased claim
//! runs them after the lock, leases the rows it keeps and commits.
//!
//! A held claim first tries a **fast claim**, the raw relay loop's own: the first free
//! rows in commit order, locked `FOR UPDATE SKIP LOCKED` up to the limit, then one range
//! scan to check that no locked row has an earlier pending row of its key that the claim
//! did not lock. With many keys and few relays that check passes and the claim is done,
//! at little more than the cost of the raw loop's `DELETE ... RETURNING`; if it fails,
//! the claim rolls back (it locked rows it must not hold) and runs step 1 and step 2,
//! and the next few claims go straight there. In step 1 a held claim locks each key's
//! first row before the key's later rows (in step 2, as it picks the keys), so that a key
//! another claim holds costs one skipped row and the claim locks little it does not keep.
//! Held claims lock and settle rows by `ctid` (TID scans): their transaction holds the
//! rows, so the rows cannot move. Statements whose only values are limits have them
//! written in rather than bound, so that each connection plans them once.
//! [`PgOutbox::explain_claim`] shows the plans on your data.
//!
//! Settling is one statement per batch (`UPDATE ... FROM unnest(...)`, filtered by the
//! lease token for a leased claim), retention deletes done rows in bounded batches on a
//! partial index (`DELETE ... WHERE seq IN (SELECT ... LIMIT n)`), and
//! [`PgOutbox::delete_on_publish`] deletes rows as they are published. A relay settles a
//! full batch and claims the next in one store call: for a held claim whose rows were all
//! delivered, the settlement (the rows' places written into the statement), the
//! `COMMIT` and the next claim's `BEGIN` travel as one message, then the claim follows:
//! two round trips per batch; for leased ones, one transaction.
//!
//! # Wake-ups and the cost of `NOTIFY`
//!
//! Relays poll with an adaptive interval. With [`PgOutbox::with_notify`], `enqueue` also
//! sends a `NOTIFY` in the producer's transaction and relays `LISTEN` (on a connection of
//! their own), so a relay wakes as soon as a transaction that enqueued commits. PostgreSQL
//! serialises the commits of notifying transactions, so a notifying producer commits
//! fewer transactions per second under concurrency, and fewer still where fsync is
//! slow. So it is off by default; turn it on where latency matters more than peak
//! producer throughput. `NOTIFY` does not reach listeners behind PgBouncer in transaction
//! pooling mode: relays then poll, as they do whenever the listener fails.
//! [`PgOutbox::wake`] wakes relays of the same process without `NOTIFY`.
//!
//! # Producing from other languages
//!
//! Services that are not written in Rust insert into `<schema>.outbox` themselves. To keep
//! per-key commit order they must take the same key lock before the row's `seq` is
//! allocated, which this statement does (parameters: id, topic, key or NULL, kind,
//! headers as a JSON object of strings, payload, creation time):
//!
//! ```sql
//! WITH guard AS MATERIALIZED (
//!   SELECT CASE WHEN $3::text IS NULL THEN false
//!          ELSE (SELECT true FROM pg_advisory_xact_lock(1869505387,
//!                  hashtext($3::text) # 'oncebox.outbox'::regclass::oid::int4))
//!          END AS keyed)
//! INSERT INTO oncebox.outbox (id, topic, key, kind, headers, payload, created_at)
//! SELECT $1::uuid, $2, $3, $4, $5::jsonb, $6, $7 FROM guard;
//! ```
//!
//! (`1869505387` is oncebox's advisory lock class for keys.) Rows inserted without it are
//! still published and never on two relays at once, but same-key rows of concurrent
//! transactions may then be published in allocation order rather than commit order.
//! Existing producers that write Debezium's outbox columns need no change at all: see
//! [`DebeziumLayout`], whose trigger takes the lock for them.
//!
//! # Errors and connections
//!
//! Driver errors reach you as [`oncebox_core::Error::Store`], transient for serialization
//! failures, deadlocks, lock and statement timeouts, server shutdowns, connection and
//! resource errors, I/O errors and pool timeouts, permanent otherwise; a closed pool is
//! [`oncebox_core::Error::Closed`]. A row that something other than oncebox wrote and that
//! cannot be read back is a permanent store error whose source is a [`RowDecodeError`];
//! a relay that claims such a row marks it dead with that reason instead of stopping.
//!
//! A held claim holds one pool connection from its claim to its settlement: a relay holds
//! one while it publishes a batch, so give the pool a connection per relay beside what
//! the application needs. A leased claim holds one only while it claims. An outbox with
//! `with_notify(true)` listens on one more connection, outside the pool, shared by all
//! clones of the outbox (and of the [`PgStore`] it came from). Held claims are kept by
//! the outbox handle (and its clones) that made them: dropping every clone rolls them
//! back, and settling through another handle on the same table (another
//! [`PgStore::outbox`] call) finds nothing to settle.

#[cfg(feature = "cdc")]
pub mod cdc;
mod dedup;
mod dialect;
mod durable;
mod error;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod ident;
mod inbox;
mod migrate;
mod notify;
mod outbox;
mod spool;
mod store;
mod time;

pub use dedup::PgDedupStore;
pub use dialect::PgDialect;
pub use durable::PgDurableInbox;
pub use error::RowDecodeError;
pub use inbox::PgInbox;
pub use migrate::{
    DEFAULT_SCHEMA, MIGRATIONS_TABLE, SCHEMA_PLACEHOLDER, SCHEMA_V1, SCHEMA_V2, SCHEMA_V3,
    SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7, migrator, schema_sql,
};
pub use outbox::{
    DeadLetter, DebeziumLayout, DebeziumPayload, OutboxStats, PgOutbox, RowState, RowStatus,
};
pub use store::{DEFAULT_MAX_CONNECTIONS, PgStore};

/// Re-exported so that callers name the same sqlx version.
pub use sqlx;
