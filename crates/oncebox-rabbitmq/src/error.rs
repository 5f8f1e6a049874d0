//! [`RabbitError`] and how lapin's errors map onto [`oncebox_core::Error`].

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use oncebox_core::Error;

/// What went wrong talking to RabbitMQ: the source of every
/// [`Error::Transport`](oncebox_core::Error::Transport) this crate returns, so callers
/// can downcast to it. The classification (transient or permanent) is on the
/// `oncebox_core::Error` around it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitError {
    /// The connection could not be opened (broker down, wrong credentials or vhost).
    #[error("cannot connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// What lapin reported.
        #[source]
        source: lapin::Error,
    },

    /// The connection did not open within the connect timeout.
    #[error("connecting to RabbitMQ at {url} took longer than {timeout:?}")]
    ConnectTimeout {
        /// The URL, password redacted.
        url: String,
        /// The configured connect timeout.
        timeout: std::time::Duration,
    },

    /// With several nodes: no node could be connected to. Each node's URL (password
    /// redacted) and why it failed, in the order tried. Transient unless every node
    /// refused for good.
    #[error("cannot connect to any of the {} RabbitMQ nodes: {}", .failures.len(), node_failures(.failures))]
    NoNodeReachable {
        /// Each node tried, with its error.
        failures: Vec<(String, Error)>,
    },

    /// The exchange does not exist (and the options say not to declare it), or was
    /// deleted while publishing.
    #[error(
        "exchange {exchange:?} does not exist in vhost {vhost:?} (declare it, or let the transport declare it with `declare_exchange(true)`): {source}"
    )]
    ExchangeNotFound {
        /// The exchange name.
        exchange: String,
        /// The virtual host.
        vhost: String,
        /// What the broker said.
        #[source]
        source: lapin::Error,
    },

    /// Declaring or binding a queue or exchange, or starting a consumer, was refused
    /// (an existing queue with other arguments, a missing permission).
    #[error("RabbitMQ refused to {action}: {source}")]
    Topology {
        /// What was attempted, naming the queue or exchange.
        action: String,
        /// What the broker said.
        #[source]
        source: lapin::Error,
    },

    /// The message could not be routed: no queue is bound to the exchange for its
    /// routing key (`basic.return` of a mandatory publish).
    #[error(
        "RabbitMQ returned the message as unroutable: no queue is bound to exchange {exchange:?} for routing key {routing_key:?} ({reply_code} {reply_text})"
    )]
    Unroutable {
        /// The exchange published to (`""` for the default exchange).
        exchange: String,
        /// The routing key (the topic).
        routing_key: String,
        /// The broker's reply code (312 `NO_ROUTE`).
        reply_code: u16,
        /// The broker's reply text.
        reply_text: String,
    },

    /// The broker refused to take the message (`basic.nack`: a queue's length limit
    /// with `reject-publish`, an internal error).
    #[error(
        "RabbitMQ did not take the message (basic.nack) on exchange {exchange:?} with routing key {routing_key:?}"
    )]
    Nacked {
        /// The exchange published to.
        exchange: String,
        /// The routing key.
        routing_key: String,
    },

    /// The message body is larger than the broker (or the configured limit) accepts.
    #[error("the message body is {size} bytes, over the maximum message size of {limit} bytes")]
    TooLarge {
        /// The body size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },

    /// The publisher is between connections; it reconnects in the background.
    #[error("not connected to RabbitMQ ({reason}); reconnecting")]
    Disconnected {
        /// Why the last connection ended or the last attempt failed.
        reason: String,
    },

    /// The channel or connection failed during an operation.
    #[error("RabbitMQ channel failed while {action}: {source}")]
    Channel {
        /// What was under way.
        action: &'static str,
        /// What lapin reported.
        #[source]
        source: lapin::Error,
    },

    /// Settling a delivery that was requeued already: its ack timeout passed, or its
    /// channel closed. The broker delivers the message again.
    #[error(
        "the delivery was requeued already (its ack timeout passed or its channel closed); it will be delivered again"
    )]
    DeliveryRequeued,

    /// A delivery whose headers cannot be carried in [`oncebox_core::Headers`].
    #[error("undecodable delivery: {0}")]
    Undecodable(#[source] oncebox_core::InvalidMessage),
}

/// `url: error; url: error…`, for [`RabbitError::NoNodeReachable`].
fn node_failures(failures: &[(String, Error)]) -> String {
    failures
        .iter()
        .map(|(url, error)| format!("{url}: {error}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl RabbitError {
    /// As a transient transport error.
    pub(crate) fn transient(self) -> Error {
        Error::transport_transient(self)
    }

    /// As a permanent transport error.
    pub(crate) fn permanent(self) -> Error {
        Error::transport_permanent(self)
    }
}

/// The AMQP error the broker closed a channel or connection with, if that is what
/// `error` is.
pub(crate) fn amqp_error(error: &lapin::Error) -> Option<&lapin::protocol::AMQPError> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp),
        _ => None,
    }
}

/// Whether the broker answered with a soft (channel) error of `kind`.
pub(crate) fn is_soft(error: &lapin::Error, kind: AMQPSoftError) -> bool {
    amqp_error(error).is_some_and(|amqp| *amqp.kind() == AMQPErrorKind::Soft(kind))
}

/// Whether `error` says the request itself is wrong, so retrying it changes nothing:
/// refused credentials or permissions, a missing vhost or exchange, arguments that
/// differ from an existing queue's. Used for errors while connecting and declaring;
/// lost connections, timeouts and a broker shutting down are transient.
pub(crate) fn is_refusal(error: &lapin::Error) -> bool {
    match amqp_error(error).map(lapin::protocol::AMQPError::kind) {
        Some(AMQPErrorKind::Soft(soft)) => matches!(
            soft,
            AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::NOTFOUND
                | AMQPSoftError::PRECONDITIONFAILED
                | AMQPSoftError::CONTENTTOOLARGE
        ),
        Some(AMQPErrorKind::Hard(hard)) => matches!(
            hard,
            AMQPHardError::NOTALLOWED
                | AMQPHardError::INVALIDPATH
                | AMQPHardError::COMMANDINVALID
                | AMQPHardError::NOTIMPLEMENTED
                | AMQPHardError::SYNTAXERROR
        ),
        None => matches!(
            error.kind(),
            lapin::ErrorKind::AuthProviderError(_) | lapin::ErrorKind::InvalidProtocolVersion(_)
        ),
    }
}

/// RabbitMQ refuses credentials by closing the connection during the handshake, which
/// lapin reports as an IO error ("connection reset", "unexpected EOF"); with the
/// `ACCESS_REFUSED` reply when the broker sends one.
pub(crate) fn setup_error(error: RabbitError) -> Error {
    let refused = match &error {
        RabbitError::Connect { source, .. }
        | RabbitError::ExchangeNotFound { source, .. }
        | RabbitError::Topology { source, .. }
        | RabbitError::Channel { source, .. } => is_refusal(source),
        RabbitError::ConnectTimeout { .. }
        | RabbitError::Disconnected { .. }
        | RabbitError::NoNodeReachable { .. } => false,
        _ => true,
    };
    if refused {
        error.permanent()
    } else {
        error.transient()
    }
}

/// The error for one message in flight on a channel that failed with `error`.
///
/// Everything is transient — the relay publishes the message again once the
/// transport has reconnected — except a body the broker refused as too large
/// (`PRECONDITION_FAILED - message size N is larger than configured max size M`),
/// which is permanent for a message larger than `M` (the others in flight on the same
/// channel are only collateral).
pub(crate) fn publish_error(error: &lapin::Error, exchange: &str, body_size: usize) -> Error {
    if let Some(limit) = broker_size_limit(error)
        && body_size > limit
    {
        return RabbitError::TooLarge {
            size: body_size,
            limit,
        }
        .permanent();
    }
    if is_soft(error, AMQPSoftError::NOTFOUND) {
        return RabbitError::ExchangeNotFound {
            exchange: exchange.to_owned(),
            vhost: String::new(),
            source: error.clone(),
        }
        .transient();
    }
    RabbitError::Channel {
        action: "publishing",
        source: error.clone(),
    }
    .transient()
}

/// The `M` of RabbitMQ's "message size N is larger than configured max size M" (or
/// "larger than max size M" when the limit is the default).
fn broker_size_limit(error: &lapin::Error) -> Option<usize> {
    let amqp = amqp_error(error)?;
    if *amqp.kind() != AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) {
        return None;
    }
    let text = amqp.get_message().as_str();
    let (_, tail) = text.split_once("is larger than")?;
    let (_, tail) = tail.split_once("max size")?;
    tail.trim()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use lapin::protocol::AMQPError;

    use super::*;

    fn soft(kind: AMQPSoftError, text: &str) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind.into(), text.into())).into()
    }

    #[test]
    fn oversized_bodies_are_permanent_for_the_oversized_message_only() {
        let closed = soft(
            AMQPSoftError::PRECONDITIONFAILED,
            "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000",
        );
        assert_eq!(broker_size_limit(&closed), Some(1000));
        let default = soft(
            AMQPSoftError::PRECONDITIONFAILED,
            "PRECONDITION_FAILED - message size 134217729 is larger than max size 134217728",
        );
        assert_eq!(broker_size_limit(&default), Some(134_217_728));
        let other = soft(
            AMQPSoftError::PRECONDITIONFAILED,
            "PRECONDITION_FAILED - unknown delivery tag 7",
        );
        assert_eq!(broker_size_limit(&other), None);
        assert!(!publish_error(&closed, "x", 2000).is_transient());
        assert!(publish_error(&closed, "x", 10).is_transient());
    }

    #[test]
    fn lost_connections_are_transient_refusals_permanent() {
        let io: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(!is_refusal(&io));
        assert!(publish_error(&io, "x", 1).is_transient());
        let missing = soft(AMQPSoftError::NOTFOUND, "NOT_FOUND - no exchange 'x'");
        assert!(is_refusal(&missing));
        // At publish time a missing exchange is a configuration problem to fix, not a
        // reason to dead-letter the outbox: transient.
        let error = publish_error(&missing, "x", 1);
        assert!(error.is_transient());
        assert!(
            error.to_string().contains("\"x\" does not exist"),
            "{error}"
        );
        let setup = setup_error(RabbitError::Topology {
            action: "declare queue q".into(),
            source: soft(AMQPSoftError::PRECONDITIONFAILED, "inequivalent arg"),
        });
        assert!(!setup.is_transient());
    }
}
