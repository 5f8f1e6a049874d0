//! What a durable table must provide for the spool engine: claim, settle, purge.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::Backlog;
use crate::{Message, Received, Result};

/// Identifies one claim: the rows it leased and the only settlements they accept.
///
/// A new token is drawn for every claim, so a relay whose lease expired cannot settle rows
/// that another relay claimed since (the token is the fencing token).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(Uuid);

impl LeaseToken {
    /// A new random token.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// Rebuilds a token read back from a store.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID inside.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0.hyphenated())
    }
}

/// What to claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The token written into every claimed row.
    pub token: LeaseToken,
    /// At most this many rows.
    pub limit: usize,
    /// How long the claim holds; after that the rows are claimable again.
    pub lease: Duration,
}

/// A leased row.
#[derive(Debug, Clone)]
pub struct Claimed<T> {
    /// The row's position in commit order (the table's sequence); settlements name it.
    pub seq: i64,
    /// The claim this row belongs to.
    pub token: LeaseToken,
    /// Failed attempts before this one.
    pub attempts: u32,
    /// The message (outbox) or delivery (durable inbox).
    pub item: T,
}

/// Items kept in a spool table.
pub trait SpoolItem: Send + Sync + 'static {
    /// The ordering key: items with equal keys are dispatched one at a time, in `seq`
    /// order; items without a key are not ordered.
    fn ordering_key(&self) -> Option<&str>;

    /// A short description for logs and dead-letter reasons (never the payload).
    fn describe(&self) -> String;

    /// When the item was created, if known: the spool's lag metric measures from it.
    fn created_at(&self) -> Option<SystemTime> {
        None
    }
}

impl SpoolItem for Message {
    fn ordering_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn describe(&self) -> String {
        format!("message {} ({} on {})", self.id, self.kind, self.topic)
    }

    fn created_at(&self) -> Option<SystemTime> {
        Some(self.created_at)
    }
}

impl SpoolItem for Received {
    fn ordering_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn describe(&self) -> String {
        match self.id {
            Some(id) => format!("received {id} ({} from {})", self.kind, self.coordinates),
            None => format!("received {} from {}", self.kind, self.coordinates),
        }
    }

    fn created_at(&self) -> Option<SystemTime> {
        self.created_at
    }
}

/// How a claimed row ends its attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// Delivered: mark done (kept until retention purges it).
    Done,
    /// Failed: count the attempt, record the error, make the row due again at `at`.
    Retry {
        /// When the row becomes claimable again.
        at: SystemTime,
        /// The error, recorded as the row's last error.
        error: String,
    },
    /// Not attempted (an earlier row of its key failed): end the lease, count nothing.
    Release,
    /// Given up: count the attempt, mark dead with the reason. A dead row no longer blocks
    /// its key.
    Dead {
        /// Why the row was given up.
        reason: String,
    },
}

/// The outcome of one claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The row, by [`Claimed::seq`].
    pub seq: i64,
    /// What happened.
    pub outcome: Settle,
}

/// A durable table of items processed by the [`Spool`](crate::spool::Spool) engine: the
/// outbox (items are [`Message`]s) or the durable inbox (items are [`Received`]
/// deliveries).
///
/// # Contract (the `oncebox-testkit` spool suite checks it)
///
/// - **Claim** returns due rows (pending, `available_at <= now`, not leased or lease
///   expired) in `seq` order and leases them to `request.token` until `now + lease`.
///   A row is claimable only if every earlier *pending* row of its ordering key is
///   claimable in the same call: so a key is never leased to two claims at once, and a
///   failing row blocks the later rows of its key (and only those) until it is
///   delivered or dead. Each key's claimed rows form a prefix of its pending rows.
/// - **Extend** moves the end of the claim's lease, only while the claim holds its rows.
/// - **Settle** applies only to rows still leased to `token`; others are left alone
///   (their lease expired and another claim may own them).
/// - **Settle and claim** is settle, then claim (the claim sees the settlements), which a
///   store may do in one transaction.
/// - **Purge** deletes done rows settled before `before`, at most `limit` per call, and
///   never touches pending or dead rows.
/// - All methods may be called concurrently, from several processes.
pub trait SpoolStore: Send + Sync {
    /// What the table holds.
    type Item: SpoolItem;

    /// Claims due rows; see the trait docs for which.
    ///
    /// # Errors
    ///
    /// A store error; nothing is claimed then.
    ///
    /// # Cancel safety
    ///
    /// Rows claimed by a dropped call stay leased until the lease expires.
    fn claim(
        &self,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed<Self::Item>>>> + Send;

    /// Extends the lease of claim `token`, which holds `rows` (their `seq`s), to `lease`
    /// from now, if the claim still holds them (its lease has not ended): the spool
    /// renews the lease of a batch in flight, so a slow sink never lets another spool
    /// claim the same rows. Stores that keep leases in the rows find them by `rows`.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the claim no longer holds its
    /// rows (its lease ended, or it was settled); a store error otherwise.
    ///
    /// # Cancel safety
    ///
    /// The extension applies or not; the claim is unchanged otherwise.
    fn extend(
        &self,
        token: LeaseToken,
        rows: &[i64],
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Records outcomes of rows claimed with `token`, in one statement or transaction.
    ///
    /// # Errors
    ///
    /// A store error; the rows keep their lease until it expires and are claimed again.
    ///
    /// # Cancel safety
    ///
    /// Either all settlements apply or none do.
    fn settle(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Records the outcomes of an earlier claim, then claims: the same as
    /// [`settle`](Self::settle)`(token, settlements)` followed, if it succeeded, by
    /// [`claim`](Self::claim)`(request)`, so the claim sees the settlements (a key whose
    /// rows were settled done may be claimed further; a row settled for retry blocks its
    /// key again). The spool engine calls it between full batches, when it has a batch to
    /// settle and wants the next one at once.
    ///
    /// The default does exactly that, in two calls. A store may instead run both in one
    /// transaction (one commit per batch instead of two); the result must be the same as
    /// the two calls'.
    ///
    /// # Errors
    ///
    /// A store error; nothing is claimed then. The settlements may have been applied (all
    /// of them) or not (none): settling them again is harmless, as settlements apply only
    /// to rows still leased to `token` and the first settlement ends that lease.
    ///
    /// # Cancel safety
    ///
    /// Either all settlements apply or none do; rows claimed by a dropped call stay leased
    /// until the lease expires.
    fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed<Self::Item>>>> + Send {
        async move {
            self.settle(token, settlements).await?;
            self.claim(request).await
        }
    }

    /// Deletes at most `limit` done rows settled before `before`; returns how many.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each call is one bounded statement.
    fn purge(&self, before: SystemTime, limit: usize) -> impl Future<Output = Result<u64>> + Send;

    /// Waits until new rows may be due, or `timeout` passed. The default sleeps for
    /// `timeout`; stores with a wake-up channel (in-process notification, Postgres
    /// `LISTEN`) return early.
    fn wait_for_work(&self, timeout: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(timeout)
    }

    /// How many rows wait and how long the oldest has waited, for the backlog metrics
    /// the spool samples every [`stats_interval`](super::SpoolOptions::stats_interval);
    /// `None` if the store does not tell (the default). One cheap statement on the
    /// indexes of pending and dead rows.
    ///
    /// # Errors
    ///
    /// A store error; the spool logs it and keeps the last reading.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn backlog(&self) -> impl Future<Output = Result<Option<Backlog>>> + Send {
        std::future::ready(Ok(None))
    }
}

impl<S: SpoolStore> SpoolStore for std::sync::Arc<S> {
    type Item = S::Item;

    fn claim(
        &self,
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed<Self::Item>>>> + Send {
        (**self).claim(request)
    }

    fn extend(
        &self,
        token: LeaseToken,
        rows: &[i64],
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).extend(token, rows, lease)
    }

    fn settle(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).settle(token, settlements)
    }

    fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> impl Future<Output = Result<Vec<Claimed<Self::Item>>>> + Send {
        (**self).settle_and_claim(token, settlements, request)
    }

    fn purge(&self, before: SystemTime, limit: usize) -> impl Future<Output = Result<u64>> + Send {
        (**self).purge(before, limit)
    }

    fn wait_for_work(&self, timeout: Duration) -> impl Future<Output = ()> + Send {
        (**self).wait_for_work(timeout)
    }

    fn backlog(&self) -> impl Future<Output = Result<Option<Backlog>>> + Send {
        (**self).backlog()
    }
}
