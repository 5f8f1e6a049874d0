//! The part of a subscriber its deliveries, its driver task and librdkafka's rebalance
//! callbacks share.

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer as _;
use rdkafka::topic_partition_list::Offset as KafkaOffset;
use tokio::sync::{Notify, watch};

use super::driver::Consumer;
use super::state::{Offset, Partition, State};
use crate::dead_letter::DeadLetterWriter;
use crate::error::KafkaTransportError;

/// Everything behind the subscriber's lock.
pub(super) struct Inner {
    pub(super) state: State,
    /// An error for the next call of `next` that finds nothing to deliver.
    pub(super) pending_error: Option<KafkaTransportError>,
    /// Why the consumer stopped for good, once it did.
    pub(super) stopped: Option<String>,
    /// Whether fetching is paused because too many records are buffered.
    pub(super) paused: bool,
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// Notified whenever a delivery may have become due: a record fetched, a nack,
    /// an assignment, an error.
    pub(super) changed: Notify,
    /// Wakes the driver to resume fetching once the buffer has drained.
    pub(super) wake_driver: Notify,
    /// Counts the assignments received (0 until the first).
    pub(super) assignments: watch::Sender<u64>,
    /// The consumer, once created (the driver owns it).
    pub(super) consumer: OnceLock<Weak<Consumer>>,
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) brokers: String,
    pub(super) dead_letters: DeadLetterWriter,
    pub(super) max_buffered: usize,
}

impl Shared {
    pub(super) fn new(
        state: State,
        topic: &str,
        group: &str,
        brokers: &str,
        dead_letters: DeadLetterWriter,
        max_buffered: usize,
    ) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state,
                pending_error: None,
                stopped: None,
                paused: false,
            }),
            changed: Notify::new(),
            wake_driver: Notify::new(),
            assignments: watch::Sender::new(0),
            consumer: OnceLock::new(),
            topic: topic.to_owned(),
            group: group.to_owned(),
            brokers: brokers.to_owned(),
            dead_letters,
            max_buffered,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves the state consistent before anything that could panic,
        // so a poisoned lock holds a usable state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles a record for good (ack, dead letter) and stores the offset the consumer
    /// may now commit, if it moved.
    pub(super) fn settle(&self, partition: Partition, offset: Offset, generation: u64) {
        let (commit, resume) = {
            let mut inner = self.lock();
            let commit = inner.state.settle(partition, offset, generation);
            let resume = inner.paused && inner.state.buffered() <= self.max_buffered / 2;
            (commit, resume)
        };
        if let Some(commit) = commit {
            self.store_offset(partition, commit);
        }
        if resume {
            self.wake_driver.notify_one();
        }
    }

    /// Hands `offset` (the next offset to consume) to the consumer for its next commit.
    fn store_offset(&self, partition: Partition, offset: Offset) {
        let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
            return;
        };
        let mut offsets = TopicPartitionList::with_capacity(1);
        let stored = offsets
            .add_partition_offset(&self.topic, partition, KafkaOffset::Offset(offset))
            .and_then(|()| consumer.store_offsets(&offsets));
        if let Err(error) = stored {
            // The partition was revoked in the meantime: its next owner starts from
            // the offset committed before, and redelivers.
            tracing::debug!(topic = %self.topic, partition, offset, %error, "offset not stored");
        }
    }

    /// Whether `partition` is still assigned in `generation`.
    pub(super) fn holds(&self, partition: Partition, generation: u64) -> bool {
        self.lock().state.generation_of(partition) == Some(generation)
    }
}

/// Keeps `Arc<Shared>` printable without its records.
impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("topic", &self.topic)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}
