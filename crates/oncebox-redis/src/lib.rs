//! Redis backend for [oncebox](https://docs.rs/oncebox): the idempotent receiver's
//! [`DedupStore`](oncebox_core::store::DedupStore), which is also an idempotency-key store
//! for the HTTP layer of `oncebox-http`.
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
//! The Redis Streams transport will live in this crate too.

mod dedup;
mod error;

pub use dedup::{DEFAULT_PREFIX, RESPONSE_TIMEOUT, RedisDedupStore};

/// Re-exported so that callers configure the same client version.
pub use redis;
