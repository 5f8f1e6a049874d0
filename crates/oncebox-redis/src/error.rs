//! How Redis client errors map onto [`oncebox_core::Error`].

use oncebox_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A store error from a Redis error: lost connections, timeouts and a server that is
/// loading, failing over, read-only or out of memory are transient; script, type and
/// configuration errors are permanent.
pub(crate) fn store_error(error: RedisError) -> Error {
    if is_transient(&error) {
        Error::store_transient(error)
    } else {
        Error::store_permanent(error)
    }
}

/// A transport error from a Redis error, classified as [`store_error`] does.
///
/// `WRONGTYPE` (the stream's key holds another type) is permanent and names the key.
pub(crate) fn transport_error(error: RedisError, key: &str) -> Error {
    if has_code(&error, "WRONGTYPE") {
        return Error::transport_permanent(StreamError::WrongType {
            key: key.to_owned(),
            source: error,
        });
    }
    if is_transient(&error) {
        Error::transport_transient(error)
    } else {
        Error::transport_permanent(error)
    }
}

/// Whether the server answered with error code `code` (`NOGROUP`, `BUSYGROUP`, ...).
pub(crate) fn has_code(error: &RedisError, code: &str) -> bool {
    error.code() == Some(code)
}

/// Errors of the Redis Streams transport that Redis itself does not name well.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// The stream's key exists and holds another type.
    #[error("the key {key:?} holds a value that is not a stream")]
    WrongType {
        /// The key.
        key: String,
        /// What Redis answered.
        #[source]
        source: RedisError,
    },
    /// A reply of a shape the transport does not know.
    #[error("unexpected reply to {command}: {shape}")]
    UnexpectedReply {
        /// The command or script.
        command: &'static str,
        /// The reply's shape, never its content.
        shape: String,
    },
}

fn is_transient(error: &RedisError) -> bool {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        return true;
    }
    // Out of memory (`maxmemory` reached), a script running too long, too few replicas:
    // the server may accept the same command later.
    if ["OOM", "BUSY", "NOREPLICAS"]
        .iter()
        .any(|code| has_code(error, code))
    {
        return true;
    }
    matches!(
        error.kind(),
        ErrorKind::Io
            | ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(store_error(io.clone()).is_transient());
        assert!(transport_error(io, "s").is_transient());
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "not an array"));
        assert!(!store_error(parse).is_transient());
        let oom = redis::make_extension_error("OOM".into(), Some("maxmemory".into()));
        assert!(transport_error(oom, "s").is_transient());
        let wrong = redis::make_extension_error("WRONGTYPE".into(), None);
        let error = transport_error(wrong, "orders");
        assert!(!error.is_transient());
        assert!(
            error
                .to_string()
                .contains("\"orders\" holds a value that is not a stream"),
            "{error}"
        );
    }
}
