#![doc = include_str!("../docs/streams.md")]

mod batcher;
mod dead;
mod delivery;
pub(crate) mod entry;
mod options;
mod publisher;
mod subscriber;
mod wakeups;

use std::fmt;
use std::sync::Arc;

use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, MessageId, Result};
use redis::Value;

pub use dead::RedisDeadLetter;
pub use delivery::RedisStreamDelivery;
pub use entry::DATA_FIELD;
pub use options::{REDIS_MAX_BULK_BYTES, RedisStreamOptions};
pub use publisher::RedisStreamPublisher;
pub use subscriber::RedisStreamSubscriber;

use delivery::{Link, TopicKeys};
use entry::parse_entries;
use subscriber::{SubscriberConfig, create_group};
use wakeups::Wakeups;

use crate::connection::{Endpoint, RedisConnection, Timeouts};
use crate::error::transport_error;

/// The environment variable [`RedisStreams::connect_env`] reads the URL from.
pub const URL_ENV: &str = "ONCEBOX_REDIS_URL";

/// The URL [`RedisStreams::connect_env`] uses when [`URL_ENV`] is not set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The Redis Streams transport: a connection to one Redis server or to a Redis Cluster
/// that hands out [publishers](RedisStreamPublisher) and
/// [subscribers](RedisStreamSubscriber). Cheap to clone; clones share the connection.
///
/// See the [module documentation](self) for the wire format and the semantics, and its
/// section on clusters.
#[derive(Clone)]
pub struct RedisStreams {
    endpoint: Endpoint,
    connection: RedisConnection,
    options: Arc<RedisStreamOptions>,
}

impl RedisStreams {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://` for TLS if the `redis` crate was built with it), with reconnection on
    /// failure.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that does not parse or invalid `options`; a
    /// transient transport error if the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the connection being made.
    pub async fn connect(url: &str, options: RedisStreamOptions) -> Result<Self> {
        options.validate()?;
        Self::connect_to(Endpoint::server(url)?, options).await
    }

    /// Connects to the Redis Cluster that `nodes` belong to (URLs as for
    /// [`connect`](Self::connect); one reachable node is enough, the client learns the
    /// others from it). Each topic's stream and its companion keys (dead letters, parked
    /// nacks) live in one hash slot: see the module docs on clusters.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no URL, a URL that does not parse, or invalid
    /// `options`; a transient transport error if no node can be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the connections being made.
    pub async fn connect_cluster<S: AsRef<str>>(
        nodes: impl IntoIterator<Item = S>,
        options: RedisStreamOptions,
    ) -> Result<Self> {
        options.validate()?;
        Self::connect_to(Endpoint::cluster(nodes)?, options).await
    }

    async fn connect_to(endpoint: Endpoint, options: RedisStreamOptions) -> Result<Self> {
        let connection = connect(&endpoint, &options, options.response_timeout).await?;
        Ok(Self {
            endpoint,
            connection,
            options: Arc::new(options),
        })
    }

    /// [`RedisStreams::connect`] to the URL in `ONCEBOX_REDIS_URL`, or to
    /// `redis://127.0.0.1:6379` if it is not set.
    ///
    /// # Errors
    ///
    /// As [`RedisStreams::connect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect_env(options: RedisStreamOptions) -> Result<Self> {
        let url = std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned());
        Self::connect(&url, options).await
    }

    /// The options this transport was made with.
    pub fn options(&self) -> &RedisStreamOptions {
        &self.options
    }

    /// The shared connection, for other commands on the same server or cluster.
    pub fn connection(&self) -> &RedisConnection {
        &self.connection
    }

    /// The key of `topic`'s stream: the key prefix and the topic.
    pub fn stream_key(&self, topic: &str) -> String {
        self.topic_keys(topic).stream
    }

    /// The key of `topic`'s dead-letter stream: the stream key and the dead-letter
    /// suffix; on a cluster, the stream key in a hash tag (`{shop:orders}:dead`) unless it
    /// has one already, so that both live in one slot.
    pub fn dead_letter_key(&self, topic: &str) -> String {
        self.topic_keys(topic).dead
    }

    fn topic_keys(&self, topic: &str) -> TopicKeys {
        TopicKeys::new(
            &self.options.key_prefix,
            topic,
            &self.options.dead_letter_suffix,
            self.connection.is_cluster(),
        )
    }

    /// The topic's keys, checked to share a slot on a cluster.
    fn keys(&self, topic: &str) -> Result<TopicKeys> {
        let keys = self.topic_keys(topic);
        if self.connection.is_cluster() {
            keys.check_one_slot()?;
        }
        Ok(keys)
    }

    /// A publisher on the shared connection.
    pub fn publisher(&self) -> RedisStreamPublisher {
        RedisStreamPublisher::new(self.connection.clone(), &self.options)
    }

    /// Joins consumer group `group` on `topic`'s stream, creating the group (from the
    /// start of the stream, so that it receives what was published before it existed) and
    /// the stream if needed. Every call is a new member with its own consumer name
    /// (unless [`RedisStreamOptions::consumer`] fixed one) and its own connection for
    /// blocking reads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for an empty topic or group; a permanent transport error
    /// if the stream's key holds another type; a transient one if Redis cannot be
    /// reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the group, if created, stays; no entry is read before this returns.
    pub async fn subscribe(&self, topic: &str, group: &str) -> Result<RedisStreamSubscriber> {
        if topic.is_empty() || group.is_empty() {
            return Err(Error::InvalidOptions(
                "Redis Streams: the topic and the group must not be empty".into(),
            ));
        }
        let keys = self.keys(topic)?;
        create_group(&self.connection, &keys.stream, group).await?;
        let options = &self.options;
        // The blocking read may take `block`, plus the usual time for the reply.
        let reader = connect(
            &self.endpoint,
            options,
            options.block + options.response_timeout,
        )
        .await?;
        let consumer = match &options.consumer {
            Some(name) => name.clone(),
            None => format!("oncebox-{}", MessageId::new()),
        };
        let link = Link {
            connection: self.connection.clone(),
            topic: topic.to_owned(),
            keys,
            group: group.to_owned(),
            consumer,
            ack_timeout: options.ack_timeout,
            wakeups: Wakeups::default(),
        };
        let config = SubscriberConfig {
            reader,
            format: WireFormat::redis(),
            batch_size: options.batch_size,
            block: options.block,
            max_deliveries: options.max_deliveries,
            reclaim_interval: options.reclaim_interval,
        };
        Ok(RedisStreamSubscriber::new(link, config))
    }

    /// The oldest `count` dead letters of `topic`, oldest first.
    ///
    /// # Errors
    ///
    /// A transport error if Redis cannot be reached or the dead-letter key holds another
    /// type.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn dead_letters(&self, topic: &str, count: usize) -> Result<Vec<RedisDeadLetter>> {
        let key = self.keys(topic)?.dead;
        let mut connection = self.connection.clone();
        let reply: Value = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut connection)
            .await
            .map_err(|e| transport_error(e, &key))?;
        let entries = parse_entries("XRANGE", reply).map_err(Error::transport_permanent)?;
        Ok(entries
            .into_iter()
            .map(|entry| RedisDeadLetter::from_entry(topic, entry))
            .collect())
    }
}

/// A new connection with the transport's timeouts, reconnecting with backoff capped at
/// one second.
async fn connect(
    endpoint: &Endpoint,
    options: &RedisStreamOptions,
    response_timeout: std::time::Duration,
) -> Result<RedisConnection> {
    let timeouts = Timeouts {
        response: response_timeout,
        connect: options.response_timeout,
    };
    endpoint
        .connect(timeouts)
        .await
        .map_err(|e| transport_error(e, ""))
}

impl fmt::Debug for RedisStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's Debug would print the URL, which may hold a password.
        f.debug_struct("RedisStreams")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn handles_cross_threads() {
        send_sync::<RedisStreams>();
        send_sync::<RedisStreamPublisher>();
        send_sync::<RedisStreamDelivery>();
        send_sync::<RedisDeadLetter>();
        send::<RedisStreamSubscriber>();
    }

    #[test]
    fn keys_follow_the_prefix_and_suffix() {
        let keys = TopicKeys::new("shop:", "orders", ":dead", false);
        assert_eq!(
            (
                keys.stream.as_str(),
                keys.dead.as_str(),
                keys.parked.as_str()
            ),
            ("shop:orders", "shop:orders:dead", "shop:orders:parked")
        );
        assert!(keys.check_one_slot().is_err(), "three slots on a cluster");
    }

    #[test]
    fn keys_share_a_slot_on_a_cluster() {
        let keys = |prefix, topic| TopicKeys::new(prefix, topic, ":dead", true);
        let plain = keys("shop:", "orders");
        assert_eq!(
            (plain.dead.as_str(), plain.parked.as_str()),
            ("{shop:orders}:dead", "{shop:orders}:parked")
        );
        let tagged = keys("{shop}:", "orders");
        assert_eq!(tagged.dead, "{shop}:orders:dead");
        for (prefix, topic) in [
            ("", "t"),
            ("{a}", "b"),
            ("x{", "y"),
            ("", "{}z"),
            ("}", "a"),
        ] {
            let k = keys(prefix, topic);
            let shared = k.check_one_slot();
            // Braces without a hash tag are the one case that cannot share a slot.
            let tagless_braces = ["{}z", "}a"].contains(&k.stream.as_str());
            assert_eq!(shared.is_err(), tagless_braces, "{k:?}");
        }
    }
}
