//! The spool engine: a durable table processed by claim → dispatch → settle.
//!
//! The outbox relay ([`Relay`]) and the durable inbox processor are the same machine with
//! different sinks: the relay's sink publishes to a broker, the inbox's sink runs a
//! handler. One loop:
//!
//! 1. **Claim** a batch of due rows with a lease ([`SpoolStore::claim`]); the store
//!    returns, for each key, a prefix of its pending rows, so no key is ever leased to two
//!    spools.
//! 2. **Dispatch** concurrently across keys and in order within a key ([`Sink`]).
//! 3. **Settle** the whole batch in one call: done, retry later with backoff, released
//!    (an earlier row of the key failed), or dead after the attempt limit. After a full
//!    batch the spool goes on at once, and settles it in the same call as the next claim
//!    ([`SpoolStore::settle_and_claim`]: one transaction where the store allows).
//!
//! Retention cleanup runs beside the loop in bounded batches. A spool that dies leaves
//! its rows leased until the lease ends, then another takes them over; rows it had
//! delivered but not settled are delivered again (at least once; consumers deduplicate).

mod admin;
mod dispatch;
mod engine;
mod lease;
mod loops;
mod metrics;
mod options;
mod relay;
mod sink;
mod store;

pub use admin::{
    Backlog, DeadLetter, DeadLetterSelection, MinuteCount, OutboxAdmin, OutboxRow, OutboxStats,
    RowFilter, RowState, RowStatus, select_dead_letters,
};
pub use engine::{BatchReport, DeadLetterHook, Spool, SpoolHealth};
pub use options::{DEFAULT_RETENTION, SpoolOptions};
pub use relay::Relay;
pub use sink::{PublishSink, Sink};
pub use store::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement, SpoolItem, SpoolStore};
