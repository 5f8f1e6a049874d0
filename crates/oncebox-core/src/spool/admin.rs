//! What operators ask of an outbox, whatever its database: counts, dead letters, the
//! state of one row. Each backend's outbox returns these types from its `stats`,
//! `dead_letters` and `status` methods.

use std::time::{Duration, SystemTime};

use crate::{Message, MessageId};

/// Counts of outbox rows by status, and how long the oldest pending message has waited.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Rows waiting to be published (including rows being retried and rows leased to a
    /// relay right now).
    pub pending: u64,
    /// Rows published and kept until retention purges them.
    pub done: u64,
    /// Rows given up on.
    pub dead: u64,
    /// Age of the first pending row in commit order (from its creation time); `None`
    /// when nothing is pending.
    pub oldest_pending_age: Option<Duration>,
}

/// A dead-lettered outbox message, with why it was given up.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The row's position in commit order.
    pub seq: i64,
    /// The message id (also in `message`).
    pub id: MessageId,
    /// The message as enqueued.
    pub message: Message,
    /// Attempts made, the last one included.
    pub attempts: u32,
    /// Why it was given up (the last error).
    pub reason: String,
    /// When it was given up.
    pub dead_at: SystemTime,
}

/// Where an outbox row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RowStatus {
    /// Waiting to be published (possibly leased to a relay, or waiting for a retry).
    Pending,
    /// Published.
    Done,
    /// Given up.
    Dead,
}

/// The state of one outbox row, as a backend's `status(id)` reads it.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The row's position in commit order.
    pub seq: i64,
    /// Pending, done or dead.
    pub status: RowStatus,
    /// Failed attempts so far (for a dead row, the last one included).
    pub attempts: u32,
    /// The last failure; for a dead row, the reason it was given up. Kept when a dead row
    /// is replayed.
    pub last_error: Option<String>,
    /// When a pending row becomes claimable.
    pub available_at: SystemTime,
    /// Until when a relay holds the row, if one claimed it (the lease may have ended).
    pub leased_until: Option<SystemTime>,
    /// When the row was published or given up.
    pub settled_at: Option<SystemTime>,
}
