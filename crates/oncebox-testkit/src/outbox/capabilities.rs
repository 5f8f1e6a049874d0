//! What an outbox store does beyond the contract every outbox keeps.

use std::time::Duration;

/// The optional behaviours an outbox store declares, so that the suite runs the checks
/// that apply to it and skips (and says so) the others. One value describes a backend:
/// its tests are its harness plus this value.
///
/// Start from [`Capabilities::new`] (nothing optional, times kept to the millisecond),
/// then set what the store does:
///
/// ```
/// use oncebox_testkit::outbox::Capabilities;
///
/// let mysql_like = Capabilities::new().producer_key_locks(true).claim_window(true);
/// assert!(!mysql_like.held_claims);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Producers of one key are serialised: a transaction enqueueing a key waits for an
    /// open one that enqueued the same key, so that commit order is `seq` order; other
    /// keys, and rows without a key, do not wait. (A store that serialises every
    /// producer, as SQLite does, keeps commit order without it.)
    pub producer_key_locks: bool,
    /// A claim reads a bounded window of pending rows first and then looks for free keys
    /// beyond it; the harness makes a store with a window of a given size
    /// ([`OutboxHarness::windowed`](super::OutboxHarness::windowed)).
    pub claim_window: bool,
    /// Claims are held: the claim's transaction stays open, its rows locked, until they
    /// are settled, so an operation on a claimed key (a replay) waits for the settlement
    /// instead of the lease.
    pub held_claims: bool,
    /// The store keeps when a row was enqueued, and counts the oldest pending age from
    /// it (and not from the producer's creation time) when that is later.
    pub keeps_enqueue_time: bool,
    /// How finely the store keeps a message's creation time: a message read back may
    /// be earlier by less than this.
    pub time_resolution: Duration,
    /// The harness can set a published row's publication time
    /// ([`OutboxHarness::set_published_at`](super::OutboxHarness::set_published_at)).
    pub publication_times: bool,
}

impl Capabilities {
    /// Nothing beyond the contract every outbox keeps; creation times kept to the
    /// millisecond.
    pub const fn new() -> Self {
        Self {
            producer_key_locks: false,
            claim_window: false,
            held_claims: false,
            keeps_enqueue_time: false,
            time_resolution: Duration::from_millis(1),
            publication_times: false,
        }
    }

    /// Sets [`Capabilities::producer_key_locks`].
    #[must_use]
    pub const fn producer_key_locks(mut self, yes: bool) -> Self {
        self.producer_key_locks = yes;
        self
    }

    /// Sets [`Capabilities::claim_window`].
    #[must_use]
    pub const fn claim_window(mut self, yes: bool) -> Self {
        self.claim_window = yes;
        self
    }

    /// Sets [`Capabilities::held_claims`].
    #[must_use]
    pub const fn held_claims(mut self, yes: bool) -> Self {
        self.held_claims = yes;
        self
    }

    /// Sets [`Capabilities::keeps_enqueue_time`].
    #[must_use]
    pub const fn keeps_enqueue_time(mut self, yes: bool) -> Self {
        self.keeps_enqueue_time = yes;
        self
    }

    /// Sets [`Capabilities::time_resolution`].
    #[must_use]
    pub const fn time_resolution(mut self, resolution: Duration) -> Self {
        self.time_resolution = resolution;
        self
    }

    /// Sets [`Capabilities::publication_times`].
    #[must_use]
    pub const fn publication_times(mut self, yes: bool) -> Self {
        self.publication_times = yes;
        self
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Self::new()
    }
}

/// Prints that `check` was skipped for lack of `capability`.
pub(super) fn skipped(check: &str, capability: &str) {
    eprintln!(
        "oncebox-testkit: skipped outbox check {check}: the harness does not declare `{capability}`"
    );
}
