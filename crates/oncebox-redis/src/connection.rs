//! One connection type for a single Redis server and for a Redis Cluster, so that the
//! dedup store and the Streams transport are written once and run on either.

use std::fmt;
use std::time::Duration;

use oncebox_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

/// A connection to one Redis server ([`ConnectionManager`], reconnecting by itself) or to
/// a Redis Cluster ([`ClusterConnection`], which routes each command to the master of its
/// key's slot, follows `MOVED` redirections and failovers, and reconnects by itself).
///
/// It implements [`ConnectionLike`], so every command and script of the `redis` crate
/// runs on it. Cheap to clone; clones share the connection.
///
/// On a cluster, every multi-key command and script must keep its keys in one hash slot
/// (Redis answers `CROSSSLOT` otherwise); the dedup store and the Streams transport lay
/// out their keys so. A pipeline is sent to one node: all its keys must be in one slot
/// too.
#[derive(Clone)]
pub struct RedisConnection(Inner);

#[derive(Clone)]
enum Inner {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Whether this is a connection to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Inner::Cluster(_))
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(connection: ConnectionManager) -> Self {
        Self(Inner::Server(connection))
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(connection: ClusterConnection) -> Self {
        Self(Inner::Cluster(connection))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Server(connection) => connection.req_packed_command(cmd),
            Inner::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Server(connection) => connection.req_packed_commands(pipeline, offset, count),
            Inner::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Server(connection) => connection.get_db(),
            Inner::Cluster(connection) => connection.get_db(),
        }
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connections' own Debug may print addresses with passwords.
        let kind = if self.is_cluster() {
            "cluster"
        } else {
            "server"
        };
        f.debug_tuple("RedisConnection").field(&kind).finish()
    }
}

/// Where to connect: one server's URL, or a cluster's seed nodes (any reachable one
/// tells the client about the others). Parsed once; connections are made from it with
/// the timeouts each use needs.
#[derive(Clone)]
pub(crate) enum Endpoint {
    Server(redis::Client),
    Cluster(Vec<ConnectionInfo>),
}

/// How connections made from an [`Endpoint`] wait and retry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// Longest wait for a reply (on a cluster: for the whole command, retries and
    /// redirections included).
    pub(crate) response: Duration,
    /// Longest wait for a connection to a node.
    pub(crate) connect: Duration,
}

impl Endpoint {
    /// One server at `url`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that does not parse (its category only: the
    /// URL may hold a password).
    pub(crate) fn server(url: &str) -> Result<Self> {
        redis::Client::open(url)
            .map(Self::Server)
            .map_err(|e| Error::InvalidOptions(format!("Redis URL: {}", e.category())))
    }

    /// A cluster known by its seed nodes' URLs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no URL, or a URL that does not parse (its position
    /// and category only).
    pub(crate) fn cluster<S: AsRef<str>>(nodes: impl IntoIterator<Item = S>) -> Result<Self> {
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(i, url)| {
                url.as_ref().into_connection_info().map_err(|e| {
                    Error::InvalidOptions(format!(
                        "Redis Cluster node URL #{}: {}",
                        i + 1,
                        e.category()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if nodes.is_empty() {
            return Err(Error::InvalidOptions(
                "Redis Cluster: at least one node URL is needed".into(),
            ));
        }
        Ok(Self::Cluster(nodes))
    }

    /// A new connection.
    ///
    /// # Errors
    ///
    /// The client's error: no server or node reachable, a refused login, nodes that
    /// disagree on credentials.
    pub(crate) async fn connect(
        &self,
        timeouts: Timeouts,
    ) -> std::result::Result<RedisConnection, RedisError> {
        match self {
            Self::Server(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeouts.response))
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_max_delay(Duration::from_secs(1))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(RedisConnection::from)
            }
            Self::Cluster(nodes) => {
                let client: ClusterClient = ClusterClientBuilder::new(nodes.iter().cloned())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.response)
                    .build()?;
                client
                    .get_async_connection()
                    .await
                    .map(RedisConnection::from)
            }
        }
    }
}
