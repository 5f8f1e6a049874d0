//! The rules of oncebox's SQL stores, written once.
//!
//! PostgreSQL, MySQL / MariaDB and SQLite keep the same tables and follow the same
//! rules: an inbox record is inserted under a unique key and a duplicate returns the
//! stored result; the admin figures, listings and dead letters read the same columns; a
//! spool row's state decodes the same way. This crate writes those rules once, generic
//! over [`sqlx::Database`]. What differs between the databases is supplied by a dialect,
//! implemented by each backend crate (`oncebox-postgres`, `oncebox-mysql`,
//! `oncebox-sqlite`) on one type:
//!
//! - [`Dialect`]: encodings and idioms. Times kept as microseconds or milliseconds,
//!   names and ids as text or bytes, statuses as text or numbers; how a handler's
//!   transaction begins; how a retention `DELETE` runs without blocking writers.
//! - one trait per store for its statements, each with its values bound
//!   ([`InboxDialect`], [`DedupDialect`]; [`OutboxStatements`] per outbox table, since
//!   PostgreSQL keeps Debezium-style layouts beside its own), every method's contract in
//!   its docs.
//!
//! The stores ([`SqlInbox`], [`SqlDedupStore`]) are what the backend crates hand out
//! under their own names (`PgInbox`, `MySqlDedupStore`, ...); their documentation says
//! how each database's statements behave. [`SqlOutboxAdmin`] is what each backend's
//! outbox answers `OutboxAdmin` with, beside the replay of a dead letter, which stays with
//! the backend whose claims it must respect. [`migrator`] builds each backend's migrator
//! from its versions. Users of oncebox need not name this crate.
//!
//! The shape follows sqlx's migrator (the protocol once in `sqlx-core`, each driver
//! supplying its statements) and Watermill's SQL adapters.

mod dedup;
mod dialect;
mod durable;
mod inbox;
mod migrate;
mod outbox;

pub use dedup::{DedupDialect, SqlDedupStore};
pub use dialect::{Dialect, Field, Query, RowReader, text_status, text_status_sql};
pub use durable::decode_received;
pub use inbox::{InboxDialect, SqlInbox, count_duplicate};
pub use migrate::migrator;
pub use outbox::{OutboxColumns, OutboxStatements, SqlOutboxAdmin};
