//! One consumer group's view of a topic: which messages wait, which are in flight, and
//! when each of them is due again.
//!
//! Every unsettled message of the group is waiting (it has a due time), in flight (one
//! or more leases, each ending at the ack timeout), or both (a nacked duplicate while the
//! other copy is still out). Both kinds of deadline live on one timeline ordered by time,
//! then by a ticket that grows with every insertion, so that messages due at the same
//! instant come out in the order they were enqueued: that is what keeps a group FIFO.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::BrokerStats;
use super::faults::{Dice, Fate};

/// A message's position in its topic log, from 1.
pub(super) type Seq = u64;

/// Identifies one delivery (one lease) within a group.
pub(super) type Token = u64;

/// A point on the timeline: when, then in which order.
type Slot = (Instant, u64);

enum Event {
    /// The message is due for (re)delivery.
    Due(Seq),
    /// The lease ends: its delivery was neither acked nor nacked in time.
    LeaseEnds(Token),
}

/// An unsettled message.
#[derive(Default)]
struct Tracked {
    /// Deliveries so far, dropped ones and duplicate copies included.
    deliveries: u32,
    /// When it is due, if it waits.
    due: Option<Slot>,
    /// Live leases: deliveries out, not yet settled nor expired.
    leases: Vec<Token>,
    /// Whether the delivery about to be made was already held back once.
    held_back: bool,
}

struct Lease {
    seq: Seq,
    ends: Slot,
}

/// A delivery for the subscriber that asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handout {
    pub(super) seq: Seq,
    pub(super) token: Token,
    pub(super) delivery_count: u32,
}

/// The answer to a subscriber asking for a delivery.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Poll {
    Ready(Handout),
    /// Nothing now; something may be due at this instant (or whenever the state changes).
    Wait(Option<Instant>),
}

/// What the group needs from the broker while it hands out deliveries.
pub(super) struct Env<'a> {
    pub(super) now: Instant,
    pub(super) ack_timeout: Duration,
    pub(super) dice: &'a mut Dice,
    pub(super) stats: &'a mut BrokerStats,
}

#[derive(Default)]
pub(super) struct Group {
    timeline: BTreeMap<Slot, Event>,
    unsettled: HashMap<Seq, Tracked>,
    leases: HashMap<Token, Lease>,
    /// Second copies of duplicated deliveries, already "on the wire".
    copies: VecDeque<Handout>,
    tickets: u64,
}

impl Group {
    /// Makes a newly published (or, for a new group, retained) message due at `now`.
    pub(super) fn enqueue(&mut self, seq: Seq, now: Instant) {
        self.unsettled.insert(seq, Tracked::default());
        self.schedule(seq, now);
    }

    /// Hands out the next due delivery, reclaiming expired leases and applying faults on
    /// the way.
    pub(super) fn poll(&mut self, env: &mut Env<'_>) -> Poll {
        if let Some(copy) = self.copies.pop_front() {
            env.stats.delivered += 1;
            return Poll::Ready(copy);
        }
        loop {
            let Some(entry) = self.timeline.first_entry() else {
                return Poll::Wait(None);
            };
            if entry.key().0 > env.now {
                return Poll::Wait(Some(entry.key().0));
            }
            let seq = match entry.remove() {
                Event::Due(seq) => {
                    self.tracked(seq).due = None;
                    seq
                }
                Event::LeaseEnds(token) => match self.reclaim(token) {
                    Some(seq) => seq,
                    None => continue,
                },
            };
            if let Some(handout) = self.attempt(seq, env) {
                return Poll::Ready(handout);
            }
        }
    }

    /// Settles the message of a live delivery for good (ack or dead letter). Returns
    /// false, changing nothing, if the delivery is stale.
    pub(super) fn settle(&mut self, token: Token, now: Instant) -> bool {
        let Some(seq) = self.live(token, now) else {
            return false;
        };
        let Some(tracked) = self.unsettled.remove(&seq) else {
            return false;
        };
        for token in tracked.leases {
            if let Some(lease) = self.leases.remove(&token) {
                self.timeline.remove(&lease.ends);
            }
        }
        if let Some(due) = tracked.due {
            self.timeline.remove(&due);
        }
        true
    }

    /// Ends a live delivery and makes its message due after `delay` (or sooner, if it
    /// was due sooner). Returns false, changing nothing, if the delivery is stale.
    pub(super) fn nack(&mut self, token: Token, delay: Duration, now: Instant) -> bool {
        let Some(seq) = self.live(token, now) else {
            return false;
        };
        self.end_lease(token);
        let at = now + delay;
        match self.tracked(seq).due {
            Some((due, _)) if due <= at => {}
            Some(due) => {
                self.timeline.remove(&due);
                self.schedule(seq, at);
            }
            None => self.schedule(seq, at),
        }
        true
    }

    /// Messages neither acked nor dead-lettered yet.
    pub(super) fn unsettled(&self) -> usize {
        self.unsettled.len()
    }

    /// The message of a delivery whose lease still runs at `now`.
    fn live(&self, token: Token, now: Instant) -> Option<Seq> {
        self.leases
            .get(&token)
            .filter(|lease| lease.ends.0 > now)
            .map(|lease| lease.seq)
    }

    /// An expired lease: forget it and take the message for redelivery now, dropping any
    /// later due time it had.
    fn reclaim(&mut self, token: Token) -> Option<Seq> {
        let seq = self.end_lease(token)?;
        if let Some(due) = self.tracked(seq).due.take() {
            self.timeline.remove(&due);
        }
        Some(seq)
    }

    fn attempt(&mut self, seq: Seq, env: &mut Env<'_>) -> Option<Handout> {
        let held_back = std::mem::take(&mut self.tracked(seq).held_back);
        match env.dice.roll(!held_back) {
            Fate::HoldBack(delay) => {
                env.stats.delayed += 1;
                self.tracked(seq).held_back = true;
                self.schedule(seq, env.now + delay);
                None
            }
            Fate::Drop => {
                env.stats.dropped += 1;
                self.hand_out(seq, env);
                None
            }
            Fate::Deliver { duplicate } => {
                let handout = self.hand_out(seq, env);
                env.stats.delivered += 1;
                if handout.delivery_count > 1 {
                    env.stats.redelivered += 1;
                }
                if duplicate {
                    env.stats.duplicated += 1;
                    let copy = self.hand_out(seq, env);
                    self.copies.push_back(copy);
                }
                Some(handout)
            }
        }
    }

    /// Records one delivery of `seq` and leases it until the ack timeout.
    fn hand_out(&mut self, seq: Seq, env: &Env<'_>) -> Handout {
        let token = self.ticket();
        let ends = (env.now + env.ack_timeout, token);
        self.timeline.insert(ends, Event::LeaseEnds(token));
        self.leases.insert(token, Lease { seq, ends });
        let tracked = self.tracked(seq);
        tracked.leases.push(token);
        tracked.deliveries = tracked.deliveries.saturating_add(1);
        Handout {
            seq,
            token,
            delivery_count: tracked.deliveries,
        }
    }

    fn schedule(&mut self, seq: Seq, at: Instant) {
        let slot = (at, self.ticket());
        self.timeline.insert(slot, Event::Due(seq));
        self.tracked(seq).due = Some(slot);
    }

    /// Removes a lease (its timeline entry included) and returns its message.
    fn end_lease(&mut self, token: Token) -> Option<Seq> {
        let lease = self.leases.remove(&token)?;
        self.timeline.remove(&lease.ends);
        self.tracked(lease.seq).leases.retain(|&t| t != token);
        Some(lease.seq)
    }

    /// The state of an unsettled message. Every timeline entry and lease belongs to one
    /// and settling removes them together, so it is always there when asked for.
    fn tracked(&mut self, seq: Seq) -> &mut Tracked {
        self.unsettled.entry(seq).or_default()
    }

    fn ticket(&mut self) -> u64 {
        self.tickets += 1;
        self.tickets
    }
}
