//! The one error type of `oncebox-core`, with its classification.

use std::error::Error as StdError;

/// A boxed error from a backend (database driver, broker client, user handler).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a failure says about retrying: the engines dead-letter, retry or wait on it.
///
/// | fault | example | a consumer or relay |
/// |---|---|---|
/// | [`Permanent`](Fault::Permanent) | a constraint violation, malformed data, a message the broker refuses | dead-letters the message at once |
/// | [`Transient`](Fault::Transient) | a deadlock, a serialization failure, a timeout | retries with backoff; the attempt counts toward the limit |
/// | [`Outage`](Fault::Outage) | connection lost, server down, no connection to be had | retries with backoff without spending the message's attempts |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The same operation on the same input fails again.
    Permanent,
    /// This attempt failed; another may succeed.
    Transient,
    /// The database or broker cannot be reached: no fault of the message.
    Outage,
}

/// Everything that can go wrong in oncebox.
///
/// Callers branch on the classification methods ([`Error::fault`],
/// [`Error::is_transient`], [`Error::is_outage`], [`Error::is_duplicate`],
/// [`Error::is_invalid_input`]) rather than on messages. The `Display` and `Debug` forms
/// never contain payloads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A message failed validation: it was never stored nor published.
    #[error("invalid message: {0}")]
    InvalidMessage(#[from] InvalidMessage),

    /// A message with this id is already in the outbox.
    #[error("a message with id {id} is already enqueued")]
    Duplicate {
        /// The id that was already present.
        id: crate::MessageId,
    },

    /// The store (database, Redis, memory) failed.
    #[error("store error: {source}")]
    Store {
        /// What the driver reported.
        #[source]
        source: BoxError,
        /// What retrying it would do.
        fault: Fault,
    },

    /// The broker or its client failed.
    #[error("transport error: {source}")]
    Transport {
        /// What the client reported.
        #[source]
        source: BoxError,
        /// What retrying it would do.
        fault: Fault,
    },

    /// A message handler failed.
    #[error("handler failed: {source}")]
    Handler {
        /// What the handler returned.
        #[source]
        source: BoxError,
        /// What retrying it would do: a permanent failure is dead-lettered at once.
        fault: Fault,
    },

    /// The lease (or fencing token) of this worker is no longer the current one: another
    /// worker took over, so this worker's write was refused.
    #[error("lease lost: another worker holds this item now")]
    LeaseLost,

    /// An operation did not finish within its deadline.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),

    /// Options failed validation.
    #[error("invalid options: {0}")]
    InvalidOptions(String),

    /// The store or transport was closed or shut down.
    #[error("closed")]
    Closed,

    /// A task of an engine (a consumer lane, a relay loop) ended before it was told to
    /// stop: it panicked outside the handler, or stopped for a reason named here.
    #[error("{0} ended unexpectedly")]
    TaskLost(String),

    /// A bounded store holds as many live entries as it may; it refuses new work rather
    /// than forget an entry that is still live. Retry after `retry_after`, when the
    /// oldest entries expire.
    #[error("the store is at capacity ({capacity} live entries); retry after {retry_after:?}")]
    AtCapacity {
        /// The store's limit of live entries.
        capacity: usize,
        /// When the oldest live entry expires.
        retry_after: std::time::Duration,
    },
}

impl Error {
    /// A store error with the given fault.
    pub fn store(source: impl Into<BoxError>, fault: Fault) -> Self {
        Self::Store {
            source: source.into(),
            fault,
        }
    }

    /// A store error that may succeed when retried (deadlock, lock timeout, busy); the
    /// attempt counts toward a message's limit.
    pub fn store_transient(source: impl Into<BoxError>) -> Self {
        Self::store(source, Fault::Transient)
    }

    /// A store error that will fail again if retried (constraint, schema, syntax).
    pub fn store_permanent(source: impl Into<BoxError>) -> Self {
        Self::store(source, Fault::Permanent)
    }

    /// The store cannot be reached (connection lost, server down, no connection to be
    /// had): retried without spending a message's attempts.
    pub fn store_outage(source: impl Into<BoxError>) -> Self {
        Self::store(source, Fault::Outage)
    }

    /// A transport error with the given fault.
    pub fn transport(source: impl Into<BoxError>, fault: Fault) -> Self {
        Self::Transport {
            source: source.into(),
            fault,
        }
    }

    /// A transport error that may succeed when retried (timeout, a refusal that may
    /// pass later).
    pub fn transport_transient(source: impl Into<BoxError>) -> Self {
        Self::transport(source, Fault::Transient)
    }

    /// A transport error that will fail again if retried (unknown stream, message too big).
    pub fn transport_permanent(source: impl Into<BoxError>) -> Self {
        Self::transport(source, Fault::Permanent)
    }

    /// The broker cannot be reached (connection lost, broker down): retried without
    /// spending a message's attempts.
    pub fn transport_outage(source: impl Into<BoxError>) -> Self {
        Self::transport(source, Fault::Outage)
    }

    /// A handler failure worth retrying (the default for handler errors); the attempt
    /// counts toward the message's limit.
    pub fn handler(source: impl Into<BoxError>) -> Self {
        Self::Handler {
            source: source.into(),
            fault: Fault::Transient,
        }
    }

    /// A handler failure that will never succeed (malformed payload, business rule): the
    /// message is dead-lettered without further attempts.
    pub fn handler_permanent(source: impl Into<BoxError>) -> Self {
        Self::Handler {
            source: source.into(),
            fault: Fault::Permanent,
        }
    }

    /// What retrying would do. Timeouts and lost leases are transient; a store at
    /// capacity is an outage (no fault of the message); invalid input, duplicates,
    /// invalid options and a closed store or transport are permanent.
    pub fn fault(&self) -> Fault {
        match self {
            Self::Store { fault, .. }
            | Self::Transport { fault, .. }
            | Self::Handler { fault, .. } => *fault,
            Self::Timeout(_) | Self::LeaseLost => Fault::Transient,
            Self::AtCapacity { .. } => Fault::Outage,
            Self::InvalidMessage(_)
            | Self::Duplicate { .. }
            | Self::InvalidOptions(_)
            | Self::Closed
            | Self::TaskLost(_) => Fault::Permanent,
        }
    }

    /// Whether the operation may succeed if retried later (a transient fault or an
    /// outage).
    pub fn is_transient(&self) -> bool {
        self.fault() != Fault::Permanent
    }

    /// Whether the database or broker could not be reached: no fault of the message.
    pub fn is_outage(&self) -> bool {
        self.fault() == Fault::Outage
    }

    /// Whether this error reports a duplicate id.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate { .. })
    }

    /// Whether the input itself was at fault (a message or options that fail validation).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Self::InvalidMessage(_) | Self::InvalidOptions(_))
    }

    /// The variant's name in snake case (`store`, `handler`, `lease_lost`...): a label of
    /// bounded cardinality for metrics and the `error.type` of a span.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidMessage(_) => "invalid_message",
            Self::Duplicate { .. } => "duplicate",
            Self::Store { .. } => "store",
            Self::Transport { .. } => "transport",
            Self::Handler { .. } => "handler",
            Self::LeaseLost => "lease_lost",
            Self::Timeout(_) => "timeout",
            Self::InvalidOptions(_) => "invalid_options",
            Self::Closed => "closed",
            Self::AtCapacity { .. } => "at_capacity",
            Self::TaskLost(_) => "task_lost",
        }
    }
}

/// Why a message (outgoing or received from the wire) is not acceptable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMessage {
    /// The topic is empty.
    #[error("the topic is empty")]
    EmptyTopic,

    /// The topic holds a character no store or broker takes in a name.
    #[error("invalid topic {topic:?}: {reason}")]
    InvalidTopic {
        /// The topic, cut to 64 characters (debug-escaped when shown).
        topic: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The key holds a character no store or broker header takes (a control character,
    /// NUL among them).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key, cut to 64 characters (debug-escaped when shown).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The kind holds a character no store or broker header takes (a control character,
    /// NUL among them).
    #[error("invalid kind {kind:?}: {reason}")]
    InvalidKind {
        /// The kind, cut to 64 characters (debug-escaped when shown).
        kind: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The topic is longer than [`Limits::max_topic_len`](crate::Limits::max_topic_len).
    #[error("the topic is {len} bytes long, over the limit of {limit}")]
    TopicTooLong {
        /// Length of the topic in bytes.
        len: usize,
        /// The configured limit.
        limit: usize,
    },

    /// The payload is larger than [`Limits::max_payload_bytes`](crate::Limits::max_payload_bytes).
    #[error("the payload is {size} bytes, over the limit of {limit}")]
    PayloadTooLarge {
        /// Payload size in bytes.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// The headers' names and values add up to more than
    /// [`Limits::max_header_bytes`](crate::Limits::max_header_bytes).
    #[error("the headers are {size} bytes, over the limit of {limit}")]
    HeadersTooLarge {
        /// The sum of the headers' names and values, in bytes.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// A message id that is not a UUID.
    #[error("{input:?} is not a valid message id (expected a UUID)")]
    InvalidId {
        /// The offending input, cut to 64 characters.
        input: String,
    },

    /// The id strategy found no id in a received message.
    #[error("no id found in the message: {0}")]
    MissingId(String),

    /// A header name or value is not acceptable.
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name (lossily decoded, cut to 64 characters).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The payload is not the JSON the caller asked for.
    #[error("payload is not valid JSON for the requested type: {0}")]
    Json(#[from] serde_json::Error),
}

/// A row read back from a oncebox table could not be turned into its Rust value: a
/// column holds the wrong type, an invalid id, malformed header JSON, a negative count.
///
/// Rows written by oncebox always decode; this error means something else wrote the
/// table (a producer in another language, a Debezium-style producer, a manual edit). SQL
/// stores hand it to callers as the source of a permanent [`Error::Store`], naming the
/// table, the row and the column, so the row can be found and repaired. The relay does
/// not stop on such a row: it marks it dead with this error as the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDecodeError {
    table: String,
    row: String,
    column: &'static str,
    reason: String,
}

impl RowDecodeError {
    /// The error for `column` of `row` (such as `seq 42` or `id X`) in `table`.
    pub fn new(
        table: &str,
        row: impl std::fmt::Display,
        column: &'static str,
        reason: impl std::fmt::Display,
    ) -> Self {
        Self {
            table: table.to_owned(),
            row: row.to_string(),
            column,
            reason: reason.to_string(),
        }
    }

    /// The table the row is in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The row, as `seq N` or `id X`.
    pub fn row(&self) -> &str {
        &self.row
    }

    /// The column that failed to decode.
    pub fn column(&self) -> &str {
        self.column
    }

    /// What is wrong with the value.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl std::fmt::Display for RowDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "row {} of {}: column {} cannot be decoded: {}",
            self.row, self.table, self.column, self.reason
        )
    }
}

impl StdError for RowDecodeError {}

impl From<RowDecodeError> for Error {
    fn from(error: RowDecodeError) -> Self {
        Error::store_permanent(error)
    }
}

/// Cuts outside input for error messages, so that a huge or binary value never floods logs.
pub(crate) fn excerpt(input: &str) -> String {
    const MAX: usize = 64;
    match input.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(Error::store_transient("busy").is_transient());
        assert!(!Error::store_transient("busy").is_outage());
        assert!(Error::store_outage("down").is_transient());
        assert!(Error::store_outage("down").is_outage());
        assert!(Error::transport_outage("down").is_outage());
        assert!(!Error::store_permanent("syntax").is_transient());
        assert!(Error::handler("try again").is_transient());
        assert!(!Error::handler_permanent("bad order").is_transient());
        assert!(Error::from(InvalidMessage::EmptyTopic).is_invalid_input());
        assert!(
            Error::Duplicate {
                id: crate::MessageId::new()
            }
            .is_duplicate()
        );
    }

    #[test]
    fn excerpt_cuts_long_input_on_a_char_boundary() {
        let long = "é".repeat(100);
        let cut = excerpt(&long);
        assert_eq!(cut.chars().count(), 65);
        assert!(cut.ends_with('…'));
    }
}
