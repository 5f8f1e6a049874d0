//! Counters of what the in-process broker did.

/// What a [`MemoryBroker`](super::MemoryBroker) did since it was created, summed over
/// all topics and groups.
///
/// A delivery is counted once, under the first that applies: `dropped` (lost on the
/// way), else `delivered`. `redelivered` and `duplicated` count deliveries also counted
/// in `delivered`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BrokerStats {
    /// Messages confirmed to publishers (re-publishes of the same id included).
    pub published: u64,
    /// Deliveries handed to subscribers, redeliveries and duplicate copies included.
    pub delivered: u64,
    /// Deliveries of a message the group had been given before (after a nack, an ack
    /// timeout or a drop), duplicate copies excluded.
    pub redelivered: u64,
    /// Messages acked.
    pub acked: u64,
    /// Deliveries nacked.
    pub nacked: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Deliveries lost on the way by fault injection (each comes back after the ack
    /// timeout).
    pub dropped: u64,
    /// Second copies handed out by fault injection.
    pub duplicated: u64,
    /// Deliveries held back by fault injection.
    pub delayed: u64,
    /// Acks, nacks and dead letters of deliveries whose ack timeout had already passed
    /// (or whose message another copy had settled): accepted and ignored.
    pub stale_settlements: u64,
}
