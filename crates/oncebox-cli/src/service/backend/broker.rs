//! The broker a configuration names, connected: [`Broker`], and its publisher,
//! subscriber and delivery. Each dispatches to the backend crate's type through
//! `each_broker!`.

use std::time::Duration;

use oncebox::{Delivery, Message, Publisher, Received, Result, Subscriber};

use crate::config::{BrokerKind, Config, ConfigError};

/// Runs `$body` with `$value` bound to the backend's value, one arm per broker of the
/// build, in an `impl` of an enum whose variants are those brokers ([`AnyPublisher`],
/// [`AnyDelivery`]).
macro_rules! each_broker {
    ($self:expr, $value:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "nats")]
            Self::Nats($value) => $body,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq($value) => $body,
            #[cfg(feature = "kafka")]
            Self::Kafka($value) => $body,
            #[cfg(feature = "sqs")]
            Self::Sqs($value) => $body,
            Self::RedisStreams($value) => $body,
        }
    };
}

/// A connected broker. Its variants are the brokers of the build (the features).
#[non_exhaustive]
pub enum Broker {
    /// NATS JetStream.
    #[cfg(feature = "nats")]
    Nats(oncebox::nats::JetStreamTransport),
    /// RabbitMQ, whose publishers and subscribers connect on their own.
    #[cfg(feature = "rabbitmq")]
    RabbitMq(oncebox::rabbitmq::RabbitOptions),
    /// Kafka, whose publishers and subscribers connect on their own.
    #[cfg(feature = "kafka")]
    Kafka(oncebox::kafka::KafkaOptions),
    /// Redis Streams.
    RedisStreams(oncebox::redis::RedisStreams),
    /// Amazon SQS.
    #[cfg(feature = "sqs")]
    Sqs(oncebox::sqs::SqsTransport),
}

impl Broker {
    /// Connects to `broker.url` (with `broker.password`), or for brokers whose clients
    /// connect per publisher or subscriber, checks the settings. A broker that cannot
    /// be reached is a configuration error (exit status 2).
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] naming the broker and the cause.
    pub async fn connect(config: &Config) -> std::result::Result<Self, ConfigError> {
        let (url, kind) = config.broker()?;
        let timeout = config.broker.connect_timeout.get();
        let unreachable = |error: &dyn std::fmt::Display| {
            ConfigError::key("broker.url", format!("cannot connect to {url}: {error}"))
        };
        match kind {
            #[cfg(feature = "nats")]
            BrokerKind::Nats => {
                use oncebox::nats::{JetStreamOptions, JetStreamTransport, StreamSettings};
                // One server, or the seeds of a cluster: the client learns the others
                // from them and fails over between them all.
                let seeds = crate::config::nats_servers(url)?;
                let options = seeds
                    .iter()
                    .skip(1)
                    .fold(JetStreamOptions::new(seeds[0]), |options, seed| {
                        options.server(*seed)
                    })
                    .name("oncebox")
                    .subject_prefix(config.broker.subject_prefix.clone())
                    .source(config.source());
                options
                    .validate()
                    .map_err(|error| ConfigError::key("broker.url", error))?;
                let servers = seeds
                    .iter()
                    .map(|seed| seed.parse::<oncebox::nats::async_nats::ServerAddr>())
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|error| ConfigError::key("broker.url", error))?;
                let mut connect = oncebox::nats::async_nats::ConnectOptions::new()
                    .name("oncebox")
                    .connection_timeout(timeout)
                    // The first connection is checked below, with its own timeout.
                    .retry_on_initial_connect();
                if let Some(password) = &config.broker.password {
                    // Without a user name, the secret is the server's token.
                    connect = match crate::config::nats_user(url)? {
                        None => connect.token(password.expose().to_owned()),
                        Some(user) => connect.user_and_password(user, password.expose().to_owned()),
                    };
                }
                let client = tokio::time::timeout(timeout, connect.connect(servers))
                    .await
                    .map_err(|_| unreachable(&format!("no answer within {timeout:?}")))?
                    .map_err(|error| unreachable(&error))?;
                let client = match tokio::time::timeout(timeout, client.flush()).await {
                    Ok(Ok(())) => client,
                    Ok(Err(error)) => return Err(unreachable(&error)),
                    Err(_) => return Err(unreachable(&format!("no answer within {timeout:?}"))),
                };
                let transport = JetStreamTransport::with_client(client, options)
                    .map_err(|error| ConfigError::key("broker", error))?;
                if let Some(stream) = &config.broker.stream {
                    let settings = StreamSettings::new(stream.as_str())
                        .topic(">")
                        .replicas(config.broker.stream_replicas.into());
                    transport
                        .ensure_stream(&settings)
                        .await
                        .map_err(|error| ConfigError::key("broker.stream", error))?;
                }
                Ok(Self::Nats(transport))
            }
            #[cfg(feature = "rabbitmq")]
            BrokerKind::RabbitMq => {
                // One node, or a cluster's: the client tries them in turn.
                let mut nodes = crate::config::rabbitmq_nodes(url)?.into_iter().map(|node| {
                    crate::config::with_password(node, config.broker.password.as_ref())
                });
                let first = nodes.next().transpose()?.unwrap_or_default();
                let mut options = oncebox::rabbitmq::RabbitOptions::new(first);
                for node in nodes {
                    options = options.node(node?);
                }
                let options = options
                    .exchange(config.broker.exchange.clone())
                    .source(config.source())
                    .connect_timeout(timeout)
                    .connection_name("oncebox");
                options
                    .validate()
                    .map_err(|error| ConfigError::key("broker", error))?;
                // The publisher and subscribers connect on their own: try once here.
                oncebox::rabbitmq::RabbitPublisher::connect(&options)
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::RabbitMq(options))
            }
            #[cfg(feature = "kafka")]
            BrokerKind::Kafka => {
                if config.broker.password.is_some() {
                    return Err(ConfigError::key(
                        "broker.password",
                        "not supported for Kafka (no SASL settings yet)",
                    ));
                }
                let brokers = url.trim_start_matches("kafka://");
                let options = oncebox::kafka::KafkaOptions::new(brokers)
                    .client_id("oncebox")
                    .source(config.source())
                    .connect_timeout(timeout);
                options
                    .validate()
                    .map_err(|error| ConfigError::key("broker", error))?;
                // Publishers and subscribers connect on their own: try once here.
                oncebox::kafka::KafkaPublisher::connect(options.clone())
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::Kafka(options))
            }
            #[cfg(feature = "sqs")]
            BrokerKind::Sqs => {
                let transport = oncebox::sqs::SqsTransport::connect(sqs_options(url, config)?)
                    .await
                    .map_err(|error| ConfigError::key("broker", error))?;
                // Nothing is sent until the first request: ask for one queue name to
                // find out whether SQS answers and takes the credentials.
                let listed = transport.client().list_queues().max_results(1).send();
                tokio::time::timeout(timeout, listed)
                    .await
                    .map_err(|_| unreachable(&format!("no answer within {timeout:?}")))?
                    .map_err(|error| {
                        unreachable(&oncebox::sqs::aws_sdk_sqs::error::DisplayErrorContext(
                            &error,
                        ))
                    })?;
                Ok(Self::Sqs(transport))
            }
            BrokerKind::RedisStreams => {
                use oncebox::redis::RedisStreams;
                let password = config.broker.password.as_ref();
                let options = oncebox::redis::RedisStreamOptions::new()
                    .key_prefix(config.broker.key_prefix.clone())
                    .source(config.source());
                let connect = if config.broker.cluster {
                    let nodes = crate::config::cluster_nodes("broker.url", url, password)?;
                    futures_util::future::Either::Left(RedisStreams::connect_cluster(
                        nodes, options,
                    ))
                } else {
                    let full = crate::config::with_password(url, password)?;
                    futures_util::future::Either::Right(async move {
                        RedisStreams::connect(&full, options).await
                    })
                };
                let streams = tokio::time::timeout(timeout, connect)
                    .await
                    .map_err(|_| unreachable(&format!("no answer within {timeout:?}")))?
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::RedisStreams(streams))
            }
            #[allow(unreachable_patterns)]
            other => unreachable!(
                "{} is refused by the config check when not built",
                other.name()
            ),
        }
    }

    /// The broker's name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(_) => BrokerKind::Nats.name(),
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(_) => BrokerKind::RabbitMq.name(),
            #[cfg(feature = "kafka")]
            Self::Kafka(_) => BrokerKind::Kafka.name(),
            #[cfg(feature = "sqs")]
            Self::Sqs(_) => BrokerKind::Sqs.name(),
            Self::RedisStreams(_) => BrokerKind::RedisStreams.name(),
        }
    }

    /// Whether the broker's connection is up, where the client keeps one (NATS, Redis);
    /// `Ok` for the brokers whose publishers and subscribers connect on their own
    /// (RabbitMQ, Kafka), whose outages the relay and consumer report instead.
    pub(crate) async fn check(&self, timeout: Duration) -> std::result::Result<(), String> {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(transport) => {
                use oncebox::nats::async_nats::connection::State;
                match transport.client().connection_state() {
                    State::Connected => Ok(()),
                    state => Err(format!("the broker is not connected ({state})")),
                }
            }
            Self::RedisStreams(streams) => {
                let mut connection = streams.connection().clone();
                let command = oncebox::redis::redis::cmd("PING");
                let ping = command.query_async::<String>(&mut connection);
                match tokio::time::timeout(timeout, ping).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(error)) => Err(format!("the broker does not answer: {error}")),
                    Err(_) => Err(format!("the broker does not answer within {timeout:?}")),
                }
            }
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    /// A publisher to the broker.
    pub(crate) async fn publisher(&self) -> Result<AnyPublisher> {
        Ok(match self {
            #[cfg(feature = "nats")]
            Self::Nats(transport) => AnyPublisher::Nats(transport.publisher()),
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(options) => {
                AnyPublisher::RabbitMq(oncebox::rabbitmq::RabbitPublisher::connect(options).await?)
            }
            #[cfg(feature = "kafka")]
            Self::Kafka(options) => {
                AnyPublisher::Kafka(oncebox::kafka::KafkaPublisher::connect(options.clone()).await?)
            }
            #[cfg(feature = "sqs")]
            Self::Sqs(transport) => AnyPublisher::Sqs(transport.publisher()),
            Self::RedisStreams(streams) => AnyPublisher::RedisStreams(streams.publisher()),
        })
    }

    /// A subscriber of `topic` in group `group`.
    ///
    /// # Errors
    ///
    /// The broker's, when it refuses the subscription or cannot be reached.
    pub async fn subscriber(&self, topic: &str, group: &str) -> Result<AnySubscriber> {
        Ok(match self {
            #[cfg(feature = "nats")]
            Self::Nats(transport) => {
                AnySubscriber::Nats(Box::new(transport.subscriber(topic, group).await?))
            }
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(options) => AnySubscriber::RabbitMq(Box::new(
                oncebox::rabbitmq::RabbitSubscriber::connect(options, topic, group).await?,
            )),
            #[cfg(feature = "kafka")]
            Self::Kafka(options) => AnySubscriber::Kafka(Box::new(
                oncebox::kafka::KafkaSubscriber::subscribe(options.clone(), topic, group).await?,
            )),
            // SQS has no groups: every subscriber of a queue competes for its messages.
            #[cfg(feature = "sqs")]
            Self::Sqs(transport) => {
                AnySubscriber::Sqs(Box::new(transport.subscriber(topic).await?))
            }
            Self::RedisStreams(streams) => {
                AnySubscriber::RedisStreams(Box::new(streams.subscribe(topic, group).await?))
            }
        })
    }
}

/// The publisher of any broker in the build.
pub(crate) enum AnyPublisher {
    #[cfg(feature = "nats")]
    Nats(oncebox::nats::JetStreamPublisher),
    #[cfg(feature = "rabbitmq")]
    RabbitMq(oncebox::rabbitmq::RabbitPublisher),
    #[cfg(feature = "kafka")]
    Kafka(oncebox::kafka::KafkaPublisher),
    #[cfg(feature = "sqs")]
    Sqs(oncebox::sqs::SqsPublisher),
    RedisStreams(oncebox::redis::RedisStreamPublisher),
}

impl Publisher for AnyPublisher {
    async fn publish(&self, message: &Message) -> Result<()> {
        each_broker!(self, publisher => publisher.publish(message).await)
    }

    fn messaging_system(&self) -> &'static str {
        each_broker!(self, publisher => publisher.messaging_system())
    }
}

/// The subscriber of any broker in the build (boxed: their sizes differ by kilobytes).
#[non_exhaustive]
pub enum AnySubscriber {
    /// NATS JetStream's.
    #[cfg(feature = "nats")]
    Nats(Box<oncebox::nats::JetStreamSubscriber>),
    /// RabbitMQ's.
    #[cfg(feature = "rabbitmq")]
    RabbitMq(Box<oncebox::rabbitmq::RabbitSubscriber>),
    /// Kafka's.
    #[cfg(feature = "kafka")]
    Kafka(Box<oncebox::kafka::KafkaSubscriber>),
    /// Redis Streams'.
    RedisStreams(Box<oncebox::redis::RedisStreamSubscriber>),
    /// Amazon SQS's.
    #[cfg(feature = "sqs")]
    Sqs(Box<oncebox::sqs::SqsSubscriber>),
}

impl Subscriber for AnySubscriber {
    type Delivery = AnyDelivery;

    async fn next(&mut self) -> Result<AnyDelivery> {
        Ok(match self {
            #[cfg(feature = "nats")]
            Self::Nats(subscriber) => AnyDelivery::Nats(subscriber.next().await?),
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(subscriber) => AnyDelivery::RabbitMq(subscriber.next().await?),
            #[cfg(feature = "kafka")]
            Self::Kafka(subscriber) => AnyDelivery::Kafka(subscriber.next().await?),
            #[cfg(feature = "sqs")]
            Self::Sqs(subscriber) => AnyDelivery::Sqs(subscriber.next().await?),
            Self::RedisStreams(subscriber) => AnyDelivery::RedisStreams(subscriber.next().await?),
        })
    }
}

/// A delivery of any broker in the build.
#[non_exhaustive]
pub enum AnyDelivery {
    /// From NATS JetStream.
    #[cfg(feature = "nats")]
    Nats(oncebox::nats::JetStreamDelivery),
    /// From RabbitMQ.
    #[cfg(feature = "rabbitmq")]
    RabbitMq(oncebox::rabbitmq::RabbitDelivery),
    /// From Kafka.
    #[cfg(feature = "kafka")]
    Kafka(oncebox::kafka::KafkaDelivery),
    /// From Redis Streams.
    RedisStreams(oncebox::redis::RedisStreamDelivery),
    /// From Amazon SQS.
    #[cfg(feature = "sqs")]
    Sqs(oncebox::sqs::SqsDelivery),
}

impl Delivery for AnyDelivery {
    fn received(&self) -> &Received {
        each_broker!(self, delivery => delivery.received())
    }

    async fn ack(self) -> Result<()> {
        each_broker!(self, delivery => delivery.ack().await)
    }

    async fn nack(self, delay: Duration) -> Result<()> {
        each_broker!(self, delivery => delivery.nack(delay).await)
    }

    async fn dead_letter(self, reason: &str) -> Result<()> {
        each_broker!(self, delivery => delivery.dead_letter(reason).await)
    }

    fn messaging_system(&self) -> &'static str {
        each_broker!(self, delivery => delivery.messaging_system())
    }
}

/// The SQS options of an `sqs://` `broker.url`: region, endpoint, one queue or a queue
/// per topic, and `[topics]` (topic → queue name or URL) for the relay and the receiver
/// alike.
#[cfg(feature = "sqs")]
fn sqs_options(
    url: &str,
    config: &Config,
) -> std::result::Result<oncebox::sqs::SqsOptions, ConfigError> {
    let parsed = crate::config::sqs_url(url)?;
    let mut options = oncebox::sqs::SqsOptions::new()
        .fifo(parsed.fifo)
        .source(config.source());
    if let Some(region) = parsed.region {
        options = options.region(region);
    }
    if let Some(endpoint) = parsed.endpoint {
        options = options.endpoint(endpoint);
    }
    if let Some(queue) = parsed.queue {
        options = options.default_queue(queue);
    }
    // The relay renames a topic to its [topics] destination before publishing; the
    // receiver subscribes to receive.topic as written: both find the queue.
    for (topic, queue) in &config.topics {
        options = options
            .queue(topic.clone(), queue.clone())
            .queue(queue.clone(), queue.clone());
    }
    options
        .validate()
        .map_err(|error| ConfigError::key("topics", error))?;
    Ok(options)
}
