//! MySQL 8 and MariaDB 10.6+ stores for [oncebox](https://docs.rs/oncebox): the
//! transactional outbox, relayed by any number of relays in per-key commit order; the
//! transactional and durable inboxes; and the dedup store of the idempotent receiver,
//! which is also the Idempotency-Key store of `oncebox-http`.
//!
//! | type | implements | table |
//! |---|---|---|
//! | [`MySqlOutbox`] | `enqueue` (or [`enqueue_batch`](MySqlOutbox::enqueue_batch), many in one insert) on your transaction, [`enqueue_scheduled`](MySqlOutbox::enqueue_scheduled) for a later delivery and [`cancel`](MySqlOutbox::cancel) before it; [`SpoolStore`](oncebox_core::spool::SpoolStore) for the relay | `oncebox_outbox` |
//! | [`MySqlInbox`] | [`InboxStore`](oncebox_core::store::InboxStore) + [`Transactional`](oncebox_core::store::Transactional); [`InboxAdmin`](oncebox_core::consumer::InboxAdmin) for both inboxes | `oncebox_inbox` |
//! | [`MySqlDurableInbox`] | [`DurableInboxStore`](oncebox_core::store::DurableInboxStore) (a spool store too) | `oncebox_durable_inbox` |
//! | [`MySqlDedupStore`] | [`DedupStore`](oncebox_core::store::DedupStore) | `oncebox_dedup` |
//!
//! [`MySqlStore`] holds the pool, runs the embedded migrations and hands out the stores.
//! The tables live in the database the connection URL names.
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
//! use oncebox_mysql::MySqlStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://app@localhost/app").await?;
//! store.migrate().await?;
//! let outbox = store.outbox();
//!
//! // The order and its event commit together, or not at all.
//! let mut tx = store.pool().begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
//! let event = Message::new("orders", r#"{"order":"order-42"}"#)
//!     .with_key("order-42")
//!     .with_kind("OrderPlaced");
//! outbox.enqueue(&mut tx, &event).await?;
//! tx.commit().await?;
//! outbox.wake(); // relays of this process look now; others find it at their next poll
//!
//! // Any number of relays, in this process or others, publish committed messages in
//! // commit order per key. A service runs `relay.run_until(shutdown)`; here one round.
//! let broker = MemoryBroker::new();
//! let relay = Relay::new(outbox.clone(), broker.publisher(), SpoolOptions::new())?;
//! relay.run_once().await?;
//! # Ok(()) }
//! ```
//!
//! # Tables and migrations
//!
//! [`MySqlStore::migrate`] creates oncebox's tables, all named `oncebox_*`, in the
//! connection's database and records the applied migrations in `_oncebox_migrations`,
//! apart from your application's `_sqlx_migrations`. Several applications or tenants
//! share a server with a database each.
//!
//! Teams with their own migration tool apply the raw SQL instead, in order:
//! [`SCHEMA_V1`] is `migrations/0001_init.sql` (`mysql --database=app < 0001_init.sql`),
//! [`SCHEMA_V2`] is `migrations/0002_claims.sql` (the table of claims; it drops the lease
//! columns of version 1, and with them the leases held while it runs, whose rows are
//! then delivered once more), [`SCHEMA_V3`] is `migrations/0003_inbox_by_consumer.sql`
//! (the inbox's index for per-consumer purges), [`SCHEMA_V4`] is
//! `migrations/0004_duplicates.sql` (the duplicates each inbox consumer skipped,
//! counted), [`SCHEMA_V5`] is `migrations/0005_outbox_by_creation.sql` (the outbox's
//! index by creation time). Every statement in them is idempotent, which matters here: MySQL commits
//! each DDL statement on its own, so a migration cannot roll back half way, and running
//! the file again finishes it.
//!
//! What the columns hold, and why:
//!
//! - **Times** are `BIGINT` milliseconds since the Unix epoch, as in the SQLite backend.
//!   Leases, retry times, retention horizons and TTLs are read from the *database's*
//!   clock, `UTC_TIMESTAMP(6)` (independent of the session's `time_zone`, so no lease
//!   jumps by an hour when daylight saving time ends), never from the relays' clocks;
//!   only `created_at` is the producer's.
//! - **UUIDs** (message ids, lease tokens) are `BINARY(16)`, not `CHAR(36)`: 16 bytes
//!   instead of 36 in every index that holds them (the outbox's unique id index, the
//!   clustered index), compared byte by byte with no collation, and UUIDv7 ids arrive in
//!   index order. The price is readability in a SQL console: `HEX(id)`, or
//!   `BIN_TO_UUID(id)` on MySQL 8. (MariaDB 10.7 has a `UUID` type; MySQL has none, and
//!   MariaDB 10.6 is supported.)
//! - **Keys, consumer names and dedup ids** are `VARBINARY`: compared byte for byte. A
//!   `VARCHAR` under the usual collations would take `a`, `A` and `a ` for one id,
//!   merging distinct keys and, worse, reporting distinct messages as duplicates. Keys
//!   hold at most 512 bytes, ids 1024, consumer names 255; topics and kinds 255
//!   characters. A longer value is refused with a [`ValueTooLong`] error, never cut.
//! - **Status** is a `TINYINT` (0 pending, 1 done, 2 dead). With an `ENUM`, MariaDB no
//!   longer reads the `(status, key, seq)` index in order one group per key.
//! - **Settlement columns** (`done_at`, `dead_at`, `available_at`) are `NOT NULL` and
//!   fixed-size, zero meaning "none": settling rewrites each row in place, where a
//!   `NULL` becoming a value would grow the row and move it.
//! - **Leases** are not written into the rows: a claim is one row of `oncebox_claims`
//!   (see "Claiming").
//!
//! # Per-key order with several relays
//!
//! Per-key order means: each key's messages are published in the order their
//! transactions committed, by any number of relays, and no key is ever handled by two
//! relays at once. Three pieces make it so.
//!
//! **Commit order.** `AUTO_INCREMENT` gives allocation order, not commit order: two
//! producers enqueueing the same key can commit in the other order, and a relay could
//! publish `seq` 11 before `seq` 10 even becomes visible. PostgreSQL's answer, a
//! transaction-scoped advisory lock, has no MySQL equivalent: `GET_LOCK` locks belong to
//! the session, not the transaction, so a lock taken in `enqueue` would outlive the
//! caller's commit (and travel with the connection back into the pool). InnoDB row locks
//! do end with the transaction, so [`MySqlOutbox::enqueue`] locks a row:
//! `oncebox_key_locks` holds 65,536 slots, and a key's slot is `CRC32(key) & 65535`,
//! locked `SELECT ... FOR UPDATE` before the row is inserted and gets its `seq`.
//! Producers of one key queue on the slot until the holder commits or rolls back, so for
//! each key `seq` order is commit order. The slots are created by the migration and
//! never change: no table grows with the number of keys, and the lock is a plain record
//! lock on a primary key (no insert, no gap lock). The costs: same-key producers
//! serialise from their enqueue to their commit (enqueue late in long transactions);
//! two keys in one slot only wait for each other; and a transaction enqueueing several
//! keys may, rarely, deadlock with another whose keys share their slots in the other
//! order, which InnoDB resolves by rolling one back with error 1213, a transient error
//! to retry. Messages without a key take no lock.
//!
//! **Serialised claims.** A claim is one short transaction in `READ COMMITTED` (set for
//! that transaction only): each statement then reads what committed before it began,
//! and InnoDB takes no gap locks for its reads, so claims never block producers inserting
//! at the end of the table. (Under `REPEATABLE READ`, InnoDB's default, a claim would
//! read one snapshot for its whole transaction and lock gaps.) It starts by locking the
//! table's row in `oncebox_claim_locks` (`INSERT ... ON DUPLICATE KEY UPDATE`), held to
//! its commit: the claims of a table run one at a time and each sees every earlier
//! claim's leases. Claims are short, so relays queue on the lock briefly and only to
//! claim; publishing and settling run without it. Under the lock, a pending row that no
//! live claim holds changes only by a claim, by a replay (which takes the lock too), or
//! by a [`cancel`](MySqlOutbox::cancel), which deletes it in its caller's transaction,
//! without the lock: settlements and the durable inbox's completions touch only rows
//! their claim holds. So step 1 (below) takes the rows it picks as its one read found
//! them, and locks them `FOR UPDATE SKIP LOCKED` (MariaDB 10.6+, MySQL 8.0.1+) in the
//! request that records the claim and commits: the claim is recorded only if every one
//! of them could be locked still pending. A row that a cancel's transaction, still open,
//! holds (or that a cancel deleted since the read) leaves the claim unrecorded, and the
//! claim is made again, locking step 1's rows before taking them, as step 2 does: that
//! claim passes over the row and the rest of its key, and a cancel that returned `true`
//! is never undone by a claim. Step 2, whose candidates come from several reads, locks
//! them `FOR UPDATE SKIP LOCKED` with the claim's conditions checked again, and a key
//! keeps only its rows before its first row that could not be locked or no longer
//! qualifies: a second layer that keeps each key's claimed rows a prefix.
//!
//! **The claim rule** is the other backends': a row is claimable if it is due, not
//! under a live lease, and every earlier pending row of its key is claimable in the same
//! claim, so each key's claimed rows are a prefix of its pending rows and a failing row
//! holds back only its own key. A key with a live lease on any of its rows is not
//! claimed at all. A relay that dies leaves its rows leased until the lease ends, then
//! another claims them (failover), and the dead relay's late settlements are refused:
//! its claim is gone.
//!
//! # Claiming
//!
//! **Leases are a table of claims.** A claim is one row of `oncebox_claims`: the table
//! it claimed from (its name in `oncebox_claim_locks`), its token, the end of its lease
//! and the `seq`s it holds, as a JSON array. A pending row is leased while a claim whose
//! lease has not ended holds it. Claims are recorded only under the claim lock, and each
//! claim first deletes the claims whose lease has ended, so live claims never hold the
//! same row. Writing the lease into each claimed row instead (schema version 1) rewrote
//! 256 rows per claim, about a sixth of a relay's time per batch.
//!
//! In the claim transaction, after the lock, the claim reads the table's claims (one
//! primary-key range) and deletes those whose lease has ended; then:
//!
//! 1. **Step 1** reads a *window* of the first pending rows in commit order from the
//!    `(status, seq)` index, in full, with the database's clock: a quarter more rows
//!    than the last claim needed, between 1.25 and 4 per row asked for (at least 128
//!    and 1024). The index holds neither the key nor the due time, so each row costs a
//!    primary-key lookup anyway, and reading the row there spares the claim a second
//!    read of what it picks. The rule is decided in Rust on those rows (every earlier
//!    pending row of a key in the window; the rows live claims hold are known from
//!    their `seqs`), and the rows picked are the claim's. The window passes over the
//!    rows of the process's own live claims (`seq NOT IN (...)`, decided on the index
//!    entry, before the lookup): it remembers their rows and keys, and the keys are all
//!    that reading the rows would tell the rule. A relay that claims its next batch
//!    while publishing one (pipelining) would otherwise read every row of that batch
//!    again. Because the process knows which rows it will pass over, the window is
//!    read in the same request as the claims; if the claims read with it disagree
//!    with what the process remembers (one of its claims ended), it is read again. A
//!    window that was full and yielded too few rows (other relays hold more of the
//!    head than it covered) is read again at the upper bound, in the same claim.
//! 2. Only when even that window held fewer free rows than asked for, **step 2**
//!    probes keys one at a time in key order on the `(status, key, seq)` index, from a
//!    cursor that moves on with every claim, until it has found as many keys with a free
//!    first row as rows are wanted (probing at most 128 keys, or twice as many as rows
//!    are wanted if that is more), and
//!    takes a fair share of each one's free rows, plus free rows without a key; then
//!    locks and reads them in full (`WHERE seq IN (...) ... FOR UPDATE SKIP LOCKED`),
//!    and cuts them to per-key prefixes.
//! 3. The rows taken are recorded as the claim's row in `oncebox_claims`, with the
//!    lease's end on the database's clock, if step 1's rows, locked in the same request
//!    (`SELECT COUNT(*) ... WHERE seq BETWEEN ... FOR UPDATE SKIP LOCKED`, by runs of
//!    consecutive rows, the others listed), are all still pending and free: a
//!    primary-key read of rows the window has just read, and their row locks until the
//!    commit that follows, no round trip more (about 0.3 ms for 256 consecutive rows on
//!    MariaDB 10.11, on a loaded 2-core machine). Step 2 is what keeps claims finding
//!    work when a few keys hold a large backlog that other relays hold, or that waits for
//!    a retry. (MariaDB has no `LATERAL` and cannot read an index "one key at a time"
//!    in a correlated subquery, so the probes are separate statements.)
//!
//! Lists of rows are bound as `IN (?, ?, ...)`, padded to a power of two so that a
//! handful of prepared statements serve every batch. Statements that need nothing from
//! the one before them are sent together, in one request: the start of the transaction
//! with the first statement, the claim lock with the read of the claims and the window
//! (after the settlement's updates when the relay settles and claims at once), the
//! claim's lock of step 1's rows and its record with the commit. A round trip costs more
//! than most of those statements take to run; a relay's batch makes three instead of
//! nine. Such requests use the text protocol, with values written as literals
//! (integers in decimal, bytes in hexadecimal). A claim or settlement dropped before
//! its commit closes its connection, so that the server rolls it back. The plans are in
//! [`MySqlOutbox`'s `claim`](MySqlOutbox#method.claim); [`MySqlOutbox::explain_claim`]
//! shows them on your data.
//!
//! Settling first locks the claim's row (`SELECT ... FOR UPDATE`) and settles only the
//! rows it still holds; a claim that is gone (its lease ended, and a later claim deleted
//! it) settles nothing, and a claimer deleting an ended claim waits for a settlement of
//! it in flight. A process settling a claim it made skips that read: it knows the rows
//! it wrote to the claim, and the claim's own statement comes first, applying only if
//! the claim's `seqs` are still exactly those (`... WHERE spool = ? AND token = ? AND
//! seqs = ?`, which locks the row as the read would). Whether it applied is kept in a
//! user variable, `@oncebox_settled`, that the statements on the rows test (the
//! optimizer reads it as a constant); if it did not, nothing changed, and the
//! settlement starts again with the read. Then one statement per kind of outcome: published rows (`UPDATE ...
//! WHERE seq IN (...)`, or `DELETE` with [`MySqlOutbox::delete_on_publish`]) and failed
//! rows (one `UPDATE` joined to a `JSON_TABLE` of the failures, each with its own retry
//! time and error); released rows only leave the claim. The claim keeps the rows not
//! settled, or is deleted. All in one transaction. When the relay settles and claims at
//! once, the settlement commits and the claim's transaction starts in the same request:
//! a window read in the transaction that had just changed the last batch's rows costs
//! more than a second commit does.
//! The durable inbox's `complete` checks in the handler's
//! transaction that its claim still holds the row, the claim's row locked in share mode,
//! so completions of one claim do not wait for each other. Retention deletes done rows in
//! bounded batches on the `(status, done_at)` index (`DELETE ... ORDER BY done_at LIMIT
//! n`), in `READ COMMITTED`.
//!
//! # Wake-ups
//!
//! MySQL has no `LISTEN/NOTIFY`: relays poll with an adaptive interval.
//! [`MySqlOutbox::wake`] wakes the relays of the same process at once (call it after
//! committing), and [`DurableInboxStore::accept`](oncebox_core::store::DurableInboxStore::accept)
//! wakes the processors of its consumer in the same process.
//!
//! # Producing from other languages
//!
//! Services that are not written in Rust insert into `oncebox_outbox` themselves. To keep
//! per-key commit order they lock the key's slot first, in the same transaction
//! (parameters: the key; then the id as 16 bytes, topic, key or NULL, kind, headers as a
//! JSON object of strings, payload, creation time in milliseconds since the epoch):
//!
//! ```sql
//! SELECT slot FROM oncebox_key_locks WHERE slot = CRC32(?) & 65535 FOR UPDATE;
//! INSERT INTO oncebox_outbox (id, topic, `key`, kind, headers, payload, created_at)
//! VALUES (?, ?, ?, ?, ?, ?, ?);
//! ```
//!
//! (With the id as text: `UNHEX(REPLACE(?, '-', ''))`.) Rows inserted without the lock
//! are still published and never on two relays at once, but same-key rows of concurrent
//! transactions may then be published in allocation order rather than commit order.
//!
//! # MariaDB and MySQL 8
//!
//! The stores use what both have: `FOR UPDATE SKIP LOCKED` (MariaDB 10.6, MySQL 8.0.1),
//! `JSON_TABLE` (10.6, 8.0.4), enforced `CHECK` constraints (10.2, 8.0.16), `WITH
//! RECURSIVE` in the migration (10.2, 8.0), `LOCK IN SHARE MODE`, and `AUTO_INCREMENT`
//! counters that survive restarts (10.2.4, 8.0), which the dedup store's fencing tokens
//! rely on. They avoid what only one has: `RETURNING` (MariaDB only), `LATERAL` and row
//! aliases in `ON DUPLICATE KEY UPDATE` (MySQL only), sequences (MariaDB only). The test
//! suites run against MariaDB 10.11;
//! MySQL 8 is supported by design and has not been run here.
//!
//! For writes that are idempotent by themselves (`INSERT ... ON DUPLICATE KEY UPDATE`,
//! why not `INSERT IGNORE`, version numbers) see the `oncebox` guide, "Natural
//! idempotency".
//!
//! # Errors and connections
//!
//! Driver errors reach you as [`oncebox_core::Error::Store`], transient for deadlocks
//! (1213), lock wait and statement timeouts, server shutdowns, killed connections, too
//! many connections, I/O errors and pool timeouts, permanent otherwise; a closed pool is
//! [`oncebox_core::Error::Closed`]. A row that something other than oncebox wrote and
//! that cannot be read back is a permanent store error whose source is a
//! [`RowDecodeError`]; a relay that claims such a row marks it dead with that reason
//! instead of stopping. The stores rely on two sqlx defaults: `CLIENT_FOUND_ROWS` (an
//! `UPDATE` reports the rows it *matched*, which is how a stale lease or fencing token is
//! told apart from a write that changed nothing) and a strict `sql_mode` (the servers'
//! default), under which nothing is silently cut.
//!
//! Each claim, settlement and retention batch holds one pool connection for its
//! transaction.

mod dedup;
mod dialect;
mod durable;
mod error;
mod inbox;
mod migrate;
mod outbox;
mod spool;
mod sql;
mod store;
mod wake;

pub use dedup::MySqlDedupStore;
pub use dialect::MySqlDialect;
pub use durable::MySqlDurableInbox;
pub use error::{RowDecodeError, ValueTooLong};
pub use inbox::MySqlInbox;
pub use migrate::{
    MIGRATIONS_TABLE, SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, TABLES, migrator,
};
pub use outbox::{DeadLetter, MySqlOutbox, OutboxStats, RowState, RowStatus};
pub use store::{DEFAULT_MAX_CONNECTIONS, MySqlStore};

/// Re-exported so that callers name the same sqlx version.
pub use sqlx;
