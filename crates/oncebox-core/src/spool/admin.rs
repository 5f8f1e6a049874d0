//! What operators ask of an outbox, whatever its database: counts, dead letters, the
//! state of one row, replay and purge ([`OutboxAdmin`], which each backend's outbox
//! implements).

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::{Message, MessageId, Result};

/// Counts of outbox rows by status, and how long the oldest pending message has waited.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Rows waiting to be published (including rows being retried and rows leased to a
    /// relay right now), scheduled rows not yet due excluded.
    pub pending: u64,
    /// Scheduled rows not yet due: never attempted, their delivery time ahead
    /// ([`Schedule`](crate::Schedule)).
    pub scheduled: u64,
    /// Rows published and kept until retention purges them.
    pub done: u64,
    /// Rows given up on.
    pub dead: u64,
    /// How long the first pending row in commit order has waited: scheduled rows not yet
    /// due are passed over; a row never attempted counts from the later of its creation
    /// and the time it became due (its delivery time if scheduled; on PostgreSQL and
    /// SQLite its enqueue otherwise, which MySQL does not keep: there, its creation), a
    /// row being retried from its creation. `None` when nothing is pending.
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

/// What waits in a spool table: the figures behind the backlog metrics.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Rows waiting (including rows being retried and rows leased right now; an outbox's
    /// scheduled rows not yet due excluded).
    pub pending: u64,
    /// Rows given up on.
    pub dead: u64,
    /// Age of the first pending row in commit order, as in
    /// [`OutboxStats::oldest_pending_age`]; `None` when nothing is pending.
    pub oldest_pending_age: Option<Duration>,
}

impl From<OutboxStats> for Backlog {
    fn from(stats: OutboxStats) -> Self {
        Self {
            pending: stats.pending,
            dead: stats.dead,
            oldest_pending_age: stats.oldest_pending_age,
        }
    }
}

/// One outbox row: where it stands, and the message it holds.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Status, attempts, last error, lease and times.
    pub state: RowState,
    /// The message as enqueued.
    pub message: Message,
}

/// Which outbox rows a listing shows: every criterion that is set must hold.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowFilter {
    /// Only rows of this status.
    pub status: Option<RowStatus>,
    /// Only rows of this topic.
    pub topic: Option<String>,
    /// Only rows of this ordering key.
    pub key: Option<String>,
    /// Only the row of this message.
    pub id: Option<MessageId>,
    /// Only rows created at or after this time.
    pub created_from: Option<SystemTime>,
    /// Only rows created before this time.
    pub created_until: Option<SystemTime>,
}

/// How many messages were published in one minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinuteCount {
    /// The minute's start.
    pub minute: SystemTime,
    /// Rows marked published in that minute (and still kept: retention and
    /// delete-on-publish remove rows from the count).
    pub published: u64,
}

/// Which dead letters an operation applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// The dead letter of this message.
    One(MessageId),
    /// Every dead letter on this topic.
    Topic(String),
    /// Every dead letter.
    All,
}

impl DeadLetterSelection {
    /// Whether `letter` is selected.
    pub fn selects(&self, letter: &DeadLetter) -> bool {
        match self {
            Self::One(id) => letter.id == *id,
            Self::Topic(topic) => letter.message.topic == *topic,
            Self::All => true,
        }
    }
}

/// What operators do with an outbox, whatever its database: the part of `oncebox
/// outbox …`, `oncebox dead-letters …` and the dashboard that does not depend on the
/// backend, which each backend's outbox implements once.
///
/// A selection of many dead letters is found with [`select_dead_letters`], which pages
/// through [`dead_letters`](Self::dead_letters); the one-row operations then apply to
/// exactly the ids found (and confirmed, in the CLI), each with the guarantees of its
/// one-row call (a replayed row keeps its place in its key's order).
///
/// # Cancel safety
///
/// Every method is cancel safe: the reads only read, and each write
/// ([`replay_dead`](Self::replay_dead), [`purge_dead`](Self::purge_dead)) is one statement
/// or one transaction, applied entirely or not at all.
pub trait OutboxAdmin: Send + Sync {
    /// Counts by status and the oldest pending age.
    ///
    /// # Errors
    ///
    /// A store error.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats>> + Send;

    /// The row of message `id` and its message, or `None` if there is none (never
    /// enqueued, or purged).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if the row holds values oncebox did not write.
    fn row(&self, id: MessageId) -> impl Future<Output = Result<Option<OutboxRow>>> + Send;

    /// Up to `limit` dead letters after position `after` (a [`DeadLetter::seq`]; `None`
    /// for the first page), in commit order.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a dead row cannot be decoded.
    fn dead_letters(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>>> + Send;

    /// Up to `limit` rows that match `filter`, newest first: in descending commit
    /// order, from the row before position `before` (a [`RowState::seq`]; `None` for
    /// the newest). Passing the last row's `seq` as `before` reads the next page, which
    /// costs the same at any depth. With a creation-time criterion
    /// ([`RowFilter::created_from`], [`RowFilter::created_until`]) the order is
    /// descending creation time, then position: the row at `before` is read for its
    /// time, and if it is gone (purged since) the listing ends.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a row holds values oncebox did not write.
    fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRow>>> + Send;

    /// Messages published per minute since `since`, by the database's clock, oldest
    /// minute first; minutes with none are left out.
    ///
    /// # Errors
    ///
    /// A store error.
    fn published_per_minute(
        &self,
        since: SystemTime,
    ) -> impl Future<Output = Result<Vec<MinuteCount>>> + Send;

    /// Puts the dead message `id` back in line (pending, due now, attempts reset, the
    /// last error kept, its place in commit order kept); whether it was dead. A dead
    /// letter of a relay that reads no update (PostgreSQL's log-tailing relay) is handed
    /// back to that relay as a new message of the same id instead.
    ///
    /// # Errors
    ///
    /// A store error.
    fn replay_dead(&self, id: MessageId) -> impl Future<Output = Result<bool>> + Send;

    /// Deletes the dead message `id`; whether it was dead. Pending and published rows
    /// are never touched.
    ///
    /// # Errors
    ///
    /// A store error.
    fn purge_dead(&self, id: MessageId) -> impl Future<Output = Result<bool>> + Send;
}

/// Dead letters read per page by the selection operations.
const PAGE: usize = 500;

/// The dead letters `selection` names, in commit order, at most `limit`.
///
/// # Errors
///
/// A store error.
pub async fn select_dead_letters<A: OutboxAdmin + ?Sized>(
    admin: &A,
    selection: &DeadLetterSelection,
    limit: usize,
) -> Result<Vec<DeadLetter>> {
    let mut selected = Vec::new();
    let mut after = None;
    while selected.len() < limit {
        let page = admin.dead_letters(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        let full = page.len() == PAGE;
        selected.extend(page.into_iter().filter(|letter| selection.selects(letter)));
        if !full {
            break;
        }
    }
    selected.truncate(limit);
    Ok(selected)
}
