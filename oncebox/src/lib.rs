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
//!   handler (memory, Redis, or a table of a SQL store).
//!
//! # Example
//!
//! An order service and two consumers of its events, on SQLite and the in-process broker:
//! the order and its event commit together; the relay publishes the event; the payment
//! service charges each order exactly once (the dedup record commits with the charge);
//! the mailer, whose effect lives outside the database, runs at most once at a time per
//! message and answers duplicates with its first result.
//!
//! ```
//! use oncebox::consumer::{
//!     Consumer, ConsumerOptions, IdempotentReceiver, TransactionalInbox, handler_fn,
//! };
//! use oncebox::memory::{MemoryBroker, MemoryDedupStore};
//! use oncebox::run::Runner;
//! use oncebox::spool::{Relay, SpoolOptions};
//! use oncebox::sqlite::SqliteStore;
//! use oncebox::{Message, Received, Result};
//! use sqlx::{Sqlite, Transaction};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order {
//!     id: String,
//!     amount: i64,
//! }
//!
//! /// The payment service's effect, in the inbox's transaction: `?` on the payload and
//! /// on sqlx errors classifies them (not an order, or a constraint violated: dead-
//! /// lettered at once; a deadlock: retried; the database unreachable: held until back).
//! async fn charge(msg: &Received, tx: &mut Transaction<'static, Sqlite>) -> Result<()> {
//!     let order: Order = msg.payload_json()?;
//!     sqlx::query("INSERT INTO charges (order_id, amount) VALUES (?, ?)")
//!         .bind(&order.id)
//!         .bind(order.amount)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::connect(dir.path().join("app.db")).await?;
//! store.migrate().await?;
//! # sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
//! #     .execute(store.pool()).await?;
//! # sqlx::query("CREATE TABLE charges (order_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
//! #     .execute(store.pool()).await?;
//!
//! // Producer: the event commits (or rolls back) with the order.
//! let order = Order { id: "order-1".into(), amount: 4200 };
//! let mut tx = store.pool().begin().await?;
//! sqlx::query("INSERT INTO orders (id, amount) VALUES (?, ?)")
//!     .bind(&order.id)
//!     .bind(order.amount)
//!     .execute(&mut *tx)
//!     .await?;
//! let event = Message::json("orders", &order)?.with_key(&order.id);
//! store.outbox().enqueue(&mut tx, &event).await?;
//! tx.commit().await?;
//!
//! // Relay: outbox → broker, marked published only after the broker confirmed.
//! let broker = MemoryBroker::new();
//! let relay = Relay::new(store.outbox(), broker.publisher(), SpoolOptions::new())?;
//!
//! // Payments: dedup record + charge in one transaction, then ack.
//! let payments = TransactionalInbox::new(
//!     store.inbox(),
//!     handler_fn(charge),
//!     ConsumerOptions::new("payments"),
//! )?;
//!
//! // Mailer: a closure; its effect is outside the database.
//! let mailer = IdempotentReceiver::new(
//!     MemoryDedupStore::new(100_000),
//!     handler_fn(|msg: &Received| {
//!         let order_id = msg.key.clone();
//!         async move {
//!             // send the confirmation for `order_id` ...
//!             # let _ = order_id;
//!             Ok("sent")
//!         }
//!     }),
//!     ConsumerOptions::new("mailer"),
//! )?;
//!
//! // Run them together; all stop on the signal (here: once the order is charged), and
//! // the first real error stops them all and returns.
//! # let pool = store.pool().clone();
//! # let shutdown = async move {
//! #     while sqlx::query("SELECT 1 FROM charges").fetch_optional(&pool).await.ok().flatten().is_none() {
//! #         tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! #     }
//! # };
//! Runner::new()
//!     .spawn("relay", relay)
//!     .spawn("payments", Consumer::new(broker.subscribe("orders", "payments"), payments))
//!     .spawn("mailer", Consumer::new(broker.subscribe("orders", "mailer"), mailer))
//!     .run_until(shutdown) // tokio::signal::ctrl_c(), in a service
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # The public API
//!
//! | item | what it is |
//! |---|---|
//! | [`Message`], [`MessageId`], [`Headers`], [`Limits`], [`Bytes`] | what a producer enqueues and a relay publishes, and the limits a store checks |
//! | [`Received`], [`Coordinates`] | what a consumer receives, and where the broker had it |
//! | [`Error`], [`Fault`], [`InvalidMessage`], [`RowDecodeError`], [`BoxError`], [`Result`] | errors, classified by what retrying would do |
//! | [`retry`], [`Backoff`] | the one decision after a failed attempt (retry, wait an outage out, dead-letter, stop), and its delays |
//! | [`Publisher`], [`Subscriber`], [`Delivery`] | the transport traits a broker crate implements |
//! | [`store`] | the store traits (inbox, durable inbox, dedup) and the transaction they share |
//! | [`spool`] | the outbox relay and the durable-inbox processor (claim → deliver → settle), the outbox's admin |
//! | [`consumer`] | transactional inbox, durable inbox, idempotent receiver, id strategies |
//! | [`memory`] | in-memory dedup stores and an in-process broker with fault injection |
//! | [`run`] | runs relays and consumers together until a signal |
//! | [`trace`], [`TRACEPARENT`] | the spans of the outbox hop |
//! | [`wire`] | the CloudEvents wire format every broker transport shares |
//! | [`time`], [`Schedule`] | timestamp conversions, and when a message becomes due |
//! | `sqlite`, `postgres`, `mysql`, `redis`, `nats`, `rabbitmq`, `kafka`, `sqs`, `http` | the backends, each behind its feature (below) |
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
//! | `sqs` | `oncebox-sqs` | the Amazon SQS transport (the AWS SDK, on rustls with ring: no C toolchain) |
//! | `http` | `oncebox-http` | the Idempotency-Key tower layer over any dedup store |
//! | `otel` | `oncebox-core/otel` | OpenTelemetry trace context from the enqueue to the handler ([`guide::tracing`]) |
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
//! - [`guide::metrics`]: every metric the engines report, through the `metrics` facade.
//! - [`guide::tracing`]: one OpenTelemetry trace from the request that enqueued a message
//!   to the handler that processed it (feature `otel`).
#![cfg_attr(docsrs, feature(doc_cfg))]

// What a user needs, by name: store internals (`oncebox_core::sql`, the row reader and
// statement conditions the SQL stores share) are not part of the facade.
pub use oncebox_core::{
    Backoff, BoxError, Bytes, Coordinates, Delivery, Error, Fault, Headers, InvalidMessage, Limits,
    Message, MessageId, Publisher, Received, Result, RowDecodeError, Schedule, Subscriber,
    TRACEPARENT,
};
pub use oncebox_core::{consumer, memory, retry, run, spool, store, time, trace, wire};

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

/// The Amazon SQS transport (feature `sqs`).
#[cfg(feature = "sqs")]
pub use oncebox_sqs as sqs;

/// The Kafka transport (feature `kafka`).
#[cfg(feature = "kafka")]
pub use oncebox_kafka as kafka;

/// The Idempotency-Key layer for HTTP APIs (feature `http`).
#[cfg(feature = "http")]
pub use oncebox_http as http;

/// The README's code, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// Long-form documentation.
pub mod guide {
    #[doc = include_str!("docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("docs/natural_idempotency.md")]
    pub mod natural_idempotency {}
    #[doc = include_str!("docs/metrics.md")]
    pub mod metrics {}
    #[doc = include_str!("docs/tracing.md")]
    pub mod tracing {}
}
