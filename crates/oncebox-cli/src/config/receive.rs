//! `[receive]`: how `oncebox receive` stores a broker's messages in the inbox.

use serde::{Deserialize, Serialize};

use super::Span;

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
