//! One delivery from a pull consumer, settled with JetStream's acks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use oncebox_core::{Delivery, Received, Result};

use crate::dead_letter::dead_letter_message;
use crate::error::client;
use crate::transport::Shared;

/// Which group of which topic a subscriber and its deliveries belong to.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) subject: String,
    pub(crate) stream: String,
    pub(crate) consumer: String,
}

/// Where a delivery sits: its stream sequence and how often it was delivered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Position {
    pub(crate) sequence: u64,
    pub(crate) deliveries: u32,
}

/// One delivery of a message from a [`JetStreamSubscriber`](crate::JetStreamSubscriber).
///
/// Settling consumes it: [`ack`](Delivery::ack) sends `+ACK`, [`nack`](Delivery::nack)
/// `-NAK` with the delay, [`dead_letter`](Delivery::dead_letter) publishes a copy to the
/// dead-letter subject and sends `+TERM`. With
/// [`confirm_settlements`](crate::JetStreamOptions::confirm_settlements) (the default)
/// each waits for the server to confirm it. Dropping a delivery unsettled is a consumer
/// crash: the server delivers the message again after the ack wait. Settling after the
/// ack wait, when the message was already delivered again, is accepted and harmless.
pub struct JetStreamDelivery {
    pub(crate) shared: Arc<Shared>,
    pub(crate) route: Arc<Route>,
    pub(crate) message: jetstream::Message,
    pub(crate) position: Position,
    pub(crate) received: Received,
}

impl JetStreamDelivery {
    /// Tells the server the message is still being worked on (`+WPI`), which restarts
    /// its ack wait. For handlers that may take longer than the ack wait.
    ///
    /// # Errors
    ///
    /// A transient transport error if the server did not take it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn in_progress(&self) -> Result<()> {
        settle(
            &self.shared,
            &self.route,
            &self.message,
            self.position,
            AckKind::Progress,
        )
        .await
    }

    /// The stream sequence of this message.
    pub fn stream_sequence(&self) -> u64 {
        self.position.sequence
    }

    /// The raw NATS message, headers and reply subject included.
    pub fn message(&self) -> &async_nats::Message {
        &self.message.message
    }
}

impl Delivery for JetStreamDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// Acks the message (`+ACK`): the group does not receive it again.
    ///
    /// # Errors
    ///
    /// A transient transport error if the server did not confirm it in time; the
    /// message may then be delivered again, which the consumer's deduplication absorbs.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the ack sent or not; if not, the message comes back
    /// after the ack wait.
    async fn ack(self) -> Result<()> {
        settle(
            &self.shared,
            &self.route,
            &self.message,
            self.position,
            AckKind::Ack,
        )
        .await
    }

    /// Asks for redelivery after `delay` (`-NAK` with a delay).
    ///
    /// # Errors
    ///
    /// A transient transport error if the server did not confirm it; the message then
    /// comes back after the ack wait instead.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the nack sent or not; if not, the message comes
    /// back after the ack wait.
    async fn nack(self, delay: Duration) -> Result<()> {
        let kind = AckKind::Nak(Some(delay));
        settle(
            &self.shared,
            &self.route,
            &self.message,
            self.position,
            kind,
        )
        .await
    }

    /// Publishes a copy of the message, with `reason`, to its dead-letter subject and
    /// waits for the PubAck, then terminates the delivery (`+TERM`): the group never
    /// receives it again. See the crate documentation for the copy's headers.
    ///
    /// # Errors
    ///
    /// A transport error if the copy was not stored (no stream captures the dead-letter
    /// subject: [`JetStreamError::NoStream`](crate::JetStreamError::NoStream)) or the
    /// termination not confirmed; the message is then delivered again after the ack
    /// wait, and dead-lettering it again stores no second copy within the dead-letter
    /// stream's duplicate window.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the copy stored and the original not terminated:
    /// the message comes back after the ack wait, and dead-lettering it again stores no
    /// second copy within the duplicate window.
    async fn dead_letter(self, reason: &str) -> Result<()> {
        // The consumer engine logs dead letters with their reason; this is the detail.
        tracing::debug!(
            topic = %self.route.topic, group = %self.route.group,
            sequence = self.position.sequence, %reason, "dead-lettering a message"
        );
        dead_letter_message(
            &self.shared,
            &self.route,
            &self.message,
            self.position,
            reason,
        )
        .await
    }

    fn messaging_system(&self) -> &'static str {
        "nats"
    }
}

impl fmt::Debug for JetStreamDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamDelivery")
            .field("group", &self.route.group)
            .field("sequence", &self.position.sequence)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// Sends `kind` for `message`, waiting for the server's confirmation if so configured.
pub(crate) async fn settle(
    shared: &Shared,
    route: &Route,
    message: &jetstream::Message,
    position: Position,
    kind: AckKind,
) -> Result<()> {
    let result = if shared.options.confirm_settlements {
        message.double_ack_with(kind).await
    } else {
        message.ack_with(kind).await
    };
    result.map_err(|error| {
        client(
            format!(
                "{} of {} sequence {} (group {})",
                kind_name(kind),
                route.topic,
                position.sequence,
                route.group
            ),
            error,
        )
    })
}

fn kind_name(kind: AckKind) -> &'static str {
    match kind {
        AckKind::Ack => "ack",
        AckKind::Nak(_) => "nack",
        AckKind::Progress => "in-progress",
        AckKind::Next => "ack-next",
        AckKind::Term => "terminate",
    }
}
