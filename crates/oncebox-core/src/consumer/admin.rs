//! What operators ask of the inboxes, whatever their database: each consumer's figures
//! and the durable inbox's rows ([`InboxAdmin`], which each SQL store's transactional
//! inbox implements for both inboxes of its database).

use std::future::Future;
use std::time::SystemTime;

use bytes::Bytes;

use crate::spool::{RowState, RowStatus};
use crate::{Received, Result};

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

/// One row of the durable inbox: whose it is, where it stands, and the delivery it holds.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone)]
pub struct InboxRow {
    /// The consumer the delivery was stored for.
    pub consumer: String,
    /// The id the consumer's id strategy found: the row is unique per consumer and id.
    pub dedup_id: String,
    /// Status, attempts, last error, lease and times, as for an outbox row.
    pub state: RowState,
    /// When the delivery was stored.
    pub received_at: SystemTime,
    /// The handler's result, once the row is done (empty if it returned none).
    pub result: Option<Bytes>,
    /// The delivery as stored.
    pub received: Received,
}

/// Which durable inbox rows a listing shows: every criterion that is set must hold.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxRowFilter {
    /// Only rows of this consumer.
    pub consumer: Option<String>,
    /// Only rows of this status.
    pub status: Option<RowStatus>,
    /// Only rows of deliveries on this topic.
    pub topic: Option<String>,
    /// Only rows of this ordering key.
    pub key: Option<String>,
    /// Only rows stored under this dedup id.
    pub dedup_id: Option<String>,
    /// Only rows received at or after this time.
    pub received_from: Option<SystemTime>,
    /// Only rows received before this time.
    pub received_until: Option<SystemTime>,
}

/// What operators ask of an inbox, whatever its database: the part of the dashboard
/// that does not depend on the backend, which each backend's inbox implements once.
pub trait InboxAdmin: Send + Sync {
    /// The figures of every consumer with a record in the transactional inbox, a row in
    /// the durable inbox or a duplicate counted, ordered by consumer name (byte order); empty when there is
    /// none. The figures are read in one statement, so they are consistent with each
    /// other.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerStats>>> + Send;

    /// Up to `limit` durable inbox rows that match `filter`, newest first: in descending
    /// order of position, from the row before position `before` (a
    /// [`RowState::seq`]; `None` for the newest). Passing the last row's `seq` as
    /// `before` reads the next page.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn inbox_rows(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<InboxRow>>> + Send;

    /// The durable inbox row at position `seq`, or `None` if there is none (never
    /// stored, or purged).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if the row holds values oncebox did not write.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn inbox_row(&self, seq: i64) -> impl Future<Output = Result<Option<InboxRow>>> + Send;
}
