//! How Redis client errors map onto [`oncebox_core::Error`].

use oncebox_core::{Error, Fault};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A store error from a Redis error: a refused or lost connection is an outage (no
/// fault of the message: a consumer waits for Redis without spending attempts);
/// timeouts and a server that is loading, failing over, read-only or out of memory are
/// transient; script, type and configuration errors are permanent.
pub(crate) fn store_error(error: RedisError) -> Error {
    let fault = fault(&error);
    Error::store(error, fault)
}

/// What retrying a command that failed with `error` would do.
fn fault(error: &RedisError) -> Fault {
    if error.is_connection_refusal() || error.is_connection_dropped() || error.is_io_error() {
        Fault::Outage
    } else if is_transient(error) {
        Fault::Transient
    } else {
        Fault::Permanent
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
    let fault = fault(&error);
    Error::transport(error, fault)
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
        assert!(store_error(io.clone()).is_outage());
        assert!(transport_error(io, "s").is_outage());
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "not an array"));
        assert!(!store_error(parse).is_transient());
        let oom = redis::make_extension_error("OOM".into(), Some("maxmemory".into()));
        let oom = transport_error(oom, "s");
        assert!(oom.is_transient() && !oom.is_outage());
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
