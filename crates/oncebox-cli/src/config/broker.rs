//! `[broker]`: the broker the relay publishes to and the receiver reads from.

use serde::{Deserialize, Serialize};

use super::{Secret, Span};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct BrokerConfig {
    pub(crate) url: Option<String>,
    pub(crate) password: Option<Secret>,
    /// NATS: prepended to every topic to make the subject.
    pub(crate) subject_prefix: String,
    /// NATS: a stream to create (if missing) over `subject_prefix` + `>`.
    pub(crate) stream: Option<String>,
    /// RabbitMQ: the exchange published to.
    pub(crate) exchange: String,
    /// Redis Streams: prepended to every topic to make the stream key.
    pub(crate) key_prefix: String,
    /// Redis Streams: `url` names seed nodes of a Redis Cluster,
    /// `redis://HOST:PORT[,HOST:PORT…]`.
    pub(crate) cluster: bool,
    /// The CloudEvents `source` of every message published: the producing service's
    /// name. None: `otel.service_name` when set, else `oncebox`.
    pub(crate) source: Option<String>,
    pub(crate) connect_timeout: Span,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: None,
            password: None,
            subject_prefix: String::new(),
            stream: None,
            exchange: "oncebox".to_owned(),
            key_prefix: String::new(),
            cluster: false,
            source: None,
            connect_timeout: Span::secs(5),
        }
    }
}
