//! Redis backend for [oncebox](https://docs.rs/oncebox): the idempotent receiver's
//! [`DedupStore`](oncebox_core::store::DedupStore), which is also an idempotency-key store
//! for the HTTP layer of `oncebox-http`, and the Redis Streams transport.
//!
//! | piece | what it is |
//! |---|---|
//! | [`RedisDedupStore`] | the dedup store: leases, fencing tokens, results with a TTL |
//! | [`RedisStreams`] | the transport: [`RedisStreamPublisher`] (`XADD`), [`RedisStreamSubscriber`] (consumer groups, `XACK`, `XAUTOCLAIM`), dead-letter streams; the wire format is in the [`streams`] module |
//!
//! # Dedup store
//!
//! [`RedisDedupStore`] keeps the state machine of the idempotent receiver,
//! `absent → in progress (lease, fencing token) → completed (result, TTL) → expired`, in
//! one hash per id, made atomic with server-side Lua scripts; Redis expires the records
//! itself. See its documentation for the key layout and the failure modes.
//!
//! ```no_run
//! use std::time::Duration;
//! use oncebox_core::store::{Begin, DedupStore};
//! use oncebox_redis::RedisDedupStore;
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let store = RedisDedupStore::connect("redis://127.0.0.1:6379")
//!     .await?
//!     .with_prefix("payments:");
//! match store.begin("order-42", Duration::from_secs(30)).await? {
//!     Begin::Started(token) => {
//!         // ... do the work once ...
//!         store.complete("order-42", token, b"charged", Duration::from_secs(86_400)).await?;
//!     }
//!     Begin::InProgress { retry_after } => { /* someone else is on it: retry later */ }
//!     Begin::Completed(result) => { /* done before: answer with `result` */ }
//! }
//! # Ok(()) }
//! ```
//!
//! # Redis Streams transport
//!
//! ```no_run
//! use oncebox_core::{Delivery, Message, Publisher, Subscriber};
//! use oncebox_redis::{RedisStreamOptions, RedisStreams};
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let streams = RedisStreams::connect_env(RedisStreamOptions::new()).await?;
//! let mut payments = streams.subscribe("orders", "payments").await?;
//! streams.publisher().publish(&Message::new("orders", "order 42")).await?;
//! let delivery = payments.next().await?;
//! delivery.ack().await?;
//! # Ok(()) }
//! ```

mod connection;
mod dedup;
mod error;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod streams;

pub use connection::RedisConnection;
pub use dedup::{DEDUP_SHARDS, DEFAULT_PREFIX, DedupLayout, RESPONSE_TIMEOUT, RedisDedupStore};
pub use streams::{
    RedisDeadLetter, RedisStreamDelivery, RedisStreamOptions, RedisStreamPublisher,
    RedisStreamSubscriber, RedisStreams,
};

/// Re-exported so that callers configure the same client version.
pub use redis;
