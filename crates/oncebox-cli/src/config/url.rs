//! Store and broker URLs: which backend, whether it is in this build, and no passwords.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ConfigError;

/// A database kind, chosen by the URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    Sqlite,
    Postgres,
    Mysql,
}

impl StoreKind {
    pub(crate) const ALL: [Self; 3] = [Self::Sqlite, Self::Postgres, Self::Mysql];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
        }
    }

    /// The cargo feature of `oncebox-cli` that brings it (`None`: always built).
    pub(crate) const fn feature(self) -> Option<&'static str> {
        match self {
            Self::Sqlite | Self::Postgres => None,
            Self::Mysql => Some("mysql"),
        }
    }

    pub(crate) const fn compiled(self) -> bool {
        match self {
            Self::Sqlite | Self::Postgres => true,
            Self::Mysql => cfg!(feature = "mysql"),
        }
    }
}

/// A broker kind, chosen by the URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BrokerKind {
    Nats,
    RabbitMq,
    Kafka,
    RedisStreams,
    Sqs,
}

impl BrokerKind {
    pub(crate) const ALL: [Self; 5] = [
        Self::Nats,
        Self::RabbitMq,
        Self::Kafka,
        Self::RedisStreams,
        Self::Sqs,
    ];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::RabbitMq => "rabbitmq",
            Self::Kafka => "kafka",
            Self::RedisStreams => "redis-streams",
            Self::Sqs => "sqs",
        }
    }

    /// The cargo feature of `oncebox-cli` that brings it (`None`: always built).
    pub(crate) const fn feature(self) -> Option<&'static str> {
        match self {
            Self::Nats => Some("nats"),
            Self::RabbitMq => Some("rabbitmq"),
            Self::Kafka => Some("kafka"),
            Self::Sqs => Some("sqs"),
            Self::RedisStreams => None,
        }
    }

    pub(crate) const fn compiled(self) -> bool {
        match self {
            Self::Nats => cfg!(feature = "nats"),
            Self::RabbitMq => cfg!(feature = "rabbitmq"),
            Self::Kafka => cfg!(feature = "kafka"),
            Self::Sqs => cfg!(feature = "sqs"),
            Self::RedisStreams => true,
        }
    }

    /// The kind of `url` (`broker.url`), if it is known, in this build, and holds no
    /// password.
    pub(crate) fn of(url: &str) -> Result<Self, ConfigError> {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        let kind = match scheme {
            "nats" | "tls" => Self::Nats,
            "amqp" | "amqps" => Self::RabbitMq,
            "kafka" => Self::Kafka,
            "redis" | "rediss" => Self::RedisStreams,
            "sqs" => Self::Sqs,
            _ => {
                return Err(ConfigError::key(
                    "broker.url",
                    format!(
                        "unknown broker {:?}: the URL starts with nats://, amqp://, kafka://, redis:// or sqs://",
                        redact(url)
                    ),
                ));
            }
        };
        require(
            "broker.url",
            &format!("the {} broker", kind.name()),
            kind.feature(),
            kind.compiled(),
        )?;
        refuse_password("broker.url", url)?;
        if kind == Self::Kafka && url.contains('@') {
            return Err(ConfigError::key(
                "broker.url",
                "a Kafka URL names brokers only (kafka://HOST:PORT[,HOST:PORT…]): user names and passwords are not supported for Kafka yet",
            ));
        }
        Ok(kind)
    }
}

/// Fails, naming the cargo feature, when what the configuration asks for is not built.
pub(crate) fn require(
    key: &str,
    what: &str,
    feature: Option<&str>,
    compiled: bool,
) -> Result<(), ConfigError> {
    match feature {
        Some(feature) if !compiled => Err(ConfigError::key(
            key,
            format!(
                "{what} is not in this build of oncebox; rebuild it with the cargo feature \
                 `{feature}` (cargo install oncebox-cli --features {feature})"
            ),
        )),
        _ => Ok(()),
    }
}

/// `store.url`: `sqlite://FILE` (or `sqlite:FILE`), `postgres://…`, `mysql://…`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct StoreUrl {
    kind: StoreKind,
    text: String,
}

impl StoreUrl {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let scheme = text.split_once(':').map_or("", |(scheme, _)| scheme);
        let kind = match scheme {
            "sqlite" => StoreKind::Sqlite,
            "postgres" | "postgresql" => StoreKind::Postgres,
            "mysql" | "mariadb" => StoreKind::Mysql,
            _ => {
                return Err(format!(
                    "unknown database {:?}: the URL starts with sqlite://, postgres:// or mysql://",
                    redact(text)
                ));
            }
        };
        require(
            "store.url",
            &format!("the {} store", kind.name()),
            kind.feature(),
            kind.compiled(),
        )
        .map_err(|error| error.0.trim_start_matches("store.url: ").to_owned())?;
        if kind != StoreKind::Sqlite {
            refuse_password("store.url", text)
                .map_err(|error| error.0.trim_start_matches("store.url: ").to_owned())?;
        }
        let text = match kind {
            // mariadb:// is a spelling of ours; the driver knows mysql://.
            StoreKind::Mysql => text.replacen("mariadb://", "mysql://", 1),
            _ => text.to_owned(),
        };
        Ok(Self { kind, text })
    }

    pub(crate) const fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The URL (it holds no password).
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// The SQLite file.
    pub(crate) fn sqlite_path(&self) -> &str {
        let rest = self.text.trim_start_matches("sqlite:");
        rest.strip_prefix("//").unwrap_or(rest)
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for StoreUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for StoreUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A URL with a password is refused: it would be printed wherever the URL is.
fn refuse_password(key: &str, text: &str) -> Result<(), ConfigError> {
    if password_spans(text).is_empty() {
        return Ok(());
    }
    let section = key.split('.').next().unwrap_or(key);
    Err(ConfigError::key(
        key,
        format!(
            "holds a password, which would then show in logs and errors; remove it from \
             the URL and set {section}.password (or ONCEBOX_{upper}__PASSWORD, or a file \
             named by ONCEBOX_{upper}__PASSWORD_FILE)",
            upper = section.to_uppercase()
        ),
    ))
}

/// `text` with every password in it replaced by `***`, for messages.
pub(crate) fn redact(text: &str) -> String {
    let mut redacted = text.to_owned();
    for span in password_spans(text).into_iter().rev() {
        redacted.replace_range(span, "***");
    }
    redacted
}

/// Where passwords stand in `text`, read as text so that nothing a URL parser rejects
/// slips through: the user info of each `scheme://` authority (a NATS URL may list
/// several servers, separated by commas), and `password` or `sslpassword` query
/// parameters (which sqlx reads).
fn password_spans(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + 3;
        let end = text[start..]
            .find(['/', ',', '?', '#'])
            .map_or(text.len(), |offset| start + offset);
        let authority = &text[start..end];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            spans.push(start + colon + 1..start + at);
        }
        from = end;
    }
    if let Some(question) = text.find('?') {
        let mut offset = question + 1;
        for pair in text[question + 1..].split(['&', '#']) {
            if let Some((name, _)) = pair.split_once('=')
                && matches!(
                    name.to_ascii_lowercase().as_str(),
                    "password" | "sslpassword"
                )
            {
                spans.push(offset + name.len() + 1..offset + pair.len());
            }
            offset += pair.len() + 1;
        }
    }
    spans.sort_by_key(|span| span.start);
    spans
}

/// `url` with `password` set, for the client library only: never print the result.
pub(crate) fn with_password(
    text: &str,
    password: Option<&super::Secret>,
) -> Result<String, ConfigError> {
    let Some(password) = password else {
        return Ok(text.to_owned());
    };
    let mut url = ::url::Url::parse(text)
        .map_err(|error| ConfigError::key("broker.url", format!("not a URL: {error}")))?;
    if url.username().is_empty() {
        return Err(ConfigError::key(
            "broker.password",
            "goes with a user name in broker.url (scheme://USER@HOST…)",
        ));
    }
    url.set_password(Some(password.expose()))
        .map_err(|()| ConfigError::key("broker.password", "this URL cannot carry a password"))?;
    Ok(url.to_string())
}

/// The node URLs of a Redis Cluster URL naming several nodes,
/// `redis://[USER@]HOST:PORT[,HOST:PORT…][/DB]`: one URL per node, each with the user
/// name, the password (if any) and the path. `key` names the setting in errors.
pub(crate) fn cluster_nodes(
    key: &str,
    text: &str,
    password: Option<&super::Secret>,
) -> Result<Vec<String>, ConfigError> {
    let not_redis = || {
        ConfigError::key(
            key,
            "a Redis Cluster is named by redis://HOST:PORT[,HOST:PORT…] or rediss://…",
        )
    };
    let (scheme, rest) = text.split_once("://").ok_or_else(not_redis)?;
    if !matches!(scheme, "redis" | "rediss") {
        return Err(not_redis());
    }
    let (authority, path) = rest.find('/').map_or((rest, ""), |at| rest.split_at(at));
    let (user, hosts) = authority
        .rsplit_once('@')
        .map_or(("", authority), |(user, hosts)| (user, hosts));
    hosts
        .split(',')
        .map(|host| {
            if host.trim().is_empty() {
                return Err(ConfigError::key(
                    key,
                    "an empty node in the list of Redis Cluster nodes",
                ));
            }
            let user = if user.is_empty() {
                String::new()
            } else {
                format!("{user}@")
            };
            with_password(&format!("{scheme}://{user}{}{path}", host.trim()), password)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_split_into_nodes() {
        let nodes = cluster_nodes("broker.url", "redis://a:7001, b:7002/0", None).unwrap();
        assert_eq!(nodes, ["redis://a:7001/0", "redis://b:7002/0"]);
        let nodes = cluster_nodes("broker.url", "rediss://app@a:1,b:2", None).unwrap();
        assert_eq!(nodes, ["rediss://app@a:1", "rediss://app@b:2"]);
        for bad in ["nats://a:1", "redis://a:1,,b:2", "a:1"] {
            let error = cluster_nodes("broker.url", bad, None).unwrap_err();
            assert!(error.0.starts_with("broker.url: "), "{}", error.0);
        }
    }

    #[test]
    fn a_backend_not_built_names_its_feature() {
        let error = require("broker.url", "the kafka broker", Some("kafka"), false).unwrap_err();
        assert!(
            error
                .0
                .starts_with("broker.url: the kafka broker is not in this build"),
            "{error}"
        );
        assert!(error.0.contains("`kafka`"), "{error}");
        assert!(require("broker.url", "the kafka broker", Some("kafka"), true).is_ok());
        assert!(require("store.url", "the sqlite store", None, false).is_ok());
    }

    #[test]
    fn passwords_in_urls_are_refused_without_being_shown() {
        let error = StoreUrl::parse("postgres://app:s3cret@db/app").unwrap_err();
        assert!(error.contains("holds a password"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
        let error = BrokerKind::of("amqp://guest:s3cret@mq:5672/%2f").unwrap_err();
        assert!(!error.0.contains("s3cret"), "{error}");
        let error = BrokerKind::of("ftp://user:s3cret@host").unwrap_err();
        assert!(!error.0.contains("s3cret"), "{error}");
        // What a URL parser rejects is read as text all the same.
        for url in [
            "postgres://app:s3cret@db:99999/app",
            "postgres://app@db/app?sslmode=require&password=s3cret",
        ] {
            let error = StoreUrl::parse(url).unwrap_err();
            assert!(
                error.contains("holds a password") && !error.contains("s3cret"),
                "{error}"
            );
        }
        let error = BrokerKind::of("nats://a:4222,nats://u:s3cret@b:4222").unwrap_err();
        assert!(
            error.0.contains("holds a password") && !error.0.contains("s3cret"),
            "{error}"
        );
        let error = BrokerKind::of("kafka://u:s3cret@broker:9092").unwrap_err();
        assert!(!error.0.contains("s3cret"), "{error}");
        let error = BrokerKind::of("kafka://user@broker:9092").unwrap_err();
        assert!(error.0.contains("not supported for Kafka"), "{error}");
        assert_eq!(
            redact("nats://u:one@a:4222,nats://v:two@b:4222?password=three"),
            "nats://u:***@a:4222,nats://v:***@b:4222?password=***"
        );
        assert_eq!(redact("postgres://app@db/app"), "postgres://app@db/app");
    }

    #[test]
    fn store_urls_pick_their_kind() {
        assert_eq!(
            StoreUrl::parse("sqlite://data/app.db")
                .unwrap()
                .sqlite_path(),
            "data/app.db"
        );
        assert_eq!(
            StoreUrl::parse("sqlite:app.db").unwrap().sqlite_path(),
            "app.db"
        );
        assert_eq!(
            StoreUrl::parse("postgresql://db/app").unwrap().kind(),
            StoreKind::Postgres
        );
        assert!(
            StoreUrl::parse("oracle://db")
                .unwrap_err()
                .contains("unknown database")
        );
    }
}
