//! RabbitMQ transport for [oncebox](https://docs.rs/oncebox): publisher confirms,
//! manual acks, dead-letter queues.
//!
//! - [`RabbitPublisher`] implements [`Publisher`](oncebox_core::Publisher): it publishes
//!   to an exchange with the topic as routing key and returns once RabbitMQ confirmed
//!   the message (publisher confirms, pipelined: many confirms outstanding). A message
//!   no queue is bound for is not reported as published.
//! - [`RabbitSubscriber`] implements [`Subscriber`](oncebox_core::Subscriber): a
//!   consumer on its group's durable queue (a quorum queue by default), handing out
//!   [`RabbitDelivery`] values that are acked, nacked with a delay or dead-lettered
//!   with a reason, and requeued when not settled within the ack timeout.
//! - [`peek_dead_letters`] reads a group's dead queue.
//!
//! Both reconnect by themselves after the broker restarts or the network fails (lapin
//! does not), with the [`RabbitOptions::reconnect`] backoff. lapin's own automatic
//! recovery is not used: it resumes channels under their old delivery tags, where a
//! late ack of a delivery from before the failure would close the channel.
//!
//! On a cluster, [`RabbitOptions::node`] names its other nodes: each connection tries
//! them in turn, and a publisher or subscriber whose node dies reconnects to another.
//! The group queues are quorum queues declared with RabbitMQ's default replica count
//! (with RabbitMQ 3.x, every node of the cluster when the queue is declared): a
//! confirmed message is on a majority of them, and the queue goes on under a new leader
//! when a minority of its nodes dies. Publishes under way when a node or the leader dies
//! fail transiently even if the broker kept them, so a relay publishes them again: the
//! consumers' deduplication (an inbox) takes the copies out. `oncebox-bench chaos` runs
//! this on a local three-node cluster (`scripts/services.sh rabbitmq-cluster`), killing
//! the node that holds the payment queue's leader.
//!
//! | this crate | [`Capabilities`](https://docs.rs/oncebox-testkit) in the conformance suite |
//! |---|---|
//! | per-key order | yes: one queue, one channel per publisher |
//! | consumer groups | yes: a queue per group, its members share it |
//! | delivery count | yes with quorum queues (`x-delivery-count`) |
//! | nack delay | yes, kept by the subscriber (the delivery is held, then requeued) |
//! | dead letters with reasons | yes: a group's dead queue, [`peek_dead_letters`] |
//! | restart | yes: quorum queues and persistent messages survive it |
//! | retained log | no: a group's queue receives the messages published after it was bound |
//!
//! ```no_run
//! use oncebox_core::{Delivery, Message, Publisher, Subscriber};
//! use oncebox_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSubscriber};
//!
//! # async fn run() -> oncebox_core::Result<()> {
//! let options = RabbitOptions::new("amqp://guest:guest@127.0.0.1:5672/%2f").exchange("shop");
//! // The group's queue must exist before publishing, or the publish is unroutable.
//! let mut payments = RabbitSubscriber::connect(&options, "orders", "payments").await?;
//! let publisher = RabbitPublisher::connect(&options).await?;
//! publisher.publish(&Message::new("orders", "order 42").with_key("order-42")).await?;
//! let delivery = payments.next().await?;
//! assert_eq!(&delivery.received().payload[..], b"order 42");
//! delivery.ack().await?;
//! # Ok(()) }
//! ```
//!
//! Errors are [`oncebox_core::Error::Transport`], transient or permanent as each
//! method documents, with a [`RabbitError`] as their source.
//!
#![doc = include_str!("docs/wire.md")]

mod codec;
mod confirm;
mod connection;
mod dead_letters;
mod delivery;
mod error;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod options;
mod publisher;
mod subscriber;

pub use codec::FOREIGN_ID_HEADER;
pub use connection::dead_queue_name;
pub use dead_letters::{
    DELIVERY_COUNT_AT_DEATH_HEADER, DeadLetter, EXCHANGE_HEADER, REASON_HEADER, TOPIC_HEADER,
    peek_dead_letters,
};
pub use delivery::RabbitDelivery;
pub use error::RabbitError;
pub use options::{
    DEFAULT_EXCHANGE, DEFAULT_MAX_MESSAGE_SIZE, ExchangeKind, QueueType, RabbitOptions,
};
pub use publisher::RabbitPublisher;
pub use subscriber::RabbitSubscriber;

/// The environment variable oncebox's tools and tests read the broker URL from.
pub const URL_ENV: &str = "ONCEBOX_AMQP_URL";

/// The URL of a local RabbitMQ with its default user: what the tools use without
/// [`URL_ENV`].
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Re-exported so that callers (and the benchmark) use the same client version.
pub use lapin;
