//! What a transport can do beyond the contract every transport keeps.

/// The optional behaviours a transport declares, so that the suite runs the checks that
/// apply to it and skips (and says so) the others.
///
/// Start from [`Capabilities::new`] (nothing optional) or [`Capabilities::all`], then set
/// flags:
///
/// ```
/// use oncebox_testkit::transport::Capabilities;
///
/// let kafka_like = Capabilities::new().per_key_order(true).consumer_groups(true).restart(true);
/// assert!(!kafka_like.delivery_count);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// One subscriber receives the messages of one key in publish order (a partition, a
    /// stream, a single queue).
    pub per_key_order: bool,
    /// Subscribers of one group share its messages, and every group receives every
    /// message.
    pub consumer_groups: bool,
    /// The harness can restart the broker ([`TransportHarness::restart`](super::TransportHarness::restart)).
    pub restart: bool,
    /// The harness can read a topic's dead letters with their reasons
    /// ([`TransportHarness::dead_letters`](super::TransportHarness::dead_letters)).
    pub dead_letter_inspection: bool,
    /// [`Received::delivery_count`](oncebox_core::Received::delivery_count) counts
    /// deliveries (JetStream, RabbitMQ quorum queues, Redis Streams); Kafka reports 1.
    pub delivery_count: bool,
    /// A nack's delay is honoured: the message does not come back sooner (JetStream
    /// `NAK` with delay, or a client that holds the delivery for the delay before it
    /// requeues it, as oncebox's RabbitMQ subscriber does).
    pub nack_delay: bool,
    /// A group created after messages were published still receives them (a stream read
    /// from its start, a Kafka group at the earliest offset).
    pub retained_log: bool,
}

impl Capabilities {
    /// Nothing beyond the contract every transport keeps.
    pub const fn new() -> Self {
        Self {
            per_key_order: false,
            consumer_groups: false,
            restart: false,
            dead_letter_inspection: false,
            delivery_count: false,
            nack_delay: false,
            retained_log: false,
        }
    }

    /// Every capability (the in-process broker has them all).
    pub const fn all() -> Self {
        Self {
            per_key_order: true,
            consumer_groups: true,
            restart: true,
            dead_letter_inspection: true,
            delivery_count: true,
            nack_delay: true,
            retained_log: true,
        }
    }

    /// Sets [`Capabilities::per_key_order`].
    #[must_use]
    pub const fn per_key_order(mut self, yes: bool) -> Self {
        self.per_key_order = yes;
        self
    }

    /// Sets [`Capabilities::consumer_groups`].
    #[must_use]
    pub const fn consumer_groups(mut self, yes: bool) -> Self {
        self.consumer_groups = yes;
        self
    }

    /// Sets [`Capabilities::restart`].
    #[must_use]
    pub const fn restart(mut self, yes: bool) -> Self {
        self.restart = yes;
        self
    }

    /// Sets [`Capabilities::dead_letter_inspection`].
    #[must_use]
    pub const fn dead_letter_inspection(mut self, yes: bool) -> Self {
        self.dead_letter_inspection = yes;
        self
    }

    /// Sets [`Capabilities::delivery_count`].
    #[must_use]
    pub const fn delivery_count(mut self, yes: bool) -> Self {
        self.delivery_count = yes;
        self
    }

    /// Sets [`Capabilities::nack_delay`].
    #[must_use]
    pub const fn nack_delay(mut self, yes: bool) -> Self {
        self.nack_delay = yes;
        self
    }

    /// Sets [`Capabilities::retained_log`].
    #[must_use]
    pub const fn retained_log(mut self, yes: bool) -> Self {
        self.retained_log = yes;
        self
    }
}
