//! NATS JetStream transport for [oncebox](https://docs.rs/oncebox): confirmed,
//! pipelined publishing with broker-side deduplication, and durable pull consumers
//! with explicit acks, delayed nacks and dead letters.
//!
//! | piece | what it is |
//! |---|---|
//! | [`JetStreamTransport`] | the connection (from URLs and [`JetStreamOptions`]), and the factory of the rest |
//! | [`JetStreamPublisher`] | a [`Publisher`](oncebox_core::Publisher): returns after the PubAck, `Nats-Msg-Id` = message id |
//! | [`JetStreamSubscriber`], [`JetStreamDelivery`] | a [`Subscriber`](oncebox_core::Subscriber): one durable pull consumer per group and topic |
//! | [`StreamSettings`], [`JetStreamTransport::ensure_stream`] | create or update the stream of some topics, with its duplicate window |
//! | [`JetStreamTransport::dead_letters`], [`DeadLetter`] | read the dead letters of a topic back |
//! | [`JetStreamError`] | the source of every transport error, already classified transient or permanent |
//!
//! ```no_run
//! use std::time::Duration;
//! use oncebox_core::{Delivery, Message, Publisher, Subscriber};
//! use oncebox_nats::{JetStreamOptions, JetStreamTransport, StreamSettings, SubscriberOptions};
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let nats = JetStreamTransport::connect(
//!     JetStreamOptions::new("nats://127.0.0.1:4222")
//!         .subscriber(SubscriberOptions::new().ack_wait(Duration::from_secs(60))),
//! )
//! .await?;
//! let orders = StreamSettings::new("ORDERS")
//!     .topic("orders")
//!     .duplicate_window(Duration::from_secs(10 * 60));
//! nats.ensure_stream(&orders).await?;
//! nats.ensure_dead_letter_stream(&StreamSettings::new("ORDERS_DLQ").topic("orders")).await?;
//!
//! // The relay's side: returns once the stream has it.
//! nats.publisher().publish(&Message::new("orders", "order 42").with_key("order-42")).await?;
//!
//! // A consumer group's side.
//! let mut payments = nats.subscriber("orders", "payments").await?;
//! let delivery = payments.next().await?;
//! assert_eq!(delivery.received().key.as_deref(), Some("order-42"));
//! delivery.ack().await?;
//! # Ok(()) }
//! ```
//!
//! # Wire format
//!
//! A message travels as a NATS message whose body is the payload, untouched, and whose
//! headers follow the CloudEvents NATS binding (binary content mode,
//! [`WireFormat::nats`](oncebox_core::wire::WireFormat::nats)), so a consumer in any
//! language reads it with its CloudEvents SDK, or by header name:
//!
//! | NATS | value | from |
//! |---|---|---|
//! | subject | `{subject prefix}{topic}`, e.g. `orders` or `shop.orders` | [`Message::topic`](oncebox_core::Message::topic), [`JetStreamOptions::subject_prefix`] |
//! | body | the payload bytes | [`Message::payload`](oncebox_core::Message::payload) |
//! | `ce-specversion` | `1.0` | |
//! | `ce-id` | the message id, a UUID: `01936f1e-8a5c-7d2e-9b1a-3f4e5d6c7b8a` | [`Message::id`](oncebox_core::Message::id) |
//! | `ce-source` | the producing service, [`JetStreamOptions::source`] (default `oncebox`): set it once per transport | |
//! | `ce-type` | the event type: `order.placed`; `oncebox.message` ([`DEFAULT_TYPE`](oncebox_core::wire::DEFAULT_TYPE)) when empty | [`Message::kind`](oncebox_core::Message::kind) |
//! | `ce-subject` | the ordering key, left out when none: `order-42` | [`Message::key`](oncebox_core::Message::key) |
//! | `ce-time` | creation time, RFC 3339 UTC: `2026-11-21T13:05:09.123456Z` | [`Message::created_at`](oncebox_core::Message::created_at) |
//! | `ce-datacontenttype` | the payload's media type, when the message has a `content-type` header (`application/json` from [`Message::json`](oncebox_core::Message::json)) | [`CONTENT_TYPE`](oncebox_core::wire::CONTENT_TYPE) |
//! | `traceparent`, others | the message's own headers, unchanged (W3C trace context among them) | [`Message::headers`](oncebox_core::Message::headers) |
//! | `Nats-Msg-Id` | the message id again, for the stream's duplicate detection | [`Message::id`](oncebox_core::Message::id) |
//!
//! The `ce-` values are percent-encoded as the NATS binding's binary mode asks (space,
//! `"`, `%` and everything outside printable ASCII: `ce-subject: Z%C3%BCrich`), and
//! decoded on receipt.
//!
//! On receipt the `ce-` headers fill [`Received`](oncebox_core::Received)'s fields and
//! are removed from its headers, as is `Nats-Msg-Id` when it equals the id. Reading is
//! lenient: a message of a producer that does not use oncebox (no `ce-` headers)
//! arrives with `id: None` and its headers as they are, for an
//! [`IdStrategy`](oncebox_core::consumer::IdStrategy) to identify it. A message whose
//! headers no [`Headers`](oncebox_core::Headers) can hold (a control character, a value
//! over 8 KiB) is dead-lettered by the subscriber with the decoding error as the reason;
//! so is one whose header block the NATS client cannot read (a value that is not UTF-8),
//! which is then deleted from the stream (see [`JetStreamSubscriber`]).
//! [`Received::delivery_count`](oncebox_core::Received::delivery_count) is JetStream's
//! delivery count; the coordinates are the topic and the stream sequence.
//!
//! # Streams, consumers and names
//!
//! Every topic's subject must be captured by a stream; [`JetStreamTransport::ensure_stream`]
//! creates or extends one. A consumer group on a topic is a durable pull consumer on that
//! stream named `{group}_{topic}` (`.`, `*`, `>`, whitespace, `/` and `\` in the topic
//! become `_`), filtering the topic's subject, with explicit acks, the
//! [`SubscriberOptions`] (ack wait, `max_deliver`, `max_ack_pending`), and starting at the
//! beginning of the stream. Group names must be valid consumer names.
//!
//! # Dead letters
//!
//! [`Delivery::dead_letter`](oncebox_core::Delivery::dead_letter) publishes a copy of the
//! message (same body, same headers except `Nats-*` ones) to `{dead-letter prefix}{topic}`
//! (`dlq.orders` by default), waits for its PubAck, then terminates the original
//! (`+TERM`: the group never receives it again; the stream keeps it under its limits).
//! The copy carries:
//!
//! | header | value |
//! |---|---|
//! | `oncebox-dead-letter-reason` | why (control characters replaced, at most 4 KiB) |
//! | `oncebox-dead-letter-topic` | the topic |
//! | `oncebox-dead-letter-group` | the consumer group that gave up |
//! | `oncebox-dead-letter-stream`, `oncebox-dead-letter-sequence` | where the original is |
//! | `oncebox-dead-letter-deliveries` | how many times the group had received it |
//! | `oncebox-dead-letter-payload-omitted` | only when the body did not fit beside these headers: its size (read it from the original) |
//! | `Nats-Msg-Id` | `{stream}.{consumer}.{sequence}`: retrying a dead letter stores one copy |
//!
//! The dead-letter subjects need a stream too: [`JetStreamTransport::ensure_dead_letter_stream`].
//! Without one, dead-lettering fails (transiently) and the message comes back after the
//! ack wait. [`JetStreamOptions::dead_letter_copies`] turns copies off.
//!
//! # Errors
//!
//! Every error is an [`oncebox_core::Error`], classified so the relay and the consumer
//! know whether to retry; its source is a [`JetStreamError`]:
//!
//! | case | class | why |
//! |---|---|---|
//! | a bad URL or option | [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) | nothing to retry |
//! | server unreachable, restarting, no PubAck in time | transient | the client reconnects by itself; the relay publishes again, `Nats-Msg-Id` drops the copy |
//! | no stream captures the subject ([`JetStreamError::NoStream`], names the subject) | **transient** | a configuration mistake, fixed by creating the stream: retried with backoff, so the outbox is not dead-lettered meanwhile (the relay still gives up after its attempt limit) |
//! | message over the server's `max_payload` or the stream's `max_msg_size` ([`JetStreamError::TooLarge`], names the limit) | permanent | it will never fit |
//! | a header NATS cannot carry (a line break; the key and kind travel percent-encoded, so they can hold one) | [`Error::InvalidMessage`](oncebox_core::Error::InvalidMessage) | NATS headers cannot carry it |
//! | other refusals of a publish (storage full, no quorum) | transient | they may lift; the relay's attempt limit is the backstop |
//! | configuration the server refuses (overlapping subjects, a consumer name taken by another topic) | permanent | |
//!
//! # Server versions
//!
//! Works with nats-server 2.9 and later (tested with 2.9.10): pull consumers, `Nats-Msg-Id`
//! deduplication, `-NAK` with a delay and `+TERM` all date from 2.7 or earlier.

mod dead_letter;
mod delivery;
mod error;
mod names;
mod options;
mod publisher;
mod stream;
mod subscriber;
mod transport;
mod unreadable;

pub use dead_letter::{
    DELIVERIES_HEADER, DeadLetter, GROUP_HEADER, PAYLOAD_OMITTED_HEADER, REASON_HEADER,
    SEQUENCE_HEADER, STREAM_HEADER, TOPIC_HEADER,
};
pub use delivery::JetStreamDelivery;
pub use error::JetStreamError;
pub use options::{
    DEFAULT_DEAD_LETTER_PREFIX, DEFAULT_URL, JetStreamOptions, SubscriberOptions, URL_ENV,
};
pub use publisher::JetStreamPublisher;
pub use stream::{StreamSettings, StreamStorage};
pub use subscriber::JetStreamSubscriber;
pub use transport::JetStreamTransport;

/// Re-exported so that callers configure the same client version.
pub use async_nats;

#[cfg(test)]
mod contracts {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: T) {}

    /// Spawnable futures: checked by compiling, never run.
    fn futures_are_send(nats: &JetStreamTransport, settings: &StreamSettings) {
        send(JetStreamTransport::connect(JetStreamOptions::default()));
        send(nats.subscriber("orders", "payments"));
        send(nats.ensure_stream(settings));
        send(nats.ensure_dead_letter_stream(settings));
        send(nats.dead_letters("orders", 10));
    }

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<JetStreamTransport>();
        send_sync::<JetStreamPublisher>();
        send_sync::<JetStreamDelivery>();
        send_sync::<JetStreamOptions>();
        send_sync::<JetStreamError>();
        let _subscriber_is_send = send::<JetStreamSubscriber>;
        let _checked = futures_are_send;
    }
}
