//! Options of the connection, the publisher and the subscribers.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use async_nats::ServerAddr;
use oncebox_core::wire::DEFAULT_SOURCE;
use oncebox_core::{Error, Result};

use crate::names::check_publish_subject;

/// The server used by [`JetStreamOptions::default`].
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The environment variable oncebox's tools and tests read the NATS URL from.
pub const URL_ENV: &str = "ONCEBOX_NATS_URL";

/// The subject prefix of dead-letter copies unless [`JetStreamOptions::dead_letter_prefix`]
/// sets another: a message of topic `orders` is dead-lettered to `dlq.orders`.
pub const DEFAULT_DEAD_LETTER_PREFIX: &str = "dlq.";

/// How to reach NATS and how the transport names, publishes and settles messages.
///
/// ```
/// use std::time::Duration;
/// use oncebox_nats::{JetStreamOptions, SubscriberOptions};
///
/// let options = JetStreamOptions::new("nats://nats-1:4222")
///     .server("nats://nats-2:4222")
///     .name("orders-relay")
///     .subject_prefix("shop.")
///     .request_timeout(Duration::from_secs(10))
///     .subscriber(SubscriberOptions::new().ack_wait(Duration::from_secs(60)));
/// options.validate().unwrap();
/// ```
///
/// URLs are `nats://host:port` or `tls://host:port` (`host:port` alone means `nats://`),
/// with credentials as `nats://user:password@host` or `nats://token@host` if the server
/// wants them. `Debug` and error messages never show credentials. For nkeys, credential
/// files or custom TLS, build an [`async_nats::Client`] yourself and hand it to
/// [`JetStreamTransport::with_client`](crate::JetStreamTransport::with_client).
#[derive(Clone)]
#[must_use]
pub struct JetStreamOptions {
    pub(crate) servers: Vec<String>,
    pub(crate) name: Option<String>,
    pub(crate) subject_prefix: String,
    pub(crate) dead_letter_prefix: String,
    pub(crate) dead_letter_copies: bool,
    pub(crate) source: Cow<'static, str>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) confirm_settlements: bool,
    pub(crate) subscriber: SubscriberOptions,
}

impl JetStreamOptions {
    /// Options for the server at `url`, with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            servers: vec![url.into()],
            name: None,
            subject_prefix: String::new(),
            dead_letter_prefix: DEFAULT_DEAD_LETTER_PREFIX.to_owned(),
            dead_letter_copies: true,
            source: Cow::Borrowed(DEFAULT_SOURCE),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            max_in_flight: 4096,
            confirm_settlements: true,
            subscriber: SubscriberOptions::new(),
        }
    }

    /// Adds another server of the cluster; the client picks one and fails over to the
    /// others.
    pub fn server(mut self, url: impl Into<String>) -> Self {
        self.servers.push(url.into());
        self
    }

    /// The connection name the server shows (`nats server report connections`).
    /// Default: none.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Put before every topic to make its subject: with `shop.`, topic `orders` is
    /// published on subject `shop.orders`. Default: empty (the subject is the topic).
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.subject_prefix = prefix.into();
        self
    }

    /// Put before the topic to make the subject of its dead-letter copies. Default:
    /// [`DEFAULT_DEAD_LETTER_PREFIX`]. The subject needs a stream, see
    /// [`JetStreamTransport::ensure_dead_letter_stream`](crate::JetStreamTransport::ensure_dead_letter_stream).
    pub fn dead_letter_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dead_letter_prefix = prefix.into();
        self
    }

    /// Whether a dead-lettered message is first copied, with its reason, to its
    /// dead-letter subject. Default: `true`. Without copies a dead letter is only
    /// terminated (`+TERM`) and logged: nothing keeps it for inspection or replay.
    pub fn dead_letter_copies(mut self, yes: bool) -> Self {
        self.dead_letter_copies = yes;
        self
    }

    /// The CloudEvents `source` written on every message (a URI reference naming the
    /// producing service, such as `/orders-service`). Default: `oncebox`.
    pub fn source(mut self, source: impl Into<Cow<'static, str>>) -> Self {
        self.source = source.into();
        self
    }

    /// How long connecting to a server may take. Default: 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a JetStream request may wait for its answer: a publish for its PubAck, a
    /// confirmed ack, a stream or consumer operation. Past it the operation fails with a
    /// transient error (the relay publishes again; `Nats-Msg-Id` makes that harmless
    /// within the duplicate window). Default: 5 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many publishes may wait for their PubAck at once; more wait for a slot.
    /// Default: 4096.
    pub fn max_in_flight(mut self, publishes: usize) -> Self {
        self.max_in_flight = publishes;
        self
    }

    /// Whether ack, nack and dead-letter wait for the server to confirm it took them
    /// (one round trip each). Default: `true`, so that an `Ok` means the server has the
    /// settlement and an error means it may not. With `false` they return once the
    /// settlement is written to the connection, which is faster; a settlement lost with
    /// the connection then shows only as a redelivery after the ack wait.
    pub fn confirm_settlements(mut self, yes: bool) -> Self {
        self.confirm_settlements = yes;
        self
    }

    /// The options of subscribers made by
    /// [`JetStreamTransport::subscriber`](crate::JetStreamTransport::subscriber).
    /// Default: [`SubscriberOptions::new`].
    pub fn subscriber(mut self, options: SubscriberOptions) -> Self {
        self.subscriber = options;
        self
    }

    /// The subscriber options set by [`JetStreamOptions::subscriber`].
    pub fn subscriber_options(&self) -> &SubscriberOptions {
        &self.subscriber
    }

    /// The subject messages of `topic` are published on.
    pub fn subject(&self, topic: &str) -> String {
        format!("{}{topic}", self.subject_prefix)
    }

    /// The subject dead-letter copies of `topic` are published on.
    pub fn dead_letter_subject(&self, topic: &str) -> String {
        format!("{}{topic}", self.dead_letter_prefix)
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad value: no server, a URL that does
    /// not parse or has another scheme than `nats` or `tls`, a prefix that makes invalid
    /// subjects, a zero timeout or limit, bad subscriber options.
    pub fn validate(&self) -> Result<()> {
        if self.servers.is_empty() {
            return Err(invalid("no NATS server URL given".into()));
        }
        self.server_addrs()?;
        if !self.subject_prefix.is_empty() {
            check_publish_subject(&format!("{}x", self.subject_prefix)).map_err(|reason| {
                invalid(format!(
                    "subject prefix {:?}: {reason}",
                    self.subject_prefix
                ))
            })?;
        }
        if self.dead_letter_prefix.is_empty() || self.dead_letter_prefix == self.subject_prefix {
            return Err(invalid(
                "the dead-letter prefix must be set and differ from the subject prefix, \
                 or dead letters would be published back to their topic"
                    .into(),
            ));
        }
        check_publish_subject(&format!("{}x", self.dead_letter_prefix)).map_err(|reason| {
            invalid(format!(
                "dead-letter prefix {:?}: {reason}",
                self.dead_letter_prefix
            ))
        })?;
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(invalid("timeouts must be positive".into()));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight must be at least 1".into()));
        }
        self.subscriber.validate()
    }

    /// The servers, parsed.
    pub(crate) fn server_addrs(&self) -> Result<Vec<ServerAddr>> {
        self.servers.iter().map(|url| parse_url(url)).collect()
    }

    /// The servers, for messages: credentials hidden.
    pub(crate) fn servers_for_display(&self) -> String {
        self.servers
            .iter()
            .map(|url| redact(url))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Default for JetStreamOptions {
    /// [`JetStreamOptions::new`] with [`DEFAULT_URL`].
    fn default() -> Self {
        Self::new(DEFAULT_URL)
    }
}

impl fmt::Debug for JetStreamOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamOptions")
            .field("servers", &self.servers_for_display())
            .field("name", &self.name)
            .field("subject_prefix", &self.subject_prefix)
            .field("dead_letter_prefix", &self.dead_letter_prefix)
            .field("dead_letter_copies", &self.dead_letter_copies)
            .field("source", &self.source)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("confirm_settlements", &self.confirm_settlements)
            .field("subscriber", &self.subscriber)
            .finish()
    }
}

/// How a subscriber's durable consumer behaves.
///
/// The consumer is created (or updated) with these values when a subscriber joins its
/// group, so all members of a group should use the same.
///
/// ```
/// use std::time::Duration;
/// use oncebox_nats::SubscriberOptions;
///
/// let options = SubscriberOptions::new()
///     .ack_wait(Duration::from_secs(60))
///     .max_deliver(10)
///     .prefetch(16);
/// options.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct SubscriberOptions {
    pub(crate) ack_wait: Duration,
    pub(crate) max_deliver: Option<u32>,
    pub(crate) max_ack_pending: u32,
    pub(crate) prefetch: u32,
}

impl SubscriberOptions {
    /// The defaults: 30 s ack wait, 20 deliveries at most, 1000 unacked messages per
    /// group, 64 messages prefetched per subscriber.
    pub const fn new() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            max_deliver: Some(20),
            max_ack_pending: 1000,
            prefetch: 64,
        }
    }

    /// How long after a delivery an unsettled message is delivered again (JetStream
    /// `ack_wait`). Default: 30 s. Keep it above the longest handling time *plus* the
    /// time a prefetched message may wait in the subscriber (see
    /// [`SubscriberOptions::prefetch`]), or messages are redelivered while still being
    /// handled.
    pub const fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// The most deliveries of one message (JetStream `max_deliver`), or `None` for no
    /// limit. Default: 20.
    ///
    /// The subscriber does not hand out the last allowed delivery: it dead-letters it
    /// (reason "delivered N times without being settled"), so a message that keeps
    /// crashing its consumer ends up among the dead letters instead of silently
    /// stopping. Keep it above the consumer's own attempt limit
    /// ([`ConsumerOptions::max_attempts`](oncebox_core::consumer::ConsumerOptions::max_attempts)),
    /// which dead-letters failing messages with their error first.
    pub fn max_deliver(mut self, deliveries: impl Into<Option<u32>>) -> Self {
        self.max_deliver = deliveries.into();
        self
    }

    /// The most messages the group may have delivered and not yet settled (JetStream
    /// `max_ack_pending`); the server holds back the rest. Default: 1000.
    pub const fn max_ack_pending(mut self, messages: u32) -> Self {
        self.max_ack_pending = messages;
        self
    }

    /// How many messages a subscriber asks for at once. Default: 64.
    ///
    /// Prefetched messages count as delivered: their ack wait runs while they wait in
    /// the subscriber, and other members of the group cannot take them. Lower it for
    /// slow handlers, raise it for throughput.
    pub const fn prefetch(mut self, messages: u32) -> Self {
        self.prefetch = messages;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a zero ack wait, prefetch or `max_ack_pending`, or a
    /// `max_deliver` below 2 (the last delivery is dead-lettered, so 1 would dead-letter
    /// every message).
    pub fn validate(&self) -> Result<()> {
        if self.ack_wait < Duration::from_millis(1) {
            return Err(invalid("ack_wait must be at least 1 ms".into()));
        }
        if self.max_deliver.is_some_and(|n| n < 2) {
            return Err(invalid(
                "max_deliver must be at least 2 (or None for no limit)".into(),
            ));
        }
        if self.prefetch == 0 || self.max_ack_pending == 0 {
            return Err(invalid(
                "prefetch and max_ack_pending must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl Default for SubscriberOptions {
    /// [`SubscriberOptions::new`].
    fn default() -> Self {
        Self::new()
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidOptions(message)
}

/// Parses a server URL, refusing schemes this build cannot connect with.
fn parse_url(url: &str) -> Result<ServerAddr> {
    let addr: ServerAddr = url.parse().map_err(|error: std::io::Error| {
        invalid(format!("NATS server URL {:?}: {error}", redact(url)))
    })?;
    match addr.scheme() {
        "nats" | "tls" => Ok(addr),
        other => Err(invalid(format!(
            "NATS server URL {:?}: scheme {other:?} is not supported (use nats:// or tls://)",
            redact(url)
        ))),
    }
}

/// `url` without the credentials it may hold.
pub(crate) fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        JetStreamOptions::default().validate().unwrap();
        SubscriberOptions::default().validate().unwrap();
    }

    #[test]
    fn bad_urls_are_invalid_options_without_credentials() {
        for url in [
            "http://127.0.0.1:4222",
            "nats://user:secret@127.0.0.1:notaport",
            "ws://127.0.0.1:8080",
        ] {
            let error = JetStreamOptions::new(url).validate().unwrap_err();
            assert!(error.is_invalid_input(), "{url}: {error}");
            assert!(!error.to_string().contains("secret"), "{error}");
        }
        JetStreamOptions::new("127.0.0.1:4222").validate().unwrap();
        JetStreamOptions::new("tls://user:pw@nats.example.com")
            .validate()
            .unwrap();
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("nats://u:p@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("token@h"), "***@h");
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
        let debug = format!("{:?}", JetStreamOptions::new("nats://u:hunter2@h"));
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    #[test]
    fn prefixes_must_make_valid_subjects() {
        assert!(
            JetStreamOptions::default()
                .subject_prefix("shop.")
                .validate()
                .is_ok()
        );
        assert!(
            JetStreamOptions::default()
                .subject_prefix("a b.")
                .validate()
                .is_err()
        );
        assert!(
            JetStreamOptions::default()
                .subject_prefix("shop..")
                .validate()
                .is_err()
        );
        assert!(
            JetStreamOptions::default()
                .dead_letter_prefix("")
                .validate()
                .is_err()
        );
        let same = JetStreamOptions::default()
            .subject_prefix("x.")
            .dead_letter_prefix("x.");
        assert!(same.validate().is_err());
        assert!(
            JetStreamOptions::default()
                .dead_letter_prefix(">.")
                .validate()
                .is_err()
        );
        let options = JetStreamOptions::default().subject_prefix("shop.");
        assert_eq!(options.subject("orders"), "shop.orders");
        assert_eq!(options.dead_letter_subject("orders"), "dlq.orders");
    }

    #[test]
    fn subscriber_limits() {
        assert!(SubscriberOptions::new().max_deliver(1).validate().is_err());
        assert!(
            SubscriberOptions::new()
                .max_deliver(None)
                .validate()
                .is_ok()
        );
        assert!(SubscriberOptions::new().prefetch(0).validate().is_err());
        assert!(
            SubscriberOptions::new()
                .ack_wait(Duration::ZERO)
                .validate()
                .is_err()
        );
    }
}
