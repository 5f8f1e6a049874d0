//! How Redis client errors map onto [`oncebox_core::Error`].

use oncebox_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A store error from a Redis error: lost connections, timeouts and a server that is
/// loading, failing over or read-only are transient; script, type and configuration
/// errors are permanent.
pub(crate) fn store_error(error: RedisError) -> Error {
    if is_transient(&error) {
        Error::store_transient(error)
    } else {
        Error::store_permanent(error)
    }
}

fn is_transient(error: &RedisError) -> bool {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
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
        assert!(store_error(io).is_transient());
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "not an array"));
        assert!(!store_error(parse).is_transient());
    }
}
