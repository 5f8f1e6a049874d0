//! Store traits of the consumer side: transactional inbox, durable inbox, dedup store.
//!
//! The outbox side is a [`SpoolStore`] plus an `enqueue`
//! method that each backend defines on its own connection type, because it joins the
//! caller's transaction.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::spool::{LeaseToken, SpoolStore};
use crate::{Received, Result};

mod dedup_record;

pub use dedup_record::{DedupRecord, DedupState};

/// A store whose writes can share a database transaction with a handler's writes.
pub trait Transactional: Send + Sync {
    /// The transaction handed to handlers (for SQL stores, a `sqlx::Transaction`).
    type Tx: Send;

    /// Starts a transaction.
    ///
    /// # Errors
    ///
    /// A store error if no connection could be had.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx>> + Send;

    /// Commits `tx`. Dropping a transaction without committing rolls it back.
    ///
    /// # Errors
    ///
    /// A store error; the transaction's writes are then not visible (rolled back).
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<()>> + Send;
}

/// What [`InboxStore::record`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// First time this consumer sees the id: the record is written in the transaction.
    New,
    /// The id was already processed (and committed) by this consumer; here is the result
    /// stored then.
    Duplicate {
        /// The result the handler returned the first time.
        result: Bytes,
    },
}

/// The record of processed ids of the transactional inbox.
///
/// # Contract (the `oncebox-testkit` inbox suite checks it)
///
/// - `record` inserts `(consumer, id)` inside `tx` relying on a unique constraint, never
///   on read-then-write: of concurrent transactions recording the same pair, exactly one
///   gets [`Recorded::New`] and commits; the others wait for it and then see
///   [`Recorded::Duplicate`] (or `New`, if it rolled back).
/// - `store_result` keeps the handler's result with the record, in the same transaction.
///   The engine skips it for an empty result, so a record without a stored result must
///   read back as an empty result.
/// - `purge` deletes records of one consumer processed before `before`, at most `limit`
///   per call, and never a record of another consumer (each consumer has its own dedup
///   window).
/// - `count_duplicate` adds one to the consumer's count of skipped duplicates, on its own
///   (outside any transaction), and never to another consumer's.
pub trait InboxStore: Transactional {
    /// Records that `consumer` processes `id`, inside `tx`.
    ///
    /// # Errors
    ///
    /// A store error; roll back and retry the delivery later.
    fn record(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
    ) -> impl Future<Output = Result<Recorded>> + Send;

    /// Begins a transaction and records `id` for `consumer` in it: what
    /// [`begin`](Transactional::begin) followed by [`record`](Self::record) does, which is
    /// the default. A store may do both in one round trip; the transaction and the
    /// outcome must be the same as the two calls'.
    ///
    /// # Errors
    ///
    /// A store error; nothing is left open then.
    fn begin_recorded(
        &self,
        consumer: &str,
        id: &str,
    ) -> impl Future<Output = Result<(Self::Tx, Recorded)>> + Send {
        async move {
            let mut tx = self.begin().await?;
            let recorded = self.record(&mut tx, consumer, id).await?;
            Ok((tx, recorded))
        }
    }

    /// Stores the handler's result with the record, inside `tx`.
    ///
    /// # Errors
    ///
    /// A store error; roll back and retry the delivery later.
    fn store_result(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Deletes at most `limit` records of `consumer` processed before `before`; returns
    /// how many.
    ///
    /// # Errors
    ///
    /// A store error.
    fn purge(
        &self,
        consumer: &str,
        before: SystemTime,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Counts one duplicate skipped by `consumer`, for operators
    /// ([`InboxAdmin::consumers`](crate::consumer::InboxAdmin::consumers)). The consumer
    /// engine calls it once the duplicate's transaction is over; code that records ids
    /// itself calls it when it skips one, if it wants them counted.
    ///
    /// # Errors
    ///
    /// A store error; the duplicate was skipped all the same.
    fn count_duplicate(&self, consumer: &str) -> impl Future<Output = Result<()>> + Send;
}

/// What [`DurableInboxStore::accept`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Stored for processing.
    New,
    /// Already stored (or processed) under this id: nothing written.
    Duplicate,
}

/// The table of the durable inbox, scoped to one consumer: deliveries are stored first
/// (and acknowledged to the broker), then processed from the table by the spool engine.
///
/// # Contract
///
/// - `accept` inserts the delivery under its dedup id with a unique constraint; a
///   second delivery of the same id is a [`Accepted::Duplicate`] for as long as the row
///   is kept (pending, done within retention, or dead).
/// - `complete` marks a claimed row done inside the handler's transaction, only while
///   `token` still holds its lease; otherwise it fails with
///   [`Error::LeaseLost`](crate::Error::LeaseLost) and the caller rolls back.
/// - `count_duplicate` adds one to the consumer's count of skipped duplicates, the same
///   count as [`InboxStore::count_duplicate`]'s.
pub trait DurableInboxStore: SpoolStore<Item = Received> + Transactional {
    /// Stores `received` under the dedup id `id`.
    ///
    /// # Errors
    ///
    /// A store error; do not acknowledge the delivery then.
    fn accept(
        &self,
        id: &str,
        received: &Received,
    ) -> impl Future<Output = Result<Accepted>> + Send;

    /// Marks the claimed row `seq` done with `result`, inside `tx`.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if `token` no longer holds the row;
    /// a store error otherwise.
    fn complete(
        &self,
        tx: &mut Self::Tx,
        token: LeaseToken,
        seq: i64,
        result: &[u8],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Counts one duplicate skipped by this store's consumer, for operators: the durable
    /// inbox calls it after [`accept`](Self::accept) found one.
    ///
    /// # Errors
    ///
    /// A store error; the duplicate was skipped all the same.
    fn count_duplicate(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Proof of holding an id in a [`DedupStore`]: only the holder of the current token may
/// complete or abandon it. Tokens only grow for a given id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What [`DedupStore::begin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The id was free (absent, expired, or its holder's lease ended): the caller now
    /// holds it with this token until the lease ends.
    Started(FencingToken),
    /// Another worker holds the id; its lease ends in `retry_after` at the latest.
    InProgress {
        /// Time left on the holder's lease.
        retry_after: Duration,
    },
    /// The id was completed; here is its result.
    Completed(Bytes),
}

/// The state machine of the idempotent receiver, for stores outside the handler's
/// transaction (Redis, memory, a separate SQL table):
/// `absent → in progress (lease, token) → completed (result, ttl) → expired`.
///
/// # Contract (the `oncebox-testkit` dedup suite checks it)
///
/// - `begin` is atomic: of concurrent callers for one id, at most one gets `Started`.
/// - A lease that ends makes the id free again for `begin`, with a larger token.
/// - `extend`, `complete` and `abandon` succeed only for the current token while its
///   lease lasts; a stale token gets [`Error::LeaseLost`](crate::Error::LeaseLost) and
///   changes nothing. `extend` moves the end of the lease to `lease` from now.
/// - A completed id answers `Completed` until its TTL ends; an in-memory store may evict
///   earlier only when over capacity, oldest first, and never refuses an insert.
/// - `inspect` reports a record exactly while `begin` would not start the id: in
///   progress with its lease end and token, or completed with its result and expiry.
///   An in-progress record expires with its lease, so an ended lease is reported as no
///   record (the id is free), never as a lease in the past.
pub trait DedupStore: Send + Sync {
    /// Tries to take `id` for `lease`.
    ///
    /// # Errors
    ///
    /// A store error (the receiver then fails closed or open, as configured).
    fn begin(&self, id: &str, lease: Duration) -> impl Future<Output = Result<Begin>> + Send;

    /// Records the result of `id` for `ttl`, if `token` still holds it.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) for a stale token; a store error.
    fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Extends the lease on `id` to `lease` from now, if `token` still holds it (in
    /// progress, its lease not ended): the idempotent receiver calls it while a handler
    /// runs, so that a handler slower than one lease keeps the id and no duplicate runs
    /// beside it.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if `token` no longer holds the id
    /// (its lease ended, or it was completed or abandoned); a store error.
    fn extend(
        &self,
        id: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Frees `id` so that it may be retried at once, if `token` still holds it.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) for a stale token; a store error.
    fn abandon(&self, id: &str, token: FencingToken) -> impl Future<Output = Result<()>> + Send;

    /// The record of `id` as the store holds it now; `None` if there is none (never
    /// seen, abandoned, or expired, including an in-progress record whose lease ended).
    /// Read-only: it changes no record and takes no lease, so operators may call it at
    /// any time. Times are on the caller's clock (see [`DedupRecord`]).
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    fn inspect(&self, id: &str) -> impl Future<Output = Result<Option<DedupRecord>>> + Send;

    /// Deletes at most `limit` expired records; returns how many. Stores that expire
    /// records by themselves (Redis TTL, memory) return 0.
    ///
    /// # Errors
    ///
    /// A store error.
    fn purge_expired(&self, limit: usize) -> impl Future<Output = Result<u64>> + Send {
        let _ = limit;
        std::future::ready(Ok(0))
    }
}
