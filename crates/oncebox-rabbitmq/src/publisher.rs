//! [`RabbitPublisher`]: confirmed, pipelined publishing to the exchange.

use std::fmt;
use std::sync::Arc;

use lapin::types::ShortString;
use oncebox_core::{Error, Limits, Message, Publisher, Result};

use crate::confirm::{ConfirmLink, Outgoing, Role};
use crate::error::RabbitError;
use crate::options::{RabbitOptions, Settings};

/// Publishes messages to the configured exchange, the topic as routing key, and returns
/// once RabbitMQ confirmed each (publisher confirms).
///
/// One connection with one confirm-mode channel, driven by a background task:
/// concurrent calls are pipelined (many confirms outstanding, answered as they come),
/// and calls made one after the other reach the broker in that order. Cheap to clone;
/// the connection closes when the last clone is dropped and every publish under way is
/// answered.
///
/// Publishes are `mandatory` and persistent (`delivery_mode` 2). A message no queue is
/// bound for is not confirmed as published: see [`Publisher::publish`] below.
///
/// When the connection or channel fails, the publishes under way fail transiently, the
/// publisher reconnects in the background with the configured backoff (declaring or
/// checking the exchange again), and publishes fail at once with
/// [`RabbitError::Disconnected`] until it is back — a relay retries them.
#[derive(Clone)]
pub struct RabbitPublisher {
    link: ConfirmLink,
    settings: Arc<Settings>,
    limits: Limits,
}

impl RabbitPublisher {
    /// Connects, puts the channel in confirm mode and declares (or checks) the exchange.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for invalid options; a permanent transport error when
    /// the broker refuses the credentials, the vhost or the exchange
    /// ([`RabbitError::ExchangeNotFound`] when it must exist and does not); a transient
    /// one when the broker cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection half opened is closed.
    pub async fn connect(options: &RabbitOptions) -> Result<Self> {
        let settings = options.settings()?;
        let link = ConfirmLink::start(Arc::clone(&settings), Role::Publisher).await?;
        let limits = Limits::new().max_payload_bytes(settings.max_message_size);
        Ok(Self {
            link,
            settings,
            limits,
        })
    }

    /// The exchange this publisher publishes to.
    pub fn exchange(&self) -> &str {
        self.settings.exchange.as_str()
    }
}

impl Publisher for RabbitPublisher {
    /// Publishes `message` with routing key [`Message::topic`] and waits for the
    /// broker's confirm.
    ///
    /// # Errors
    ///
    /// - permanent: a message that fails [`Message::validate`] (a topic over 255 bytes
    ///   cannot be a routing key), or a body over the maximum message size
    ///   ([`RabbitError::TooLarge`]: the configured one, or the broker's when it
    ///   refuses the message);
    /// - transient: [`RabbitError::Unroutable`] when no queue is bound for the topic,
    ///   [`RabbitError::Nacked`] when the broker refuses the message,
    ///   [`RabbitError::ExchangeNotFound`] when the exchange was deleted,
    ///   [`RabbitError::Disconnected`] or [`RabbitError::Channel`] while the
    ///   connection is lost, [`Error::Timeout`] without a confirm within the confirm
    ///   timeout.
    ///
    /// Unroutable and unknown-exchange errors are configuration mistakes (a consumer
    /// group not created yet, a binding missing), not faults of the message: they are
    /// transient so that a relay keeps the message and retries it with backoff instead
    /// of dead-lettering the outbox while someone fixes the topology.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the message published or not, as the trait says.
    async fn publish(&self, message: &Message) -> Result<()> {
        message
            .validate(&self.limits)
            .map_err(|invalid| match invalid {
                oncebox_core::InvalidMessage::PayloadTooLarge { size, limit } => {
                    RabbitError::TooLarge { size, limit }.permanent()
                }
                other => Error::transport_permanent(other),
            })?;
        let properties = crate::codec::encode(&self.settings.format, message)
            .map_err(Error::transport_permanent)?;
        let routing_key = ShortString::try_new(message.topic.as_str())
            .map_err(|_| Error::transport_permanent("the topic is over 255 bytes"))?;
        self.link
            .publish(Outgoing {
                exchange: self.settings.exchange.clone(),
                routing_key,
                properties,
                body: message.payload.clone(),
            })
            .await
    }

    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("url", &self.settings.url)
            .field("exchange", &self.settings.exchange.as_str())
            .finish_non_exhaustive()
    }
}
