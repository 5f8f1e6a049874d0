//! A member of a consumer group: a durable pull consumer per group and topic.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::Statistics;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, ErrorCode};
use futures_util::StreamExt;
use oncebox_core::{Coordinates, Error, Result, Subscriber};

use crate::dead_letter::dead_letter_message;
use crate::delivery::{Position, Route};
use crate::error::{JetStreamError, client, permanent, refused, transient};
use crate::names::{check_name, durable_name};
use crate::transport::Shared;
use crate::unreadable::remove_unreadable;
use crate::{JetStreamDelivery, SubscriberOptions};

/// How long one pull request stays open on the server.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// How often the server signals an idle pull request is alive; two missed heartbeats
/// report a transient error (the connection is probably down).
const PULL_HEARTBEAT: Duration = Duration::from_secs(5);

/// How often a waiting subscriber checks whether the client reconnected.
const RECONNECT_CHECK: Duration = Duration::from_millis(500);

/// A member of a consumer group on a topic: pulls from the group's durable consumer.
///
/// Members of one group (in one process or many) share its messages; each group gets
/// every message of the topic, from the start of the stream. Made by
/// [`JetStreamTransport::subscriber`](crate::JetStreamTransport::subscriber).
///
/// The subscriber settles two kinds of deliveries itself, never handing them out and
/// never dropping them:
///
/// - one whose headers cannot be decoded ([`WireFormat::decode`](oncebox_core::wire::WireFormat::decode)
///   fails: a header value with a control character, over 8 KiB, not UTF-8) is
///   dead-lettered with the decoding error as the reason;
/// - the last delivery [`max_deliver`](SubscriberOptions::max_deliver) allows is
///   dead-lettered with the reason "delivered N times without being settled", so that a
///   message that crashes its consumer every time ends among the dead letters.
///
/// Both are logged at `warn`. If the dead letter cannot be stored (no dead-letter
/// stream), [`Subscriber::next`] returns that error; for a last delivery, which the
/// server will not deliver again, it tries again on every later call before pulling.
///
/// A message whose header block the NATS client cannot read at all (a value that is not
/// UTF-8) never arrives: the client drops the connection on it. After every reconnection
/// the subscriber reads what its consumer delivered and did not see acked through
/// JetStream's raw message API, copies each such message to the dead-letter subject
/// with the reason, and deletes it from the stream (no consumer of this client could
/// read it). The connection drops once per such message; the messages of the pull batch
/// lost with it are delivered again after the ack wait.
pub struct JetStreamSubscriber {
    shared: Arc<Shared>,
    route: Arc<Route>,
    options: SubscriberOptions,
    consumer: Option<PullConsumer>,
    messages: Option<pull::Stream>,
    unfinished: Option<Unfinished>,
    /// The client's connection count when unreadable messages were last looked for.
    connects_seen: u64,
}

/// A dead letter the subscriber started itself and has not finished.
struct Unfinished {
    message: jetstream::Message,
    position: Position,
    reason: String,
    /// Whether the server would deliver it again if given up (not its last delivery).
    redelivered: bool,
}

/// What a received message turns out to be.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per message and unpacked at once, never stored"
)]
enum Inspected {
    Deliver(JetStreamDelivery),
    DeadLetter(Unfinished),
}

impl JetStreamSubscriber {
    /// Creates or updates the durable consumer of `group` on `topic`.
    pub(crate) async fn join(
        shared: Arc<Shared>,
        topic: &str,
        group: &str,
        options: SubscriberOptions,
    ) -> Result<Self> {
        options.validate()?;
        check_name(group).map_err(|reason| {
            Error::InvalidOptions(format!(
                "group {group:?} cannot name a JetStream consumer: {reason}"
            ))
        })?;
        let subject = shared.subject(topic)?;
        let stream = shared.stream_for(&subject).await?;
        let consumer = durable_name(group, topic);
        check_name(&consumer).map_err(|reason| {
            Error::InvalidOptions(format!("consumer name {consumer:?}: {reason}"))
        })?;
        let route = Arc::new(Route {
            topic: topic.to_owned(),
            group: group.to_owned(),
            subject,
            stream,
            consumer,
        });
        let connects_seen = shared.client.statistics().connects.load(Ordering::Relaxed);
        let mut subscriber = Self {
            shared,
            route,
            options,
            consumer: None,
            messages: None,
            unfinished: None,
            connects_seen,
        };
        subscriber.consumer = Some(subscriber.create_consumer().await?);
        Ok(subscriber)
    }

    /// The topic subscribed to.
    pub fn topic(&self) -> &str {
        &self.route.topic
    }

    /// The consumer group this subscriber is a member of.
    pub fn group(&self) -> &str {
        &self.route.group
    }

    /// The stream read.
    pub fn stream(&self) -> &str {
        &self.route.stream
    }

    /// The durable consumer's name.
    pub fn consumer_name(&self) -> &str {
        &self.route.consumer
    }

    async fn create_consumer(&self) -> Result<PullConsumer> {
        let route = &self.route;
        let config = pull::Config {
            durable_name: Some(route.consumer.clone()),
            description: Some(format!(
                "oncebox consumer group {} on topic {}",
                route.group, route.topic
            )),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.options.ack_wait,
            max_deliver: self.options.max_deliver.map_or(-1, i64::from),
            filter_subject: route.subject.clone(),
            max_ack_pending: i64::from(self.options.max_ack_pending),
            ..Default::default()
        };
        let operation = || {
            format!(
                "create consumer {} on stream {}",
                route.consumer, route.stream
            )
        };
        let consumer = self
            .shared
            .context
            .create_consumer_on_stream(config, &route.stream)
            .await
            .map_err(|error| match error.kind() {
                ConsumerErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    transient(JetStreamError::NoStream {
                        subject: route.subject.clone(),
                    })
                }
                ConsumerErrorKind::JetStream(api) => refused(operation(), api),
                ConsumerErrorKind::InvalidName | ConsumerErrorKind::InvalidConsumerType => {
                    permanent(JetStreamError::Client {
                        operation: operation(),
                        source: error.into(),
                    })
                }
                ConsumerErrorKind::TimedOut
                | ConsumerErrorKind::Request
                | ConsumerErrorKind::Other => client(operation(), error),
            })?;
        let found = &consumer.cached_info().config.filter_subject;
        if found != &route.subject {
            return Err(permanent(JetStreamError::ConsumerMismatch {
                stream: route.stream.clone(),
                consumer: route.consumer.clone(),
                found: found.clone(),
                expected: route.subject.clone(),
            }));
        }
        Ok(consumer)
    }

    /// Opens the pull stream, re-creating the consumer first if it was deleted.
    async fn open(&mut self) -> Result<pull::Stream> {
        let consumer = match &self.consumer {
            Some(consumer) => consumer.clone(),
            None => {
                let consumer = self.create_consumer().await?;
                self.consumer = Some(consumer.clone());
                consumer
            }
        };
        let prefetch = usize::try_from(self.options.prefetch).unwrap_or(usize::MAX);
        consumer
            .stream()
            .max_messages_per_batch(prefetch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|error| client(format!("pull from {}", self.route.consumer), error))
    }

    /// Turns a failed pull into the error `next` returns, dropping what cannot go on.
    fn pull_failed(&mut self, error: pull::MessagesError) -> Error {
        let operation = format!("pull from {}", self.route.consumer);
        match error.kind() {
            MessagesErrorKind::ConsumerDeleted => {
                tracing::warn!(
                    consumer = %self.route.consumer, stream = %self.route.stream,
                    "the consumer was deleted; re-creating it (the group starts again from the \
                     beginning of the stream)"
                );
                self.messages = None;
                self.consumer = None;
                client(operation, error)
            }
            MessagesErrorKind::PushBasedConsumer | MessagesErrorKind::RequestLimitExceeded => {
                self.messages = None;
                permanent(JetStreamError::Client {
                    operation,
                    source: error.into(),
                })
            }
            // The pull request is gone, or was never made: lost with the node that led
            // the consumer (or sent before any node led a new one), answered by no one,
            // or not sent. The client's stream would ask again only when the request
            // expires (35 s) or the connection comes back: the next call opens a new
            // one. Nothing is left in the stream to lose (no heartbeat came, so no
            // message either); whatever the server delivers to the old one meanwhile
            // is delivered again after the ack wait.
            MessagesErrorKind::MissingHeartbeat
            | MessagesErrorKind::NoResponders
            | MessagesErrorKind::Pull => {
                self.messages = None;
                client(operation, error)
            }
            MessagesErrorKind::Other => client(operation, error),
        }
    }

    /// Reads a message into a delivery, or into a dead letter of the subscriber's own.
    fn inspect(&self, message: jetstream::Message) -> Option<Inspected> {
        let info = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(error) => {
                // A pull consumer only hands out JetStream messages; without the ack
                // subject this one could not be settled anyway.
                tracing::warn!(
                    consumer = %self.route.consumer, subject = %message.subject, %error,
                    "skipped a message without JetStream metadata"
                );
                return None;
            }
        };
        let (sequence, delivered) = info;
        let deliveries = u32::try_from(delivered.max(1)).unwrap_or(u32::MAX);
        let position = Position {
            sequence,
            deliveries,
        };
        if let Some(max) = self.options.max_deliver
            && deliveries >= max
        {
            return Some(Inspected::DeadLetter(Unfinished {
                message,
                position,
                reason: format!(
                    "delivered {deliveries} times without being settled (max_deliver {max})"
                ),
                redelivered: false,
            }));
        }
        let coordinates = Coordinates {
            source: self.route.topic.clone(),
            partition: None,
            position: sequence.to_string(),
        };
        let fields = message.headers.iter().flat_map(|headers| {
            headers.iter().flat_map(|(name, values)| {
                let name: &str = name.as_ref();
                values
                    .iter()
                    .map(move |value| (name.as_bytes(), value.as_str().as_bytes()))
            })
        });
        let decoded = self.shared.wire.decode(
            &self.route.topic,
            fields,
            message.payload.clone(),
            coordinates,
            deliveries,
        );
        match decoded {
            Ok(mut received) => {
                // `Nats-Msg-Id` carried the id for the stream's dedup; a foreign
                // producer's own `Nats-Msg-Id` stays.
                let id = received.id.map(|id| id.to_string());
                if id.is_some() && received.headers.get(NATS_MESSAGE_ID.as_ref()) == id.as_deref() {
                    received.headers.remove(NATS_MESSAGE_ID.as_ref());
                }
                Some(Inspected::Deliver(JetStreamDelivery {
                    shared: Arc::clone(&self.shared),
                    route: Arc::clone(&self.route),
                    message,
                    position,
                    received,
                }))
            }
            Err(invalid) => Some(Inspected::DeadLetter(Unfinished {
                message,
                position,
                reason: format!("the message's headers cannot be decoded: {invalid}"),
                redelivered: true,
            })),
        }
    }

    /// Finishes the dead letter the subscriber started, if any.
    async fn finish_dead_letter(&mut self) -> Result<()> {
        let Some(unfinished) = &self.unfinished else {
            return Ok(());
        };
        let result = dead_letter_message(
            &self.shared,
            &self.route,
            &unfinished.message,
            unfinished.position,
            &unfinished.reason,
        )
        .await;
        match result {
            Ok(()) => {
                self.unfinished = None;
                Ok(())
            }
            Err(error) => {
                tracing::error!(
                    topic = %self.route.topic, group = %self.route.group,
                    sequence = unfinished.position.sequence, reason = %unfinished.reason,
                    %error, "could not dead-letter a message"
                );
                if unfinished.redelivered {
                    // The server delivers it again after the ack wait: try then.
                    self.unfinished = None;
                }
                Err(error)
            }
        }
    }
}

impl Subscriber for JetStreamSubscriber {
    type Delivery = JetStreamDelivery;

    /// Waits for the next message of the group that is due.
    ///
    /// The subscriber keeps a pull request open on the server (asking for
    /// [`prefetch`](SubscriberOptions::prefetch) messages, renewed as they arrive), so
    /// messages arrive as soon as they are published; there is no polling.
    ///
    /// # Errors
    ///
    /// Transient transport errors while the server is unreachable or the pull request
    /// is lost (two heartbeats missed: in a cluster, the node leading the consumer died
    /// or the request reached a new consumer before any node led it) or when a dead
    /// letter of the subscriber's own could not be stored; the next call goes on (with a
    /// new pull request after missed heartbeats; after a reconnection the client renews
    /// the request; a deleted consumer is re-created). Permanent ones when the consumer is not a pull
    /// consumer or refuses the pull request's size.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken from the subscription only in the step that
    /// returns it, and a dead letter of the subscriber's own that was interrupted is
    /// finished on the next call.
    async fn next(&mut self) -> Result<JetStreamDelivery> {
        self.finish_dead_letter().await?;
        loop {
            if self.messages.is_none() {
                self.messages = Some(self.open().await?);
            }
            let Some(messages) = self.messages.as_mut() else {
                continue;
            };
            let statistics = self.shared.client.statistics();
            let pulled = tokio::select! {
                message = messages.next() => Pulled::Message(message),
                connects = reconnected(statistics, self.connects_seen) => Pulled::Reconnected(connects),
            };
            let message = match pulled {
                Pulled::Reconnected(connects) => {
                    // One look per reconnection: a look that fails (no permission for
                    // the raw message API, say) is logged, not retried at every pull.
                    self.connects_seen = connects;
                    if let Some(consumer) = &self.consumer
                        && let Err(error) =
                            remove_unreadable(&self.shared, &self.route, consumer).await
                    {
                        tracing::warn!(
                            consumer = %self.route.consumer, %error,
                            "could not look for unreadable messages after a reconnection"
                        );
                    }
                    continue;
                }
                Pulled::Message(Some(Ok(message))) => message,
                Pulled::Message(Some(Err(error))) => return Err(self.pull_failed(error)),
                Pulled::Message(None) => {
                    self.messages = None;
                    return Err(client(
                        format!("pull from {}", self.route.consumer),
                        "the subscription ended; it is renewed on the next call",
                    ));
                }
            };
            match self.inspect(message) {
                Some(Inspected::Deliver(delivery)) => return Ok(delivery),
                Some(Inspected::DeadLetter(unfinished)) => {
                    tracing::warn!(
                        topic = %self.route.topic, group = %self.route.group,
                        sequence = unfinished.position.sequence, reason = %unfinished.reason,
                        "dead-lettering a message the subscriber cannot hand out"
                    );
                    self.unfinished = Some(unfinished);
                    self.finish_dead_letter().await?;
                }
                None => {}
            }
        }
    }
}

/// What waiting on the pull stream gave.
#[expect(
    clippy::large_enum_variant,
    reason = "made once per message and unpacked at once, never stored"
)]
enum Pulled {
    Message(Option<Result<jetstream::Message, pull::MessagesError>>),
    /// The client connected again; its connection count now.
    Reconnected(u64),
}

/// Returns once the client has connected more often than `seen` times.
async fn reconnected(statistics: Arc<Statistics>, seen: u64) -> u64 {
    loop {
        let connects = statistics.connects.load(Ordering::Relaxed);
        if connects > seen {
            return connects;
        }
        tokio::time::sleep(RECONNECT_CHECK).await;
    }
}

impl fmt::Debug for JetStreamSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamSubscriber")
            .field("topic", &self.route.topic)
            .field("group", &self.route.group)
            .field("stream", &self.route.stream)
            .field("consumer", &self.route.consumer)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
