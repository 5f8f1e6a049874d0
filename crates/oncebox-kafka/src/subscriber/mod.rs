//! [`KafkaSubscriber`]: a consumer-group member with acks, nacks, an ack timeout and a
//! dead-letter topic, kept by the subscriber since Kafka has none of them.

mod delivery;
mod driver;
pub(crate) mod record;
mod shared;
mod state;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Error, Result, Subscriber};
use rdkafka::consumer::Consumer as _;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::KafkaOptions;
use crate::context::LoggingContext;
use crate::dead_letter::DeadLetterWriter;
use crate::error::{KafkaTransportError, config_error};
use crate::publisher::create_producer;
pub use delivery::KafkaDelivery;
use driver::{Consumer, SubscriberContext};
use shared::Shared;
use state::{Poll, State};

/// A member of a Kafka consumer group on one topic.
///
/// Kafka keeps one committed offset per partition and group, and nothing per message.
/// This subscriber supplies what the [`Delivery`](oncebox_core::Delivery) contract
/// needs on top:
///
/// - **Commits only the settled prefix.** The consumer does not commit what it fetched
///   (`enable.auto.offset.store=false`): a partition's offset moves up to the first
///   record not yet acked or dead-lettered, and is committed in the background every
///   [`commit_interval`](KafkaOptions::commit_interval), when partitions are revoked
///   and when the subscriber is dropped. After a crash or a rebalance, everything not
///   committed is delivered again (by this member or another).
/// - **Ack timeout.** The subscriber keeps every record it handed out; one not settled
///   within [`ack_timeout`](KafkaOptions::ack_timeout) (a dropped delivery, a stuck
///   handler) is handed out again.
/// - **Nack with delay**, kept locally: the record is handed out again after the delay.
/// - **Dead letters** go to a topic (`<topic>.dlq` by default); see [`KafkaDelivery`].
///   A record whose headers cannot be decoded (a header value that is not UTF-8) is
///   dead-lettered by the subscriber itself, with the decoding error as the reason:
///   never dropped, never handed out.
/// - **`delivery_count`** counts the deliveries this subscriber made of a record
///   (redeliveries after nacks and ack timeouts); a record redelivered after a crash or
///   a rebalance starts again at 1, since Kafka keeps no count across consumers.
/// - **Order**: records are handed out in the order they were fetched, so each
///   partition's (and each key's) order holds, redeliveries aside.
///
/// A background task polls the consumer all the time, so rebalances are served while
/// the application works; it pauses fetching while
/// [`max_buffered`](KafkaOptions::max_buffered) records are unsettled.
pub struct KafkaSubscriber {
    shared: Arc<Shared>,
    assignments: watch::Receiver<u64>,
    /// Sending or dropping it stops the driver, which closes the consumer.
    shutdown: oneshot::Sender<()>,
    driver: JoinHandle<()>,
    /// Becomes true (or loses its sender) once the consumer is closed.
    closed: watch::Receiver<bool>,
}

impl KafkaSubscriber {
    /// Joins consumer group `group` on `topic`.
    ///
    /// Returns once the brokers answered and the topic was found; partitions are
    /// assigned afterwards, in the background (with Kafka's initial rebalance delay,
    /// about 3 s for a new group): see [`KafkaSubscriber::wait_for_assignment`]. A new
    /// group starts at the earliest offset, so it receives what was published before it
    /// existed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that fail [`KafkaOptions::validate`] or an
    /// empty topic or group; a transient transport error when no broker answers within
    /// [`KafkaOptions::connect_timeout`] ([`KafkaTransportError::Unreachable`]) or the
    /// topic does not exist ([`KafkaTransportError::UnknownTopic`]). A missing
    /// dead-letter topic is only logged: dead-lettering fails transiently until it
    /// exists.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the consumer before it joined.
    pub async fn subscribe(options: KafkaOptions, topic: &str, group: &str) -> Result<Self> {
        options.validate()?;
        if topic.is_empty() || group.is_empty() {
            return Err(Error::InvalidOptions(
                "the topic and the consumer group must not be empty".to_owned(),
            ));
        }
        let dead_letters = DeadLetterWriter::new(
            create_producer(&options, LoggingContext::default())?,
            &options,
            topic,
            group,
        );
        let shared = Arc::new(Shared::new(
            State::new(options.ack_timeout),
            topic,
            group,
            &options.brokers,
            dead_letters,
            options.max_buffered,
        ));
        let context = SubscriberContext {
            shared: Arc::clone(&shared),
            logging: LoggingContext::default(),
        };
        let consumer: Arc<Consumer> = Arc::new(
            options
                .consumer_config(group)
                .create_with_context(context)
                .map_err(config_error)?,
        );
        // The consumer holds the shared part through its context; this link back is weak.
        let _ = shared.consumer.set(Arc::downgrade(&consumer));
        check_topics(
            &options,
            &consumer,
            topic,
            shared.dead_letters.dead_letter_topic(),
        )
        .await?;
        consumer.subscribe(&[topic]).map_err(|error| {
            Error::from(KafkaTransportError::client(
                format!("subscribe to {topic:?}"),
                error,
            ))
        })?;
        let (shutdown, stop) = oneshot::channel();
        let (closed_sender, closed) = watch::channel(false);
        let driver = tokio::spawn(driver::drive(
            Arc::clone(&shared),
            consumer,
            options.wire.clone(),
            stop,
            closed_sender,
        ));
        Ok(Self {
            assignments: shared.assignments.subscribe(),
            shared,
            shutdown,
            driver,
            closed,
        })
    }

    /// A future that completes once this subscriber's consumer is closed (after
    /// [`close`](KafkaSubscriber::close), or in the background after a drop): its
    /// offsets are committed and it has left the group. It does not keep the
    /// subscriber alive; await it after dropping the subscriber before deleting its
    /// topic, say.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            // An error means the driver is gone, which also means closed.
            let _ = closed.wait_for(|closed| *closed).await;
        }
    }

    /// Leaves the group: commits the offsets of the settled records, hands the
    /// partitions back for a rebalance, and returns once the consumer is closed.
    /// Deliveries still out are delivered again by the group (their settlements change
    /// nothing any more).
    ///
    /// Dropping the subscriber does the same in the background.
    ///
    /// # Errors
    ///
    /// None so far; the result leaves room for reporting a failed final commit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the close goes on in the background.
    pub async fn close(self) -> Result<()> {
        let _ = self.shutdown.send(());
        if let Err(error) = self.driver.await {
            tracing::warn!(topic = %self.shared.topic, %error, "the consumer task failed");
        }
        Ok(())
    }

    /// Waits until the group assigned this member its partitions (possibly none, when
    /// the group has more members than the topic has partitions) for the first time.
    /// Records published after it returns reach this member or another of its group.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if no assignment came within `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_for_assignment(&self, timeout: Duration) -> Result<()> {
        let mut assignments = self.assignments.clone();
        match tokio::time::timeout(timeout, assignments.wait_for(|count| *count > 0)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// The partitions this member holds now.
    pub fn assigned_partitions(&self) -> Vec<i32> {
        self.shared.lock().state.assigned()
    }

    /// The topic subscribed to.
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.shared.group
    }

    /// The topic this subscriber's dead letters go to.
    pub fn dead_letter_topic(&self) -> &str {
        self.shared.dead_letters.dead_letter_topic()
    }
}

impl Subscriber for KafkaSubscriber {
    type Delivery = KafkaDelivery;

    /// Waits for the next record due: a fetched one, or one handed out again after a
    /// nack's delay or its ack timeout. Records come in the order they were fetched.
    ///
    /// # Errors
    ///
    /// A transient transport error, once per occurrence and only when nothing is due,
    /// when all brokers are down or the topic disappeared (calling again waits on);
    /// a permanent one ([`KafkaTransportError::ConsumerStopped`]) after a fatal
    /// consumer error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a record is taken in the same step that returns it.
    async fn next(&mut self) -> Result<KafkaDelivery> {
        loop {
            let changed = self.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Register before looking, so that a change made after the look wakes us.
            changed.as_mut().enable();
            let due = {
                let mut inner = self.shared.lock();
                match inner.state.poll(Instant::now()) {
                    Poll::Ready(handout) => {
                        let handout = *handout;
                        return Ok(KafkaDelivery {
                            shared: Arc::clone(&self.shared),
                            ticket: handout.ticket,
                            received: handout.received,
                            record: handout.record,
                        });
                    }
                    Poll::Wait(due) => {
                        if let Some(reason) = &inner.stopped {
                            return Err(KafkaTransportError::ConsumerStopped {
                                group: self.shared.group.clone(),
                                reason: reason.clone(),
                            }
                            .into());
                        }
                        if let Some(error) = inner.pending_error.take() {
                            return Err(Error::transport_transient(error));
                        }
                        due
                    }
                }
            };
            match due {
                Some(due) => {
                    tokio::select! {
                        () = changed => {}
                        () = sleep_until(due) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

impl fmt::Debug for KafkaSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSubscriber")
            .field("topic", &self.shared.topic)
            .field("group", &self.shared.group)
            .finish_non_exhaustive()
    }
}

/// Checks that a broker answers and `topic` exists; warns if `dead_letter_topic` does not.
async fn check_topics(
    options: &KafkaOptions,
    consumer: &Arc<Consumer>,
    topic: &str,
    dead_letter_topic: &str,
) -> Result<()> {
    let waited = options.connect_timeout;
    let metadata = {
        let consumer = Arc::clone(consumer);
        tokio::task::spawn_blocking(move || {
            consumer
                .fetch_metadata(None, Timeout::After(waited))
                .map_err(|error| {
                    consumer
                        .context()
                        .logging
                        .last_error()
                        .unwrap_or_else(|| error.to_string())
                })
        })
        .await
        .map_err(|joined| Error::transport_transient(joined.to_string()))?
    };
    let metadata = metadata.map_err(|cause| KafkaTransportError::Unreachable {
        brokers: options.brokers.clone(),
        waited,
        cause,
    })?;
    let exists = |name: &str| {
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    };
    if !exists(topic) {
        return Err(KafkaTransportError::UnknownTopic {
            topic: topic.to_owned(),
            brokers: options.brokers.clone(),
            code: RDKafkaErrorCode::UnknownTopicOrPartition,
        }
        .into());
    }
    if !exists(dead_letter_topic) {
        tracing::warn!(
            topic,
            dead_letter_topic,
            "the dead-letter topic does not exist: dead letters will fail until it is created"
        );
    }
    Ok(())
}
