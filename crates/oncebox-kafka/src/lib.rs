//! Kafka transport for [oncebox](https://docs.rs/oncebox): an idempotent producer that
//! confirms every publish, and consumer-group subscribers with acks, nacks, an ack
//! timeout and dead-letter topics.
//!
//! Built on [rdkafka](https://docs.rs/rdkafka) with its bundled librdkafka (2.12), and
//! tested against the [tansu](https://github.com/tansu-io/tansu) Kafka-protocol broker.
//!
//! | type | role |
//! |---|---|
//! | [`KafkaPublisher`] | [`Publisher`](oncebox_core::Publisher): the relay's sink; returns after the delivery report |
//! | [`KafkaSubscriber`] | [`Subscriber`](oncebox_core::Subscriber): one member of a consumer group on one topic |
//! | [`KafkaDelivery`] | [`Delivery`](oncebox_core::Delivery): ack, nack, dead letter, kept by the subscriber |
//! | [`KafkaOptions`] | brokers, batching, timeouts, dead-letter topic, any librdkafka property |
//! | [`KafkaAdmin`] | create and delete topics, read dead letters |
//!
//! ```no_run
//! use std::time::Duration;
//! use oncebox_core::{Delivery, Message, Publisher, Subscriber};
//! use oncebox_kafka::{KafkaOptions, KafkaPublisher, KafkaSubscriber};
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let options = KafkaOptions::new("127.0.0.1:9092").ack_timeout(Duration::from_secs(60));
//! let publisher = KafkaPublisher::connect(options.clone()).await?;
//! publisher.publish(&Message::new("orders", "order 42").with_key("customer-7")).await?;
//!
//! let mut payments = KafkaSubscriber::subscribe(options, "orders", "payments").await?;
//! let delivery = payments.next().await?;
//! assert_eq!(delivery.received().key.as_deref(), Some("customer-7"));
//! delivery.ack().await?;
//! # Ok(()) }
//! ```
//!
//! # Wire format
//!
//! CloudEvents' Kafka protocol binding, binary content mode
//! ([`WireFormat::kafka`](oncebox_core::wire::WireFormat::kafka)), so consumers in any
//! language read the messages with a CloudEvents SDK or by header name:
//!
//! | Kafka record | carries | when |
//! |---|---|---|
//! | value | [`Message::payload`](oncebox_core::Message::payload), untouched | always |
//! | key | [`Message::key`](oncebox_core::Message::key), UTF-8; it picks the partition (murmur2, as Java clients do) | if the message has a key (else no key: partitions are picked at random) |
//! | header `ce_specversion` | `1.0` | always |
//! | header `ce_id` | [`Message::id`](oncebox_core::Message::id), a UUID in hyphenated form | always |
//! | header `ce_source` | [`KafkaOptions::source`], default `oncebox` | always |
//! | header `ce_type` | [`Message::kind`](oncebox_core::Message::kind) | always: `oncebox.message` ([`DEFAULT_TYPE`](oncebox_core::wire::DEFAULT_TYPE)) when the kind is empty |
//! | header `ce_subject` | [`Message::key`](oncebox_core::Message::key) again | if the message has a key |
//! | header `ce_time` | [`Message::created_at`](oncebox_core::Message::created_at), RFC 3339 UTC with microseconds | always |
//! | other headers | [`Message::headers`](oncebox_core::Message::headers) as they are (`traceparent`...), UTF-8 | if any |
//! | timestamp | the time of sending (CreateTime), not `created_at`, so that retention counts from publishing | always |
//!
//! Receiving is lenient: a record from a producer that does not use oncebox arrives with
//! what it has. With no `ce_id` the [`Received::id`](oncebox_core::Received::id) is
//! `None` (an [`IdStrategy`](oncebox_core::consumer::IdStrategy) then uses another header,
//! the payload's hash or the coordinates); the key is `ce_subject`, else the record's
//! key if it is UTF-8; [`Received::coordinates`](oncebox_core::Received::coordinates) are
//! always the topic, the partition and the offset. A record whose headers no
//! [`Headers`](oncebox_core::Headers) can hold (a value that is not UTF-8) is
//! dead-lettered by the subscriber with the reason, never handed out or dropped.
//!
//! Dead letters are copies of the record (key, value, headers byte for byte) on
//! `<topic>.dlq` (configurable) with the headers listed in [`dead_letter`].
//!
//! # Delivery semantics
//!
//! Kafka has consumer groups and one committed offset per partition, nothing per
//! message. [`KafkaSubscriber`] supplies the rest in the process:
//!
//! - **ack**: commits only the contiguous prefix of settled records of each partition
//!   (in the background, every second by default); everything after it is delivered
//!   again after a crash or a rebalance.
//! - **nack(delay)** and the **ack timeout**: the subscriber keeps what it handed out
//!   and hands it out again after the delay, or after the ack timeout when it is not
//!   settled. Both are local: another member of the group knows nothing of them.
//! - **dead_letter(reason)**: a copy goes to the dead-letter topic, and the record
//!   counts as settled once the broker confirmed the copy.
//! - **delivery_count** counts this subscriber's deliveries of a record; Kafka keeps no
//!   count across consumers, so after a crash or a rebalance it starts again at 1. The
//!   consumer engines' attempt limit (dead-letter after N failures) therefore holds
//!   within one subscriber, not across restarts. The conformance suite is told so
//!   (`Capabilities::delivery_count` is false).
//! - **Late settlements are harmless**: settling a delivery after its ack timeout, or
//!   after its partition moved to another member, changes nothing that matters.
//!
//! # Errors
//!
//! Publishing fails permanently only when the message itself can never be accepted (too
//! large); an unknown topic, missing permissions and unreachable brokers are transient,
//! so that a configuration mistake makes the relay retry rather than dead-letter the
//! outbox (see [`KafkaTransportError`]). librdkafka reconnects on its own after a broker
//! outage; publishes that get no delivery report within
//! [`KafkaOptions::publish_timeout`] fail transiently and are retried by the relay.
//!
//! # Features
//!
//! | feature | what |
//! |---|---|
//! | `ssl` | TLS (`security.protocol=ssl`), through rdkafka's `ssl` |
//! | `sasl` | SASL/GSSAPI, through rdkafka's `sasl` |
//! | `zstd` | reading and writing zstd-compressed batches (gzip, snappy and lz4 always work) |
//!
//! # Testing
//!
//! `tests/conformance.rs` runs `oncebox-testkit`'s transport suite against the broker
//! at `ONCEBOX_KAFKA_BROKERS` (default `127.0.0.1:9092`; `scripts/services.sh kafka`
//! starts tansu with in-memory storage); every check uses topics and groups of its own,
//! deleted afterwards. The restart check is skipped: tansu's in-memory storage does not
//! survive a restart. `tests/end_to_end.rs` runs 10,000 messages from a SQLite outbox
//! through Kafka into a transactional inbox, with real redeliveries. `tests/kafka.rs`
//! covers what is particular to Kafka (foreign and undecodable records, committing only
//! the settled prefix, rebalances, errors); two of its tests run on librdkafka's mock
//! cluster instead of tansu, for what tansu cannot show:
//! `unknown_topics_fail_transiently_naming_the_topic` (tansu creates any topic a producer
//! writes to) and `clients_ride_out_a_broker_outage` (taking tansu down loses its
//! in-memory topics; the mock broker goes down and up with its data).
//!
//! # Known issues
//!
//! - **tansu answers a JoinGroup after half the session timeout**: with librdkafka's
//!   default `session.timeout.ms` of 45 s every assignment takes 23 s. Against tansu, set
//!   `KafkaOptions::set("session.timeout.ms", "6000")` (the tests do, with heartbeats
//!   every second).
//! - **Deleting a topic while a consumer fetches from it crashes the process** with
//!   tansu 0.6 and the bundled librdkafka 2.12.1: tansu's fetch answer for the deleted
//!   topic carries a leader hint with no topic id, and librdkafka dereferences the
//!   missing topic name (`rd_kafka_metadata_update_op`). Close subscribers (and await
//!   [`KafkaSubscriber::closed`]) before deleting their topic; the tests do.
//! - rdkafka 0.39 panics on a record header name that is not UTF-8; the subscriber
//!   contains the panic and dead-letters the record.

mod admin;
mod context;
pub mod dead_letter;
mod error;
mod options;
mod publisher;
mod subscriber;

pub use admin::{DeadLetter, KafkaAdmin};
pub use error::KafkaTransportError;
pub use options::{BROKERS_ENV, DEFAULT_BROKERS, KafkaOptions, MAX_IN_FLIGHT_ORDERED};
pub use publisher::KafkaPublisher;
pub use subscriber::{KafkaDelivery, KafkaSubscriber};

/// Re-exported so that callers configure the same client version.
pub use rdkafka;
