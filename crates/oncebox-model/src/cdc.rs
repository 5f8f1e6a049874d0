//! The log-tailing (CDC) relay's confirm rule: which position of the replication slot
//! the relay may confirm, so that a restart re-reads everything the broker has not
//! confirmed, and an idle outbox does not pin the WAL.
//!
//! The relay's side is `crates/oncebox-postgres/src/cdc/session.rs` (`Session::read` on
//! Begin, Message and Commit events, `Session::start`, `Session::settle` after the
//! broker's confirm, `Session::advance`, `Session::confirm` → `update_applied_lsn`) and
//! its bookkeeping `crates/oncebox-postgres/src/cdc/progress.rs` (`Progress`: `begin`,
//! `add`, `commit`, `done`, `advance`), mirrored here by [`Progress`]. The modelled rule
//! is messages mode's: a position is confirmed as soon as it is confirmable, which
//! happens when a publish settles and when a Commit is read.
//!
//! A position is a commit count: the end of the WAL's commit `c` is position `c + 1`,
//! and a slot confirmed at `p` hands a new reader the commits from `p` on.

use stateright::{Model, Property};

/// A mistake the model can be told to make, to show that a property catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdcBug {
    /// The confirmable position is recomputed (`Progress::advance`) only when a publish
    /// settles, never when a Commit is read: a commit with no messages read after the
    /// last settlement is never confirmed (an idle outbox pins the WAL). The relay's
    /// rule until its Commit event called `Session::advance` too.
    ConfirmOnlyOnSettle,
    /// A commit is confirmed as soon as its Commit is read, before the broker confirmed
    /// its messages.
    ConfirmAtCommit,
    /// `advance` moves past every finished commit, not only those at the front: a done
    /// commit is confirmed while an earlier one still has messages out.
    NoFrontWait,
    /// Every message is published at once, without waiting behind its key's message in
    /// flight (`Session::start`'s per-key queue removed).
    NoKeyQueue,
}

/// The bounds and the seeded bug of one check.
#[derive(Debug, Clone)]
pub struct CdcModel {
    /// The producers' commits, in commit order: each the keys of its messages (none: a
    /// transaction on another table).
    pub commits: Vec<Vec<u8>>,
    /// Heartbeats the relay may emit on a path (each an empty commit in the WAL).
    pub heartbeats: u8,
    /// Relay crashes allowed on a path.
    pub crashes: u8,
    /// Messages in flight or waiting before the relay stops reading
    /// (`CdcOptions::max_in_flight`).
    pub max_in_flight: usize,
    /// The mistake to make, if any.
    pub bug: Option<CdcBug>,
}

/// One commit in the WAL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WalCommit {
    /// The key of each of its messages, in order.
    pub keys: Vec<u8>,
    /// Ghost: whether the broker confirmed each message at least once, ever.
    pub published: Vec<bool>,
}

/// A commit in `Progress`'s window (`Pending`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pending {
    /// Where it ends, once its Commit was read.
    pub end: Option<u8>,
    /// Its messages the broker has not confirmed yet.
    pub outstanding: u8,
}

/// `Progress`: the commits read and not yet confirmable, in commit order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Progress {
    /// The window.
    pub commits: Vec<Pending>,
    /// The WAL index of the window's first commit.
    pub first: u8,
    /// The confirmable position reached.
    pub confirmed: u8,
}

/// A message started (`Job`): in flight if it is the first of its key, else waiting
/// behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Job {
    /// Its commit's WAL index.
    pub commit: u8,
    /// Its index in the commit.
    pub index: u8,
    /// Its key.
    pub key: u8,
}

/// One replication session of the relay (`Session`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Session {
    /// The WAL index of the commit being read, or next to be read.
    pub commit: u8,
    /// The next event of that commit: 0 its Begin, `1..=n` its messages, `n + 1` its
    /// Commit.
    pub event: u8,
    /// The bookkeeping.
    pub progress: Progress,
    /// Messages started and not settled, in start (commit) order (`unsettled`, the
    /// in-flight set and the per-key `waiting` queues).
    pub jobs: Vec<Job>,
    /// The position handed to `update_applied_lsn`, which the next status update
    /// reports.
    pub applied: u8,
}

/// The WAL, the slot, the relay and the broker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CdcState {
    /// The WAL's commits.
    pub wal: Vec<WalCommit>,
    /// The producers' commits in the WAL so far.
    pub produced: u8,
    /// Heartbeats left.
    pub heartbeats: u8,
    /// Crashes left.
    pub crashes: u8,
    /// The slot's `confirmed_flush`, where a new session starts.
    pub slot_confirmed: u8,
    /// The relay's session.
    pub session: Session,
    /// Ghost: the broker confirmed a message while an earlier message of its key in the
    /// same session was unsettled.
    pub session_order_broken: bool,
    /// Ghost: a message reached the broker for the first time before an earlier
    /// message of its key ever had.
    pub first_order_broken: bool,
    /// Ghost: the broker confirmed a message it had confirmed before.
    pub republished: bool,
    /// Ghost: the broker confirmed a message while one of an earlier commit was still
    /// unsettled.
    pub overtaken: bool,
}

/// A step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdcAction {
    /// The next producer's transaction commits.
    Produce,
    /// The relay emits a heartbeat: an empty commit.
    Heartbeat,
    /// `client.recv()` → `Session::read`: the relay reads the next event.
    Read,
    /// The broker confirms the publish of commit `.0`'s message `.1` →
    /// `Session::settle`.
    BrokerConfirm(u8, u8),
    /// A status update reports the applied position: the slot's `confirmed_flush`.
    Feedback,
    /// The relay dies; a new session starts from the slot's confirmed position.
    Crash,
}

impl CdcModel {
    /// A commit with messages of keys 0 and 1, a transaction on another table, a
    /// message of key 1, two of key 0, another table's transaction; two heartbeats, two
    /// crashes, three messages in flight: the bounds of the test command.
    pub fn small() -> Self {
        Self {
            commits: vec![vec![0, 1], vec![], vec![1], vec![0, 0], vec![]],
            heartbeats: 2,
            crashes: 2,
            max_in_flight: 3,
            bug: None,
        }
    }

    /// A message of key 0, a commit with messages of keys 1 and 0, another table's
    /// transaction; one heartbeat, one crash, two messages in flight: a world where
    /// every seeded bug shows, small enough for the shortest counterexamples to be
    /// found quickly.
    pub fn tiny() -> Self {
        Self {
            commits: vec![vec![0], vec![1, 0], vec![]],
            heartbeats: 1,
            crashes: 1,
            max_in_flight: 2,
            bug: None,
        }
    }

    /// Six commits over three keys, two heartbeats, three crashes, four messages in
    /// flight: the larger bounds.
    pub fn large() -> Self {
        Self {
            commits: vec![vec![0, 1], vec![], vec![1, 2], vec![0, 0], vec![2], vec![]],
            heartbeats: 2,
            crashes: 3,
            max_in_flight: 4,
            bug: None,
        }
    }

    /// The same bounds with `bug` seeded.
    #[must_use]
    pub fn with_bug(mut self, bug: CdcBug) -> Self {
        self.bug = Some(bug);
        self
    }

    fn has(&self, bug: CdcBug) -> bool {
        self.bug == Some(bug)
    }

    /// `Progress::advance`: moves past the finished commits at the front (with
    /// [`CdcBug::NoFrontWait`], past every finished commit); the new confirmable
    /// position, if it moved.
    fn advance(&self, progress: &mut Progress) -> Option<u8> {
        let before = progress.confirmed;
        if self.has(CdcBug::NoFrontWait) {
            for pending in &progress.commits {
                if let Pending {
                    end: Some(end),
                    outstanding: 0,
                } = pending
                {
                    progress.confirmed = progress.confirmed.max(*end);
                }
            }
        }
        while let Some(Pending {
            end: Some(end),
            outstanding: 0,
        }) = progress.commits.first()
        {
            progress.confirmed = progress.confirmed.max(*end);
            progress.commits.remove(0);
            progress.first += 1;
        }
        (progress.confirmed > before).then_some(progress.confirmed)
    }

    /// `advance`, then `confirm`: messages mode hands the new position to the client
    /// at once.
    fn advance_and_confirm(&self, session: &mut Session) {
        if let Some(confirmable) = self.advance(&mut session.progress) {
            session.applied = session.applied.max(confirmable);
        }
    }

    /// Whether the relay has nothing left to do but crash: every commit made and read,
    /// every message settled, every confirmation reported.
    fn idle(&self, state: &CdcState) -> bool {
        usize::from(state.produced) == self.commits.len()
            && state.heartbeats == 0
            && usize::from(state.session.commit) == state.wal.len()
            && state.session.jobs.is_empty()
            && state.session.applied == state.slot_confirmed
    }

    /// Whether the job at `at` is in flight: the first unsettled message of its key
    /// (`Session::start` queues the others behind it).
    fn in_flight(&self, jobs: &[Job], at: usize) -> bool {
        self.has(CdcBug::NoKeyQueue) || jobs[..at].iter().all(|job| job.key != jobs[at].key)
    }
}

impl Progress {
    /// The commit's entry in the window (`Progress::get`).
    fn get(&mut self, commit: u8) -> Option<&mut Pending> {
        let index = commit.checked_sub(self.first)?;
        self.commits.get_mut(usize::from(index))
    }
}

/// A new session of a relay that starts reading at the slot's confirmed position.
fn fresh_session(slot_confirmed: u8) -> Session {
    Session {
        commit: slot_confirmed,
        event: 0,
        progress: Progress {
            commits: Vec::new(),
            first: slot_confirmed,
            confirmed: 0,
        },
        jobs: Vec::new(),
        applied: slot_confirmed,
    }
}

impl Model for CdcModel {
    type State = CdcState;
    type Action = CdcAction;

    fn init_states(&self) -> Vec<CdcState> {
        vec![CdcState {
            wal: Vec::new(),
            produced: 0,
            heartbeats: self.heartbeats,
            crashes: self.crashes,
            slot_confirmed: 0,
            session: fresh_session(0),
            session_order_broken: false,
            first_order_broken: false,
            republished: false,
            overtaken: false,
        }]
    }

    fn actions(&self, state: &CdcState, actions: &mut Vec<CdcAction>) {
        if usize::from(state.produced) < self.commits.len() {
            actions.push(CdcAction::Produce);
        }
        if state.heartbeats > 0 {
            actions.push(CdcAction::Heartbeat);
        }
        let session = &state.session;
        // `client.recv()` is polled only while `unsettled < max_in_flight`.
        if usize::from(session.commit) < state.wal.len() && session.jobs.len() < self.max_in_flight
        {
            actions.push(CdcAction::Read);
        }
        for (at, job) in session.jobs.iter().enumerate() {
            if self.in_flight(&session.jobs, at) {
                actions.push(CdcAction::BrokerConfirm(job.commit, job.index));
            }
        }
        if session.applied > state.slot_confirmed {
            actions.push(CdcAction::Feedback);
        }
        // A crash of a session that has read, started and confirmed nothing changes
        // nothing but the budget: left out, to keep the state space small.
        if state.crashes > 0 && *session != fresh_session(state.slot_confirmed) {
            actions.push(CdcAction::Crash);
        }
    }

    fn next_state(&self, last: &CdcState, action: CdcAction) -> Option<CdcState> {
        let mut state = last.clone();
        match action {
            CdcAction::Produce => {
                let keys = self.commits.get(usize::from(state.produced))?.clone();
                state.produced += 1;
                state.wal.push(WalCommit {
                    published: vec![false; keys.len()],
                    keys,
                });
            }
            CdcAction::Heartbeat => {
                state.heartbeats -= 1;
                state.wal.push(WalCommit {
                    keys: Vec::new(),
                    published: Vec::new(),
                });
            }
            CdcAction::Read => self.read(&mut state)?,
            CdcAction::BrokerConfirm(commit, index) => self.settle(&mut state, commit, index)?,
            CdcAction::Feedback => {
                state.slot_confirmed = state.slot_confirmed.max(state.session.applied);
            }
            CdcAction::Crash => {
                state.crashes -= 1;
                state.session = fresh_session(state.slot_confirmed);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "nothing is confirmed before the broker confirmed every message at or before it",
                |_, state: &CdcState| {
                    state.wal[..usize::from(state.slot_confirmed)]
                        .iter()
                        .all(|commit| commit.published.iter().all(|&published| published))
                },
            ),
            Property::eventually(
                "every finished commit is confirmed",
                |model: &CdcModel, state: &CdcState| {
                    // Once no commit can join the WAL, a confirmed position at its end
                    // stays there: the condition, once met, holds on every longer path.
                    usize::from(state.produced) == model.commits.len()
                        && state.heartbeats == 0
                        && usize::from(state.slot_confirmed) == state.wal.len()
                },
            ),
            Property::always(
                "an idle relay has confirmed every commit",
                |model: &CdcModel, state: &CdcState| {
                    !model.idle(state) || usize::from(state.slot_confirmed) == state.wal.len()
                },
            ),
            Property::always("per-key order within a session", |_, state: &CdcState| {
                !state.session_order_broken
            }),
            Property::always("per-key order of first publishes", |_, state: &CdcState| {
                !state.first_order_broken
            }),
            Property::sometimes(
                "a message is published again after a crash",
                |_, state: &CdcState| state.republished,
            ),
            Property::sometimes(
                "the broker confirms a message before one of an earlier commit",
                |_, state: &CdcState| state.overtaken,
            ),
        ]
    }
}

impl CdcModel {
    /// `Session::read`: the next event of the commit under the cursor.
    fn read(&self, state: &mut CdcState) -> Option<()> {
        let session = &mut state.session;
        let commit = session.commit;
        let keys = &state.wal.get(usize::from(commit))?.keys;
        let messages = keys.len() as u8;
        let end = commit + 1;
        if session.event == 0 {
            // Begin: `progress.begin()`.
            session.progress.commits.push(Pending {
                end: None,
                outstanding: 0,
            });
            session.event = 1;
        } else if session.event <= messages {
            // A message: `Session::start` → `progress.add`.
            let index = session.event - 1;
            if let Some(pending) = session.progress.get(commit) {
                pending.outstanding += 1;
            }
            session.jobs.push(Job {
                commit,
                index,
                key: keys[usize::from(index)],
            });
            session.event += 1;
        } else {
            // Commit: `progress.commit(open.commit, end_lsn)`.
            if let Some(pending) = session.progress.get(commit) {
                pending.end = Some(end);
            }
            if self.has(CdcBug::ConfirmAtCommit) {
                session.applied = session.applied.max(end);
            } else if !self.has(CdcBug::ConfirmOnlyOnSettle) {
                self.advance_and_confirm(session);
            }
            session.commit += 1;
            session.event = 0;
        }
        Some(())
    }

    /// The broker confirms a message in flight: `Session::settle` moves its key on,
    /// `progress.done`, then `Session::advance` (and `confirm`).
    fn settle(&self, state: &mut CdcState, commit: u8, index: u8) -> Option<()> {
        let at = state
            .session
            .jobs
            .iter()
            .position(|job| job.commit == commit && job.index == index)?;
        let job = state.session.jobs.remove(at);
        let earlier = &state.session.jobs[..at];
        state.session_order_broken |= earlier.iter().any(|other| other.key == job.key);
        state.overtaken |= earlier.iter().any(|other| other.commit < job.commit);
        let first_time = !state.wal[usize::from(commit)].published[usize::from(index)];
        if first_time {
            let unpublished_before = state.wal[..=usize::from(commit)]
                .iter()
                .enumerate()
                .flat_map(|(c, wal_commit)| {
                    wal_commit
                        .keys
                        .iter()
                        .zip(&wal_commit.published)
                        .enumerate()
                        .map(move |(i, (key, published))| (c, i, *key, *published))
                })
                .any(|(c, i, key, published)| {
                    key == job.key && !published && (c, i) < (commit.into(), index.into())
                });
            state.first_order_broken |= unpublished_before;
        }
        state.republished |= !first_time;
        state.wal[usize::from(commit)].published[usize::from(index)] = true;
        if let Some(pending) = state.session.progress.get(commit) {
            pending.outstanding = pending.outstanding.saturating_sub(1);
        }
        self.advance_and_confirm(&mut state.session);
        Some(())
    }
}
