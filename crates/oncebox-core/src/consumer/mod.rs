//! The consumer engines: transactional inbox, durable inbox, idempotent receiver.
//!
//! | engine | dedup record | effect happens | use when |
//! |---|---|---|---|
//! | [`TransactionalInbox`] | in the handler's transaction | exactly once | the effect is a write to the same database |
//! | [`DurableInbox`] | stored on receipt, processed from the table | exactly once | the broker's retention or redelivery limits are too short, or processing is slow |
//! | [`IdempotentReceiver`] | [`DedupStore`](crate::store::DedupStore) beside the handler | at most once at a time, may repeat after a crash | the effect is outside the database (HTTP call, email) |
//!
//! All three find the dedup id with an [`IdStrategy`] and run under a [`Consumer`].
//! Operators read each consumer's figures across both inboxes through [`InboxAdmin`].

mod admin;
mod durable;
mod handler;
mod health;
mod id;
mod lease;
mod metrics;
mod options;
mod process;
mod receiver;
mod runner;
mod transactional;

pub use admin::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
pub use durable::{DurableInbox, HandlerSink};
pub use handler::{
    FnHandler, Handler, HandlerFn, HandlerOutput, Json, TxHandler, TxHandlerFn, handler_fn,
};
pub use health::{ConsumerHealth, ConsumerHealthHandle};
pub use id::IdStrategy;
pub use lease::keep_lease;
pub use options::{ConsumerOptions, StoreFailure};
pub use process::{Outcome, Panicked, Process, TimedOut};
pub use receiver::IdempotentReceiver;
pub use runner::{Consumer, process_delivery};
pub use transactional::TransactionalInbox;
