//! The service's configuration: defaults < TOML file (`--config`) < `ONCEBOX_…`
//! environment < flags.
//!
//! Environment variables name a key by its section and name, upper case, joined by a
//! double underscore: `ONCEBOX_STORE__URL` is `store.url`, `ONCEBOX_RELAY__BATCH_SIZE`
//! is `relay.batch_size`. Every secret (`store.password`, `broker.password`) is also
//! read from the file named by the same variable with `_FILE` appended
//! (`ONCEBOX_STORE__PASSWORD_FILE`), as container secrets are mounted. Secrets are never
//! printed: [`Config`] serialises them as `<hidden>`, and URLs may not hold passwords at
//! all (they end up in logs and error messages).
//!
//! Every problem is a [`ConfigError`] naming the key and the cause; the binary exits
//! with status 2 on one.
//!
//! Each section of the file has a module of its name (`store` for `[store]` and
//! `[outbox]`, `relay`, `cdc`, …); `load` merges the sources, `validate` checks the
//! result.

mod broker;
mod cdc;
mod dashboard;
mod http;
mod load;
mod members;
mod otel;
mod rabbitmq;
mod receive;
mod relay;
mod secret;
mod span;
mod sqs;
mod store;
mod url;
mod validate;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use broker::BrokerConfig;
#[cfg(feature = "nats")]
pub(crate) use broker::{nats_servers, nats_user};
use cdc::CdcConfig;
pub(crate) use dashboard::DashboardConfig;
use http::HttpConfig;
pub use load::Overrides;
use otel::OtelConfig;
pub(crate) use rabbitmq::rabbitmq_nodes;
use receive::ReceiveConfig;
use relay::RelayConfig;
pub(crate) use relay::RelayMode;
pub(crate) use secret::Secret;
pub(crate) use span::Span;
pub(crate) use sqs::sqs_url;
pub(crate) use store::Layout;
use store::{OutboxConfig, StoreConfig};
pub(crate) use url::{BrokerKind, StoreKind, StoreUrl, cluster_nodes, with_password};

/// Prefix of the environment variables the configuration reads.
pub(crate) const ENV_PREFIX: &str = "ONCEBOX_";

/// A configuration that cannot work: the key (or source) and why, on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub(crate) String);

impl ConfigError {
    pub(crate) fn key(key: &str, problem: impl fmt::Display) -> Self {
        Self(format!("{key}: {problem}"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The whole configuration. Every field has a documented default (see
/// `docs/service.md`); `store.url` and `broker.url` have none.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The database holding the outbox and inbox tables.
    pub(crate) store: StoreConfig,
    /// How the relay reads the outbox table.
    pub(crate) outbox: OutboxConfig,
    /// The broker.
    pub(crate) broker: BrokerConfig,
    /// Outbox topic → broker destination (subject, routing key, topic, stream).
    pub(crate) topics: BTreeMap<String, String>,
    /// `oncebox relay`.
    pub(crate) relay: RelayConfig,
    /// The log-tailing relay (`relay.mode = "cdc"`).
    pub(crate) cdc: CdcConfig,
    /// `oncebox receive`.
    pub(crate) receive: ReceiveConfig,
    /// The metrics and health endpoint.
    pub(crate) http: HttpConfig,
    /// OpenTelemetry export of the services' spans.
    pub(crate) otel: OtelConfig,
    /// The web dashboard.
    pub(crate) dashboard: DashboardConfig,
}

impl Config {
    /// The CloudEvents `source` the relay writes (`broker.source`, else
    /// `otel.service_name`, else `oncebox`).
    pub(crate) fn source(&self) -> String {
        self.broker
            .source
            .clone()
            .or_else(|| self.otel.service_name.clone())
            .unwrap_or_else(|| oncebox::wire::DEFAULT_SOURCE.to_owned())
    }

    /// The store URL, which every command needs.
    pub(crate) fn store_url(&self) -> Result<&StoreUrl, ConfigError> {
        self.store.url.as_ref().ok_or_else(|| {
            ConfigError::key(
                "store.url",
                "missing: set it in the file, ONCEBOX_STORE__URL or --store-url",
            )
        })
    }

    /// The broker URL and its kind, which the relay and the receiver need.
    pub(crate) fn broker(&self) -> Result<(&str, BrokerKind), ConfigError> {
        let url = self.broker.url.as_deref().ok_or_else(|| {
            ConfigError::key(
                "broker.url",
                "missing: set it in the file, ONCEBOX_BROKER__URL or --broker-url",
            )
        })?;
        Ok((url, BrokerKind::of(url)?))
    }

    /// The merged configuration as TOML, secrets hidden.
    pub(crate) fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|error| format!("# cannot print: {error}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relay's CloudEvents `source`: `broker.source`, else `otel.service_name`, else
    /// `oncebox`; the environment sets it like the file.
    #[test]
    fn the_source_is_the_broker_source_else_the_service_name() {
        let source = |text: &str, vars: &[(String, String)]| {
            Config::load_from_text(text, vars)
                .expect("a valid configuration")
                .source()
        };
        assert_eq!(source("", &[]), "oncebox");
        let named = "[otel]\nservice_name = \"billing\"\n";
        assert_eq!(source(named, &[]), "billing");
        let both = format!("{named}[broker]\nsource = \"/orders-service\"\n");
        assert_eq!(source(&both, &[]), "/orders-service");
        let from_env = [(
            "ONCEBOX_BROKER__SOURCE".to_owned(),
            "/from-the-environment".to_owned(),
        )];
        assert_eq!(source(named, &from_env), "/from-the-environment");
        let written = Config::load_from_text(&both, &[]).expect("valid").to_toml();
        assert!(written.contains("/orders-service"), "{written}");
    }
}
