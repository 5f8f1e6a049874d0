//! Options of the client, the publisher and the subscribers.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use oncebox_core::wire::DEFAULT_SOURCE;
use oncebox_core::{Error, Result};

use crate::names;

/// The largest message (body and attributes) the publisher sends unless
/// [`SqsOptions::max_message_size`] says otherwise: 256 KiB, the limit SQS queues had
/// until 2025 and the one every SQS-compatible server accepts.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 * 1024;

/// The most SQS accepts with a queue's `MaximumMessageSize` raised to its maximum.
pub const MAX_MESSAGE_SIZE: usize = 1024 * 1024;

/// The suffix of a queue's dead-letter queue unless [`SqsOptions::dead_letter_suffix`]
/// sets another: the dead letters of queue `orders` go to `orders-dlq` (of `orders.fifo`
/// to `orders-dlq.fifo`).
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = "-dlq";

/// The environment variable oncebox's tools and tests read a local SQS endpoint from.
pub const ENDPOINT_ENV: &str = "ONCEBOX_SQS_ENDPOINT";

/// The longest SQS keeps a message invisible after its receipt.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// How to reach SQS, and how the transport names, publishes and settles messages.
///
/// ```
/// use std::time::Duration;
/// use oncebox_sqs::{SqsOptions, SubscriberOptions};
///
/// let options = SqsOptions::new()
///     .region("eu-west-1")
///     .queue("orders", "orders.fifo")
///     .queue("audit", "https://sqs.eu-west-1.amazonaws.com/123456789012/audit")
///     .source("/orders-service")
///     .subscriber(SubscriberOptions::new().visibility_timeout(Duration::from_secs(60)));
/// options.validate().unwrap();
/// ```
///
/// Region, credentials and endpoint come from the standard AWS chain (environment,
/// shared config and credentials files, web identity, ECS and EC2 instance metadata)
/// unless set here. `Debug` and error messages never show credentials.
#[derive(Clone)]
#[must_use]
pub struct SqsOptions {
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) queues: BTreeMap<String, String>,
    pub(crate) default_queue: Option<String>,
    pub(crate) queue_prefix: String,
    pub(crate) fifo: bool,
    pub(crate) dead_letter_suffix: String,
    pub(crate) source: Cow<'static, str>,
    pub(crate) max_message_size: usize,
    pub(crate) batches_in_flight: usize,
    pub(crate) entry_attempts: u32,
    pub(crate) subscriber: SubscriberOptions,
}

impl Default for SqsOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl SqsOptions {
    /// Every setting at its default: the AWS chain's region, credentials and endpoint;
    /// each topic on the standard queue of its own name.
    pub fn new() -> Self {
        Self {
            endpoint: None,
            region: None,
            credentials: None,
            queues: BTreeMap::new(),
            default_queue: None,
            queue_prefix: String::new(),
            fifo: false,
            dead_letter_suffix: DEFAULT_DEAD_LETTER_SUFFIX.to_owned(),
            source: Cow::Borrowed(DEFAULT_SOURCE),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            batches_in_flight: 8,
            entry_attempts: 4,
            subscriber: SubscriberOptions::new(),
        }
    }

    /// An explicit endpoint, for a local SQS-compatible server (`http://127.0.0.1:4566`)
    /// or a VPC endpoint. Default: the chain's (`AWS_ENDPOINT_URL_SQS`,
    /// `AWS_ENDPOINT_URL`), else the region's public endpoint.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The region (`eu-west-1`). Default: the chain's (`AWS_REGION`, the profile), and
    /// `us-east-1` when only an [`endpoint`](Self::endpoint) is given.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Static credentials instead of the chain's: for local servers, which accept any.
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some((access_key_id.into(), secret_access_key.into()));
        self
    }

    /// Publishes `topic` to `queue`, a queue name (`orders.fifo`) or URL
    /// (`https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo`), and subscribes
    /// to it there. A topic without such an entry goes to the queue named
    /// `{queue prefix}{topic}` (characters other than ASCII letters, digits, `-` and `_`
    /// replaced by `-`, and `.fifo` appended when [`fifo`](Self::fifo) is set).
    pub fn queue(mut self, topic: impl Into<String>, queue: impl Into<String>) -> Self {
        self.queues.insert(topic.into(), queue.into());
        self
    }

    /// One queue (name or URL) for every topic without a [`queue`](Self::queue) entry,
    /// instead of a queue named after each topic.
    pub fn default_queue(mut self, queue: impl Into<String>) -> Self {
        self.default_queue = Some(queue.into());
        self
    }

    /// A prefix of the queue names derived from topics (not of [`queue`](Self::queue)
    /// entries): `shop-` puts topic `orders` on queue `shop-orders`.
    pub fn queue_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.queue_prefix = prefix.into();
        self
    }

    /// Whether queue names derived from topics are FIFO queues (`orders.fifo`). Whether
    /// a queue is FIFO is always read from its name, as SQS requires the `.fifo` suffix.
    pub fn fifo(mut self, yes: bool) -> Self {
        self.fifo = yes;
        self
    }

    /// The suffix naming a queue's dead-letter queue, inserted before `.fifo`
    /// (default [`DEFAULT_DEAD_LETTER_SUFFIX`]).
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_suffix = suffix.into();
        self
    }

    /// The CloudEvents `source` written on every message (default `oncebox`).
    pub fn source(mut self, source: impl Into<Cow<'static, str>>) -> Self {
        self.source = source.into();
        self
    }

    /// The largest message, body and attributes as SQS counts them, the publisher sends
    /// (default [`DEFAULT_MAX_MESSAGE_SIZE`], at most [`MAX_MESSAGE_SIZE`]); a larger one
    /// is refused with [`SqsError::TooLarge`](crate::SqsError::TooLarge) before
    /// sending. Raise it only for queues whose `MaximumMessageSize` is raised too.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// How many `SendMessageBatch` requests a publisher keeps in flight per queue
    /// (default 8).
    pub fn batches_in_flight(mut self, batches: usize) -> Self {
        self.batches_in_flight = batches;
        self
    }

    /// How many times a publisher sends an entry SQS did not confirm (a failed entry of
    /// a batch, a batch that got no answer) before `publish` returns a transient error
    /// (default 4).
    pub fn entry_attempts(mut self, attempts: u32) -> Self {
        self.entry_attempts = attempts;
        self
    }

    /// The subscribers' options.
    pub fn subscriber(mut self, subscriber: SubscriberOptions) -> Self {
        self.subscriber = subscriber;
        self
    }

    /// The subscribers' options.
    pub fn subscriber_options(&self) -> &SubscriberOptions {
        &self.subscriber
    }

    /// The queue (name or URL) `topic` is published to and read from: its
    /// [`queue`](Self::queue) entry, else the topic itself when it is a queue URL, else
    /// the [`default_queue`](Self::default_queue), else the queue named after it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when the derived name is not a valid queue name.
    pub fn queue_of(&self, topic: &str) -> Result<String> {
        if let Some(queue) = self.queues.get(topic) {
            return Ok(queue.clone());
        }
        if names::is_url(topic) {
            return Ok(topic.to_owned());
        }
        if let Some(queue) = &self.default_queue {
            return Ok(queue.clone());
        }
        let name = format!(
            "{}{}{}",
            self.queue_prefix,
            names::sanitize(topic),
            if self.fifo && !topic.ends_with(names::FIFO) {
                names::FIFO
            } else {
                ""
            }
        );
        names::check_queue_name(&name).map_err(|reason| {
            invalid(format!(
                "topic {topic:?} maps to queue name {name:?}: {reason}"
            ))
        })?;
        Ok(name)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(invalid(format!(
                "endpoint {endpoint:?} must be an http:// or https:// URL"
            )));
        }
        if self.region.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("the region must not be empty".into()));
        }
        let default = self
            .default_queue
            .iter()
            .map(|queue| ("(default)", queue.as_str()));
        for (topic, queue) in self
            .queues
            .iter()
            .map(|(topic, queue)| (topic.as_str(), queue.as_str()))
            .chain(default)
        {
            if names::is_url(queue) {
                names::name_of_url(queue).map_err(|reason| {
                    invalid(format!("queue URL {queue:?} of topic {topic:?}: {reason}"))
                })?;
            } else {
                names::check_queue_name(queue).map_err(|reason| {
                    invalid(format!("queue {queue:?} of topic {topic:?}: {reason}"))
                })?;
            }
        }
        names::check_queue_name(&format!("{}x", self.queue_prefix))
            .map_err(|reason| invalid(format!("queue prefix {:?}: {reason}", self.queue_prefix)))?;
        if self.dead_letter_suffix.is_empty() {
            return Err(invalid(
                "the dead-letter suffix must not be empty, or dead letters would go back to their queue"
                    .into(),
            ));
        }
        names::check_queue_name(&format!("x{}", self.dead_letter_suffix)).map_err(|reason| {
            invalid(format!(
                "dead-letter suffix {:?}: {reason}",
                self.dead_letter_suffix
            ))
        })?;
        if !(1024..=MAX_MESSAGE_SIZE).contains(&self.max_message_size) {
            return Err(invalid(format!(
                "max_message_size must be between 1024 and {MAX_MESSAGE_SIZE} bytes, not {}",
                self.max_message_size
            )));
        }
        if self.batches_in_flight == 0 || self.entry_attempts == 0 {
            return Err(invalid(
                "batches_in_flight and entry_attempts must be at least 1".into(),
            ));
        }
        self.subscriber.validate()
    }
}

impl fmt::Debug for SqsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsOptions")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "static (hidden)"),
            )
            .field("queues", &self.queues)
            .field("default_queue", &self.default_queue)
            .field("queue_prefix", &self.queue_prefix)
            .field("fifo", &self.fifo)
            .field("dead_letter_suffix", &self.dead_letter_suffix)
            .field("source", &self.source)
            .field("max_message_size", &self.max_message_size)
            .field("batches_in_flight", &self.batches_in_flight)
            .field("entry_attempts", &self.entry_attempts)
            .field("subscriber", &self.subscriber)
            .finish()
    }
}

/// How subscribers receive and hold deliveries.
///
/// A received message stays invisible to other consumers for the
/// [`visibility_timeout`](Self::visibility_timeout); while its delivery is held
/// (handled, not yet settled) the subscriber extends that every third of the timeout,
/// up to [`max_lease`](Self::max_lease) after the receipt. A delivery dropped unsettled
/// (a crashed handler) is no longer extended and comes back within one visibility
/// timeout; one held past `max_lease` (a stuck handler) comes back then. So `max_lease`
/// is the ack timeout of the transport's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct SubscriberOptions {
    pub(crate) visibility_timeout: Duration,
    pub(crate) max_lease: Duration,
    pub(crate) wait_time: Duration,
    pub(crate) max_messages: u8,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl SubscriberOptions {
    /// Visibility timeout 30 s, max lease 15 min, long polls of 20 s, 10 messages a
    /// receive.
    pub const fn new() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_lease: Duration::from_secs(15 * 60),
            wait_time: Duration::from_secs(20),
            max_messages: 10,
        }
    }

    /// The visibility timeout asked for at each receipt and extension, in whole seconds
    /// (rounded up; 1 s to 12 h; default 30 s).
    pub const fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = timeout;
        self
    }

    /// How long after its receipt a held delivery stops being extended (at least the
    /// visibility timeout, at most 12 h; default 15 min).
    pub const fn max_lease(mut self, lease: Duration) -> Self {
        self.max_lease = lease;
        self
    }

    /// How long a receive waits for messages (long polling; whole seconds up to 20;
    /// default 20 s). `next` waits on in further receives.
    pub const fn wait_time(mut self, wait: Duration) -> Self {
        self.wait_time = wait;
        self
    }

    /// How many messages a receive takes at most (1 to 10; default 10).
    pub const fn max_messages(mut self, messages: u8) -> Self {
        self.max_messages = messages;
        self
    }

    /// The ack timeout of the transport: [`max_lease`](Self::max_lease).
    pub fn ack_timeout(&self) -> Duration {
        self.max_lease
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.visibility_timeout < Duration::from_secs(1)
            || self.visibility_timeout > MAX_VISIBILITY
        {
            return Err(invalid(
                "visibility_timeout must be between 1 s and 12 h".into(),
            ));
        }
        if self.max_lease < self.visibility_timeout || self.max_lease > MAX_VISIBILITY {
            return Err(invalid(
                "max_lease must be at least the visibility timeout and at most 12 h".into(),
            ));
        }
        if self.wait_time > Duration::from_secs(20) {
            return Err(invalid("wait_time must be at most 20 s".into()));
        }
        if !(1..=10).contains(&self.max_messages) {
            return Err(invalid("max_messages must be between 1 and 10".into()));
        }
        Ok(())
    }
}

/// Whole seconds, rounded up, as SQS takes them.
pub(crate) fn seconds(duration: Duration) -> i32 {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(whole.min(MAX_VISIBILITY.as_secs())).unwrap_or(i32::MAX)
}

pub(crate) fn invalid(message: String) -> Error {
    Error::InvalidOptions(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SqsOptions::new().validate().unwrap();
    }

    #[test]
    fn queues_are_named_after_topics() {
        let options = SqsOptions::new()
            .queue_prefix("shop-")
            .queue("audit", "audit-log");
        assert_eq!(options.queue_of("orders").unwrap(), "shop-orders");
        assert_eq!(options.queue_of("billing.v1").unwrap(), "shop-billing-v1");
        assert_eq!(options.queue_of("audit").unwrap(), "audit-log");
        let fifo = SqsOptions::new().fifo(true);
        assert_eq!(fifo.queue_of("orders").unwrap(), "orders.fifo");
        assert_eq!(fifo.queue_of("orders.fifo").unwrap(), "orders.fifo");
        assert!(SqsOptions::new().queue_of(&"x".repeat(81)).is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = [
            SqsOptions::new().endpoint("localhost:4566"),
            SqsOptions::new().queue("orders", "bad name"),
            SqsOptions::new().queue("orders", "https://sqs.example.com/"),
            SqsOptions::new().dead_letter_suffix(""),
            SqsOptions::new().max_message_size(2 * MAX_MESSAGE_SIZE),
            SqsOptions::new()
                .subscriber(SubscriberOptions::new().visibility_timeout(Duration::from_millis(10))),
            SqsOptions::new().subscriber(
                SubscriberOptions::new()
                    .visibility_timeout(Duration::from_secs(60))
                    .max_lease(Duration::from_secs(30)),
            ),
            SqsOptions::new().subscriber(SubscriberOptions::new().max_messages(11)),
        ];
        for options in bad {
            assert!(options.validate().is_err(), "{options:?}");
        }
    }

    #[test]
    fn credentials_are_hidden() {
        let options = SqsOptions::new().static_credentials("AKIA", "very-secret");
        assert!(!format!("{options:?}").contains("very-secret"));
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(seconds(Duration::ZERO), 0);
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(2)), 2);
        assert_eq!(seconds(Duration::from_secs(100_000)), 43_200);
    }
}
