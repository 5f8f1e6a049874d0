//! The idempotent receiver over a dedup store: `begin` / `extend` / `complete` /
//! `abandon` with a lease and fencing tokens (the `DedupStore` contract in
//! `crates/oncebox-core/src/store.rs`, as `MemoryDedupStore` implements it in
//! `crates/oncebox-core/src/memory/dedup.rs`), and the receiver that keeps its lease
//! while the handler runs and stops the handler when it cannot
//! (`crates/oncebox-core/src/consumer/receiver.rs`, `lease.rs`).

use stateright::{Model, Property};

/// The bounds and the seeded bug of one check.
#[derive(Debug, Clone)]
pub struct DedupModel {
    /// Workers receiving copies of one message.
    pub workers: usize,
    /// Ticks a lease lasts; the receiver counts its own one tick shorter.
    pub lease: u8,
    /// Worker crashes allowed on a path.
    pub crashes: u8,
    /// Ticks a completed record is kept (the TTL).
    pub ttl: u8,
    /// Seeded bug: `complete`, `extend` and `abandon` check neither the token nor the
    /// lease.
    pub no_fencing: bool,
    /// Seeded bug: the receiver does not stop its handler when its lease is lost.
    pub no_lease_keeping: bool,
}

/// The store's record of the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// No record (never begun, abandoned or expired).
    Absent,
    /// `State::InProgress { token, until }`: ticks left on the lease.
    InProgress {
        /// The holder's fencing token.
        token: u8,
        /// Ticks until the lease ends.
        left: u8,
    },
    /// `State::Completed { result, until }`: the result is the token of the run that
    /// made it.
    Completed {
        /// The result.
        result: u8,
        /// Ticks until the TTL ends (then the record expires: absent).
        left: u8,
    },
}

/// A worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Waiting for a copy.
    Idle,
    /// Holding the id: the handler runs (`keep_lease` beside it).
    Running {
        /// Its token.
        token: u8,
        /// Ticks its own view of the lease has left.
        held: u8,
    },
    /// The handler returned; `complete` to call.
    Finished {
        /// Its token.
        token: u8,
    },
}

/// The store, the workers and the ghosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupState {
    /// The record.
    pub record: Record,
    /// The next fencing token.
    pub next_token: u8,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Copies still to arrive, one per worker (each worker receives one copy).
    pub copies: Vec<bool>,
    /// Crashes left.
    pub crashes: u8,
    /// Ghost: the first result a completion wrote.
    pub first_result: Option<u8>,
    /// Ghost: a duplicate was answered with another result than the first.
    pub other_result: bool,
    /// Ghost: a completion by a token that no longer held the id applied.
    pub stale_completion: bool,
    /// Ghost: two handlers ran at once.
    pub concurrent: bool,
}

/// A step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DedupAction {
    /// Time passes.
    Tick,
    /// A copy arrives: `begin`.
    Begin(usize),
    /// The handler returns.
    Finish(usize),
    /// `keep_lease` → `extend`.
    Extend(usize),
    /// The lease is lost: the receiver drops the handler and frees nothing (the lease
    /// ends by itself).
    Stop(usize),
    /// `complete`.
    Complete(usize),
    /// The handler failed: `abandon`.
    Abandon(usize),
    /// The worker dies.
    Crash(usize),
}

impl DedupModel {
    /// Two workers, a three-tick lease, one crash: the bounds of the test command.
    pub fn small() -> Self {
        Self {
            workers: 2,
            lease: 3,
            ttl: 2,
            crashes: 1,
            no_fencing: false,
            no_lease_keeping: false,
        }
    }

    /// Three workers, two crashes.
    pub fn large() -> Self {
        Self {
            workers: 3,
            crashes: 2,
            ..Self::small()
        }
    }

    fn holds(&self, record: Record, token: u8) -> bool {
        match record {
            Record::InProgress { token: held, left } => {
                self.no_fencing || (held == token && left > 0)
            }
            _ => self.no_fencing,
        }
    }
}

impl Model for DedupModel {
    type State = DedupState;
    type Action = DedupAction;

    fn init_states(&self) -> Vec<DedupState> {
        vec![DedupState {
            record: Record::Absent,
            next_token: 1,
            workers: vec![Worker::Idle; self.workers],
            copies: vec![true; self.workers],
            crashes: self.crashes,
            first_result: None,
            other_result: false,
            stale_completion: false,
            concurrent: false,
        }]
    }

    fn actions(&self, state: &DedupState, actions: &mut Vec<DedupAction>) {
        let mut stop_pending = false;
        for (w, worker) in state.workers.iter().enumerate() {
            match *worker {
                Worker::Idle if state.copies[w] => actions.push(DedupAction::Begin(w)),
                Worker::Idle => {}
                Worker::Running { held, .. } => {
                    if held == 0 && !self.no_lease_keeping {
                        stop_pending = true;
                        actions.push(DedupAction::Stop(w));
                    } else {
                        actions.push(DedupAction::Finish(w));
                        actions.push(DedupAction::Abandon(w));
                        if held > 0 {
                            actions.push(DedupAction::Extend(w));
                        }
                    }
                }
                Worker::Finished { .. } => actions.push(DedupAction::Complete(w)),
            }
            if state.crashes > 0 && *worker != Worker::Idle {
                actions.push(DedupAction::Crash(w));
            }
        }
        let running = matches!(
            state.record,
            Record::InProgress { left, .. } | Record::Completed { left, .. } if left > 0
        ) || state
            .workers
            .iter()
            .any(|worker| matches!(worker, Worker::Running { held, .. } if *held > 0));
        if running && !stop_pending {
            actions.push(DedupAction::Tick);
        }
    }

    fn next_state(&self, last: &DedupState, action: DedupAction) -> Option<DedupState> {
        let mut state = last.clone();
        match action {
            DedupAction::Tick => {
                match &mut state.record {
                    Record::InProgress { left, .. } => *left = left.saturating_sub(1),
                    Record::Completed { left, .. } => {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            // The TTL ended: the id is free, and a new window begins.
                            state.record = Record::Absent;
                            state.first_result = None;
                        }
                    }
                    Record::Absent => {}
                }
                for worker in &mut state.workers {
                    if let Worker::Running { held, .. } = worker {
                        *held = held.saturating_sub(1);
                    }
                }
            }
            DedupAction::Begin(w) => match state.record {
                // `begin_sync`: free (absent, or its holder's lease ended) → Started.
                Record::Absent | Record::InProgress { left: 0, .. } => {
                    let token = state.next_token;
                    state.next_token += 1;
                    state.record = Record::InProgress {
                        token,
                        left: self.lease,
                    };
                    state.concurrent |= state
                        .workers
                        .iter()
                        .any(|worker| matches!(worker, Worker::Running { .. }));
                    state.copies[w] = false;
                    state.workers[w] = Worker::Running {
                        token,
                        held: self.lease - 1,
                    };
                }
                // In progress elsewhere: nacked, delivered again later (the copy stays).
                Record::InProgress { .. } => return None,
                Record::Completed { result, .. } => {
                    state.other_result |= state.first_result != Some(result);
                    state.copies[w] = false;
                }
            },
            DedupAction::Finish(w) => {
                let Worker::Running { token, .. } = state.workers[w] else {
                    return None;
                };
                state.workers[w] = Worker::Finished { token };
            }
            DedupAction::Extend(w) => {
                let Worker::Running { token, held } = &mut state.workers[w] else {
                    return None;
                };
                if self.holds(state.record, *token) {
                    state.record = Record::InProgress {
                        token: *token,
                        left: self.lease,
                    };
                    *held = self.lease - 1;
                } else {
                    *held = 0;
                }
            }
            DedupAction::Stop(w) => {
                // `keep_lease` drops the handler and the receiver abandons the id (its
                // lease, by the store's clock, has a tenth left); the copy comes again.
                let Worker::Running { token, .. } = state.workers[w] else {
                    return None;
                };
                if self.holds(state.record, token) {
                    state.record = Record::Absent;
                }
                state.workers[w] = Worker::Idle;
                state.copies[w] = true;
            }
            DedupAction::Complete(w) => {
                let Worker::Finished { token } = state.workers[w] else {
                    return None;
                };
                let live = matches!(state.record, Record::InProgress { token: held, left } if held == token && left > 0);
                if self.holds(state.record, token) {
                    state.stale_completion |= !live;
                    state.record = Record::Completed {
                        result: token,
                        left: self.ttl,
                    };
                    state.first_result.get_or_insert(token);
                    if state.first_result != Some(token) {
                        state.other_result = true;
                    }
                } else {
                    // `LeaseLost`: the receiver logs it and acks (`receiver.rs`): the
                    // effect ran and no result is kept, so a later copy would run it
                    // again, which guarantee 5 allows for effects outside the store.
                }
                state.workers[w] = Worker::Idle;
            }
            DedupAction::Abandon(w) => {
                let Worker::Running { token, .. } = state.workers[w] else {
                    return None;
                };
                if self.holds(state.record, token) {
                    state.record = Record::Absent;
                }
                state.copies[w] = true;
                state.workers[w] = Worker::Idle;
            }
            DedupAction::Crash(w) => {
                state.crashes -= 1;
                state.copies[w] = true;
                state.workers[w] = Worker::Idle;
            }
        }
        canonical_tokens(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one handler runs per id at a time",
                |_, state: &DedupState| !state.concurrent,
            ),
            Property::always(
                "a completion by a holder whose lease ended never applies",
                |_, state: &DedupState| !state.stale_completion,
            ),
            Property::always(
                "a duplicate within the TTL always sees the first result",
                |_, state: &DedupState| !state.other_result,
            ),
            Property::sometimes(
                "the holder's own view of its lease runs out while its handler runs",
                |_, state: &DedupState| {
                    state
                        .workers
                        .iter()
                        .any(|worker| matches!(worker, Worker::Running { held: 0, .. }))
                },
            ),
        ]
    }
}

/// Renumbers the tokens in the order they appear (the record, the workers, the first
/// result), from 1: tokens are only compared, so the state space stays finite.
fn canonical_tokens(state: &mut DedupState) {
    let mut seen: Vec<u8> = Vec::new();
    let mut note = |token: u8| {
        if !seen.contains(&token) {
            seen.push(token);
        }
    };
    match state.record {
        Record::InProgress { token, .. } => note(token),
        Record::Completed { result, .. } => note(result),
        Record::Absent => {}
    }
    for worker in &state.workers {
        match *worker {
            Worker::Running { token, .. } | Worker::Finished { token } => note(token),
            Worker::Idle => {}
        }
    }
    if let Some(first) = state.first_result {
        note(first);
    }
    let renumber = |token: u8| {
        seen.iter()
            .position(|&old| old == token)
            .map_or(0, |at| at as u8 + 1)
    };
    match &mut state.record {
        Record::InProgress { token, .. } => *token = renumber(*token),
        Record::Completed { result, .. } => *result = renumber(*result),
        Record::Absent => {}
    }
    for worker in &mut state.workers {
        match worker {
            Worker::Running { token, .. } | Worker::Finished { token } => *token = renumber(*token),
            Worker::Idle => {}
        }
    }
    state.first_result = state.first_result.map(renumber);
    state.next_token = seen.len() as u8 + 1;
}
