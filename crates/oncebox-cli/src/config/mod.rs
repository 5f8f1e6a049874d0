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

mod secret;
mod span;
mod url;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::{Deserialize, Serialize};

pub(crate) use secret::Secret;
pub(crate) use span::Span;
pub(crate) use url::{BrokerKind, StoreKind, StoreUrl, with_password};

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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct StoreConfig {
    pub(crate) url: Option<StoreUrl>,
    pub(crate) password: Option<Secret>,
    /// PostgreSQL schema of oncebox's tables.
    pub(crate) schema: String,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Span,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: None,
            password: None,
            schema: "oncebox".to_owned(),
            pool_size: 8,
            connect_timeout: Span::secs(5),
        }
    }
}

/// The outbox table's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Layout {
    /// oncebox's own table.
    #[default]
    Oncebox,
    /// A Debezium-style table (PostgreSQL).
    Debezium,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct OutboxConfig {
    pub(crate) layout: Layout,
    /// The Debezium-style table, `schema.name` or `name` (in `public`).
    pub(crate) table: String,
    /// Prepended to `aggregatetype` to make the topic (Debezium layout).
    pub(crate) topic_prefix: String,
    /// PostgreSQL: wake on `NOTIFY` from producers that notify.
    pub(crate) listen: bool,
    /// PostgreSQL: hold claimed rows with the claim's transaction (else leases).
    pub(crate) held_claims: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            layout: Layout::Oncebox,
            table: "public.outbox".to_owned(),
            topic_prefix: String::new(),
            listen: false,
            held_claims: true,
        }
    }
}

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
    /// The CloudEvents `source` of every message published: the producing service's
    /// name. None: `otel.service_name` when set, else `oncebox`.
    pub(crate) source: Option<String>,
    pub(crate) connect_timeout: Span,
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
            source: None,
            connect_timeout: Span::secs(5),
        }
    }
}

/// How `oncebox relay` reads the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RelayMode {
    /// Claims pending rows of the outbox table.
    #[default]
    Poll,
    /// Tails PostgreSQL's log through a logical replication slot (`[cdc]`).
    Cdc,
}

/// What the log-tailing relay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CdcSource {
    /// Logical decoding messages (`emit`), no table.
    #[default]
    Messages,
    /// Inserts into the outbox table.
    Table,
}

/// What the relay does with a lost slot: invalidated, or gone although the store
/// remembers reading it (a failover, a drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LostSlotPolicy {
    /// Refuse to start, naming the range of WAL positions that may be lost.
    #[default]
    Fail,
    /// Drop and recreate it, saying what may be lost.
    Recreate,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct CdcConfig {
    /// Logical decoding messages or the outbox table's inserts.
    pub(crate) source: CdcSource,
    /// The replication slot (created when absent).
    pub(crate) slot: String,
    /// The publication (created when absent); default: the slot's name.
    pub(crate) publication: Option<String>,
    /// Messages published at once across keys.
    pub(crate) max_in_flight: i64,
    /// How often an idle outbox's slot is moved on.
    pub(crate) heartbeat: Span,
    /// How often the confirmed position is reported to the server.
    pub(crate) status_interval: Span,
    /// What to do with an invalidated slot.
    pub(crate) on_lost_slot: LostSlotPolicy,
}

impl Default for CdcConfig {
    fn default() -> Self {
        Self {
            source: CdcSource::Messages,
            slot: "oncebox_outbox".to_owned(),
            publication: None,
            max_in_flight: 1024,
            heartbeat: Span::secs(10),
            status_interval: Span::secs(1),
            on_lost_slot: LostSlotPolicy::Fail,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RelayConfig {
    /// Poll the outbox table, or tail the log (`[cdc]`).
    pub(crate) mode: RelayMode,
    /// Name in logs and metric labels.
    pub(crate) name: String,
    pub(crate) batch_size: i64,
    /// Keys published at once.
    pub(crate) concurrency: i64,
    /// Attempts before a message is dead-lettered.
    pub(crate) max_attempts: i64,
    pub(crate) retry_initial: Span,
    pub(crate) retry_max: Span,
    pub(crate) lease: Span,
    pub(crate) publish_timeout: Span,
    pub(crate) poll_max: Span,
    pub(crate) retention: Span,
    pub(crate) cleanup_interval: Span,
    pub(crate) stats_interval: Span,
    /// Relay loops in this process (each claims its own batches).
    pub(crate) workers: i64,
    /// Time a graceful stop may take.
    pub(crate) stop_timeout: Span,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            mode: RelayMode::Poll,
            name: "outbox".to_owned(),
            batch_size: 256,
            concurrency: 256,
            max_attempts: 10,
            retry_initial: Span::secs(1),
            retry_max: Span::secs(300),
            lease: Span::secs(30),
            publish_timeout: Span::secs(10),
            poll_max: Span::secs(1),
            retention: Span::secs(24 * 3600),
            cleanup_interval: Span::secs(60),
            stats_interval: Span::secs(5),
            workers: 1,
            stop_timeout: Span::secs(10),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ReceiveConfig {
    /// The topic received from.
    pub(crate) topic: Option<String>,
    /// The consumer name: the broker's group and the inbox rows' `consumer`.
    pub(crate) consumer: String,
    /// How long a message id is remembered (done rows are kept that long).
    pub(crate) dedup_window: Span,
    /// Deliveries stored at once.
    pub(crate) lanes: i64,
    /// Attempts to store a delivery before it is dead-lettered on the broker.
    pub(crate) max_attempts: i64,
    /// Time between deletions of processed rows older than the dedup window.
    pub(crate) cleanup_interval: Span,
    pub(crate) stop_timeout: Span,
}

impl Default for ReceiveConfig {
    fn default() -> Self {
        Self {
            topic: None,
            consumer: "inbox".to_owned(),
            dedup_window: Span::secs(7 * 24 * 3600),
            lanes: 16,
            max_attempts: 10,
            cleanup_interval: Span::secs(60),
            stop_timeout: Span::secs(10),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HttpConfig {
    /// Address of `/metrics`, `/healthz` and `/readyz`; `off` for none.
    pub(crate) listen: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".to_owned(),
        }
    }
}

/// The web dashboard: served by `oncebox dashboard`, and by `oncebox relay` and
/// `oncebox receive` when `listen` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DashboardConfig {
    /// Address to serve on; `off` (the default): `relay` and `receive` serve none, and
    /// `oncebox dashboard` serves on [`DashboardConfig::COMMAND_DEFAULT`].
    pub(crate) listen: String,
    /// The path the dashboard is served under, for a reverse proxy that forwards
    /// `/oncebox/…` as it is: `"/oncebox"`; `""` for the root.
    pub(crate) base_path: String,
    /// What operators log in with (`ONCEBOX_DASHBOARD__TOKEN` or `…_TOKEN_FILE`), at
    /// least [`DashboardConfig::MIN_TOKEN`] characters; the dashboard is not served
    /// without one.
    pub(crate) token: Option<Secret>,
    /// Shows no action and refuses every change (the default): `false` lets operators
    /// replay and purge dead letters.
    pub(crate) read_only: bool,
    /// Marks the session cookie `Secure`, for a dashboard reached over HTTPS.
    pub(crate) secure_cookie: bool,
    /// How long a login lasts.
    pub(crate) session_ttl: Span,
    /// The Redis server holding an idempotent receiver's dedup records (`redis://…`),
    /// for the keys page to look ids up in besides the store's own. A secret, as the URL
    /// may carry a password (`ONCEBOX_DASHBOARD__REDIS_DEDUP_URL` or `…_FILE`).
    pub(crate) redis_dedup_url: Option<Secret>,
    /// The key prefix those records are under (`RedisDedupStore::with_prefix`); unset:
    /// the store's default.
    pub(crate) redis_dedup_prefix: Option<String>,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            listen: "off".to_owned(),
            base_path: String::new(),
            token: None,
            read_only: true,
            secure_cookie: false,
            session_ttl: Span::secs(12 * 3600),
            redis_dedup_url: None,
            redis_dedup_prefix: None,
        }
    }
}

impl DashboardConfig {
    /// Where `oncebox dashboard` listens when `listen` is `off`.
    pub(crate) const COMMAND_DEFAULT: &str = "127.0.0.1:9465";
    /// The shortest token accepted: long enough that guessing it is hopeless.
    pub(crate) const MIN_TOKEN: usize = 16;

    /// The address `relay` and `receive` serve the dashboard on, or `None` when off.
    pub(crate) fn address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|_| {
            ConfigError::key(
                "dashboard.listen",
                format!(
                    "{:?} is not an address such as {} (or \"off\")",
                    self.listen,
                    Self::COMMAND_DEFAULT
                ),
            )
        })
    }

    /// The base path without its trailing slash: `""` or `"/segment[/segment…]"`.
    pub(crate) fn base(&self) -> &str {
        self.base_path.trim_end_matches('/')
    }

    /// The token, checked: what serving the dashboard needs.
    pub(crate) fn checked_token(&self) -> Result<&Secret, ConfigError> {
        let token = self.token.as_ref().ok_or_else(|| {
            ConfigError::key(
                "dashboard.token",
                "the dashboard needs a token to log in with: set ONCEBOX_DASHBOARD__TOKEN or ONCEBOX_DASHBOARD__TOKEN_FILE",
            )
        })?;
        let length = token.expose().chars().count();
        if length < Self::MIN_TOKEN || token.expose().trim() != token.expose() {
            return Err(ConfigError::key(
                "dashboard.token",
                format!(
                    "must be at least {} characters, without leading or trailing spaces",
                    Self::MIN_TOKEN
                ),
            ));
        }
        Ok(token)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let base = self.base();
        let segment_ok = |segment: &str| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
        };
        let clean = base.is_empty()
            || base
                .strip_prefix('/')
                .is_some_and(|path| path.split('/').all(segment_ok));
        if !clean {
            return Err(ConfigError::key(
                "dashboard.base_path",
                format!(
                    "{:?} is not a path such as \"/oncebox\" (segments of letters, digits, - . _ ~)",
                    self.base_path
                ),
            ));
        }
        if self.session_ttl.get().is_zero() {
            return Err(ConfigError::key(
                "dashboard.session_ttl",
                "must be above zero",
            ));
        }
        if self.address()?.is_some() {
            self.checked_token()?;
        }
        Ok(())
    }
}

/// Where `oncebox relay` and `oncebox receive` export their spans (feature `otel`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct OtelConfig {
    /// An OTLP/HTTP collector's base URL (`http://127.0.0.1:4318`); spans go to
    /// `{endpoint}/v1/traces`. None: nothing is exported.
    pub(crate) endpoint: Option<String>,
    /// `service.name` of the exported spans; default `oncebox-relay` or
    /// `oncebox-receive`.
    pub(crate) service_name: Option<String>,
}

impl OtelConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let Some(endpoint) = &self.endpoint else {
            return Ok(());
        };
        let key = |problem: &str| ConfigError::key("otel.endpoint", problem);
        if !crate::telemetry::can_trace() {
            return Err(key(
                "this build exports no spans: build the cli with the feature otel (or full)",
            ));
        }
        let url = ::url::Url::parse(endpoint)
            .map_err(|_| key("is not a URL such as http://127.0.0.1:4318"))?;
        if url.scheme() != "http" {
            return Err(key(
                "must be http:// (OTLP/HTTP to a collector beside the service; this build has no TLS for it)",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
            return Err(key("must hold no credentials and no query"));
        }
        Ok(())
    }
}

impl HttpConfig {
    /// The address to listen on, or `None` when off.
    pub(crate) fn address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|_| {
            ConfigError::key(
                "http.listen",
                format!(
                    "{:?} is not an address such as 127.0.0.1:9464 (or \"off\")",
                    self.listen
                ),
            )
        })
    }
}

/// Flags that override the merged configuration (they win over everything).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// TOML configuration file.
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// `store.url`: sqlite://FILE, postgres://…, mysql://….
    #[arg(long, global = true, value_name = "URL")]
    pub store_url: Option<String>,
    /// `broker.url`: nats://…, amqp://…, kafka://HOST:PORT[,…], redis://….
    #[arg(long, global = true, value_name = "URL")]
    pub broker_url: Option<String>,
    /// `http.listen`: the metrics and health address, or `off`.
    #[arg(long, global = true, value_name = "ADDR")]
    pub listen: Option<String>,
}

impl Config {
    /// Merges defaults, the file, the environment and `flags`, then checks the result.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key and the cause.
    pub fn load(flags: &Overrides) -> Result<Self, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(flags, &vars)
    }

    /// [`load`](Self::load) with the environment given (tests).
    pub(crate) fn load_from(
        flags: &Overrides,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = &flags.config {
            if !path.is_file() {
                return Err(ConfigError::key(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        Self::extract(figment, flags, vars)
    }

    /// [`load_from`](Self::load_from) with the file's text given instead of its path (the
    /// fuzz targets, which write no files).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn load_from_text(
        text: &str,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let figment = Figment::new().merge(Toml::string(text));
        Self::extract(figment, &Overrides::default(), vars)
    }

    /// Merges the environment and `flags` over `figment` (defaults and the file), then
    /// checks the result.
    fn extract(
        figment: Figment,
        flags: &Overrides,
        vars: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let figment = figment.merge(Environment::read(vars)?);
        let mut config: Config = figment
            .extract_lossy()
            .map_err(|error| from_figment(&error))?;
        config.apply(flags)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(url) = &flags.store_url {
            self.store.url =
                Some(StoreUrl::parse(url).map_err(|e| ConfigError::key("--store-url", e))?);
        }
        if let Some(url) = &flags.broker_url {
            self.broker.url = Some(url.clone());
        }
        if let Some(listen) = &flags.listen {
            self.http.listen.clone_from(listen);
        }
        Ok(())
    }

    /// Checks what the types alone do not: limits, URLs, the layout.
    fn validate(&self) -> Result<(), ConfigError> {
        let positive = |key: &str, value: i64| {
            if value < 1 {
                Err(ConfigError::key(
                    key,
                    format!("must be at least 1, not {value}"),
                ))
            } else {
                Ok(())
            }
        };
        positive("relay.batch_size", self.relay.batch_size)?;
        positive("relay.concurrency", self.relay.concurrency)?;
        positive("relay.max_attempts", self.relay.max_attempts)?;
        positive("relay.workers", self.relay.workers)?;
        positive("receive.lanes", self.receive.lanes)?;
        positive("receive.max_attempts", self.receive.max_attempts)?;
        positive("store.pool_size", i64::from(self.store.pool_size))?;
        for (key, span) in [
            ("relay.lease", self.relay.lease),
            ("relay.publish_timeout", self.relay.publish_timeout),
            ("relay.poll_max", self.relay.poll_max),
            ("relay.retry_initial", self.relay.retry_initial),
            ("relay.retry_max", self.relay.retry_max),
            ("relay.retention", self.relay.retention),
            ("relay.cleanup_interval", self.relay.cleanup_interval),
            ("relay.stats_interval", self.relay.stats_interval),
            ("relay.stop_timeout", self.relay.stop_timeout),
            ("receive.cleanup_interval", self.receive.cleanup_interval),
            ("receive.stop_timeout", self.receive.stop_timeout),
            ("receive.dedup_window", self.receive.dedup_window),
            ("store.connect_timeout", self.store.connect_timeout),
            ("broker.connect_timeout", self.broker.connect_timeout),
        ] {
            if span.get().is_zero() {
                return Err(ConfigError::key(key, "must be above zero"));
            }
        }
        if self.relay.retry_max < self.relay.retry_initial {
            return Err(ConfigError::key(
                "relay.retry_max",
                format!(
                    "must not be shorter than relay.retry_initial ({})",
                    self.relay.retry_initial
                ),
            ));
        }
        if let Some(url) = &self.store.url {
            // A relay loop with held claims (PostgreSQL's default) holds a connection for
            // the batch in flight and one for the claim ahead; the pool also serves the
            // readiness checks, the backlog readings and the cleanup.
            let per_loop = if url.kind() == StoreKind::Postgres && self.outbox.held_claims {
                2
            } else {
                1
            };
            // Saturating: a huge relay.workers must fail this check, not wrap past it.
            let needed = self
                .relay
                .workers
                .max(0)
                .saturating_mul(per_loop)
                .saturating_add(2);
            if i64::from(self.store.pool_size) < needed {
                return Err(ConfigError::key(
                    "store.pool_size",
                    format!(
                        "{} connections cannot serve {} relay loop(s) (relay.workers); set at least {needed}",
                        self.store.pool_size, self.relay.workers
                    ),
                ));
            }
        }
        if self.relay.publish_timeout.get() >= self.relay.lease.get() {
            return Err(ConfigError::key(
                "relay.publish_timeout",
                "must be shorter than relay.lease",
            ));
        }
        if let Some(url) = &self.broker.url {
            BrokerKind::of(url)?;
        }
        if self.broker.stream.is_some() && self.broker.subject_prefix.is_empty() {
            return Err(ConfigError::key(
                "broker.stream",
                "needs broker.subject_prefix (such as \"shop.\"): the stream captures the subjects under it, and one over every subject would capture JetStream's own",
            ));
        }
        if self.outbox.layout == Layout::Debezium
            && let Some(url) = &self.store.url
            && url.kind() != StoreKind::Postgres
        {
            return Err(ConfigError::key(
                "outbox.layout",
                "the Debezium layout needs PostgreSQL (store.url postgres://…)",
            ));
        }
        if self.relay.mode == RelayMode::Cdc {
            if let Some(url) = &self.store.url
                && url.kind() != StoreKind::Postgres
            {
                return Err(ConfigError::key(
                    "relay.mode",
                    "cdc tails PostgreSQL's log: it needs store.url postgres://…",
                ));
            }
            if self.outbox.layout == Layout::Debezium {
                return Err(ConfigError::key(
                    "relay.mode",
                    "cdc reads oncebox's outbox table or its messages, not the Debezium layout",
                ));
            }
            if self.cdc.max_in_flight <= 0 {
                return Err(ConfigError::key("cdc.max_in_flight", "must be positive"));
            }
            self.cdc_options()
                .map_err(|error| ConfigError::key("cdc", error))?;
        }
        self.http.address()?;
        self.otel.validate()?;
        self.dashboard.validate()?;
        Ok(())
    }

    /// The log-tailing relay's options, from `[cdc]` and `[relay]`.
    ///
    /// # Errors
    ///
    /// The options' own check failed (see `CdcOptions::validate`).
    pub fn cdc_options(&self) -> oncebox::Result<oncebox::postgres::cdc::CdcOptions> {
        use oncebox::postgres::cdc::{CdcMode, CdcOptions, LostSlot};
        let cdc = &self.cdc;
        let mode = match cdc.source {
            CdcSource::Messages => CdcMode::Messages,
            CdcSource::Table => CdcMode::Table,
        };
        let options = CdcOptions::new(mode, cdc.slot.clone())
            .publication(cdc.publication.clone().unwrap_or_else(|| cdc.slot.clone()))
            .max_in_flight(usize::try_from(cdc.max_in_flight).unwrap_or(1))
            .max_attempts(u32::try_from(self.relay.max_attempts).unwrap_or(u32::MAX))
            .backoff(
                oncebox::Backoff::new()
                    .initial(self.relay.retry_initial.get())
                    .max(self.relay.retry_max.get()),
            )
            .publish_timeout(self.relay.publish_timeout.get())
            .heartbeat(cdc.heartbeat.get())
            .status_interval(cdc.status_interval.get())
            .stats_interval(self.relay.stats_interval.get())
            .on_lost_slot(match cdc.on_lost_slot {
                LostSlotPolicy::Fail => LostSlot::Fail,
                LostSlotPolicy::Recreate => LostSlot::Recreate,
            });
        options.validate()?;
        Ok(options)
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

/// The keys whose value may come from a file named by a `…_FILE` variable.
const SECRETS: [&str; 4] = [
    "store.password",
    "broker.password",
    "dashboard.token",
    "dashboard.redis_dedup_url",
];

/// Where a value from the environment came from, for error messages.
const FROM_ENVIRONMENT: &str = "the environment";

/// The `ONCEBOX_SECTION__KEY` variables, and the secrets of `…_FILE` variables, as one
/// source of configuration. Values stay text: the extraction reads `"256"` as the
/// number a key wants and `"42"` as the name another wants.
struct Environment(figment::value::Dict);

impl Environment {
    fn read(vars: &[(String, String)]) -> Result<Self, ConfigError> {
        let mut tree = figment::value::Dict::new();
        let mut from_files = Vec::new();
        for (name, value) in vars {
            let Some(key) = env_key(name) else { continue };
            match key.strip_suffix("_file") {
                Some(secret) if SECRETS.contains(&secret) => {
                    let content = std::fs::read_to_string(Path::new(value)).map_err(|error| {
                        ConfigError::key(name, format!("cannot read {value}: {error}"))
                    })?;
                    let content = content.strip_suffix('\n').unwrap_or(&content);
                    let content = content.strip_suffix('\r').unwrap_or(content);
                    from_files.push(secret.to_owned());
                    insert_path(&mut tree, secret, content.to_owned().into());
                }
                Some(_) if !SECRETS.contains(&key.as_str()) => {
                    return Err(ConfigError::key(
                        name,
                        format!("only secrets are read from files ({})", SECRETS.join(", ")),
                    ));
                }
                _ => {
                    if from_files.contains(&key)
                        || vars
                            .iter()
                            .any(|(other, _)| *other == format!("{name}_FILE"))
                    {
                        return Err(ConfigError::key(
                            name,
                            format!("set twice: by {name} and by {name}_FILE; keep one"),
                        ));
                    }
                    insert_path(&mut tree, &key, value.clone().into());
                }
            }
        }
        Ok(Self(tree))
    }
}

impl figment::Provider for Environment {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(FROM_ENVIRONMENT)
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        Ok(figment::Profile::Default.collect(self.0.clone()))
    }
}

/// `store.url` from `ONCEBOX_STORE__URL`; `None` for other variables. Section and key
/// are lower-cased: `[topics]` names set from the environment are lower case.
fn env_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix(ENV_PREFIX)?;
    let (section, key) = rest.split_once("__")?;
    if section.is_empty() || key.is_empty() {
        return None;
    }
    Some(format!("{}.{}", section.to_lowercase(), key.to_lowercase()))
}

fn insert_path(tree: &mut figment::value::Dict, key: &str, value: figment::value::Value) {
    use figment::value::{Dict, Value};
    let Some((section, field)) = key.split_once('.') else {
        tree.insert(key.to_owned(), value);
        return;
    };
    let entry = tree
        .entry(section.to_owned())
        .or_insert_with(|| Value::from(Dict::new()));
    if let Value::Dict(_, dict) = entry {
        dict.insert(field.to_owned(), value);
    }
}

/// One line from figment's error: the key, what was wrong, where it came from (the
/// file, or the variable that set it).
fn from_figment(error: &figment::Error) -> ConfigError {
    let key = if error.path.is_empty() {
        "configuration".to_owned()
    } else {
        error.path.join(".")
    };
    let source = match &error.metadata {
        Some(metadata) if metadata.name == FROM_ENVIRONMENT => format!(
            " (from {ENV_PREFIX}{})",
            error.path.join("__").to_uppercase()
        ),
        Some(metadata) => match &metadata.source {
            Some(source) => format!(" (in {source})"),
            None => format!(" (in {})", metadata.name),
        },
        None => String::new(),
    };
    ConfigError(format!("{key}: {}{source}", error.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found with the fuzz target `config`: `relay.workers` near `i64::MAX` overflowed the
    /// pool-size check (a panic in debug builds; in release builds it wrapped, passed, and
    /// the relay would have started that many loops).
    #[test]
    fn a_huge_worker_count_fails_the_pool_check() {
        let text = "[store]\nurl = \"sqlite://x.db\"\n[relay]\nworkers = 9223372036854775807\n";
        let error = Config::load_from_text(text, &[]).expect_err("too many workers");
        assert!(error.0.starts_with("store.pool_size:"), "{error}");
    }

    #[test]
    fn a_served_dashboard_needs_a_strong_token_and_a_clean_base_path() {
        let load = |dashboard: &str, vars: &[(String, String)]| {
            Config::load_from_text(&format!("[dashboard]\n{dashboard}\n"), vars)
        };
        let off = load("", &[]).expect("off by default: no token needed");
        assert!(off.dashboard.read_only, "read-only by default");
        let error = load("listen = \"127.0.0.1:9465\"", &[]).expect_err("no token");
        assert!(error.0.starts_with("dashboard.token:"), "{error}");
        let error =
            load("listen = \"127.0.0.1:9465\"\ntoken = \"short\"", &[]).expect_err("a short token");
        assert!(error.0.contains("at least 16"), "{error}");

        let dir = tempfile::tempdir().expect("a directory");
        let file = dir.path().join("token");
        std::fs::write(&file, "a-token-from-a-file\n").expect("written");
        let vars = [(
            "ONCEBOX_DASHBOARD__TOKEN_FILE".to_owned(),
            file.display().to_string(),
        )];
        let config = load("listen = \"127.0.0.1:9465\"", &vars).expect("a token from a file");
        let token = config.dashboard.checked_token().expect("strong enough");
        assert_eq!(token.expose(), "a-token-from-a-file");
        assert!(
            !config.to_toml().contains("a-token-from-a-file"),
            "never printed"
        );

        for base in ["ops", "/a//b", "/a/../b", "/<x>", "/a b"] {
            let error = load(&format!("base_path = {base:?}"), &[]).expect_err(base);
            assert!(
                error.0.starts_with("dashboard.base_path:"),
                "{base}: {error}"
            );
        }
        let config = load("base_path = \"/ops/oncebox/\"", &[]).expect("a clean path");
        assert_eq!(config.dashboard.base(), "/ops/oncebox");
    }

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
