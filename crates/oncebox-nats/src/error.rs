//! What goes wrong talking to JetStream, and how it maps onto [`oncebox_core::Error`].

use async_nats::jetstream::{self, ErrorCode};
use oncebox_core::Error;

/// The source of every transport error this crate returns, inside
/// [`Error::Transport`](oncebox_core::Error::Transport): reach it with
/// [`std::error::Error::source`] and `downcast_ref` to tell the cases apart; the
/// classification ([`Error::is_transient`](oncebox_core::Error::is_transient)) is
/// already made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JetStreamError {
    /// No stream captures the subject, so nothing stores what is published there
    /// (the server answers "no responders"). Transient: a stream may be created (see
    /// [`JetStreamTransport::ensure_stream`](crate::JetStreamTransport::ensure_stream)),
    /// and until then the relay keeps the messages and retries with backoff instead of
    /// dead-lettering a whole outbox over a configuration mistake.
    #[error(
        "no JetStream stream captures subject {subject:?}: create one covering it \
         (JetStreamTransport::ensure_stream); until then this is retried"
    )]
    NoStream {
        /// The subject nothing listens on.
        subject: String,
    },

    /// The message is larger than the server or the stream accepts. Permanent.
    #[error("the message is {size} bytes (payload and headers), over the {limit}")]
    TooLarge {
        /// Its size on the wire, payload and headers.
        size: usize,
        /// Which limit, and its value when known.
        limit: String,
    },

    /// A topic whose subject cannot be published to (empty token, wildcard,
    /// whitespace). Permanent.
    #[error("subject {subject:?} cannot be published to: {reason}")]
    InvalidSubject {
        /// The subject.
        subject: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The server answered a JetStream request with an error.
    #[error("{operation}: JetStream refused: {source}")]
    Refused {
        /// What was being done.
        operation: String,
        /// The server's answer.
        #[source]
        source: jetstream::Error,
    },

    /// The client failed: connection lost or refused, no answer in time, a request the
    /// server could not route.
    #[error("{operation}: {source}")]
    Client {
        /// What was being done.
        operation: String,
        /// What the client reported.
        #[source]
        source: async_nats::Error,
    },

    /// The consumer of a group exists but filters another subject: two group and topic
    /// pairs map to the same consumer name. Permanent.
    #[error(
        "consumer {consumer:?} of stream {stream:?} filters {found:?}, not {expected:?}: \
         another topic maps to the same consumer name"
    )]
    ConsumerMismatch {
        /// The stream.
        stream: String,
        /// The consumer name.
        consumer: String,
        /// The filter it has.
        found: String,
        /// The filter this subscriber needs.
        expected: String,
    },
}

/// A transient transport error.
pub(crate) fn transient(error: JetStreamError) -> Error {
    Error::transport_transient(error)
}

/// A permanent transport error.
pub(crate) fn permanent(error: JetStreamError) -> Error {
    Error::transport_permanent(error)
}

/// A transport error from the client, transient: connections come back.
pub(crate) fn client(operation: impl Into<String>, source: impl Into<async_nats::Error>) -> Error {
    transient(JetStreamError::Client {
        operation: operation.into(),
        source: source.into(),
    })
}

/// A transport error from a JetStream API answer: transient for server-side trouble
/// (5xx: no leader yet, cluster not ready, storage busy), permanent for requests the
/// server will refuse again (4xx: invalid configuration, a name in use).
pub(crate) fn refused(operation: impl Into<String>, source: jetstream::Error) -> Error {
    let transient_answer = source.code() >= 500 || matches!(source.code(), 408 | 429);
    let error = JetStreamError::Refused {
        operation: operation.into(),
        source,
    };
    if transient_answer {
        transient(error)
    } else {
        permanent(error)
    }
}

/// Whether a publish refused with `source` would be refused again: a message too large
/// for the stream, or a failed expectation. Everything else (storage full with
/// `discard: new`, no quorum, ...) may pass later, and the relay's dead letter after its
/// attempt limit is the backstop.
pub(crate) fn publish_refusal_is_permanent(source: &jetstream::Error) -> bool {
    matches!(
        source.error_code(),
        ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
            | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
            | ErrorCode::STREAM_WRONG_LAST_SEQUENCE
            | ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID
            | ErrorCode::STREAM_NOT_MATCH
    )
}

/// The JetStream API error somewhere in `error`'s chain of sources, if any.
pub(crate) fn api_error<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e jetstream::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(api) = error.downcast_ref::<jetstream::Error>() {
            return Some(api);
        }
        current = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: usize, err_code: u64) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code, "err_code": err_code, "description": "test"
        }))
        .unwrap()
    }

    #[test]
    fn classification() {
        assert!(refused("x", api(503, 10008)).is_transient());
        assert!(!refused("x", api(400, 10065)).is_transient());
        assert!(client("x", "connection lost").is_transient());
        let no_stream = transient(JetStreamError::NoStream {
            subject: "orders".into(),
        });
        assert!(no_stream.is_transient());
        assert!(no_stream.to_string().contains("\"orders\""), "{no_stream}");
        assert!(publish_refusal_is_permanent(&api(400, 10054)));
        assert!(!publish_refusal_is_permanent(&api(503, 10077)));
    }

    #[test]
    fn api_errors_are_found_in_source_chains() {
        let inner = api(400, 10054);
        let wrapped = JetStreamError::Refused {
            operation: "publish".into(),
            source: inner.clone(),
        };
        assert_eq!(api_error(&wrapped), Some(&inner));
        assert_eq!(api_error(&std::io::Error::other("x")), None);
    }
}
