//! The core of [oncebox](https://docs.rs/oncebox): the message model, the store and
//! transport traits, and the engines that make at-least-once delivery effectively once.
//!
//! This crate depends on no database, broker or HTTP crate. Backends implement its
//! traits in crates of their own (`oncebox-sqlite`, `oncebox-postgres`, `oncebox-nats`,
//! ...), and the engines here run over any of them:
//!
//! | piece | what it is |
//! |---|---|
//! | [`Message`], [`MessageId`], [`Headers`] | what a producer enqueues and a relay publishes |
//! | [`Received`], [`Coordinates`] | what a consumer receives (the id may be missing for foreign producers) |
//! | [`Publisher`], [`Subscriber`], [`Delivery`] | the transport traits |
//! | [`spool::SpoolStore`], [`store::InboxStore`], [`store::DurableInboxStore`], [`store::DedupStore`] | the store traits |
//! | [`spool::Spool`] / [`spool::Relay`] | claim → dispatch → settle: the outbox relay and the durable inbox processor |
//! | [`consumer`] | transactional inbox, durable inbox, idempotent receiver, id strategies |
//! | [`retry`] | the one decision after a failed attempt: retry, wait an outage out, dead-letter, or stop |
//! | [`memory`] | an exact in-memory dedup store, a layered store (an in-memory window of completed results in front of any dedup store) and an in-process broker with fault injection |
//!
//! With the feature `otel`, the spans of the outbox hop ([`trace`]) carry OpenTelemetry
//! trace context from the enqueue to the handler.
//!
//! With the feature `sqlx` (which the SQL store crates turn on), [`Error`] converts from
//! `sqlx::Error`, classified by SQLSTATE, so `?` works on queries inside handlers.
//!
//! Async traits are native (`impl Future + Send` in trait methods), so the engines are
//! generic and monomorphised; the CLI boxes concrete backends once at its edge.
//!
//! The guarantees and how each engine keeps them are described in the `oncebox` facade
//! crate's documentation.

mod backoff;
mod error;
mod headers;
mod message;
mod received;
mod schedule;
mod transport;

pub mod consumer;
pub mod memory;
pub mod retry;
pub mod run;
pub mod spool;
#[cfg(feature = "sqlx")]
pub mod sql;
pub mod store;
pub mod time;
pub mod trace;
pub mod wire;

pub use backoff::Backoff;
pub use error::{BoxError, Error, Fault, InvalidMessage, Result, RowDecodeError};
pub use headers::{Headers, TRACEPARENT};
pub use message::{Limits, Message, MessageId};
pub use received::{Coordinates, Received};
pub use schedule::Schedule;
pub use transport::{Delivery, Publisher, Subscriber};

/// Re-exported so that stores and tests name the same versions.
pub use bytes::Bytes;
