//! `[relay]`: how `oncebox relay` reads the outbox and publishes it.

use serde::{Deserialize, Serialize};

use super::Span;

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
