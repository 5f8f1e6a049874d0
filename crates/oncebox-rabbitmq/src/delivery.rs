//! [`RabbitDelivery`]: settling one delivery, and the client-side ack timeout.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use oncebox_core::{Delivery, Received, Result};
use tokio::task::AbortHandle;

use crate::dead_letters::{DeadLetterSink, Original};
use crate::error::RabbitError;

const REQUEUE: BasicNackOptions = BasicNackOptions {
    multiple: false,
    requeue: true,
};

/// One delivery from a [`RabbitSubscriber`](crate::RabbitSubscriber).
///
/// | settlement | what RabbitMQ sees |
/// |---|---|
/// | [`ack`](Delivery::ack) | `basic.ack` |
/// | [`nack(delay)`](Delivery::nack) | the delivery is held for `delay`, then `basic.nack` with requeue (the quorum queue counts a delivery) |
/// | [`dead_letter(reason)`](Delivery::dead_letter) | a copy, with the reason in `x-oncebox-reason`, is published to the group's dead queue and confirmed, then the delivery is acked |
/// | none within the ack timeout, or dropped | `basic.nack` with requeue once the ack timeout has passed since the delivery |
///
/// RabbitMQ has no delayed requeue, and redelivers an unacked message only when its
/// channel closes. So the subscriber keeps both timers itself: a nack holds the
/// delivery (it counts against the prefetch meanwhile) and requeues it when the delay
/// is over; a delivery neither settled nor nacked is requeued when the ack timeout
/// runs out. If the subscriber's connection closes first, the broker requeues the
/// message at once: a nack's delay is then cut short, never made longer.
///
/// Each delivery is settled once: the first of the settlement and the ack-timeout
/// requeue wins, and a late settlement (after the requeue, or after the channel closed)
/// sends nothing to the broker — which would close the channel over an unknown
/// delivery tag — and fails with the transient [`RabbitError::DeliveryRequeued`].
///
/// Dead letters are at least once: if the ack after the confirmed copy fails, the
/// message comes back and may be dead-lettered twice.
pub struct RabbitDelivery {
    received: Received,
    acker: Acker,
    expiry: Expiry,
    original: Original,
    dead: Arc<DeadLetterSink>,
}

impl RabbitDelivery {
    pub(crate) fn new(
        received: Received,
        acker: Acker,
        expiry: Expiry,
        original: Original,
        dead: Arc<DeadLetterSink>,
    ) -> Self {
        Self {
            received,
            acker,
            expiry,
            original,
            dead,
        }
    }
}

impl Delivery for RabbitDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// Acks the delivery.
    ///
    /// # Errors
    ///
    /// Transient: [`RabbitError::DeliveryRequeued`] when it was requeued already (the
    /// ack timeout passed, or the channel closed), [`RabbitError::Channel`] when the
    /// ack could not be sent. The message is then delivered again.
    async fn ack(self) -> Result<()> {
        let acked = self.acker.ack(BasicAckOptions::default()).await;
        self.expiry.cancel();
        settled(acked)
    }

    /// Holds the delivery for `delay`, then requeues it; at once if `delay` is zero.
    ///
    /// # Errors
    ///
    /// With a zero delay, as [`ack`](Delivery::ack). With a delay, none: the requeue
    /// happens later, and if it fails the channel is gone and the broker has requeued
    /// the message already.
    async fn nack(self, delay: Duration) -> Result<()> {
        self.expiry.cancel();
        if delay.is_zero() {
            return settled(self.acker.nack(REQUEUE).await);
        }
        let acker = self.acker;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            requeue(&acker, "its nack delay is over").await;
        });
        Ok(())
    }

    /// Publishes a copy to the group's dead queue with `reason` in the
    /// `x-oncebox-reason` header (and the topic, exchange and delivery count in
    /// `x-oncebox-topic`, `x-oncebox-exchange`, `x-oncebox-delivery-count`), waits for
    /// the broker's confirm, then acks the delivery.
    ///
    /// # Errors
    ///
    /// Transient when the copy is not confirmed (the delivery is then left to its ack
    /// timeout and comes back), or when the ack fails (the message comes back and may be
    /// dead-lettered twice).
    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.dead
            .publish(&self.original, self.received.payload.clone(), reason)
            .await?;
        self.ack().await
    }

    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }
}

fn settled(result: lapin::Result<bool>) -> Result<()> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(RabbitError::DeliveryRequeued.transient()),
        Err(source) => Err(RabbitError::Channel {
            action: "settling a delivery",
            source,
        }
        .transient()),
    }
}

/// Requeues a delivery unless it was settled meanwhile.
async fn requeue(acker: &Acker, why: &str) {
    match acker.nack(REQUEUE).await {
        Ok(true) => tracing::debug!(why, "requeued a delivery"),
        // Settled meanwhile, or its channel closed (the broker requeued it then).
        Ok(false) => {}
        Err(error) => tracing::debug!(
            %error, why,
            "could not requeue a delivery; the broker requeues it when its channel closes"
        ),
    }
}

/// The task that requeues a delivery once its ack timeout is over.
pub(crate) struct Expiry(AbortHandle);

impl Expiry {
    /// Starts the ack timeout of a delivery.
    pub(crate) fn start(acker: Acker, ack_timeout: Duration) -> Self {
        let task = tokio::spawn(async move {
            tokio::time::sleep(ack_timeout).await;
            requeue(&acker, "its ack timeout passed").await;
        });
        Self(task.abort_handle())
    }

    /// Stops the timer (the delivery is settled or held for a nack).
    pub(crate) fn cancel(&self) {
        self.0.abort();
    }
}

impl fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}
