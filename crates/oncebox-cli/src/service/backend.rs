//! The store and broker a configuration names, boxed once at the binary's edge: each
//! enum dispatches to the backend crate's type, so the relay, the receiver and the
//! admin commands are written once.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use oncebox::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox::postgres::sqlx::postgres::PgConnectOptions;
use oncebox::postgres::{DebeziumLayout, PgStore};
use oncebox::spool::{
    Backlog, ClaimRequest, Claimed, DeadLetter, LeaseToken, MinuteCount, OutboxAdmin, OutboxRow,
    OutboxStats, RowFilter, Settlement, SpoolStore,
};
use oncebox::sqlite::SqliteStore;
use oncebox::store::{DedupRecord, DedupStore, InboxStore};
use oncebox::{Delivery, Message, MessageId, Publisher, Received, Result, Subscriber};

use crate::config::{BrokerKind, Config, ConfigError, Layout, Secret, StoreKind};

/// Runs `$body` with `$store` bound to the backend's value, one arm per store of the
/// build, in an `impl` of an enum whose variants are those stores ([`Database`],
/// [`AnyOutbox`]).
macro_rules! each_store {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            Self::Sqlite($store) => $body,
            Self::Postgres($store) => $body,
            #[cfg(feature = "mysql")]
            Self::Mysql($store) => $body,
        }
    };
}

/// A connected database. Its variants are the stores of the build (the features).
#[non_exhaustive]
pub enum Database {
    /// SQLite.
    Sqlite(SqliteStore),
    /// PostgreSQL.
    Postgres(PgStore),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(oncebox::mysql::MySqlStore),
}

impl Database {
    /// Connects to `store.url` with `store.password`. A database that cannot be reached
    /// is a configuration error (exit status 2), named by its URL; so is a SQLite file
    /// that does not exist (a relay on a new empty file would wait on it forever).
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] naming the store and the cause.
    pub async fn connect(config: &Config) -> std::result::Result<Self, ConfigError> {
        Self::open(config, false).await
    }

    /// [`connect`](Self::connect), creating a SQLite file that does not exist yet
    /// (`oncebox migrate`).
    pub(crate) async fn connect_creating(
        config: &Config,
    ) -> std::result::Result<Self, ConfigError> {
        Self::open(config, true).await
    }

    async fn open(config: &Config, create: bool) -> std::result::Result<Self, ConfigError> {
        let url = config.store_url()?;
        let unreachable = |error: &dyn std::fmt::Display| {
            ConfigError::key(
                "store.url",
                format!("cannot connect to {}: {error}", url.as_str()),
            )
        };
        let password = config.store.password.as_ref().map(Secret::expose);
        match url.kind() {
            StoreKind::Sqlite => {
                let options = SqliteStore::default_connect_options(url.sqlite_path())
                    .create_if_missing(create);
                let pool = pool(config, options)
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::Sqlite(SqliteStore::from_pool(pool)))
            }
            StoreKind::Postgres => {
                let mut options = PgConnectOptions::from_str(url.as_str())
                    .map_err(|error| unreachable(&error))?;
                if let Some(password) = password {
                    options = options.password(password);
                }
                let pool = pool(config, options)
                    .await
                    .map_err(|error| unreachable(&error))?;
                let store = PgStore::from_pool(pool)
                    .with_schema(&config.store.schema)
                    .map_err(|error| ConfigError::key("store.schema", error))?;
                Ok(Self::Postgres(store))
            }
            #[cfg(feature = "mysql")]
            StoreKind::Mysql => {
                use oncebox::mysql::sqlx::mysql::MySqlConnectOptions;
                let mut options = MySqlConnectOptions::from_str(url.as_str())
                    .map_err(|error| unreachable(&error))?;
                if let Some(password) = password {
                    options = options.password(password);
                }
                let pool = pool(config, options)
                    .await
                    .map_err(|error| unreachable(&error))?;
                Ok(Self::Mysql(oncebox::mysql::MySqlStore::from_pool(pool)))
            }
            #[cfg(not(feature = "mysql"))]
            StoreKind::Mysql => unreachable!("the URL parser refuses stores not in the build"),
        }
    }

    /// Creates or upgrades oncebox's tables (and the Debezium-style table's columns,
    /// with that layout).
    pub(crate) async fn migrate(&self, config: &Config) -> Result<()> {
        match self {
            Self::Sqlite(store) => store.migrate().await,
            Self::Postgres(store) => {
                store.migrate().await?;
                if config.outbox.layout == Layout::Debezium {
                    store.migrate_debezium(&debezium_layout(config)).await?;
                }
                Ok(())
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(store) => store.migrate().await,
        }
    }

    /// The outbox the configuration describes.
    pub(crate) fn outbox(&self, config: &Config) -> std::result::Result<AnyOutbox, ConfigError> {
        Ok(match self {
            Self::Sqlite(store) => AnyOutbox::Sqlite(store.outbox()),
            Self::Postgres(store) => {
                let outbox = match config.outbox.layout {
                    Layout::Oncebox => store.outbox(),
                    Layout::Debezium => store
                        .debezium_outbox_with(&debezium_layout(config))
                        .map_err(|error| ConfigError::key("outbox.table", error))?,
                };
                AnyOutbox::Postgres(
                    outbox
                        .with_notify(config.outbox.listen)
                        .with_held_claims(config.outbox.held_claims),
                )
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(store) => AnyOutbox::Mysql(store.outbox()),
        })
    }

    /// Deletes inbox records of `consumer` older than `before` (the transactional
    /// inbox's records and the durable inbox's processed rows), in bounded batches;
    /// returns how many.
    pub(crate) async fn purge_inbox(&self, consumer: &str, before: SystemTime) -> Result<u64> {
        const BATCH: usize = 1000;
        let mut total = 0;
        loop {
            let deleted = each_store!(self, store => {
                store.inbox().purge(consumer, before, BATCH).await?
                    + store.durable_inbox(consumer).purge(before, BATCH).await?
            });
            total += deleted;
            if deleted == 0 {
                return Ok(total);
            }
        }
    }

    /// Every inbox consumer's figures across the transactional and the durable inbox, in
    /// byte order of the name: one statement, which reads every record of both inboxes
    /// (each store's [`InboxAdmin`] implementation says how).
    pub(crate) async fn consumers(&self) -> Result<Vec<ConsumerStats>> {
        each_store!(self, store => store.inbox().consumers().await)
    }

    /// Up to `limit` durable inbox rows matching `filter`, newest first from `before`
    /// ([`InboxAdmin::inbox_rows`]).
    pub(crate) async fn inbox_rows(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<InboxRow>> {
        each_store!(self, store => store.inbox().inbox_rows(filter, before, limit).await)
    }

    /// The durable inbox row at position `seq`, if there is one.
    pub(crate) async fn inbox_row(&self, seq: i64) -> Result<Option<InboxRow>> {
        each_store!(self, store => store.inbox().inbox_row(seq).await)
    }

    /// The idempotent receiver's dedup record of `id` in this store, if there is one.
    pub(crate) async fn inspect_key(&self, id: &str) -> Result<Option<DedupRecord>> {
        each_store!(self, store => store.dedup().inspect(id).await)
    }

    /// The store's name, for logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => StoreKind::Sqlite.name(),
            Self::Postgres(_) => StoreKind::Postgres.name(),
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => StoreKind::Mysql.name(),
        }
    }

    /// Whether the database answers a `SELECT 1` within `timeout`; the reason if not.
    pub(crate) async fn ping(&self, timeout: Duration) -> std::result::Result<(), String> {
        let ping = async {
            each_store!(self, store => {
                sqlx::query("SELECT 1").execute(store.pool()).await.map(drop)
            })
        };
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(format!("the store does not answer: {error}")),
            Err(_) => Err(format!("the store does not answer within {timeout:?}")),
        }
    }
}

/// A pool of `store.pool_size` connections made with `options`, waiting at most
/// `store.connect_timeout` for one. No ping before each checkout: a connection that died
/// fails its statement, which the engines retry.
async fn pool<DB: sqlx::Database>(
    config: &Config,
    options: <DB::Connection as sqlx::Connection>::Options,
) -> std::result::Result<sqlx::Pool<DB>, sqlx::Error> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(config.store.pool_size)
        .acquire_timeout(config.store.connect_timeout.get())
        .test_before_acquire(false)
        .connect_with(options)
        .await
}

fn debezium_layout(config: &Config) -> DebeziumLayout {
    DebeziumLayout::new(&config.outbox.table).topic_prefix(&config.outbox.topic_prefix)
}

/// The outbox of any store in the build.
#[derive(Clone)]
pub(crate) enum AnyOutbox {
    Sqlite(oncebox::sqlite::SqliteOutbox),
    Postgres(oncebox::postgres::PgOutbox),
    #[cfg(feature = "mysql")]
    Mysql(oncebox::mysql::MySqlOutbox),
}

impl SpoolStore for AnyOutbox {
    type Item = Message;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<Message>>> {
        each_store!(self, outbox => outbox.claim(request).await)
    }

    async fn extend(&self, token: LeaseToken, rows: &[i64], lease: Duration) -> Result<()> {
        each_store!(self, outbox => outbox.extend(token, rows, lease).await)
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        each_store!(self, outbox => outbox.settle(token, settlements).await)
    }

    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<Message>>> {
        each_store!(self, outbox => outbox.settle_and_claim(token, settlements, request).await)
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        each_store!(self, outbox => SpoolStore::purge(outbox, before, limit).await)
    }

    async fn wait_for_work(&self, timeout: Duration) {
        each_store!(self, outbox => outbox.wait_for_work(timeout).await);
    }

    async fn backlog(&self) -> Result<Option<Backlog>> {
        each_store!(self, outbox => outbox.backlog().await)
    }
}

impl OutboxAdmin for AnyOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        each_store!(self, outbox => OutboxAdmin::stats(outbox).await)
    }

    async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        each_store!(self, outbox => outbox.row(id).await)
    }

    async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        each_store!(self, outbox => OutboxAdmin::dead_letters(outbox, after, limit).await)
    }

    async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        each_store!(self, outbox => OutboxAdmin::rows(outbox, filter, before, limit).await)
    }

    async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        each_store!(self, outbox => OutboxAdmin::published_per_minute(outbox, since).await)
    }

    async fn replay_dead(&self, id: MessageId) -> Result<bool> {
        each_store!(self, outbox => OutboxAdmin::replay_dead(outbox, id).await)
    }

    async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        each_store!(self, outbox => outbox.purge_dead(id).await)
    }
}

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
                let mut connect = oncebox::nats::async_nats::ConnectOptions::new()
                    .name("oncebox")
                    .connection_timeout(timeout)
                    // The first connection is checked below, with its own timeout.
                    .retry_on_initial_connect();
                if let Some(password) = &config.broker.password {
                    let user = ::url::Url::parse(url)
                        .map(|url| url.username().to_owned())
                        .unwrap_or_default();
                    // Without a user name, the secret is the server's token.
                    connect = if user.is_empty() {
                        connect.token(password.expose().to_owned())
                    } else {
                        connect.user_and_password(user, password.expose().to_owned())
                    };
                }
                let client = tokio::time::timeout(timeout, connect.connect(url))
                    .await
                    .map_err(|_| unreachable(&format!("no answer within {timeout:?}")))?
                    .map_err(|error| unreachable(&error))?;
                let client = match tokio::time::timeout(timeout, client.flush()).await {
                    Ok(Ok(())) => client,
                    Ok(Err(error)) => return Err(unreachable(&error)),
                    Err(_) => return Err(unreachable(&format!("no answer within {timeout:?}"))),
                };
                let options = JetStreamOptions::new(url)
                    .name("oncebox")
                    .subject_prefix(config.broker.subject_prefix.clone())
                    .source(config.source());
                let transport = JetStreamTransport::with_client(client, options)
                    .map_err(|error| ConfigError::key("broker", error))?;
                if let Some(stream) = &config.broker.stream {
                    transport
                        .ensure_stream(&StreamSettings::new(stream.as_str()).topic(">"))
                        .await
                        .map_err(|error| ConfigError::key("broker.stream", error))?;
                }
                Ok(Self::Nats(transport))
            }
            #[cfg(feature = "rabbitmq")]
            BrokerKind::RabbitMq => {
                let full = crate::config::with_password(url, config.broker.password.as_ref())?;
                let options = oncebox::rabbitmq::RabbitOptions::new(full)
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
            BrokerKind::RedisStreams => {
                let full = crate::config::with_password(url, config.broker.password.as_ref())?;
                let options = oncebox::redis::RedisStreamOptions::new()
                    .key_prefix(config.broker.key_prefix.clone())
                    .source(config.source());
                let streams = tokio::time::timeout(
                    timeout,
                    oncebox::redis::RedisStreams::connect(&full, options),
                )
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

/// The stores and brokers in this build, for `oncebox --version`.
pub(crate) fn compiled_in() -> String {
    let stores: Vec<&str> = StoreKind::ALL
        .iter()
        .filter(|kind| kind.compiled())
        .map(|kind| kind.name())
        .collect();
    let brokers: Vec<&str> = BrokerKind::ALL
        .iter()
        .filter(|kind| kind.compiled())
        .map(|kind| kind.name())
        .collect();
    format!(
        "stores: {}\nbrokers: {}",
        stores.join(", "),
        brokers.join(", ")
    )
}
