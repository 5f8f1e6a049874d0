//! What a subscriber holds: the records it fetched and has not settled, per partition,
//! and when each of them is due (again).
//!
//! Kafka itself only knows a committed offset per partition. Everything a broker with
//! acks does per message happens here: a record fetched is *waiting* (due at a time:
//! now, or after a nack's delay) or *out* (handed to the application, with a lease
//! ending at the ack timeout, after which it is due again), until it is settled. The
//! offset the subscriber may commit is the lowest offset it has not settled: only the
//! contiguous settled prefix of a partition is ever committed, so everything after it is
//! redelivered after a crash or a rebalance.
//!
//! Both kinds of deadline live on one timeline ordered by time, then by a ticket that
//! grows with every insertion, so that records due at the same instant come out in the
//! order they were fetched: that keeps each partition (so each key) in order.
//!
//! Partitions are numbered by *generation*: every assignment of a partition gets a new
//! one, and a delivery carries the generation it was handed out in, so that settling
//! it after the partition was revoked (and maybe assigned again) changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::Received;
use tokio::time::Instant;

use super::record::Record;

/// A Kafka partition number.
pub(super) type Partition = i32;
/// A Kafka offset.
pub(super) type Offset = i64;

/// A point on the timeline: when, then in which order.
type Slot = (Instant, u64);

enum Event {
    /// The record is due for (re)delivery.
    Due(Partition, Offset),
    /// The lease of the record's delivery ends: it was not settled in time.
    LeaseEnds(Partition, Offset),
}

enum Status {
    /// Due at the slot (which is on the timeline).
    Waiting(Slot),
    /// Handed out as delivery `token`; due again when the lease slot comes.
    Out { token: u64, ends: Slot },
    /// Being written to the dead-letter topic by the subscriber itself (a record it
    /// cannot decode); never handed out.
    DeadLettering,
}

struct Entry {
    record: Arc<Record>,
    status: Status,
    /// Deliveries made by this subscriber (during this assignment).
    deliveries: u32,
}

struct PartitionState {
    generation: u64,
    entries: BTreeMap<Offset, Entry>,
    /// The offset after the last record fetched.
    next_fetch: Option<Offset>,
    /// The last offset handed to the consumer for committing (at first, the offset the
    /// assignment started at).
    stored: Option<Offset>,
}

/// Identifies one delivery: which record, in which assignment, which lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket {
    pub(super) partition: Partition,
    pub(super) offset: Offset,
    pub(super) generation: u64,
    pub(super) token: u64,
}

/// A delivery for the subscriber that asked.
pub(super) struct Handout {
    pub(super) ticket: Ticket,
    pub(super) received: Received,
    pub(super) record: Arc<Record>,
}

/// The answer to a subscriber asking for a delivery.
pub(super) enum Poll {
    Ready(Box<Handout>),
    /// Nothing now; something is due at this instant (or whenever the state changes).
    Wait(Option<Instant>),
}

/// What became of a fetched record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Added {
    /// Waiting for a subscriber.
    Queued,
    /// It cannot be decoded: the subscriber dead-letters it (generation attached).
    DeadLetter(u64),
    /// Its partition is not assigned (any more): dropped, its next owner fetches it.
    Ignored,
}

/// A subscriber's records and deliveries.
pub(super) struct State {
    ack_timeout: Duration,
    partitions: HashMap<Partition, PartitionState>,
    timeline: BTreeMap<Slot, Event>,
    tickets: u64,
    generations: u64,
    buffered: usize,
}

impl State {
    pub(super) fn new(ack_timeout: Duration) -> Self {
        Self {
            ack_timeout,
            partitions: HashMap::new(),
            timeline: BTreeMap::new(),
            tickets: 0,
            generations: 0,
            buffered: 0,
        }
    }

    /// Starts a new generation for each of `partitions` (just assigned).
    pub(super) fn assign(&mut self, partitions: impl IntoIterator<Item = Partition>) {
        for partition in partitions {
            self.revoke([partition]);
            self.generations += 1;
            self.partitions.insert(
                partition,
                PartitionState {
                    generation: self.generations,
                    entries: BTreeMap::new(),
                    next_fetch: None,
                    stored: None,
                },
            );
        }
    }

    /// Forgets `partitions` (revoked or lost): their records go to their next owner.
    pub(super) fn revoke(&mut self, partitions: impl IntoIterator<Item = Partition>) {
        let mut revoked = Vec::new();
        for partition in partitions {
            if let Some(state) = self.partitions.remove(&partition) {
                self.buffered -= state.entries.len();
                revoked.push(partition);
            }
        }
        if !revoked.is_empty() {
            self.timeline.retain(|_, event| {
                let (Event::Due(partition, _) | Event::LeaseEnds(partition, _)) = event;
                !revoked.contains(partition)
            });
        }
    }

    /// Forgets every partition.
    pub(super) fn revoke_all(&mut self) {
        let all: Vec<Partition> = self.partitions.keys().copied().collect();
        self.revoke(all);
    }

    /// The partitions assigned now.
    pub(super) fn assigned(&self) -> Vec<Partition> {
        let mut partitions: Vec<Partition> = self.partitions.keys().copied().collect();
        partitions.sort_unstable();
        partitions
    }

    /// The generation of `partition`, if it is assigned.
    pub(super) fn generation_of(&self, partition: Partition) -> Option<u64> {
        self.partitions
            .get(&partition)
            .map(|state| state.generation)
    }

    /// Records fetched and not settled.
    pub(super) fn buffered(&self) -> usize {
        self.buffered
    }

    /// Takes a record just fetched.
    pub(super) fn add(&mut self, record: Record, now: Instant) -> (Added, Arc<Record>) {
        let record = Arc::new(record);
        let (partition, offset) = (record.partition, record.offset);
        let Some(state) = self.partitions.get_mut(&partition) else {
            return (Added::Ignored, record);
        };
        if state.entries.contains_key(&offset) || state.next_fetch.is_some_and(|next| offset < next)
        {
            // Fetched again (the consumer went back): it is, or was, here already.
            return (Added::Ignored, record);
        }
        // The first record of an assignment is where the consumer started (the
        // committed offset): nothing below it needs storing.
        state.stored.get_or_insert(offset);
        state.next_fetch = Some(offset + 1);
        let generation = state.generation;
        let (status, added) = if record.received.is_ok() {
            self.tickets += 1;
            let slot = (now, self.tickets);
            self.timeline.insert(slot, Event::Due(partition, offset));
            (Status::Waiting(slot), Added::Queued)
        } else {
            (Status::DeadLettering, Added::DeadLetter(generation))
        };
        state.entries.insert(
            offset,
            Entry {
                record: Arc::clone(&record),
                status,
                deliveries: 0,
            },
        );
        self.buffered += 1;
        (added, record)
    }

    /// Hands out the next due record, if any.
    pub(super) fn poll(&mut self, now: Instant) -> Poll {
        loop {
            let Some(entry) = self.timeline.first_entry() else {
                return Poll::Wait(None);
            };
            let slot = *entry.key();
            if slot.0 > now {
                return Poll::Wait(Some(slot.0));
            }
            let (partition, offset) = match entry.remove() {
                Event::Due(partition, offset) | Event::LeaseEnds(partition, offset) => {
                    (partition, offset)
                }
            };
            if let Some(handout) = self.hand_out(partition, offset, slot, now) {
                return Poll::Ready(Box::new(handout));
            }
        }
    }

    /// Hands out the record whose timeline slot `slot` just came, if it is still there.
    fn hand_out(
        &mut self,
        partition: Partition,
        offset: Offset,
        slot: Slot,
        now: Instant,
    ) -> Option<Handout> {
        self.tickets += 1;
        let token = self.tickets;
        let ends = (now + self.ack_timeout, token);
        let state = self.partitions.get_mut(&partition)?;
        let entry = state.entries.get_mut(&offset)?;
        let current = match entry.status {
            Status::Waiting(due) => due == slot,
            Status::Out { ends, .. } => ends == slot,
            Status::DeadLettering => false,
        };
        if !current {
            return None;
        }
        entry.status = Status::Out { token, ends };
        entry.deliveries = entry.deliveries.saturating_add(1);
        let mut received = entry.record.received.as_ref().ok()?.clone();
        received.delivery_count = entry.deliveries;
        let ticket = Ticket {
            partition,
            offset,
            generation: state.generation,
            token,
        };
        let record = Arc::clone(&entry.record);
        self.timeline
            .insert(ends, Event::LeaseEnds(partition, offset));
        Some(Handout {
            ticket,
            received,
            record,
        })
    }

    /// Settles a record for good (acked or dead-lettered) if it is still unsettled in
    /// the delivery's generation, whichever delivery of it this was: a late ack of an
    /// earlier delivery is as good as any. Returns the offset to commit for its
    /// partition, if that moved.
    pub(super) fn settle(
        &mut self,
        partition: Partition,
        offset: Offset,
        generation: u64,
    ) -> Option<Offset> {
        let state = self.partitions.get_mut(&partition)?;
        if state.generation != generation {
            return None;
        }
        let entry = state.entries.remove(&offset)?;
        self.buffered -= 1;
        match entry.status {
            Status::Waiting(slot) | Status::Out { ends: slot, .. } => {
                self.timeline.remove(&slot);
            }
            Status::DeadLettering => {}
        }
        let commit = state
            .entries
            .first_key_value()
            .map(|(offset, _)| *offset)
            .or(state.next_fetch)?;
        if state.stored.is_some_and(|stored| stored >= commit) {
            return None;
        }
        state.stored = Some(commit);
        Some(commit)
    }

    /// Ends delivery `ticket` and makes its record due after `delay`. Returns false,
    /// changing nothing, if the delivery is no longer the current one (its lease ended,
    /// the record was settled, the partition was revoked).
    pub(super) fn nack(&mut self, ticket: Ticket, delay: Duration, now: Instant) -> bool {
        let Some(state) = self.partitions.get_mut(&ticket.partition) else {
            return false;
        };
        if state.generation != ticket.generation {
            return false;
        }
        let Some(entry) = state.entries.get_mut(&ticket.offset) else {
            return false;
        };
        let Status::Out { token, ends } = entry.status else {
            return false;
        };
        if token != ticket.token {
            return false;
        }
        self.timeline.remove(&ends);
        self.tickets += 1;
        let slot = (now + delay, self.tickets);
        self.timeline
            .insert(slot, Event::Due(ticket.partition, ticket.offset));
        entry.status = Status::Waiting(slot);
        true
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::{Bytes, Coordinates};

    use super::*;

    const ACK_TIMEOUT: Duration = Duration::from_secs(10);

    fn record(partition: Partition, offset: Offset) -> Record {
        Record {
            partition,
            offset,
            received: Ok(Received {
                id: None,
                topic: "t".into(),
                key: None,
                kind: String::new(),
                headers: oncebox_core::Headers::new(),
                payload: Bytes::from(offset.to_string()),
                created_at: None,
                coordinates: Coordinates::default(),
                delivery_count: 1,
            }),
            key: None,
            payload: Bytes::new(),
            headers: None,
        }
    }

    fn undecodable(partition: Partition, offset: Offset) -> Record {
        Record {
            received: Err("bad header".into()),
            ..record(partition, offset)
        }
    }

    fn take(state: &mut State, now: Instant) -> Handout {
        match state.poll(now) {
            Poll::Ready(handout) => *handout,
            Poll::Wait(until) => panic!("nothing due (next at {until:?})"),
        }
    }

    fn nothing(state: &mut State, now: Instant) -> Option<Instant> {
        match state.poll(now) {
            Poll::Ready(handout) => {
                panic!("unexpected delivery of offset {}", handout.ticket.offset)
            }
            Poll::Wait(until) => until,
        }
    }

    #[test]
    fn hands_out_in_fetch_order_and_commits_the_settled_prefix() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0]);
        for offset in 0..3 {
            assert_eq!(state.add(record(0, offset), now).0, Added::Queued);
        }
        let handouts: Vec<Handout> = (0..3).map(|_| take(&mut state, now)).collect();
        let offsets: Vec<Offset> = handouts.iter().map(|h| h.ticket.offset).collect();
        assert_eq!(offsets, [0, 1, 2]);
        let generation = handouts[0].ticket.generation;
        // Settling 1 first commits nothing: 0 is still open.
        assert_eq!(state.settle(0, 1, generation), None);
        assert_eq!(state.settle(0, 0, generation), Some(2));
        assert_eq!(state.settle(0, 2, generation), Some(3));
        assert_eq!(state.buffered(), 0);
        assert_eq!(nothing(&mut state, now), None);
    }

    #[test]
    fn an_unsettled_delivery_comes_back_after_the_ack_timeout_counted() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0]);
        state.add(record(0, 7), now);
        let first = take(&mut state, now);
        assert_eq!(first.received.delivery_count, 1);
        assert_eq!(nothing(&mut state, now), Some(now + ACK_TIMEOUT));
        let again = take(&mut state, now + ACK_TIMEOUT);
        assert_eq!(again.received.delivery_count, 2);
        // The first delivery's nack is stale; its ack still settles the record.
        assert!(!state.nack(first.ticket, Duration::ZERO, now + ACK_TIMEOUT));
        assert_eq!(state.settle(0, 7, first.ticket.generation), Some(8));
        assert!(!state.nack(again.ticket, Duration::ZERO, now + ACK_TIMEOUT));
        assert_eq!(state.settle(0, 7, again.ticket.generation), None);
        assert_eq!(nothing(&mut state, now + ACK_TIMEOUT * 3), None);
    }

    #[test]
    fn a_nack_makes_the_record_due_after_its_delay() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0]);
        state.add(record(0, 0), now);
        let first = take(&mut state, now);
        let delay = Duration::from_secs(2);
        assert!(state.nack(first.ticket, delay, now));
        assert_eq!(
            nothing(&mut state, now + Duration::from_secs(1)),
            Some(now + delay)
        );
        let again = take(&mut state, now + delay);
        assert_eq!(again.ticket.offset, 0);
        assert_eq!(again.received.delivery_count, 2);
    }

    #[test]
    fn a_revoked_partition_is_forgotten_and_late_settlements_change_nothing() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0, 1]);
        state.add(record(0, 0), now);
        state.add(record(1, 0), now);
        let out = take(&mut state, now);
        state.revoke([out.ticket.partition]);
        assert_eq!(state.buffered(), 1);
        // Assigned again: the record is fetched again from the committed offset.
        state.assign([out.ticket.partition]);
        assert_eq!(
            state.add(record(out.ticket.partition, 0), now).0,
            Added::Queued
        );
        assert_eq!(
            state.settle(out.ticket.partition, 0, out.ticket.generation),
            None
        );
        assert!(!state.nack(out.ticket, Duration::ZERO, now));
        assert_eq!(state.buffered(), 2);
        assert_eq!(state.add(record(5, 0), now).0, Added::Ignored);
    }

    #[test]
    fn records_fetched_twice_are_kept_once() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0]);
        state.add(record(0, 0), now);
        assert_eq!(state.add(record(0, 0), now).0, Added::Ignored);
        assert_eq!(state.buffered(), 1);
    }

    #[test]
    fn undecodable_records_block_the_commit_until_dead_lettered() {
        let now = Instant::now();
        let mut state = State::new(ACK_TIMEOUT);
        state.assign([0]);
        let (added, _) = state.add(undecodable(0, 0), now);
        let Added::DeadLetter(generation) = added else {
            panic!("expected a dead letter, got {added:?}");
        };
        state.add(record(0, 1), now);
        let next = take(&mut state, now);
        assert_eq!(next.ticket.offset, 1);
        assert_eq!(state.settle(0, 1, generation), None);
        assert_eq!(state.settle(0, 0, generation), Some(2));
    }
}
