//! Creating and updating the streams that store topics and their dead letters.

use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
use async_nats::jetstream::stream::{Config, StorageType};
use async_nats::jetstream::{self, ErrorCode};
use oncebox_core::{Backoff, Error, Result};

use crate::JetStreamTransport;
use crate::error::{client, refused};
use crate::names::{check_name, check_subject_pattern};
use crate::transport::Shared;

/// Where a stream keeps its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamStorage {
    /// On disk: survives server restarts. The default.
    #[default]
    File,
    /// In memory: faster, lost when the server stops.
    Memory,
}

/// The stream [`JetStreamTransport::ensure_stream`] creates or updates.
///
/// ```
/// use std::time::Duration;
/// use oncebox_nats::StreamSettings;
///
/// let orders = StreamSettings::new("ORDERS")
///     .topic("orders")
///     .topic("orders.>")
///     .duplicate_window(Duration::from_secs(10 * 60))
///     .max_age(Duration::from_secs(7 * 24 * 3600));
/// orders.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct StreamSettings {
    pub(crate) name: String,
    pub(crate) topics: Vec<String>,
    pub(crate) duplicate_window: Duration,
    pub(crate) storage: StreamStorage,
    pub(crate) replicas: usize,
    pub(crate) max_age: Option<Duration>,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) max_message_size: Option<u32>,
}

impl StreamSettings {
    /// A stream named `name` (no `.`, `*`, `>`, whitespace, `/` or `\`) with no topics
    /// yet, a two-minute duplicate window, file storage, one replica and no limits.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            topics: Vec::new(),
            duplicate_window: Duration::from_secs(120),
            storage: StreamStorage::File,
            replicas: 1,
            max_age: None,
            max_bytes: None,
            max_message_size: None,
        }
    }

    /// Adds a topic the stream captures. NATS wildcards work: `orders.*` is every
    /// `orders.` topic one token deeper, `orders.>` every one below `orders.`.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Adds several topics.
    pub fn topics<T: Into<String>>(mut self, topics: impl IntoIterator<Item = T>) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// How long the stream remembers the `Nats-Msg-Id` of each message, dropping a
    /// re-publish of the same id (and confirming it) within that time. Default: 2
    /// minutes, the JetStream default.
    ///
    /// This is the broker-side dedup window of the relay: a message published again
    /// later than this (a relay that crashed between the PubAck and marking the row,
    /// and came back after the window) is stored twice, and the consumers' inbox
    /// deduplicates it. Longer windows cost server memory per message.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Where the stream keeps messages. Default: [`StreamStorage::File`]. An existing
    /// stream's storage cannot be changed.
    pub fn storage(mut self, storage: StreamStorage) -> Self {
        self.storage = storage;
        self
    }

    /// How many servers of a cluster keep the stream. Default: 1.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// Messages older than this are removed. Default: none (kept until other limits).
    pub fn max_age(mut self, age: impl Into<Option<Duration>>) -> Self {
        self.max_age = age.into();
        self
    }

    /// The stream removes its oldest messages beyond this size. Default: none.
    pub fn max_bytes(mut self, bytes: impl Into<Option<u64>>) -> Self {
        self.max_bytes = bytes.into();
        self
    }

    /// The stream refuses larger messages (payload and headers); publishing one fails
    /// permanently, naming the limit. Default: none (the server's `max_payload`, 1 MiB
    /// unless configured).
    pub fn max_message_size(mut self, bytes: impl Into<Option<u32>>) -> Self {
        self.max_message_size = bytes.into();
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for an invalid name or topic pattern, no topics, a zero
    /// duplicate window or replica count, or a duplicate window longer than `max_age`.
    pub fn validate(&self) -> Result<()> {
        check_name(&self.name).map_err(|reason| {
            Error::InvalidOptions(format!("stream name {:?}: {reason}", self.name))
        })?;
        if self.topics.is_empty() {
            return Err(Error::InvalidOptions(format!(
                "stream {:?} has no topics",
                self.name
            )));
        }
        if self.duplicate_window.is_zero() || self.replicas == 0 {
            return Err(Error::InvalidOptions(
                "duplicate window and replicas must be positive".into(),
            ));
        }
        if let Some(max_age) = self.max_age
            && self.duplicate_window > max_age
        {
            return Err(Error::InvalidOptions(format!(
                "the duplicate window ({:?}) must not exceed max_age ({max_age:?})",
                self.duplicate_window
            )));
        }
        Ok(())
    }
}

impl JetStreamTransport {
    /// Creates the stream of `settings`, capturing the subjects of its topics, or
    /// updates it: its subjects become the union of the existing ones and these, and
    /// the other settings are applied. Safe to call from every process at start-up.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for settings that fail [`StreamSettings::validate`] or
    /// a storage change; a permanent transport error when the server refuses the
    /// configuration (subjects overlapping another stream's); a transient one when it
    /// cannot be reached, or when it keeps failing to create the stream's storage.
    ///
    /// A server that fails to create a stream's storage answers only with the sentence
    /// "error creating store for stream" (the cause goes to its own log). That creation
    /// is tried four times in all, 100, 200 and 400 ms apart, before the error is
    /// returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: calling it again finishes the job.
    pub async fn ensure_stream(&self, settings: &StreamSettings) -> Result<()> {
        let subjects = settings
            .topics
            .iter()
            .map(|topic| self.shared.options.subject(topic))
            .collect();
        ensure(&self.shared, settings, subjects).await
    }

    /// Like [`JetStreamTransport::ensure_stream`] for the dead-letter subjects of the
    /// topics of `settings` (`dlq.orders` for topic `orders`, with the default
    /// [prefix](crate::JetStreamOptions::dead_letter_prefix)); `dlq.>` with topic `>`.
    ///
    /// # Errors
    ///
    /// As [`JetStreamTransport::ensure_stream`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn ensure_dead_letter_stream(&self, settings: &StreamSettings) -> Result<()> {
        let subjects = settings
            .topics
            .iter()
            .map(|topic| self.shared.options.dead_letter_subject(topic))
            .collect();
        ensure(&self.shared, settings, subjects).await
    }
}

async fn ensure(shared: &Shared, settings: &StreamSettings, subjects: Vec<String>) -> Result<()> {
    settings.validate()?;
    for subject in &subjects {
        check_subject_pattern(subject).map_err(|reason| {
            Error::InvalidOptions(format!("stream subject {subject:?}: {reason}"))
        })?;
    }
    // Two processes may race to create it: the loser updates instead.
    let mut races = 0;
    let mut store_failures = 0;
    loop {
        match existing(shared, &settings.name).await? {
            Some(current) => return update(shared, settings, subjects, current).await,
            None => match create(shared, settings, subjects.clone()).await {
                Ok(()) => return Ok(()),
                Err(Created::Exists) if races < 1 => races += 1,
                Err(Created::Exists) => {
                    return Err(client(
                        format!("ensure stream {}", settings.name),
                        "the stream kept appearing and disappearing",
                    ));
                }
                Err(Created::StoreFailed(error)) => {
                    store_failures += 1;
                    if store_failures == STORE_ATTEMPTS {
                        return Err(error);
                    }
                    tracing::warn!(
                        stream = %settings.name, attempt = store_failures, %error,
                        "JetStream failed to create the stream's storage; trying again"
                    );
                    tokio::time::sleep(STORE_RETRY.delay(store_failures)).await;
                }
                Err(Created::Failed(error)) => return Err(error),
            },
        }
    }
}

/// How many times [`JetStreamTransport::ensure_stream`] tries to create a stream whose
/// storage the server failed to create.
const STORE_ATTEMPTS: u32 = 4;

/// The pauses between those attempts: 100, 200 and 400 ms, without jitter (one client
/// waits on one server; there is no crowd to spread).
const STORE_RETRY: Backoff = Backoff::new()
    .initial(Duration::from_millis(100))
    .max(Duration::from_secs(1))
    .jitter(0.0);

/// The configuration of stream `name`, or `None` if there is no such stream.
async fn existing(shared: &Shared, name: &str) -> Result<Option<Config>> {
    match shared.context.get_stream(name).await {
        Ok(stream) => Ok(Some(stream.cached_info().config.clone())),
        Err(error) => match error.kind() {
            GetStreamErrorKind::JetStream(api)
                if api.error_code() == ErrorCode::STREAM_NOT_FOUND =>
            {
                Ok(None)
            }
            GetStreamErrorKind::JetStream(api) => Err(refused(format!("read stream {name}"), api)),
            GetStreamErrorKind::EmptyName | GetStreamErrorKind::InvalidStreamName => Err(
                Error::InvalidOptions(format!("stream name {name:?} is invalid")),
            ),
            GetStreamErrorKind::Request => Err(client(format!("read stream {name}"), error)),
        },
    }
}

enum Created {
    Exists,
    /// The server's generic answer when creating the stream's storage failed: worth
    /// another try.
    StoreFailed(Error),
    Failed(Error),
}

async fn create(
    shared: &Shared,
    settings: &StreamSettings,
    subjects: Vec<String>,
) -> Result<(), Created> {
    let mut config = Config {
        name: settings.name.clone(),
        subjects,
        ..Default::default()
    };
    apply(settings, &mut config);
    match shared.context.create_stream(config).await {
        Ok(_) => {
            tracing::info!(stream = %settings.name, "created JetStream stream");
            Ok(())
        }
        Err(error) => Err(match error.kind() {
            CreateStreamErrorKind::JetStream(api)
                if api.error_code() == ErrorCode::STREAM_NAME_EXIST =>
            {
                Created::Exists
            }
            CreateStreamErrorKind::JetStream(api) if is_store_failure(&api) => {
                Created::StoreFailed(refused(format!("create stream {}", settings.name), api))
            }
            kind => Created::Failed(stream_error(&settings.name, "create", kind, error)),
        }),
    }
}

/// The server's answers to a stream whose storage it could not create: 10077, or 10049
/// (the generic creation error) with the fixed sentence standalone servers send.
fn is_store_failure(api: &jetstream::Error) -> bool {
    api.error_code() == ErrorCode::STREAM_STORE_FAILED
        || (api.error_code() == ErrorCode::STREAM_CREATE
            && api.to_string().contains("error creating store"))
}

async fn update(
    shared: &Shared,
    settings: &StreamSettings,
    subjects: Vec<String>,
    current: Config,
) -> Result<()> {
    let wanted = storage_type(settings.storage);
    if current.storage != wanted {
        return Err(Error::InvalidOptions(format!(
            "stream {} keeps its messages in {:?} storage, not {:?}; JetStream cannot change that",
            settings.name, current.storage, wanted
        )));
    }
    let mut config = current.clone();
    for subject in subjects {
        if !config.subjects.contains(&subject) {
            config.subjects.push(subject);
        }
    }
    apply(settings, &mut config);
    if config == current {
        return Ok(());
    }
    match shared.context.update_stream(&config).await {
        Ok(_) => {
            tracing::info!(stream = %settings.name, subjects = ?config.subjects, "updated JetStream stream");
            Ok(())
        }
        Err(error) => Err(stream_error(&settings.name, "update", error.kind(), error)),
    }
}

/// Writes the settings (beside name and subjects) into `config`.
fn apply(settings: &StreamSettings, config: &mut Config) {
    config.duplicate_window = settings.duplicate_window;
    config.storage = storage_type(settings.storage);
    config.num_replicas = settings.replicas;
    config.max_age = settings.max_age.unwrap_or(Duration::ZERO);
    config.max_bytes = settings
        .max_bytes
        .map_or(-1, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX));
    config.max_message_size = settings
        .max_message_size
        .map_or(-1, |bytes| i32::try_from(bytes).unwrap_or(i32::MAX));
}

fn storage_type(storage: StreamStorage) -> StorageType {
    match storage {
        StreamStorage::File => StorageType::File,
        StreamStorage::Memory => StorageType::Memory,
    }
}

fn stream_error(
    name: &str,
    verb: &str,
    kind: CreateStreamErrorKind,
    error: jetstream::context::CreateStreamError,
) -> Error {
    let operation = format!("{verb} stream {name}");
    match kind {
        CreateStreamErrorKind::JetStream(api) => refused(operation, api),
        CreateStreamErrorKind::EmptyStreamName | CreateStreamErrorKind::InvalidStreamName => {
            Error::InvalidOptions(format!("stream name {name:?} is invalid"))
        }
        CreateStreamErrorKind::DomainAndExternalSet
        | CreateStreamErrorKind::JetStreamUnavailable
        | CreateStreamErrorKind::TimedOut
        | CreateStreamErrorKind::Response
        | CreateStreamErrorKind::NotFound
        | CreateStreamErrorKind::ResponseParse => client(operation, error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let ok = StreamSettings::new("ORDERS").topic("orders");
        ok.validate().unwrap();
        assert!(StreamSettings::new("ORDERS").validate().is_err());
        assert!(
            StreamSettings::new("OR.DERS")
                .topic("x")
                .validate()
                .is_err()
        );
        let window_too_long = ok
            .clone()
            .duplicate_window(Duration::from_secs(600))
            .max_age(Duration::from_secs(60));
        assert!(window_too_long.validate().is_err());
        assert!(ok.duplicate_window(Duration::ZERO).validate().is_err());
    }

    #[test]
    fn settings_become_the_stream_config() {
        let settings = StreamSettings::new("ORDERS")
            .topic("orders")
            .duplicate_window(Duration::from_secs(300))
            .storage(StreamStorage::Memory)
            .max_message_size(1024);
        let mut config = Config::default();
        apply(&settings, &mut config);
        assert_eq!(config.duplicate_window, Duration::from_secs(300));
        assert_eq!(config.storage, StorageType::Memory);
        assert_eq!(config.max_message_size, 1024);
        assert_eq!(config.max_bytes, -1);
        assert_eq!(config.max_age, Duration::ZERO);
    }
}
