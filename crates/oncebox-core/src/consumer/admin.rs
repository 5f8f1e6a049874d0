//! What operators ask of the inboxes, whatever their database: each consumer's figures
//! ([`InboxAdmin`], which each SQL store's transactional inbox implements for both
//! inboxes of its database).

use std::future::Future;
use std::time::SystemTime;

use crate::Result;

/// One inbox consumer's figures, across the transactional and the durable inbox.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// The consumer's name.
    pub consumer: String,
    /// Messages handled and still kept: the consumer's records in the transactional
    /// inbox plus its done rows in the durable inbox (retention purges both).
    pub handled: u64,
    /// Durable inbox rows waiting to be processed (including rows being retried and rows
    /// leased right now).
    pub pending: u64,
    /// Durable inbox rows given up on.
    pub dead: u64,
    /// Duplicate deliveries skipped, by either inbox, since the consumer's first one
    /// (retention does not lower it). Counted by the consumer engine
    /// ([`InboxStore::count_duplicate`](crate::store::InboxStore::count_duplicate)) once
    /// each duplicate is settled: a process that dies in between leaves one uncounted.
    pub duplicates: u64,
    /// When the latest of the handled messages was handled (its inbox record written, or
    /// its durable row marked done); `None` when no handled message is kept.
    pub last_handled_at: Option<SystemTime>,
}

/// What operators ask of an inbox, whatever its database: the part of the dashboard's
/// overview that does not depend on the backend, which each backend's inbox implements
/// once.
pub trait InboxAdmin: Send + Sync {
    /// The figures of every consumer with a record in the transactional inbox, a row in
    /// the durable inbox or a duplicate counted, ordered by consumer name (byte order); empty when there is
    /// none. The figures are read in one statement, so they are consistent with each
    /// other.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a row holds values oncebox did not write.
    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerStats>>> + Send;
}
