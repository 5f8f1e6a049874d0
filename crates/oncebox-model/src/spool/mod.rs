//! The spool's claim, lease, publish and settle protocol: relays over one outbox table.
//!
//! The store's side is the SQLite claims table (`crates/oncebox-sqlite/src/spool.rs`,
//! `SpoolTable`), whose rules PostgreSQL's leased claims and MySQL's claims table
//! share; the relay's side is the engine (`crates/oncebox-core/src/spool/`: `engine.rs`,
//! `dispatch.rs`, `loops.rs` and `lease.rs`). Time is kept relative: each lease holds
//! the ticks it has left, so the state space is finite and no time bound cuts a path
//! short.

use stateright::{Model, Property};

mod state;

pub use state::{Attempt, Claim, Relay, Row, SpoolAction, SpoolState};

/// A mistake the model can be told to make, to show that a property catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpoolBug {
    /// Settlements apply whether or not their claim still holds the rows (no fencing in
    /// `SpoolTable::apply`).
    NoFencing,
    /// The relay publishes without testing its lease (`dispatch_key`'s
    /// `lease.is_lost()` and `deliver`'s `lease.lost()` removed).
    NoLeaseTest,
    /// A settlement takes the rows out of the claim (freeing their keys) in one
    /// transaction and writes their outcome in a later one, which has no claim left to
    /// check against.
    ReleaseBeforeSettle,
    /// The claim takes rows behind an unclaimable row of their key (`claim_rows`'s
    /// per-key prefix test removed).
    NoKeyPrefix,
}

/// The bounds and the seeded bug of one check.
#[derive(Debug, Clone)]
pub struct SpoolModel {
    /// The ordering key of each committed row, in commit (`seq`) order.
    pub rows: Vec<u8>,
    /// Relay processes.
    pub relays: usize,
    /// Rows claimed at once (`SpoolOptions::batch_size`).
    pub batch: usize,
    /// Ticks a claim's lease lasts (`SpoolOptions::lease`); the relay counts its own
    /// lease one tick shorter (`Lease::keep`'s safety margin, a tenth of the lease).
    pub lease: u8,
    /// Relay crashes allowed on a path.
    pub crashes: u8,
    /// Failed publishes allowed on a path (transient broker errors: retried).
    pub failures: u8,
    /// The mistake to make, if any.
    pub bug: Option<SpoolBug>,
}

impl SpoolModel {
    /// Two keys (three rows), two relays, batches of two, a three-tick lease, one crash
    /// and one failed publish: the bounds of the test command.
    pub fn small() -> Self {
        Self {
            rows: vec![0, 1, 0],
            relays: 2,
            batch: 2,
            lease: 3,
            crashes: 1,
            failures: 1,
            bug: None,
        }
    }

    /// Three relays over four rows of two keys, two crashes: the larger bounds.
    pub fn large() -> Self {
        Self {
            rows: vec![0, 1, 0, 1],
            relays: 3,
            batch: 2,
            lease: 3,
            crashes: 2,
            failures: 1,
            bug: None,
        }
    }

    /// The same bounds with `bug` seeded.
    #[must_use]
    pub fn with_bug(mut self, bug: SpoolBug) -> Self {
        self.bug = Some(bug);
        self
    }

    fn has(&self, bug: SpoolBug) -> bool {
        self.bug == Some(bug)
    }

    /// The rows a claim takes now (`claim_rows`): pending rows in `seq` order, each
    /// claimable if no live claim holds it and no earlier pending row of its key is
    /// unclaimable, up to the batch size.
    fn claimable(&self, state: &SpoolState) -> Vec<u8> {
        let held: Vec<u8> = state
            .claims
            .iter()
            .filter(|claim| claim.left > 0)
            .flat_map(|claim| claim.seqs.iter().copied())
            .collect();
        let mut blocked: Vec<u8> = Vec::new();
        let mut taken = Vec::new();
        for (seq, row) in state.rows.iter().enumerate() {
            let seq = seq as u8;
            if row.done || taken.len() == self.batch {
                continue;
            }
            let behind = blocked.contains(&row.key) && !self.has(SpoolBug::NoKeyPrefix);
            if held.contains(&seq) || behind {
                blocked.push(row.key);
                continue;
            }
            taken.push(seq);
        }
        taken
    }
}

/// Publishes `seq` on the broker, noting a break of per-key order.
fn confirm(state: &mut SpoolState, seq: u8) {
    let key = state.rows[seq as usize].key;
    let earlier_unpublished = state.rows[..seq as usize]
        .iter()
        .enumerate()
        .any(|(earlier, row)| row.key == key && !state.broker[earlier]);
    state.order_broken |= earlier_unpublished;
    state.broker[seq as usize] = true;
}

/// Whether the batch's row at `index` may start: all earlier rows of its key in the
/// batch confirmed (`dispatch_key` goes on only after `Settle::Done`), none in flight.
fn may_start(
    model: &SpoolModel,
    state: &SpoolState,
    batch: &[(u8, Attempt)],
    index: usize,
) -> bool {
    let (seq, attempt) = batch[index];
    let key = state.rows[seq as usize].key;
    attempt == Attempt::Waiting
        && batch[..index]
            .iter()
            .filter(|(earlier, _)| state.rows[*earlier as usize].key == key)
            .all(|(_, attempt)| *attempt == Attempt::Done)
        && (model.batch > 0)
}

/// Whether every row of the batch has its outcome, or can have none but `Release`: the
/// batch may be settled (`dispatch` returns).
fn dispatched(state: &SpoolState, held: u8, batch: &[(u8, Attempt)]) -> bool {
    batch
        .iter()
        .enumerate()
        .all(|(index, (seq, attempt))| match attempt {
            Attempt::InFlight => false,
            Attempt::Waiting => {
                let key = state.rows[*seq as usize].key;
                held == 0
                    || batch[..index].iter().any(|(earlier, attempt)| {
                        state.rows[*earlier as usize].key == key
                            && matches!(attempt, Attempt::Retry | Attempt::Release)
                    })
            }
            _ => true,
        })
}

impl Model for SpoolModel {
    type State = SpoolState;
    type Action = SpoolAction;

    fn init_states(&self) -> Vec<SpoolState> {
        vec![SpoolState {
            rows: self
                .rows
                .iter()
                .map(|&key| Row {
                    key,
                    done: false,
                    claimed_by: None,
                })
                .collect(),
            claims: Vec::new(),
            relays: vec![Relay::Idle; self.relays],
            broker: vec![false; self.rows.len()],
            next_token: 1,
            crashes: self.crashes,
            failures: self.failures,
            order_broken: false,
            overlap: false,
            stale_settlement: false,
            taken_over: false,
            late_settlement: false,
        }]
    }

    fn actions(&self, state: &SpoolState, actions: &mut Vec<SpoolAction>) {
        // A lost lease cuts the publish under way at once (`deliver`'s select): time
        // does not pass while one is pending.
        let mut cut_pending = false;
        for (r, relay) in state.relays.iter().enumerate() {
            match relay {
                Relay::Idle => {
                    if !self.claimable(state).is_empty() {
                        actions.push(SpoolAction::Claim(r));
                    }
                }
                Relay::Holding { held, batch, .. } => {
                    let lease_test = !self.has(SpoolBug::NoLeaseTest);
                    for (index, (_, attempt)) in batch.iter().enumerate() {
                        if *attempt == Attempt::InFlight {
                            if *held == 0 && lease_test {
                                cut_pending = true;
                                actions.push(SpoolAction::Cut(r, index, false));
                                actions.push(SpoolAction::Cut(r, index, true));
                            } else {
                                actions.push(SpoolAction::Confirm(r, index));
                                if state.failures > 0 {
                                    actions.push(SpoolAction::Fail(r, index));
                                }
                            }
                        } else if (*held > 0 || !lease_test) && may_start(self, state, batch, index)
                        {
                            actions.push(SpoolAction::Publish(r, index));
                        }
                    }
                    if *held > 0 {
                        actions.push(SpoolAction::Extend(r));
                    }
                    if dispatched(state, if lease_test { *held } else { 1 }, batch) {
                        actions.push(SpoolAction::Settle(r));
                    }
                }
                Relay::Settling { .. } => actions.push(SpoolAction::WriteOutcomes(r)),
            }
            if state.crashes > 0 && *relay != Relay::Idle {
                actions.push(SpoolAction::Crash(r));
            }
        }
        let leases_running = state.claims.iter().any(|claim| claim.left > 0)
            || state
                .relays
                .iter()
                .any(|relay| matches!(relay, Relay::Holding { held, .. } if *held > 0));
        if leases_running && !cut_pending {
            actions.push(SpoolAction::Tick);
        }
    }

    fn next_state(&self, last: &SpoolState, action: SpoolAction) -> Option<SpoolState> {
        let mut state = last.clone();
        match action {
            SpoolAction::Tick => {
                for claim in &mut state.claims {
                    claim.left = claim.left.saturating_sub(1);
                }
                for relay in &mut state.relays {
                    if let Relay::Holding { held, .. } = relay {
                        *held = held.saturating_sub(1);
                    }
                }
            }
            SpoolAction::Claim(r) => {
                let seqs = self.claimable(&state);
                let token = state.next_token;
                state.next_token += 1;
                // `oncebox_outbox_claims_supersede`: inserting a claim deletes every
                // claim whose lease has ended.
                let superseded: Vec<u8> = state
                    .claims
                    .iter()
                    .filter(|claim| claim.left == 0)
                    .map(|claim| claim.token)
                    .collect();
                state.claims.retain(|claim| claim.left > 0);
                for relay in &state.relays {
                    if let Relay::Holding { token, .. } = relay {
                        state.taken_over |= superseded.contains(token);
                    }
                }
                for &seq in &seqs {
                    state.rows[seq as usize].claimed_by = Some(token);
                }
                state.claims.push(Claim {
                    token,
                    left: self.lease,
                    seqs: seqs.clone(),
                });
                state.relays[r] = Relay::Holding {
                    token,
                    held: self.lease - 1,
                    batch: seqs
                        .into_iter()
                        .map(|seq| (seq, Attempt::Waiting))
                        .collect(),
                };
            }
            SpoolAction::Publish(r, index) => {
                let key = {
                    let Relay::Holding { batch, .. } = &state.relays[r] else {
                        return None;
                    };
                    state.rows[batch[index].0 as usize].key
                };
                let elsewhere = state.relays.iter().enumerate().any(|(other, relay)| {
                    other != r
                        && matches!(relay, Relay::Holding { batch, .. } if batch.iter().any(|(seq, attempt)| {
                            *attempt == Attempt::InFlight && state.rows[*seq as usize].key == key
                        }))
                });
                state.overlap |= elsewhere;
                set_attempt(&mut state, r, index, Attempt::InFlight);
            }
            SpoolAction::Confirm(r, index) => {
                let seq = seq_of(&state, r, index)?;
                confirm(&mut state, seq);
                set_attempt(&mut state, r, index, Attempt::Done);
            }
            SpoolAction::Fail(r, index) => {
                state.failures -= 1;
                set_attempt(&mut state, r, index, Attempt::Retry);
            }
            SpoolAction::Cut(r, index, reached) => {
                if reached {
                    let seq = seq_of(&state, r, index)?;
                    confirm(&mut state, seq);
                }
                set_attempt(&mut state, r, index, Attempt::Release);
            }
            SpoolAction::Extend(r) => {
                let Relay::Holding { token, held, .. } = &mut state.relays[r] else {
                    return None;
                };
                // `extend`: `UPDATE … SET until = ? WHERE token = ? AND until > now`.
                match state
                    .claims
                    .iter_mut()
                    .find(|claim| claim.token == *token && claim.left > 0)
                {
                    Some(claim) => {
                        claim.left = self.lease;
                        *held = self.lease - 1;
                    }
                    None => *held = 0,
                }
            }
            SpoolAction::Settle(r) => {
                let Relay::Holding { token, batch, .. } = state.relays[r].clone() else {
                    return None;
                };
                let batch: Vec<(u8, Attempt)> = batch
                    .into_iter()
                    .map(|(seq, attempt)| match attempt {
                        Attempt::Waiting => (seq, Attempt::Release),
                        other => (seq, other),
                    })
                    .collect();
                if self.has(SpoolBug::ReleaseBeforeSettle) {
                    take_out_of_claim(&mut state, token, &batch);
                    state.relays[r] = Relay::Settling { token, batch };
                } else {
                    // `apply`: only rows the claim still holds are settled.
                    let claim = state.claims.iter().find(|claim| claim.token == token);
                    let holds: Vec<u8> = claim.map(|claim| claim.seqs.clone()).unwrap_or_default();
                    state.late_settlement |= claim.is_some_and(|claim| claim.left == 0)
                        && batch.iter().any(|(_, attempt)| *attempt == Attempt::Done);
                    for &(seq, attempt) in &batch {
                        if holds.contains(&seq) || self.has(SpoolBug::NoFencing) {
                            write_outcome(&mut state, token, seq, attempt);
                        }
                    }
                    take_out_of_claim(&mut state, token, &batch);
                    state.relays[r] = Relay::Idle;
                }
            }
            SpoolAction::WriteOutcomes(r) => {
                let Relay::Settling { token, batch } = state.relays[r].clone() else {
                    return None;
                };
                for (seq, attempt) in batch {
                    write_outcome(&mut state, token, seq, attempt);
                }
                state.relays[r] = Relay::Idle;
            }
            SpoolAction::Crash(r) => {
                state.crashes -= 1;
                state.relays[r] = Relay::Idle;
            }
        }
        canonical_tokens(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a row marked published was confirmed by the broker",
                |_, state: &SpoolState| {
                    state
                        .rows
                        .iter()
                        .enumerate()
                        .all(|(seq, row)| !row.done || state.broker[seq])
                },
            ),
            Property::always("per-key order", |_, state: &SpoolState| !state.order_broken),
            Property::always(
                "no key in flight on two relays at once",
                |_, state: &SpoolState| !state.overlap,
            ),
            Property::always(
                "a settlement never applies to a row another claim took since",
                |_, state: &SpoolState| !state.stale_settlement,
            ),
            Property::eventually(
                "every committed message is published",
                |_, state: &SpoolState| state.rows.iter().all(|row| row.done),
            ),
            Property::sometimes(
                "a claim is taken over while its relay holds it",
                |_, state: &SpoolState| state.taken_over,
            ),
            Property::sometimes(
                "a settlement after its lease ended, its rows untaken, applies",
                |_, state: &SpoolState| state.late_settlement,
            ),
        ]
    }
}

fn seq_of(state: &SpoolState, r: usize, index: usize) -> Option<u8> {
    match &state.relays[r] {
        Relay::Holding { batch, .. } => Some(batch[index].0),
        _ => None,
    }
}

fn set_attempt(state: &mut SpoolState, r: usize, index: usize, attempt: Attempt) {
    if let Relay::Holding { batch, .. } = &mut state.relays[r] {
        batch[index].1 = attempt;
    }
}

/// The settled rows leave the claim; a claim left empty is deleted.
fn take_out_of_claim(state: &mut SpoolState, token: u8, batch: &[(u8, Attempt)]) {
    if let Some(claim) = state.claims.iter_mut().find(|claim| claim.token == token) {
        claim
            .seqs
            .retain(|seq| !batch.iter().any(|(settled, _)| settled == seq));
    }
    state.claims.retain(|claim| !claim.seqs.is_empty());
}

/// Writes one settlement (`Done`: `status = 'done'`; `Retry`: the attempt counted, the
/// row pending; `Release`: nothing), noting one whose row another claim took since. As
/// every settle statement does (`… AND status = 'pending'`), a done row is left alone.
fn write_outcome(state: &mut SpoolState, token: u8, seq: u8, attempt: Attempt) {
    let row = &mut state.rows[seq as usize];
    if row.done || attempt == Attempt::Release {
        return;
    }
    if row.claimed_by != Some(token) {
        state.stale_settlement = true;
    }
    if attempt == Attempt::Done {
        row.done = true;
    }
    // A retried row stays pending, due again after its backoff (which the model does
    // not count).
}

/// Renumbers the claim tokens in the order they appear (claims, relays, rows), from 1:
/// tokens are only ever compared, so states that differ by their numbering alone are
/// one state, and the state space stays finite however many claims a path makes.
fn canonical_tokens(state: &mut SpoolState) {
    let mut seen: Vec<u8> = Vec::new();
    let mut note = |token: u8| {
        if !seen.contains(&token) {
            seen.push(token);
        }
    };
    state.claims.iter().for_each(|claim| note(claim.token));
    for relay in &state.relays {
        match relay {
            Relay::Holding { token, .. } | Relay::Settling { token, .. } => note(*token),
            Relay::Idle => {}
        }
    }
    state
        .rows
        .iter()
        .filter_map(|row| row.claimed_by)
        .for_each(&mut note);
    let renumber = |token: u8| {
        seen.iter()
            .position(|&old| old == token)
            .map_or(0, |at| at as u8 + 1)
    };
    for claim in &mut state.claims {
        claim.token = renumber(claim.token);
    }
    for relay in &mut state.relays {
        match relay {
            Relay::Holding { token, .. } | Relay::Settling { token, .. } => {
                *token = renumber(*token)
            }
            Relay::Idle => {}
        }
    }
    for row in &mut state.rows {
        row.claimed_by = row.claimed_by.map(renumber);
    }
    state.next_token = seen.len() as u8 + 1;
}
