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
}

impl BrokerKind {
    pub(crate) const ALL: [Self; 4] = [Self::Nats, Self::RabbitMq, Self::Kafka, Self::RedisStreams];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::RabbitMq => "rabbitmq",
            Self::Kafka => "kafka",
            Self::RedisStreams => "redis-streams",
        }
    }

    /// The cargo feature of `oncebox-cli` that brings it (`None`: always built).
    pub(crate) const fn feature(self) -> Option<&'static str> {
        match self {
            Self::Nats => Some("nats"),
            Self::RabbitMq => Some("rabbitmq"),
            Self::Kafka => Some("kafka"),
            Self::RedisStreams => None,
        }
    }

    pub(crate) const fn compiled(self) -> bool {
        match self {
            Self::Nats => cfg!(feature = "nats"),
            Self::RabbitMq => cfg!(feature = "rabbitmq"),
            Self::Kafka => cfg!(feature = "kafka"),
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
            _ => {
                return Err(ConfigError::key(
                    "broker.url",
                    format!(
                        "unknown broker {:?}: the URL starts with nats://, amqp://, kafka:// or redis://",
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
        if kind != Self::Kafka {
            refuse_password("broker.url", url)?;
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
    let Ok(url) = ::url::Url::parse(text) else {
        return Ok(());
    };
    if url.password().is_some() {
        let section = key.split('.').next().unwrap_or(key);
        return Err(ConfigError::key(
            key,
            format!(
                "holds a password, which would then show in logs and errors; remove it from \
                 the URL and set {section}.password (or ONCEBOX_{upper}__PASSWORD, or a file \
                 named by ONCEBOX_{upper}__PASSWORD_FILE)",
                upper = section.to_uppercase()
            ),
        ));
    }
    Ok(())
}

/// `url` with any password replaced, for messages.
pub(crate) fn redact(text: &str) -> String {
    match ::url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.to_owned(),
    }
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
    url.set_password(Some(password.expose()))
        .map_err(|()| ConfigError::key("broker.password", "this URL cannot carry a password"))?;
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
