//! The spool model's state: the outbox table, the claims table, the relays, the broker,
//! and the ghosts the properties read.

/// One row of the outbox table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// Its key.
    pub key: u8,
    /// `status = 'done'`.
    pub done: bool,
    /// The token of the last claim that took it (ghost: for the fencing property).
    pub claimed_by: Option<u8>,
}

/// One row of the claims table (`oncebox_outbox_claims`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    /// `token`.
    pub token: u8,
    /// Ticks until `until`; 0: the lease has ended.
    pub left: u8,
    /// `seqs`: the rows it holds.
    pub seqs: Vec<u8>,
}

/// How one claimed row fares in the relay (`Settle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// Not started.
    Waiting,
    /// `Sink::deliver` under way.
    InFlight,
    /// `Settle::Done`: the broker confirmed.
    Done,
    /// `Settle::Retry`: the publish failed.
    Retry,
    /// `Settle::Release`: handed back unattempted (or cut off by a lost lease).
    Release,
}

/// A relay process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Relay {
    /// Between batches (`claim_loop` about to claim).
    Idle,
    /// Delivering a claimed batch (`Spool::dispatch`).
    Holding {
        /// The claim's token.
        token: u8,
        /// Ticks its own view of the lease has left (`Lease::keep`'s `held_until`).
        held: u8,
        /// The batch: each row's `seq` and attempt.
        batch: Vec<(u8, Attempt)>,
    },
    /// [`SpoolBug::ReleaseBeforeSettle`](super::SpoolBug::ReleaseBeforeSettle): rows out of the claim, outcome not yet written.
    Settling {
        /// The claim's token.
        token: u8,
        /// The outcomes to write.
        batch: Vec<(u8, Attempt)>,
    },
}

/// The whole system: table, claims, relays, broker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpoolState {
    /// The outbox rows, in `seq` order.
    pub rows: Vec<Row>,
    /// The claims table.
    pub claims: Vec<Claim>,
    /// The relays.
    pub relays: Vec<Relay>,
    /// Which rows the broker confirmed at least once (by `seq`).
    pub broker: Vec<bool>,
    /// The next claim token (`LeaseToken::new`).
    pub next_token: u8,
    /// Crashes left.
    pub crashes: u8,
    /// Failed publishes left.
    pub failures: u8,
    /// Ghost: a row was published before an earlier row of its key had ever been.
    pub order_broken: bool,
    /// Ghost: two relays had one key in flight at once.
    pub overlap: bool,
    /// Ghost: a settlement applied to a row another claim had taken since.
    pub stale_settlement: bool,
    /// Ghost: a relay's claim was taken over by another while it held its batch.
    pub taken_over: bool,
    /// Ghost: a settlement applied after its lease had ended, no other claim having
    /// taken its rows (allowed: the outcome is the claimant's own).
    pub late_settlement: bool,
}

/// A step of the system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SpoolAction {
    /// Time passes (one tick): leases run down.
    Tick,
    /// `SpoolStore::claim`: the relay claims the claimable rows.
    Claim(usize),
    /// `dispatch_key` → `deliver`: the relay starts publishing the batch's row at this
    /// index.
    Publish(usize, usize),
    /// The broker confirms the publish (`Publisher::publish` returns `Ok`).
    Confirm(usize, usize),
    /// The publish fails (a transient broker error).
    Fail(usize, usize),
    /// The relay's lease ran out while the publish was under way: `deliver`'s
    /// `lease.lost()` drops it (the broker may have received it or not).
    Cut(usize, usize, bool),
    /// `Lease::keep` → `SpoolStore::extend`.
    Extend(usize),
    /// `SpoolStore::settle` (`SpoolTable::settle` → `apply`).
    Settle(usize),
    /// [`SpoolBug::ReleaseBeforeSettle`](super::SpoolBug::ReleaseBeforeSettle): the late write of the outcomes.
    WriteOutcomes(usize),
    /// The relay process dies; its claim stays until its lease ends.
    Crash(usize),
}
