//! The transactional inbox: copies of one message delivered to several workers, each
//! recording the id and having the effect in one database transaction
//! (`TransactionalInbox::handle` in `crates/oncebox-core/src/consumer/transactional.rs`:
//! `begin_recorded` → the handler → `store_result` → `commit`; then the `Consumer`
//! acks). The record's unique key (`PRIMARY KEY (consumer, message_id)`) is what the
//! database serialises on: a second insert waits for the first transaction, then finds
//! the record (a duplicate) or, if it rolled back, takes the key itself.

use stateright::{Model, Property};

/// The bounds and the seeded bug of one check.
#[derive(Debug, Clone)]
pub struct InboxModel {
    /// Workers (consumer lanes or processes of one consumer name).
    pub workers: usize,
    /// Copies of the message the broker delivers (redeliveries and duplicates).
    pub copies: u8,
    /// Worker crashes allowed on a path (the transaction rolls back, the copy comes again).
    pub crashes: u8,
    /// Seeded bug: the record is committed in a transaction of its own before the
    /// handler runs, not in the handler's.
    pub record_outside_the_transaction: bool,
}

/// A worker's step in handling one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Waiting for a delivery.
    Idle,
    /// A copy received; the transaction not begun.
    Received,
    /// `begin_recorded`: the record inserted in the open transaction (the key is locked).
    Recorded,
    /// The handler's effect written in the open transaction.
    Effected,
    /// Committed (record and effect), not yet acked.
    Committed,
    /// A duplicate: the record was found committed; to be acked with the first result.
    Duplicate,
}

/// The database, the broker's undelivered copies and the workers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboxState {
    /// The committed record exists.
    pub recorded: bool,
    /// Committed effects.
    pub effects: u8,
    /// The worker whose open transaction holds the record's key, if any.
    pub key_holder: Option<usize>,
    /// Copies not delivered yet, or to be delivered again.
    pub undelivered: u8,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Crashes left.
    pub crashes: u8,
}

/// A step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxAction {
    /// The broker delivers a copy to the worker.
    Deliver(usize),
    /// `begin_recorded`: insert the record (waits while another transaction holds it).
    Record(usize),
    /// The handler's effect, in the transaction.
    Effect(usize),
    /// `commit`.
    Commit(usize),
    /// `Delivery::ack`.
    Ack(usize),
    /// The worker dies: its transaction rolls back, its copy is delivered again.
    Crash(usize),
}

impl InboxModel {
    /// Two workers, three copies, one crash: the bounds of the test command.
    pub fn small() -> Self {
        Self {
            workers: 2,
            copies: 3,
            crashes: 1,
            record_outside_the_transaction: false,
        }
    }

    /// Three workers, four copies, two crashes.
    pub fn large() -> Self {
        Self {
            workers: 3,
            copies: 4,
            crashes: 2,
            record_outside_the_transaction: false,
        }
    }
}

impl Model for InboxModel {
    type State = InboxState;
    type Action = InboxAction;

    fn init_states(&self) -> Vec<InboxState> {
        vec![InboxState {
            recorded: false,
            effects: 0,
            key_holder: None,
            undelivered: self.copies,
            workers: vec![Worker::Idle; self.workers],
            crashes: self.crashes,
        }]
    }

    fn actions(&self, state: &InboxState, actions: &mut Vec<InboxAction>) {
        for (w, worker) in state.workers.iter().enumerate() {
            match worker {
                Worker::Idle if state.undelivered > 0 => actions.push(InboxAction::Deliver(w)),
                Worker::Idle => {}
                Worker::Received if state.key_holder.is_none() => {
                    actions.push(InboxAction::Record(w))
                }
                Worker::Received => {}
                Worker::Recorded => actions.push(InboxAction::Effect(w)),
                Worker::Effected => actions.push(InboxAction::Commit(w)),
                Worker::Committed | Worker::Duplicate => actions.push(InboxAction::Ack(w)),
            }
            if state.crashes > 0 && *worker != Worker::Idle {
                actions.push(InboxAction::Crash(w));
            }
        }
    }

    fn next_state(&self, last: &InboxState, action: InboxAction) -> Option<InboxState> {
        let mut state = last.clone();
        match action {
            InboxAction::Deliver(w) => {
                state.undelivered -= 1;
                state.workers[w] = Worker::Received;
            }
            InboxAction::Record(w) => {
                if state.recorded {
                    state.workers[w] = Worker::Duplicate;
                } else if self.record_outside_the_transaction {
                    // The record commits at once, on its own.
                    state.recorded = true;
                    state.workers[w] = Worker::Recorded;
                } else {
                    state.key_holder = Some(w);
                    state.workers[w] = Worker::Recorded;
                }
            }
            InboxAction::Effect(w) => state.workers[w] = Worker::Effected,
            InboxAction::Commit(w) => {
                state.recorded = true;
                state.effects += 1;
                state.key_holder = None;
                state.workers[w] = Worker::Committed;
            }
            InboxAction::Ack(w) => state.workers[w] = Worker::Idle,
            InboxAction::Crash(w) => {
                state.crashes -= 1;
                if state.key_holder == Some(w) {
                    state.key_holder = None;
                }
                // Unacked: the broker delivers the copy again.
                state.undelivered += 1;
                state.workers[w] = Worker::Idle;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one committed effect per (consumer, id)",
                |_, state: &InboxState| state.effects <= 1,
            ),
            Property::eventually(
                "exactly one committed effect per (consumer, id)",
                |_, state: &InboxState| {
                    state.effects == 1
                        && state.undelivered == 0
                        && state.workers.iter().all(|worker| *worker == Worker::Idle)
                },
            ),
            Property::sometimes(
                "a duplicate waits for the first transaction",
                |_, state: &InboxState| {
                    state.key_holder.is_some()
                        && state
                            .workers
                            .iter()
                            .filter(|worker| **worker == Worker::Received)
                            .count()
                            > 0
                },
            ),
        ]
    }
}
