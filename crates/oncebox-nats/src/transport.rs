//! The connection handle: publishers, subscribers, streams and dead letters come from it.

use std::fmt;
use std::sync::Arc;

use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::{self, ContextBuilder};
use async_nats::{Client, ConnectErrorKind, ConnectOptions};
use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, Result};

use crate::error::{JetStreamError, client, permanent, refused, transient};
use crate::names::check_publish_subject;
use crate::{JetStreamOptions, JetStreamPublisher, JetStreamSubscriber, SubscriberOptions};

/// A connection to NATS with JetStream, and the factory of the transport's parts.
///
/// Cheap to clone: clones share the connection, which reconnects by itself after the
/// server restarts or the network drops (with growing pauses up to 4 s between
/// attempts, for ever). While it is down, publishes fail with transient errors once
/// their [request timeout](JetStreamOptions::request_timeout) passes and subscribers
/// report transient errors; both work again once it is back.
///
/// ```no_run
/// use oncebox_nats::{JetStreamOptions, JetStreamTransport, StreamSettings};
/// use oncebox_core::{Message, Publisher};
///
/// # async fn run() -> oncebox_core::Result<()> {
/// let nats = JetStreamTransport::connect(JetStreamOptions::new("nats://127.0.0.1:4222")).await?;
/// nats.ensure_stream(&StreamSettings::new("ORDERS").topic("orders")).await?;
/// nats.ensure_dead_letter_stream(&StreamSettings::new("ORDERS_DLQ").topic("orders")).await?;
/// nats.publisher().publish(&Message::new("orders", "order 42")).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JetStreamTransport {
    pub(crate) shared: Arc<Shared>,
}

/// What every handle of one transport shares.
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) context: jetstream::Context,
    pub(crate) options: JetStreamOptions,
    pub(crate) wire: WireFormat,
}

impl JetStreamTransport {
    /// Connects to the servers of `options`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that fail
    /// [`JetStreamOptions::validate`] (a bad URL among them); a transient transport
    /// error when no server can be reached, a permanent one when the server refuses the
    /// credentials or the TLS handshake fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the connection being made.
    pub async fn connect(options: JetStreamOptions) -> Result<Self> {
        options.validate()?;
        let servers = options.server_addrs()?;
        let mut connect = ConnectOptions::new()
            .connection_timeout(options.connect_timeout)
            .request_timeout(Some(options.request_timeout));
        if let Some(name) = &options.name {
            connect = connect.name(name);
        }
        let nats = connect.connect(servers).await.map_err(|error| {
            let operation = format!("connect to NATS at {}", options.servers_for_display());
            let lasting = matches!(
                error.kind(),
                ConnectErrorKind::ServerParse
                    | ConnectErrorKind::Authentication
                    | ConnectErrorKind::AuthorizationViolation
                    | ConnectErrorKind::Tls
            );
            let error = JetStreamError::Client {
                operation,
                source: error.into(),
            };
            if lasting {
                permanent(error)
            } else {
                transient(error)
            }
        })?;
        Self::with_client(nats, options)
    }

    /// A transport over a client you connected yourself (for nkeys, credential files,
    /// custom TLS); the server URLs of `options` are not used.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that fail [`JetStreamOptions::validate`],
    /// or when called outside a Tokio runtime (the transport runs a task in it).
    pub fn with_client(nats: Client, options: JetStreamOptions) -> Result<Self> {
        options.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidOptions(
                "JetStreamTransport::with_client must be called within a Tokio runtime".into(),
            ));
        }
        let context = ContextBuilder::new()
            .timeout(options.request_timeout)
            .max_ack_inflight(options.max_in_flight)
            .backpressure_on_inflight(true)
            .build(nats.clone());
        let wire = WireFormat::nats().with_source(options.source.clone());
        Ok(Self {
            shared: Arc::new(Shared {
                client: nats,
                context,
                options,
                wire,
            }),
        })
    }

    /// A publisher. Cheap; every publisher shares the connection.
    pub fn publisher(&self) -> JetStreamPublisher {
        JetStreamPublisher::new(Arc::clone(&self.shared))
    }

    /// Joins consumer group `group` on `topic` with the subscriber options of
    /// [`JetStreamOptions::subscriber`].
    ///
    /// # Errors
    ///
    /// See [`JetStreamTransport::subscriber_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: creating the consumer again is harmless.
    pub async fn subscriber(&self, topic: &str, group: &str) -> Result<JetStreamSubscriber> {
        let options = self.shared.options.subscriber.clone();
        self.subscriber_with(topic, group, options).await
    }

    /// Joins consumer group `group` on `topic`: creates or updates the group's durable
    /// pull consumer (named `{group}_{topic}`, see the crate documentation) on the
    /// stream that captures the topic's subject. A group created after messages were
    /// published receives them all, from the start of the stream.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a group that is not a valid consumer name or bad
    /// `options`; a permanent transport error for a topic that is not a valid subject
    /// or a consumer of that name filtering another subject; a transient one when no
    /// stream captures the subject or the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: creating the consumer again is harmless.
    pub async fn subscriber_with(
        &self,
        topic: &str,
        group: &str,
        options: SubscriberOptions,
    ) -> Result<JetStreamSubscriber> {
        JetStreamSubscriber::join(Arc::clone(&self.shared), topic, group, options).await
    }

    /// The options this transport was made with.
    pub fn options(&self) -> &JetStreamOptions {
        &self.shared.options
    }

    /// The NATS client, for anything this crate does not cover.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The JetStream context (stream and consumer management, raw publishing).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.shared.context
    }
}

impl fmt::Debug for JetStreamTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamTransport")
            .field("options", &self.shared.options)
            .field("state", &self.shared.client.connection_state())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The subject of `topic`, checked.
    pub(crate) fn subject(&self, topic: &str) -> Result<String> {
        checked(self.options.subject(topic))
    }

    /// The dead-letter subject of `topic`, checked.
    pub(crate) fn dead_letter_subject(&self, topic: &str) -> Result<String> {
        checked(self.options.dead_letter_subject(topic))
    }

    /// The name of the stream that captures `subject`.
    pub(crate) async fn stream_for(&self, subject: &str) -> Result<String> {
        self.context
            .stream_by_subject(subject)
            .await
            .map_err(|error| match error.kind() {
                GetStreamByNameErrorKind::NotFound => transient(JetStreamError::NoStream {
                    subject: subject.to_owned(),
                }),
                GetStreamByNameErrorKind::InvalidSubject => {
                    permanent(JetStreamError::InvalidSubject {
                        subject: subject.to_owned(),
                        reason: "the server's client refused it",
                    })
                }
                GetStreamByNameErrorKind::JetStream(api) => {
                    refused(format!("find the stream of {subject:?}"), api)
                }
                GetStreamByNameErrorKind::Request => {
                    client(format!("find the stream of {subject:?}"), error)
                }
            })
    }
}

fn checked(subject: String) -> Result<String> {
    match check_publish_subject(&subject) {
        Ok(()) => Ok(subject),
        Err(reason) => Err(permanent(JetStreamError::InvalidSubject {
            subject,
            reason,
        })),
    }
}
