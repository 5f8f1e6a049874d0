//! Amazon SQS transport for [oncebox](https://docs.rs/oncebox): publishing confirmed by
//! `SendMessageBatch` answers, FIFO queues deduplicating a relay's re-publishes, leased
//! deliveries, and dead-letter queues with the reason.
//!
//! | piece | what it is |
//! |---|---|
//! | [`SqsTransport`] | the AWS SDK client (from [`SqsOptions`] and the standard AWS chain), queue URLs, and the factory of the rest |
//! | [`SqsPublisher`] | a [`Publisher`](oncebox_core::Publisher): batches of up to ten, returns once SQS confirmed the entry |
//! | [`SqsSubscriber`], [`SqsDelivery`] | a [`Subscriber`](oncebox_core::Subscriber): long polling, visibility extended while a delivery is held |
//! | [`QueueSettings`], [`SqsTransport::ensure_queue`] | create a topic's queue and its dead-letter queue, with a redrive policy if asked |
//! | [`SqsTransport::dead_letters`], [`DeadLetter`] | read a topic's dead letters back |
//! | [`SqsError`] | the source of every transport error, already classified |
//!
//! ```no_run
//! use std::time::Duration;
//! use oncebox_core::{Delivery, Message, Publisher, Subscriber};
//! use oncebox_sqs::{QueueSettings, SqsOptions, SqsTransport, SubscriberOptions};
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let sqs = SqsTransport::connect(
//!     SqsOptions::new()
//!         .region("eu-west-1")
//!         .queue("orders", "orders.fifo")
//!         .subscriber(SubscriberOptions::new().visibility_timeout(Duration::from_secs(60))),
//! )
//! .await?;
//! sqs.ensure_queue("orders", &QueueSettings::new()).await?;
//!
//! // The relay's side: returns once SQS confirmed it.
//! sqs.publisher().publish(&Message::new("orders", "order 42").with_key("order-42")).await?;
//!
//! // A consumer's side.
//! let mut payments = sqs.subscriber("orders").await?;
//! let delivery = payments.next().await?;
//! assert_eq!(delivery.received().key.as_deref(), Some("order-42"));
//! delivery.ack().await?;
//! # Ok(()) }
//! ```
//!
//! # Delivery guarantees
//!
//! - **FIFO queues** (names ending in `.fifo`): `MessageGroupId` is the message's key, so
//!   messages of one key arrive in order and keys go in parallel; `MessageDeduplicationId`
//!   is the message id, so SQS drops a copy the relay publishes again **within five
//!   minutes** (a relay that crashed between SQS's answer and marking the row
//!   published). After five minutes SQS delivers the copy again: the consumer's inbox
//!   (transactional or idempotent receiver) is what deduplicates then, and always for
//!   redeliveries. A key SQS does not accept as a group id (over 128 characters, or
//!   other than printable ASCII) is replaced by its hex SHA-256 (still one group per
//!   key); a message without key is a group of its own.
//! - **Standard queues**: at least once, in no particular order; the inbox
//!   deduplicates. Use FIFO queues where per-key order matters.
//! - A publish returns `Ok` only for an entry SQS's answer lists as successful; a failed
//!   entry is sent again in a later batch (unless SQS blames the entry itself), and so is
//!   every entry of a batch that got no answer (see [`SqsPublisher`]).
//! - A message over [`SqsOptions::max_message_size`] (256 KiB by default, counted as SQS
//!   counts: body plus attribute names, types and values) is refused with
//!   [`SqsError::TooLarge`] before anything is sent.
//! - SQS has no consumer groups: every subscriber of a queue competes for its messages.
//!   Fan out with SNS (or a publisher per queue) and give each consuming service a queue.
//!
//! # Wire format
//!
//! A message travels as an SQS message whose body is the payload's text, and whose
//! message attributes carry its CloudEvents attributes (binary content mode with Kafka's
//! `ce_` naming, [`WireFormat::sqs`](oncebox_core::wire::WireFormat::sqs); `ce-` is read
//! too) and its headers, as `String` attributes:
//!
//! | SQS | value | from |
//! |---|---|---|
//! | queue | the topic's queue ([`SqsOptions::queue`], else named after the topic) | [`Message::topic`](oncebox_core::Message::topic) |
//! | body | the payload, when it is text SQS accepts; otherwise its base64, with `oncebox_body: base64` (an empty payload: body `-`, `oncebox_body: empty`) | [`Message::payload`](oncebox_core::Message::payload) |
//! | `ce_specversion` | `1.0` | |
//! | `ce_id` | the message id, a UUID | [`Message::id`](oncebox_core::Message::id) |
//! | `ce_source` | [`SqsOptions::source`] (default `oncebox`) | |
//! | `ce_type` | the event type; `oncebox.message` when empty | [`Message::kind`](oncebox_core::Message::kind) |
//! | `ce_subject` | the key, left out when none | [`Message::key`](oncebox_core::Message::key) |
//! | `ce_time` | creation time, RFC 3339 UTC | [`Message::created_at`](oncebox_core::Message::created_at) |
//! | `content-type`, `traceparent`, others | the message's own headers | [`Message::headers`](oncebox_core::Message::headers) |
//! | `oncebox_headers` | only when needed: a JSON object of the headers beyond SQS's ten attributes per message, or whose names SQS does not allow (`/`, a leading `AWS.`) | |
//! | `MessageGroupId`, `MessageDeduplicationId` | FIFO only: the key and the id, as above | |
//!
//! On receipt the `ce_` attributes fill [`Received`](oncebox_core::Received)'s fields;
//! [`Received::delivery_count`](oncebox_core::Received::delivery_count) is SQS's
//! `ApproximateReceiveCount`; the coordinates are the topic and the sequence number
//! (FIFO) or SQS message id. Reading is lenient: a message of a producer that does not use
//! oncebox (no `ce_` attributes) arrives with `id: None` and its attributes as headers,
//! for an [`IdStrategy`](oncebox_core::consumer::IdStrategy) to identify. A message this
//! crate cannot read is dead-lettered with the reason (see [`SqsSubscriber`]).
//!
//! # Leases, nacks and dead letters
//!
//! A received message stays invisible for the
//! [`visibility_timeout`](SubscriberOptions::visibility_timeout), extended every third
//! of it while its delivery is held, up to [`max_lease`](SubscriberOptions::max_lease)
//! after the receipt (the transport's ack timeout). See [`SqsDelivery`] for what each
//! settlement sends.
//!
//! [`Delivery::dead_letter`](oncebox_core::Delivery::dead_letter) sends a copy to the
//! queue's dead-letter queue (`orders-dlq` for `orders`, `orders-dlq.fifo` for
//! `orders.fifo`, [`SqsOptions::dead_letter_suffix`]), waits for SQS's answer, then deletes
//! the original. The copy keeps the body and attributes and adds:
//!
//! | attribute | value |
//! |---|---|
//! | `oncebox_dead_letter_reason` | why (characters SQS refuses replaced, at most 4 KiB) |
//! | `oncebox_dead_letter_topic`, `oncebox_dead_letter_queue` | where it was received |
//! | `oncebox_dead_letter_deliveries` | SQS's receive count of the original |
//! | `oncebox_dead_letter_message_id` | the original's SQS message id (on a FIFO dead-letter queue also the copy's group and deduplication id) |
//! | `oncebox_dead_letter_payload_omitted` | only when the body did not fit beside these: its size |
//!
//! A queue can also have a redrive policy ([`QueueSettings::max_receive_count`]): SQS then
//! moves a message received that many times to the same dead-letter queue by itself,
//! without a reason (a consumer that crashes on it every time).
//! [`SqsTransport::dead_letters`] reads both kinds (on a FIFO queue, of the messages a
//! redrive policy moved, only the first of each group: SQS hands out a group's next
//! message only once the one before is deleted). Binary attributes of the original are
//! base64 text on the copy.
//!
//! # Errors
//!
//! Every error is an [`oncebox_core::Error`], classified so the relay and the consumer
//! know whether to retry; its source is an [`SqsError`]:
//!
//! | case | class |
//! |---|---|
//! | bad options, no region | [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) |
//! | SQS unreachable, no answer in time | outage (retried without spending a message's attempts) |
//! | the queue does not exist ([`SqsError::NoQueue`]) | transient: a configuration mistake fixed by creating it |
//! | throttling, 5xx answers, credentials or permissions refused | transient |
//! | a message over the size limit ([`SqsError::TooLarge`]), an entry SQS refuses as invalid | permanent |
//!
//! # Building
//!
//! The AWS SDK's default HTTPS client is rustls on aws-lc, a C and cmake build. This
//! crate builds the SDK's hyper client on rustls with *ring* instead, and `aws-config`
//! without its `sso` and `credentials-process` features: credentials come from the
//! environment, shared config and credentials files (static keys, assumed roles), web
//! identity tokens, and ECS and EC2 instance metadata; for SSO profiles, build a client
//! with `aws-config`'s defaults yourself and pass it to [`SqsTransport::with_client`].
//! The SDK is large: the feature `sqs` adds 41 crates to the `oncebox` command's build,
//! most of the time going to the generated `aws-sdk-sqs` and `aws-sdk-sts` (which
//! `aws-config` uses for assumed roles and web identity).
//!
//! # Local servers
//!
//! The tests run against [fauxqs](https://www.npmjs.com/package/fauxqs) 1.9.2
//! (`scripts/services.sh sqs`), an in-memory SQS emulator, with
//! [`SqsOptions::endpoint`] and [`SqsOptions::static_credentials`]. Checked against it:
//! FIFO group ordering with one message in flight per group, deduplication ids over
//! five minutes (also after a delete), content-based deduplication,
//! `ChangeMessageVisibility`, redrive policies, `ApproximateReceiveCount`, message
//! attributes of the three types, per-entry batch failures. What it does **not** do as
//! SQS does, so what these tests cannot show:
//!
//! - it accepts more than ten message attributes and attribute names SQS refuses (this
//!   crate never sends either: unit tests cover that rule);
//! - its message size limit is the queue's `MaximumMessageSize` (1 MiB by default), with
//!   no separate limit on a whole batch;
//! - it accepts `MessageDeduplicationId` on standard queues (SQS refuses it; this crate
//!   sets it on FIFO queues only);
//! - it keeps at most 10,000 deduplication ids per queue, so beyond 10,000 messages in
//!   five minutes the oldest ids are forgotten early;
//! - it keeps nothing across a restart, so no test restarts it;
//! - it hands out one message per FIFO group at a time, where SQS may return several
//!   of a group in one receive (the subscriber's release of a nacked group's buffered
//!   messages is therefore not exercised against it);
//! - it checks no credentials, signatures or permissions.

mod dead_letter;
mod delivery;
mod error;
mod lease;
mod names;
mod options;
mod publisher;
mod subscriber;
mod transport;
mod wire;

pub use dead_letter::{
    DELIVERIES_ATTRIBUTE, DeadLetter, MESSAGE_ID_ATTRIBUTE, PAYLOAD_OMITTED_ATTRIBUTE,
    QUEUE_ATTRIBUTE, REASON_ATTRIBUTE, TOPIC_ATTRIBUTE,
};
pub use delivery::SqsDelivery;
pub use error::SqsError;
pub use options::{
    DEFAULT_DEAD_LETTER_SUFFIX, DEFAULT_MAX_MESSAGE_SIZE, ENDPOINT_ENV, MAX_MESSAGE_SIZE,
    SqsOptions, SubscriberOptions,
};
pub use publisher::SqsPublisher;
pub use subscriber::SqsSubscriber;
pub use transport::{QueueSettings, SqsTransport};
pub use wire::{BODY_ATTRIBUTE, HEADERS_ATTRIBUTE};

/// Re-exported so that callers configure the same SDK version.
pub use aws_sdk_sqs;

#[cfg(test)]
mod contracts {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: T) {}

    /// Spawnable futures: checked by compiling, never run.
    fn futures_are_send(sqs: &SqsTransport) {
        send(SqsTransport::connect(SqsOptions::new()));
        send(sqs.subscriber("orders"));
        send(sqs.ensure_queue("orders", &QueueSettings::new()));
        send(sqs.dead_letters("orders", 10));
    }

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<SqsTransport>();
        send_sync::<SqsPublisher>();
        send_sync::<SqsDelivery>();
        send_sync::<SqsOptions>();
        send_sync::<SqsError>();
        let _subscriber_is_send = send::<SqsSubscriber>;
        let _checked = futures_are_send;
    }
}
