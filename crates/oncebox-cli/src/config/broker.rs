//! `[broker]`: the broker the relay publishes to and the receiver reads from.

use serde::{Deserialize, Serialize};

use super::members::Members;
use super::url::redact;
use super::{ConfigError, Secret, Span};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct BrokerConfig {
    /// The broker's URL. NATS: one server, or the seeds of a cluster separated by
    /// commas (`nats://n1:4222,nats://n2:4222`, see [`nats_servers`]).
    pub(crate) url: Option<String>,
    pub(crate) password: Option<Secret>,
    /// NATS: prepended to every topic to make the subject.
    pub(crate) subject_prefix: String,
    /// NATS: a stream to create (if missing) over `subject_prefix` + `>`.
    pub(crate) stream: Option<String>,
    /// NATS: how many servers of the cluster keep `stream` (1 to 5).
    pub(crate) stream_replicas: u8,
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
            stream_replicas: 1,
            exchange: "oncebox".to_owned(),
            key_prefix: String::new(),
            cluster: false,
            source: None,
            connect_timeout: Span::secs(5),
        }
    }
}

/// JetStream keeps a stream on at most five servers.
pub(crate) const MAX_STREAM_REPLICAS: u8 = 5;

/// The servers a NATS `broker.url` names: one URL, or several separated by commas (the
/// seeds of a cluster; the client learns the other servers from them and fails over
/// between them). Each is a whole URL, `nats://HOST:PORT` or `tls://HOST:PORT`, with at
/// most a user name (a password goes in `broker.password`).
pub(crate) fn nats_servers(url: &str) -> Result<Vec<&str>, ConfigError> {
    let servers = Members {
        member: "server",
        cluster: "NATS",
        schemes: ["nats", "tls"],
        example: "nats://n1:4222,nats://n2:4222",
    };
    servers.parse(url, |seed, parsed, _| {
        if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
            return Err(format!(
                "{:?}: a NATS server URL has no path or query",
                redact(seed)
            ));
        }
        Ok(())
    })
}

/// The user name the NATS servers of `url` give (for `broker.password`): the same on
/// every server that names one, or none.
pub(crate) fn nats_user(url: &str) -> Result<Option<String>, ConfigError> {
    let mut user: Option<String> = None;
    for seed in nats_servers(url)? {
        let name = ::url::Url::parse(seed)
            .map(|url| url.username().to_owned())
            .unwrap_or_default();
        match &user {
            _ if name.is_empty() => {}
            Some(known) if *known != name => {
                return Err(ConfigError::key(
                    "broker.url",
                    "the servers name different users; one connection has one user",
                ));
            }
            _ => user = Some(name),
        }
    }
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_url_lists_the_seeds_of_a_cluster() {
        assert_eq!(
            nats_servers("nats://127.0.0.1:4222").unwrap(),
            ["nats://127.0.0.1:4222"]
        );
        assert_eq!(
            nats_servers("nats://n1:4222, nats://n2:4222,tls://n3:4222").unwrap(),
            ["nats://n1:4222", "nats://n2:4222", "tls://n3:4222"]
        );
        for (url, needle) in [
            ("nats://n1:4222,,nats://n2:4222", "server 2 of 3: empty"),
            ("nats://n1:4222,", "server 2 of 2: empty"),
            (
                "nats://n1:4222,n2:4222",
                "server 2 of 2: \"n2:4222\": each server",
            ),
            ("nats://n1:4222,amqp://n2:5672", "nats:// or tls://"),
            (
                "nats://n1:4222,nats://n2:99999",
                "server 2 of 2: \"nats://n2:99999\" is not a URL",
            ),
            ("nats://n1:4222/x", "no path or query"),
            ("nats://n1:4222?x=1", "no path or query"),
        ] {
            let error = nats_servers(url).unwrap_err();
            assert!(error.0.starts_with("broker.url: "), "{url}: {error}");
            assert!(error.0.contains(needle), "{url}: {error}");
        }
    }

    #[test]
    fn the_seeds_agree_on_their_user() {
        assert_eq!(nats_user("nats://n1:4222,nats://n2:4222").unwrap(), None);
        assert_eq!(
            nats_user("nats://app@n1:4222,nats://n2:4222,nats://app@n3:4222").unwrap(),
            Some("app".to_owned())
        );
        let error = nats_user("nats://app@n1:4222,nats://ops@n2:4222").unwrap_err();
        assert!(error.0.contains("different users"), "{error}");
    }
}
