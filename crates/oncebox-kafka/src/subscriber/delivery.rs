//! [`KafkaDelivery`]: one delivery, settled in the subscriber that handed it out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Delivery, Received, Result};
use tokio::time::Instant;

use super::record::Record;
use super::shared::Shared;
use super::state::Ticket;

/// One delivery from a [`KafkaSubscriber`](crate::KafkaSubscriber).
///
/// Kafka has no per-message acknowledgement: settling happens in the subscriber, which
/// commits a partition's offset up to the first record not yet settled.
///
/// - [`ack`](Delivery::ack) settles the record; its offset is committed once every
///   record before it is settled too.
/// - [`nack`](Delivery::nack) makes the subscriber hand the record out again after the
///   delay.
/// - [`dead_letter`](Delivery::dead_letter) writes a copy to the dead-letter topic
///   (`<topic>.dlq` by default) with the reason in the `oncebox-dlq-reason` header, and
///   settles the record once the copy is confirmed.
/// - Dropping it unsettled: the subscriber hands the record out again after its ack
///   timeout.
///
/// Settling late (after the ack timeout, when the record was handed out again; after
/// the partition went to another member in a rebalance) is accepted and harmless: an ack
/// or dead letter of any delivery of a record still held settles it, anything else
/// changes nothing, and the new owner of a partition redelivers what was not committed.
pub struct KafkaDelivery {
    pub(super) shared: Arc<Shared>,
    pub(super) ticket: Ticket,
    pub(super) received: Received,
    pub(super) record: Arc<Record>,
}

impl Delivery for KafkaDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// Settles the record; its offset is stored for the next commit once the records
    /// before it are settled too.
    ///
    /// # Errors
    ///
    /// None: the commit happens in the background (every
    /// [`commit_interval`](crate::KafkaOptions::commit_interval), on rebalance, on
    /// drop); if the process dies first, the record is delivered again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the record is settled when the future first runs.
    async fn ack(self) -> Result<()> {
        self.shared.settle(
            self.ticket.partition,
            self.ticket.offset,
            self.ticket.generation,
        );
        Ok(())
    }

    /// Hands the record out again after `delay`, from this subscriber. A nack of a
    /// delivery that is no longer current (its ack timeout passed) changes nothing.
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    async fn nack(self, delay: Duration) -> Result<()> {
        let renewed = self
            .shared
            .lock()
            .state
            .nack(self.ticket, delay, Instant::now());
        if renewed {
            self.shared.changed.notify_waiters();
        }
        Ok(())
    }

    /// Writes a copy of the record (key, value and headers as received) to the
    /// dead-letter topic with `reason` and the record's origin in headers (see
    /// [`dead_letter`](crate::dead_letter)), waits for the broker's confirmation, then
    /// settles the record.
    ///
    /// # Errors
    ///
    /// A transient transport error when the copy is not confirmed (the dead-letter
    /// topic does not exist, the brokers cannot be reached): the record stays unsettled
    /// and is handed out again after the ack timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the copy written and the record unsettled: it is
    /// then handed out again, and dead-lettered a second time if it fails again.
    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.shared.dead_letters.write(&self.record, reason).await?;
        self.shared.settle(
            self.ticket.partition,
            self.ticket.offset,
            self.ticket.generation,
        );
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        "kafka"
    }
}

impl fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDelivery")
            .field("group", &self.shared.group)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}
