//! The handles applications hold: publisher, subscriber, delivery.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep_until;

use super::{Polled, Settlement, Shared};
use crate::{Delivery, Message, Publisher, Received, Result, Subscriber};

/// Publishes to a [`MemoryBroker`](super::MemoryBroker). Cheap to clone.
#[derive(Clone)]
pub struct MemoryPublisher {
    shared: Arc<Shared>,
}

impl MemoryPublisher {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl Publisher for MemoryPublisher {
    /// Appends `message` to the log of its topic; returns once it is stored (the
    /// broker's confirmation).
    ///
    /// # Errors
    ///
    /// A transient transport error while the broker is down; a permanent one for a
    /// message that fails [`Message::validate`] against the default
    /// [`Limits`](crate::Limits) (too large, empty topic), which real brokers refuse too.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the message is stored when the future first runs, or not at all.
    async fn publish(&self, message: &Message) -> Result<()> {
        self.shared.publish(message)
    }
}

impl fmt::Debug for MemoryPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPublisher").finish_non_exhaustive()
    }
}

/// Which group of which topic a subscriber and its deliveries belong to.
struct Route {
    topic: String,
    group: String,
}

/// A member of a consumer group of a [`MemoryBroker`](super::MemoryBroker) topic.
pub struct MemorySubscriber {
    shared: Arc<Shared>,
    route: Arc<Route>,
}

impl MemorySubscriber {
    pub(super) fn new(shared: Arc<Shared>, topic: &str, group: &str) -> Self {
        Self {
            shared,
            route: Arc::new(Route {
                topic: topic.to_owned(),
                group: group.to_owned(),
            }),
        }
    }

    /// The topic subscribed to.
    pub fn topic(&self) -> &str {
        &self.route.topic
    }

    /// The consumer group this subscriber is a member of.
    pub fn group(&self) -> &str {
        &self.route.group
    }
}

impl Subscriber for MemorySubscriber {
    type Delivery = MemoryDelivery;

    /// Waits until a delivery is due for this group and takes it.
    ///
    /// Sleeps until the next due time (a nack delay, an ack timeout, a held-back
    /// delivery) or until the broker signals a change (a publish, a nack, the end of an
    /// outage); there is no polling loop. While the broker is down it waits.
    ///
    /// # Errors
    ///
    /// None: the in-memory broker never closes a subscription and waits out outages.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a delivery is taken from the broker only in the same step that
    /// returns it, so dropping the future never loses one.
    async fn next(&mut self) -> Result<MemoryDelivery> {
        loop {
            let changed = self.shared.wake.notified();
            let mut changed = std::pin::pin!(changed);
            // Register before looking, so that a change made after the look wakes us.
            changed.as_mut().enable();
            match self.shared.poll(&self.route.topic, &self.route.group) {
                Polled::Ready { token, received } => {
                    return Ok(MemoryDelivery {
                        shared: Arc::clone(&self.shared),
                        route: Arc::clone(&self.route),
                        token,
                        received,
                    });
                }
                Polled::Wait(Some(due)) => {
                    tokio::select! {
                        () = changed => {}
                        () = sleep_until(due) => {}
                    }
                }
                Polled::Wait(None) => changed.await,
            }
        }
    }
}

impl fmt::Debug for MemorySubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySubscriber")
            .field("topic", &self.route.topic)
            .field("group", &self.route.group)
            .finish_non_exhaustive()
    }
}

/// One delivery from a [`MemoryBroker`](super::MemoryBroker).
///
/// Settling consumes it. Dropping it unsettled is a consumer crash: the message is
/// redelivered after the ack timeout. Settling it after the ack timeout (when it has been
/// or is about to be redelivered), or after another copy of the same message settled it,
/// is accepted and changes nothing.
pub struct MemoryDelivery {
    shared: Arc<Shared>,
    route: Arc<Route>,
    token: super::Token,
    received: Received,
}

impl MemoryDelivery {
    fn settle(&self, settlement: Settlement<'_>) -> Result<()> {
        self.shared
            .settle(&self.route.topic, &self.route.group, self.token, settlement)
    }
}

impl Delivery for MemoryDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// Acks the message: this group never receives it again (copies already handed out
    /// excepted).
    ///
    /// # Errors
    ///
    /// A transient transport error while the broker is down; the message is then
    /// redelivered after the ack timeout.
    async fn ack(self) -> Result<()> {
        self.settle(Settlement::Ack)
    }

    /// Ends this delivery; the message is due again after `delay`.
    ///
    /// # Errors
    ///
    /// A transient transport error while the broker is down; the message is then
    /// redelivered after the ack timeout instead.
    async fn nack(self, delay: Duration) -> Result<()> {
        self.settle(Settlement::Nack(delay))
    }

    /// Moves the message to the topic's dead letters (see
    /// [`MemoryBroker::dead_letters`](super::MemoryBroker::dead_letters)) with `reason`;
    /// this group never receives it again.
    ///
    /// # Errors
    ///
    /// A transient transport error while the broker is down; the message is then
    /// redelivered after the ack timeout.
    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.settle(Settlement::DeadLetter {
            received: &self.received,
            reason,
        })
    }
}

impl fmt::Debug for MemoryDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDelivery")
            .field("group", &self.route.group)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}
