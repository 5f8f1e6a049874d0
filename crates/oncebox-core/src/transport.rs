//! What a broker client provides: a [`Publisher`] and a [`Subscriber`] handing out
//! [`Delivery`] values.
//!
//! Transports are separate crates (`oncebox-nats`, `oncebox-rabbitmq`, ...); the
//! in-process broker in [`memory`](crate::memory) implements the same traits and is the
//! reference for their behaviour. `oncebox-testkit` holds the conformance suite every
//! transport passes.

use std::future::Future;
use std::time::Duration;

use crate::{Message, Received, Result};

/// Sends messages to a broker.
///
/// # Contract
///
/// - `publish` must not return `Ok` before the broker confirmed that it holds the
///   message (JetStream PubAck, publisher confirm, Kafka delivery report, XADD reply):
///   the relay marks the outbox row published on that `Ok`, so an early `Ok` loses data.
/// - It may be called concurrently; calls for messages with the same key are never
///   concurrent (the relay serialises them), and their order of return is the order the
///   broker must keep. Implementations pipeline concurrent calls rather than waiting for
///   one confirmation at a time.
/// - Broker-side deduplication (`Nats-Msg-Id`, idempotent producers) should use
///   [`Message::id`].
pub trait Publisher: Send + Sync {
    /// Publishes `message` and waits for the broker's confirmation.
    ///
    /// # Errors
    ///
    /// [`Error::Transport`](crate::Error::Transport), transient when the broker is
    /// unreachable or did not confirm in time, permanent when it refused the message
    /// (too large, unknown destination).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the message published or not: the relay treats it
    /// as not published and publishes it again, which consumers deduplicate.
    fn publish(&self, message: &Message) -> impl Future<Output = Result<()>> + Send;

    /// The broker, as OpenTelemetry's `messaging.system` names it (`kafka`, `rabbitmq`,
    /// `nats`, `redis`) on the relay's spans; [`trace::SYSTEM`](crate::trace::SYSTEM)
    /// unless the transport says otherwise. Wrappers forward it.
    fn messaging_system(&self) -> &'static str {
        crate::trace::SYSTEM
    }
}

/// Receives deliveries from a broker (a durable consumer, a consumer-group member, a
/// queue consumer).
pub trait Subscriber: Send {
    /// The delivery type, which is acknowledged through its own methods.
    type Delivery: Delivery;

    /// Waits for the next delivery.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](crate::Error::Closed) once the subscription is closed for good;
    /// a transient [`Error::Transport`](crate::Error::Transport) while the broker is
    /// unreachable (calling again retries).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a delivery is never lost by dropping the future, at worst it is
    /// redelivered after the ack timeout.
    fn next(&mut self) -> impl Future<Output = Result<Self::Delivery>> + Send;
}

/// One delivery of a message, to be settled exactly once by [`ack`](Delivery::ack),
/// [`nack`](Delivery::nack) or [`dead_letter`](Delivery::dead_letter).
///
/// A delivery dropped without being settled is redelivered after the broker's ack
/// timeout, like a consumer that crashed.
pub trait Delivery: Send + 'static {
    /// The message as received.
    fn received(&self) -> &Received;

    /// Confirms the message was handled; the broker will not deliver it again.
    ///
    /// # Errors
    ///
    /// A transport error if the broker did not take the ack; the message will then be
    /// delivered again, which the consumer's deduplication absorbs.
    fn ack(self) -> impl Future<Output = Result<()>> + Send;

    /// Asks for redelivery after `delay`.
    ///
    /// # Errors
    ///
    /// A transport error if the broker did not take the nack; the message is then
    /// redelivered after the ack timeout instead.
    fn nack(self, delay: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Gives up on the message: the broker moves it to its dead-letter destination with
    /// `reason` and never delivers it here again.
    ///
    /// # Errors
    ///
    /// A transport error if the broker did not take it; the message is then redelivered.
    fn dead_letter(self, reason: &str) -> impl Future<Output = Result<()>> + Send;

    /// The broker, as OpenTelemetry's `messaging.system` names it, on the consumer's
    /// spans: see [`Publisher::messaging_system`].
    fn messaging_system(&self) -> &'static str {
        crate::trace::SYSTEM
    }
}

/// A shared publisher publishes as the one it shares: several relays of one process
/// can use one broker connection.
impl<P: Publisher> Publisher for std::sync::Arc<P> {
    fn publish(&self, message: &Message) -> impl Future<Output = Result<()>> + Send {
        (**self).publish(message)
    }

    fn messaging_system(&self) -> &'static str {
        (**self).messaging_system()
    }
}
