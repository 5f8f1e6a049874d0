//! [`RabbitSubscriber`]: a consumer on a group's queue.

use std::fmt;
use std::sync::Arc;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use oncebox_core::{Bytes, Result, Subscriber};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::codec::{self, Incoming, Strictness};
use crate::connection::{GroupNames, Link};
use crate::dead_letters::{DeadLetterSink, Original};
use crate::delivery::{Expiry, RabbitDelivery};
use crate::error::RabbitError;
use crate::options::{RabbitOptions, Settings};

/// A member of a consumer group: a consumer on the group's queue.
///
/// Each group has one durable queue, named after the group, bound to the exchange with
/// the topic as routing key, and a dead queue `<group>.dead`. Members of a group share
/// its queue (RabbitMQ hands each message to one of them); every group receives every
/// message published after its queue was bound. Subscribing a group to a second topic
/// binds its queue to that topic too, so a member then receives both
/// ([`Received::topic`](oncebox_core::Received::topic) tells them apart).
///
/// Deliveries are acknowledged manually; see [`RabbitDelivery`] for how each
/// settlement maps onto RabbitMQ and for the client-side ack timeout.
///
/// When the connection fails, [`next`](Subscriber::next) returns a transient error
/// and the following calls reconnect (declaring the queues again) with the configured
/// backoff; the broker requeues every delivery that was not acked, and settling one of
/// them afterwards is harmless.
pub struct RabbitSubscriber {
    settings: Arc<Settings>,
    names: GroupNames,
    consuming: Option<Consuming>,
    /// The reconnection under way, in a task of its own: a `next` cancelled while it
    /// runs leaves it running, and the next call takes its result. Dropped half-way, a
    /// connection that had asked for its consumer stays open with the consumer the
    /// broker registered, which is then handed deliveries no one reads or requeues.
    connecting: Option<JoinHandle<Result<Consuming>>>,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// When to try connecting again.
    retry_at: Option<Instant>,
    dead: Arc<DeadLetterSink>,
}

/// A live consumer and the link it runs on.
struct Consuming {
    link: Link,
    consumer: lapin::Consumer,
}

impl RabbitSubscriber {
    /// Joins consumer group `group` on `topic`: declares the exchange (or checks it),
    /// the group's queue and dead queue, binds the queue for `topic`, and starts
    /// consuming. A message published once this returns reaches the group.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) for invalid options
    /// or names (empty, over 255 bytes); a permanent transport error when the broker
    /// refuses the credentials, the vhost, the exchange, or the queue (an existing queue
    /// with other arguments, such as a classic queue where a quorum queue is asked for);
    /// a transient one when the broker cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the connection is set up in a task of its own, which closes it once
    /// set up if this future was dropped meanwhile.
    pub async fn connect(options: &RabbitOptions, topic: &str, group: &str) -> Result<Self> {
        let settings = options.settings()?;
        let names = GroupNames::new(topic, group)?;
        // In a task, so that a cancelled connect finishes setting up, then closes.
        let consuming = joined(tokio::spawn(consume(Arc::clone(&settings), names.clone())).await)?;
        let dead = Arc::new(DeadLetterSink::new(
            Arc::clone(&settings),
            names.dead.clone(),
        ));
        Ok(Self {
            settings,
            names,
            consuming: Some(consuming),
            connecting: None,
            failures: 0,
            retry_at: None,
            dead,
        })
    }

    /// The topic subscribed to (the binding's routing key).
    pub fn topic(&self) -> &str {
        self.names.topic.as_str()
    }

    /// The consumer group, which is also the queue's name.
    pub fn group(&self) -> &str {
        self.names.queue.as_str()
    }

    /// The group's dead queue.
    pub fn dead_queue(&self) -> &str {
        self.names.dead.as_str()
    }

    /// Stops consuming and closes the connection; the broker requeues every delivery
    /// not acked yet.
    pub async fn close(self) {
        if let Some(consuming) = self.consuming {
            consuming.link.close().await;
        }
        if let Some(connecting) = self.connecting
            && let Ok(Ok(consuming)) = connecting.await
        {
            consuming.link.close().await;
        }
    }

    /// Turns a lapin delivery into a [`RabbitDelivery`], or dead-letters it if it
    /// cannot be decoded (`None`).
    async fn accept(&self, delivery: lapin::message::Delivery) -> Option<RabbitDelivery> {
        let lapin::message::Delivery {
            exchange,
            routing_key,
            redelivered,
            properties,
            data,
            acker,
            ..
        } = delivery;
        // From now on the delivery is requeued after the ack timeout unless settled,
        // whatever happens to this future.
        let expiry = Expiry::start(acker.clone(), self.settings.ack_timeout);
        let body = Bytes::from(data);
        let incoming = Incoming {
            routing_key: routing_key.as_str(),
            redelivered,
            properties: &properties,
            body: body.clone(),
        };
        let decoded = codec::decode(
            &self.settings.format,
            incoming,
            |_| false,
            Strictness::Strict,
        );
        let original = Original {
            delivery_count: codec::delivery_count(&properties, redelivered),
            exchange,
            routing_key,
            properties,
        };
        match decoded {
            Ok(received) => Some(RabbitDelivery::new(
                received,
                acker,
                expiry,
                original,
                Arc::clone(&self.dead),
            )),
            Err(invalid) => {
                let reason = RabbitError::Undecodable(invalid).to_string();
                tracing::warn!(
                    queue = %self.names.queue,
                    routing_key = %original.routing_key,
                    %reason,
                    "dead-lettering a delivery that cannot be decoded"
                );
                match self.dead.publish(&original, body, &reason).await {
                    Ok(()) => {
                        if !matches!(acker.ack(BasicAckOptions::default()).await, Ok(true)) {
                            tracing::debug!("the dead-lettered delivery was requeued meanwhile");
                        }
                        expiry.cancel();
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "could not dead-letter an undecodable delivery; it is retried after the ack timeout"
                    ),
                }
                None
            }
        }
    }
}

/// Opens a link, declares the group's topology and starts consuming. Run in a task of
/// its own (see [`RabbitSubscriber::connecting`]).
async fn consume(settings: Arc<Settings>, names: GroupNames) -> Result<Consuming> {
    crate::connection::setting_up(&settings, |settings, node| {
        let names = names.clone();
        async move { open_consuming(&settings, node, &names).await }
    })
    .await
}

/// The outcome of a [`consume`] task.
fn joined(
    outcome: std::result::Result<Result<Consuming>, tokio::task::JoinError>,
) -> Result<Consuming> {
    outcome.unwrap_or_else(|join| {
        Err(oncebox_core::Error::TaskLost(format!(
            "connecting a RabbitMQ subscriber ({join})"
        )))
    })
}

async fn open_consuming(settings: &Settings, node: usize, names: &GroupNames) -> Result<Consuming> {
    let link = Link::open(settings, node, "subscriber").await?;
    link.exchange(settings).await?;
    link.group(settings, names).await?;
    link.prefetch(settings.prefetch).await?;
    let consumer = link
        .channel
        .basic_consume(
            names.queue.clone(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|source| {
            crate::error::setup_error(RabbitError::Topology {
                action: format!("consume from queue {:?}", names.queue.as_str()),
                source,
            })
        })?;
    Ok(Consuming { link, consumer })
}

impl Subscriber for RabbitSubscriber {
    type Delivery = RabbitDelivery;

    /// Waits for the next delivery of the group's queue.
    ///
    /// A delivery whose headers cannot be decoded (bytes that are not UTF-8, names a
    /// [`Headers`](oncebox_core::Headers) may not hold) is not returned: it is copied
    /// to the dead queue with the decoding error as the reason, then acked (and logged).
    ///
    /// # Errors
    ///
    /// A transient transport error when the connection is lost or cannot be opened
    /// again; calling again reconnects, after the backoff delay once an attempt has
    /// failed. A permanent one if the broker refuses the topology on reconnection (the
    /// queue was re-declared with other arguments meanwhile).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a delivery taken from the broker is requeued after the ack timeout
    /// if the future is dropped before returning it, and a reconnection under way goes
    /// on in the background, its result taken by the next call.
    async fn next(&mut self) -> Result<RabbitDelivery> {
        loop {
            let Some(consuming) = self.consuming.as_mut() else {
                let connecting = match &mut self.connecting {
                    Some(connecting) => connecting,
                    None => {
                        if let Some(at) = self.retry_at {
                            tokio::time::sleep_until(at).await;
                        }
                        let task = consume(Arc::clone(&self.settings), self.names.clone());
                        self.connecting.insert(tokio::spawn(task))
                    }
                };
                // Cancel safe: the handle stays, the task goes on.
                let connected = joined(connecting.await);
                self.connecting = None;
                match connected {
                    Ok(consuming) => {
                        tracing::info!(queue = %self.names.queue, "subscriber reconnected to RabbitMQ");
                        self.consuming = Some(consuming);
                        self.failures = 0;
                        self.retry_at = None;
                        continue;
                    }
                    Err(error) => {
                        self.failures = self.failures.saturating_add(1);
                        let delay = self.settings.reconnect.delay(self.failures);
                        self.retry_at = Some(Instant::now() + delay);
                        return Err(error);
                    }
                }
            };
            let failure = match consuming.consumer.next().await {
                Some(Ok(delivery)) => match self.accept(delivery).await {
                    Some(delivery) => return Ok(delivery),
                    None => continue,
                },
                Some(Err(source)) => RabbitError::Channel {
                    action: "consuming",
                    source,
                },
                None => RabbitError::Disconnected {
                    reason: format!(
                        "the consumer of queue {:?} was cancelled",
                        self.names.queue.as_str()
                    ),
                },
            };
            tracing::warn!(queue = %self.names.queue, error = %failure, "subscriber lost RabbitMQ; reconnecting");
            self.consuming = None;
            self.retry_at = None;
            return Err(failure.transient());
        }
    }
}

impl fmt::Debug for RabbitSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSubscriber")
            .field("url", &self.settings.url)
            .field("topic", &self.names.topic.as_str())
            .field("group", &self.names.queue.as_str())
            .field("connected", &self.consuming.is_some())
            .finish_non_exhaustive()
    }
}
