//! Effectively-once messaging for Rust services: every committed state change is
//! announced exactly as committed, and every announcement has its effect on a receiver
//! exactly once, over brokers that only promise at-least-once delivery.
//!
//! oncebox implements, as one system:
//!
//! - the **transactional outbox**: a message is written to an outbox table in the same
//!   transaction as the business change, and a relay publishes it afterwards, in per-key
//!   order, with retries and dead letters;
//! - the **inbox** (idempotent consumer): each received id is recorded, in the handler's
//!   own transaction, so a redelivered message is recognised and its effect happens once;
//! - the **durable inbox**: store on receipt, ack at once, process from the table;
//! - the **idempotent receiver**: a lease and a cached result in a store beside the
//!   handler (memory now; Redis and SQL stores implement the same trait).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use oncebox::consumer::{ConsumerOptions, TransactionalInbox, TxHandler};
//! use oncebox::memory::MemoryBroker;
//! use oncebox::spool::{Relay, SpoolOptions};
//! use oncebox::sqlite::SqliteStore;
//! use oncebox::{Bytes, Message, Received, Result, Subscriber, Delivery};
//! use sqlx::{Sqlite, Transaction};
//!
//! struct Charge;
//! impl TxHandler<Transaction<'static, Sqlite>> for Charge {
//!     async fn handle(&self, msg: &Received, tx: &mut Transaction<'static, Sqlite>) -> Result<Bytes> {
//!         sqlx::query("INSERT INTO charges (order_id) VALUES (?)")
//!             .bind(msg.key.as_deref())
//!             .execute(&mut **tx)
//!             .await
//!             .map_err(oncebox::Error::store_transient)?;
//!         Ok(Bytes::from_static(b"charged"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::connect(dir.path().join("app.db")).await?;
//! store.migrate().await?;
//! # sqlx::query("CREATE TABLE charges (order_id TEXT)").execute(store.pool()).await?;
//! let outbox = store.outbox();
//!
//! // Producer: the message commits (or rolls back) with the business write.
//! let mut tx = store.pool().begin().await?;
//! // ... INSERT INTO orders ... on &mut *tx
//! outbox.enqueue(&mut tx, &Message::new("orders", "{}").with_key("order-1")).await?;
//! tx.commit().await?;
//!
//! // Relay: outbox → broker, marked published only after the broker confirmed.
//! let broker = MemoryBroker::new();
//! let mut subscriber = broker.subscribe("orders", "payments");
//! let relay = Relay::relay(outbox, broker.publisher(), SpoolOptions::new())?;
//! relay.run_once().await?;
//!
//! // Consumer: record + effect + result in one transaction, then ack.
//! let inbox = TransactionalInbox::new(store.inbox(), Charge, ConsumerOptions::new("payments"))?;
//! let delivery = subscriber.next().await?;
//! let redelivered = delivery.received().clone();
//! oncebox::consumer::Process::process(&inbox, delivery).await?;
//! let (outcome, _first_result) = inbox.handle(&redelivered).await?; // a duplicate
//! assert_eq!(outcome, oncebox::consumer::Outcome::Duplicate);
//! # Ok(()) }
//! ```
//!
//! # Crates and features
//!
//! | feature | crate | what it brings |
//! |---|---|---|
//! | (always) | `oncebox-core` | model, traits, engines, in-memory dedup store and broker |
//! | `sqlite` (default) | `oncebox-sqlite` | outbox, inbox, durable inbox and dedup stores on SQLite |
//! | `postgres` | `oncebox-postgres` | the same stores on PostgreSQL, several relays in per-key commit order, `LISTEN/NOTIFY` wake-ups, the Debezium outbox layout |
//! | `mysql` | `oncebox-mysql` | the same stores on MySQL 8 and MariaDB 10.6+ |
//! | `redis` | `oncebox-redis` | the idempotent receiver's dedup store on Redis, and the Redis Streams transport |
//! | `nats` | `oncebox-nats` | the NATS JetStream transport |
//! | `rabbitmq` | `oncebox-rabbitmq` | the RabbitMQ transport |
//! | `kafka` | `oncebox-kafka` | the Kafka transport (builds the bundled librdkafka) |
//! | `http` | `oncebox-http` | the Idempotency-Key tower layer over any dedup store |
//! | `full` | all of the above | |
//!
//! Each backend and transport is a crate of its own, so a build compiles only what it
//! uses: NATS compiles neither lapin nor librdkafka.
//!
//! # Guides
//!
//! - [`guide::guarantees`]: what oncebox promises and how each promise is kept.
//! - [`guide::natural_idempotency`]: making the effect itself idempotent in SQL
//!   (PostgreSQL, MySQL/MariaDB), and the version-number strategy.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use oncebox_core::*;

/// SQLite stores, the embedded default (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub use oncebox_sqlite as sqlite;

/// PostgreSQL stores: outbox with LISTEN/NOTIFY wake-ups, inboxes, dedup store (feature
/// `postgres`).
#[cfg(feature = "postgres")]
pub use oncebox_postgres as postgres;

/// MySQL 8 and MariaDB 10.6+ stores (feature `mysql`).
#[cfg(feature = "mysql")]
pub use oncebox_mysql as mysql;

/// The Redis dedup store and the Redis Streams transport (feature `redis`).
#[cfg(feature = "redis")]
pub use oncebox_redis as redis;

/// The NATS JetStream transport (feature `nats`).
#[cfg(feature = "nats")]
pub use oncebox_nats as nats;

/// The RabbitMQ transport (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub use oncebox_rabbitmq as rabbitmq;

/// The Kafka transport (feature `kafka`).
#[cfg(feature = "kafka")]
pub use oncebox_kafka as kafka;

/// The Idempotency-Key layer for HTTP APIs (feature `http`).
#[cfg(feature = "http")]
pub use oncebox_http as http;

/// Long-form documentation.
pub mod guide {
    #[doc = include_str!("docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("docs/natural_idempotency.md")]
    pub mod natural_idempotency {}
}
