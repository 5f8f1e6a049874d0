//! [`RabbitOptions`]: where the broker is and how the transport uses it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::types::ShortString;
use lapin::uri::AMQPUri;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Backoff, Error, Result};

/// The kind of exchange the transport declares; topics are its routing keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExchangeKind {
    /// A `topic` exchange (the default): subscribing to `orders.*` binds with a wildcard.
    #[default]
    Topic,
    /// A `direct` exchange: routing keys match bindings exactly.
    Direct,
}

impl ExchangeKind {
    pub(crate) fn to_lapin(self) -> lapin::ExchangeKind {
        match self {
            Self::Topic => lapin::ExchangeKind::Topic,
            Self::Direct => lapin::ExchangeKind::Direct,
        }
    }
}

/// The type of the queues the subscriber declares, one per consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueType {
    /// Quorum queues (the default): replicated, durable, with the `x-delivery-count`
    /// header that [`Received::delivery_count`](oncebox_core::Received::delivery_count)
    /// comes from, and the broker-side delivery limit.
    #[default]
    Quorum,
    /// Classic durable queues: no delivery count (a redelivery reports 2, whatever its
    /// number) and no delivery limit, so a consumer's attempt limit never triggers;
    /// only for existing deployments.
    Classic,
}

impl QueueType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Quorum => "quorum",
            Self::Classic => "classic",
        }
    }
}

/// How the transport connects to RabbitMQ and uses it.
///
/// ```
/// use std::time::Duration;
/// use oncebox_rabbitmq::RabbitOptions;
///
/// let options = RabbitOptions::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .exchange("orders-events")
///     .prefetch(128)
///     .ack_timeout(Duration::from_secs(60));
/// assert!(options.validate().is_ok());
/// // Debug never prints the password.
/// assert!(!format!("{options:?}").contains("guest:guest"));
/// ```
#[derive(Clone)]
#[must_use]
pub struct RabbitOptions {
    url: String,
    /// Further nodes of the same cluster, in the order given.
    nodes: Vec<String>,
    pub(crate) exchange: String,
    pub(crate) exchange_kind: ExchangeKind,
    pub(crate) declare_exchange: bool,
    pub(crate) queue_type: QueueType,
    pub(crate) delivery_limit: Option<u32>,
    pub(crate) prefetch: u16,
    pub(crate) ack_timeout: Duration,
    pub(crate) confirm_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_message_size: usize,
    pub(crate) reconnect: Backoff,
    pub(crate) source: String,
    pub(crate) connection_name: String,
}

/// RabbitMQ's default `max_message_size`: 128 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// The exchange used unless [`RabbitOptions::exchange`] names another.
pub const DEFAULT_EXCHANGE: &str = "oncebox";

impl RabbitOptions {
    /// Options for the broker at `url` (`amqp://user:password@host:5672/vhost`, the
    /// vhost percent-encoded: `%2f` is `/`; `amqps://` for TLS), with the defaults:
    ///
    /// | setting | default |
    /// |---|---|
    /// | [`exchange`](Self::exchange) | `oncebox`, a durable [`ExchangeKind::Topic`] exchange, declared if missing |
    /// | [`queue_type`](Self::queue_type) | [`QueueType::Quorum`] |
    /// | [`delivery_limit`](Self::delivery_limit) | 20 deliveries, then the broker dead-letters |
    /// | [`prefetch`](Self::prefetch) | 64 unsettled deliveries per subscriber |
    /// | [`ack_timeout`](Self::ack_timeout) | 30 s |
    /// | [`confirm_timeout`](Self::confirm_timeout) | 30 s |
    /// | [`connect_timeout`](Self::connect_timeout) | 10 s |
    /// | [`max_message_size`](Self::max_message_size) | 128 MiB, RabbitMQ's default |
    /// | [`reconnect`](Self::reconnect) | 100 ms doubling to 5 s |
    /// | [`source`](Self::source) | `oncebox` |
    ///
    /// A cluster's other nodes are added with [`node`](Self::node).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            nodes: Vec::new(),
            exchange: DEFAULT_EXCHANGE.to_owned(),
            exchange_kind: ExchangeKind::Topic,
            declare_exchange: true,
            queue_type: QueueType::Quorum,
            delivery_limit: Some(20),
            prefetch: 64,
            ack_timeout: Duration::from_secs(30),
            confirm_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            reconnect: Backoff::new()
                .initial(Duration::from_millis(100))
                .max(Duration::from_secs(5)),
            source: oncebox_core::wire::DEFAULT_SOURCE.to_owned(),
            connection_name: "oncebox".to_owned(),
        }
    }

    /// Another node of the same RabbitMQ cluster (same user, same vhost), tried when
    /// the others cannot be reached.
    ///
    /// Each connection (a publisher's, a subscriber's) is opened to one node. The first
    /// one tries the nodes in the order given, [`new`](Self::new)'s first; every
    /// reconnection starts with the node after the one last connected to, so that a
    /// node that just died is tried last, and tries each node once, each within the
    /// [`connect_timeout`](Self::connect_timeout), before waiting for the
    /// [`reconnect`](Self::reconnect) backoff. Any node serves every queue: RabbitMQ
    /// forwards to the node holding a quorum queue's leader, and a quorum queue kept on
    /// three nodes goes on with a new leader when one of them dies.
    ///
    /// ```
    /// use oncebox_rabbitmq::RabbitOptions;
    ///
    /// let options = RabbitOptions::new("amqp://app@mq-1:5672/orders")
    ///     .node("amqp://app@mq-2:5672/orders")
    ///     .node("amqp://app@mq-3:5672/orders");
    /// assert!(options.validate().is_ok());
    /// // All the nodes of one cluster share its vhosts.
    /// assert!(options.node("amqp://app@mq-4:5672/other").validate().is_err());
    /// ```
    pub fn node(mut self, url: impl Into<String>) -> Self {
        self.nodes.push(url.into());
        self
    }

    /// The exchange messages are published to (topic → routing key) and queues are
    /// bound to.
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = name.into();
        self
    }

    /// The kind of exchange declared. Default: [`ExchangeKind::Topic`].
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.exchange_kind = kind;
        self
    }

    /// Whether to declare the exchange (durable) when connecting. With `false` the
    /// exchange must exist already: connecting checks it (a passive declare) and fails
    /// with [`RabbitError::ExchangeNotFound`](crate::RabbitError::ExchangeNotFound)
    /// otherwise. Default: `true`.
    pub fn declare_exchange(mut self, declare: bool) -> Self {
        self.declare_exchange = declare;
        self
    }

    /// The type of the group queues. Default: [`QueueType::Quorum`].
    pub fn queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// The broker-side delivery limit of quorum queues (`x-delivery-limit`): a message
    /// returned more often than this (nacks, ack timeouts, crashed consumers) goes to
    /// the group's dead queue with the reason `delivery_limit`. Keep it above the
    /// consumer's attempt limit, which dead-letters with the handler's error as the
    /// reason; it is the backstop for messages that crash their consumer. `None`: no
    /// limit. Ignored for classic queues. Default: 20.
    pub fn delivery_limit(mut self, limit: Option<u32>) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// How many unsettled deliveries the broker hands one subscriber (`basic.qos`).
    /// Deliveries held for a nack's delay count against it. Default: 64.
    pub fn prefetch(mut self, count: u16) -> Self {
        self.prefetch = count;
        self
    }

    /// How long a delivery may stay unsettled before the subscriber requeues it, so that
    /// it is delivered again (RabbitMQ itself only redelivers when the channel closes,
    /// or after its `consumer_timeout` of 30 minutes, by closing the channel). Default:
    /// 30 s.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How long a publish waits for the broker's confirm before failing transiently.
    /// Default: 30 s.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// How long opening a connection may take: TCP, TLS, the AMQP handshake, the channel
    /// and the declarations on it (a starting broker may accept a connection and answer
    /// nothing for a while). Default: 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The largest message body published; larger ones fail permanently without being
    /// sent. Set it to the broker's `max_message_size` if that is lower than RabbitMQ's
    /// default of 128 MiB (a larger message would be refused by the broker, which
    /// closes the channel; that is reported as permanent too, for that message).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// The delays between reconnection attempts after the connection is lost.
    /// Default: 100 ms doubling to 5 s, with jitter.
    pub fn reconnect(mut self, backoff: Backoff) -> Self {
        self.reconnect = backoff;
        self
    }

    /// The CloudEvents `source` written on every message published. Default: `oncebox`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// The connection name shown in the management UI (suffixed with the role:
    /// publisher, subscriber, dead letters). Default: `oncebox`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The URL with its password replaced by `***`; with several
    /// [nodes](Self::node), each node's, separated by commas.
    pub fn redacted_url(&self) -> String {
        self.urls().map(redact).collect::<Vec<_>>().join(",")
    }

    /// The URLs of the nodes, in the order given.
    fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.nodes.iter().map(String::as_str))
    }

    /// Checks the options; connecting calls it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that does not parse, nodes with different
    /// vhosts or a node listed twice, an empty or overlong exchange name, a zero
    /// prefetch, delivery limit or timeout, or an invalid backoff.
    pub fn validate(&self) -> Result<()> {
        self.settings().map(drop)
    }

    /// The nodes, parsed, checked to be distinct nodes of one vhost.
    fn parse_nodes(&self) -> Result<Vec<Node>> {
        let several = !self.nodes.is_empty();
        let mut nodes: Vec<Node> = Vec::with_capacity(1 + self.nodes.len());
        for (i, url) in self.urls().enumerate() {
            let redacted = redact(url);
            let which = if several {
                format!("node {} ({redacted})", i + 1)
            } else {
                redacted.clone()
            };
            let uri = url.parse::<AMQPUri>().map_err(|reason| {
                Error::InvalidOptions(format!("invalid AMQP URL {which}: {reason}"))
            })?;
            if let Some(first) = nodes.first() {
                if uri.vhost != first.uri.vhost {
                    return Err(Error::InvalidOptions(format!(
                        "{which} names vhost {:?}, node 1 {:?}: the nodes of one cluster share their vhosts",
                        uri.vhost, first.uri.vhost
                    )));
                }
                if nodes.iter().any(|node| node.url == redacted) {
                    return Err(Error::InvalidOptions(format!("{which} is listed twice")));
                }
            }
            nodes.push(Node { uri, url: redacted });
        }
        Ok(nodes)
    }

    /// The validated settings the connections share.
    pub(crate) fn settings(&self) -> Result<Arc<Settings>> {
        let nodes = self.parse_nodes()?;
        if self.exchange.is_empty() {
            return Err(Error::InvalidOptions(
                "the exchange name is empty (the default exchange cannot be bound to)".into(),
            ));
        }
        let exchange = short(&self.exchange, "exchange name")?;
        let invalid = |what: &str| Err(Error::InvalidOptions(what.to_owned()));
        if self.prefetch == 0 {
            return invalid("prefetch must be at least 1");
        }
        if self.delivery_limit == Some(0) {
            return invalid("delivery_limit must be at least 1 (or None)");
        }
        if self.ack_timeout.is_zero()
            || self.confirm_timeout.is_zero()
            || self.connect_timeout.is_zero()
        {
            return invalid("timeouts must be longer than zero");
        }
        if self.max_message_size == 0 {
            return invalid("max_message_size must be at least 1");
        }
        self.reconnect.validate()?;
        Ok(Arc::new(Settings {
            vhost: nodes[0].uri.vhost.clone(),
            nodes,
            next_node: AtomicUsize::new(0),
            url: self.redacted_url(),
            exchange,
            exchange_kind: self.exchange_kind,
            declare_exchange: self.declare_exchange,
            queue_type: self.queue_type,
            delivery_limit: self.delivery_limit,
            prefetch: self.prefetch,
            ack_timeout: self.ack_timeout,
            confirm_timeout: self.confirm_timeout,
            connect_timeout: self.connect_timeout,
            max_message_size: self.max_message_size,
            reconnect: self.reconnect.clone(),
            format: WireFormat::amqp().with_source(self.source.clone()),
            connection_name: self.connection_name.clone(),
        }))
    }
}

impl fmt::Debug for RabbitOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitOptions")
            .field("url", &self.redacted_url())
            .field("exchange", &self.exchange)
            .field("exchange_kind", &self.exchange_kind)
            .field("declare_exchange", &self.declare_exchange)
            .field("queue_type", &self.queue_type)
            .field("delivery_limit", &self.delivery_limit)
            .field("prefetch", &self.prefetch)
            .field("ack_timeout", &self.ack_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_message_size", &self.max_message_size)
            .finish_non_exhaustive()
    }
}

/// One node of the broker: where to connect.
pub(crate) struct Node {
    pub(crate) uri: AMQPUri,
    /// The URL without its password, for errors and logs.
    pub(crate) url: String,
}

/// Validated options, shared by every connection of a publisher or subscriber.
pub(crate) struct Settings {
    /// At least one: the first is [`RabbitOptions::new`]'s.
    pub(crate) nodes: Vec<Node>,
    /// The vhost, every node's.
    pub(crate) vhost: String,
    /// The node the next connection tries first: the one after the node last
    /// connected to.
    next_node: AtomicUsize,
    /// The URLs without their passwords, for errors and logs.
    pub(crate) url: String,
    pub(crate) exchange: ShortString,
    pub(crate) exchange_kind: ExchangeKind,
    pub(crate) declare_exchange: bool,
    pub(crate) queue_type: QueueType,
    pub(crate) delivery_limit: Option<u32>,
    pub(crate) prefetch: u16,
    pub(crate) ack_timeout: Duration,
    pub(crate) confirm_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_message_size: usize,
    pub(crate) reconnect: Backoff,
    pub(crate) format: WireFormat,
    pub(crate) connection_name: String,
}

impl Settings {
    /// The nodes in the order the next connection tries them.
    pub(crate) fn nodes_in_turn(&self) -> impl Iterator<Item = (usize, &Node)> {
        let start = self.next_node.load(Ordering::Relaxed) % self.nodes.len();
        (0..self.nodes.len()).map(move |offset| {
            let index = (start + offset) % self.nodes.len();
            (index, &self.nodes[index])
        })
    }

    /// Node `index` (of [`nodes_in_turn`](Self::nodes_in_turn)).
    pub(crate) fn node(&self, index: usize) -> &Node {
        &self.nodes[index % self.nodes.len()]
    }

    /// Notes that a connection to node `index` opened: the next starts after it.
    pub(crate) fn connected_to(&self, index: usize) {
        self.next_node
            .store((index + 1) % self.nodes.len(), Ordering::Relaxed);
    }
}

/// `name` as an AMQP short string (at most 255 bytes).
pub(crate) fn short(name: &str, what: &str) -> Result<ShortString> {
    ShortString::try_new(name).map_err(|_| {
        Error::InvalidOptions(format!(
            "the {what} is {} bytes long; AMQP allows at most 255",
            name.len()
        ))
    })
}

/// `url` with the password of its user info replaced by `***`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let user_info = &rest[..at];
    match user_info.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &user_info[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
        assert_eq!(redact("amqp://user@host/v"), "amqp://user@host/v");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("amqp://a:b@c@host/x@y"), "amqp://a:***@host/x@y");
    }

    #[test]
    fn a_cluster_names_distinct_nodes_of_one_vhost() {
        let options = RabbitOptions::new("amqp://app:pw@mq-1:5672/shop")
            .node("amqps://app:pw@mq-2:5671/shop")
            .node("amqp://app:pw@mq-3:5672/shop");
        assert!(options.validate().is_ok());
        assert_eq!(
            options.redacted_url(),
            "amqp://app:***@mq-1:5672/shop,amqps://app:***@mq-2:5671/shop,amqp://app:***@mq-3:5672/shop"
        );
        assert!(!format!("{options:?}").contains(":pw@"));
        for (bad, problem) in [
            (
                options.clone().node("amqp://app@mq-4:5672/other"),
                "node 4 (amqp://app@mq-4:5672/other) names vhost \"other\", node 1 \"shop\"",
            ),
            (
                options.clone().node("amqps://app:other@mq-2:5671/shop"),
                "is listed twice",
            ),
            (
                options.clone().node("http://mq-4"),
                "invalid AMQP URL node 4",
            ),
        ] {
            let error = bad.validate().expect_err(problem);
            assert!(error.is_invalid_input(), "{error}");
            assert!(error.to_string().contains(problem), "{error}");
        }
    }

    #[test]
    fn reconnections_start_after_the_node_last_connected_to() {
        let settings = RabbitOptions::new("amqp://mq-1/%2f")
            .node("amqp://mq-2/%2f")
            .node("amqp://mq-3/%2f")
            .settings()
            .expect("valid");
        let order = |settings: &Settings| -> Vec<usize> {
            settings.nodes_in_turn().map(|(index, _)| index).collect()
        };
        assert_eq!(order(&settings), [0, 1, 2]);
        settings.connected_to(0);
        assert_eq!(order(&settings), [1, 2, 0]);
        settings.connected_to(2);
        assert_eq!(order(&settings), [0, 1, 2]);
        let single = RabbitOptions::new("amqp://mq-1/%2f")
            .settings()
            .expect("valid");
        single.connected_to(0);
        assert_eq!(order(&single), [0]);
    }

    #[test]
    fn invalid_options_are_refused() {
        let ok = RabbitOptions::new("amqp://127.0.0.1:5672/%2f");
        assert!(ok.validate().is_ok());
        for bad in [
            RabbitOptions::new("http://nope"),
            ok.clone().exchange(""),
            ok.clone().exchange("x".repeat(256)),
            ok.clone().prefetch(0),
            ok.clone().delivery_limit(Some(0)),
            ok.clone().ack_timeout(Duration::ZERO),
            ok.clone().max_message_size(0),
        ] {
            let error = bad.validate().expect_err("invalid");
            assert!(error.is_invalid_input(), "{error}");
        }
    }
}
