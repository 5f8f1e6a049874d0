//! The transport conformance suite: what every [`Publisher`], [`Subscriber`] and
//! [`Delivery`](oncebox_core::Delivery) implementation does, checked against the real
//! broker.
//!
//! A transport crate implements [`TransportHarness`] and calls each check from its own
//! test (or all of them with [`run_all`]):
//!
//! ```ignore
//! #[tokio::test]
//! async fn transport_per_key_order() -> oncebox_core::Result<()> {
//!     oncebox_testkit::transport::per_key_order(&JetStreamHarness::connect().await).await
//! }
//! ```
//!
//! Each check works on a topic of its own ([`TransportHarness::fresh_topic`]) with group
//! names derived from it, so checks may run in parallel on one broker. Waits are short
//! and bounded: a broken transport fails a check within its
//! [`TransportHarness::patience`] (plus the ack timeout where a redelivery is awaited)
//! instead of hanging. Checks fail by panicking with `[check name]` and the rule broken;
//! a transport error that is not transient is returned. A check needing a capability the
//! harness does not declare prints that it is skipped and returns `Ok`.
//!
//! | check | proves | needs |
//! |---|---|---|
//! | [`publish_confirm_and_receive`] | every confirmed message is delivered | |
//! | [`received_fields_round_trip`] | id, topic, key, kind, headers, binary payload, time, coordinates survive the wire | |
//! | [`ack_stops_redelivery`] | an acked message never comes back | |
//! | [`nack_redelivers_after_delay`] | a nacked message comes back, not before its delay, well before the ack timeout | (`nack_delay` for the lower bound) |
//! | [`unacked_delivery_redelivered_after_timeout`] | a held delivery is not redelivered early; a dropped one comes back after the ack timeout | |
//! | [`late_ack_is_harmless`] | acking after the ack timeout (the message was redelivered) does no harm | |
//! | [`dead_letter_stops_delivery`] | a dead letter never comes back, the next message flows, the reason is kept | (`dead_letter_inspection` for the reason) |
//! | [`per_key_order`] | 200 messages on 10 keys, published concurrently across keys, arrive in order per key | `per_key_order` |
//! | [`consumer_settles_by_fault`] | a consumer dead-letters a permanent failure at once and a transient one after the attempt limit, holds a delivery through an outage of its store without spending attempts, and survives a panicking handler | (`delivery_count` for the attempt count) |
//! | [`groups_share_work`] | members of a group share its messages, exactly once each; every group gets all | `consumer_groups` |
//! | [`late_group_receives_history`] | a group created after publishing still gets the messages | `retained_log` |
//! | [`survives_restart`] | messages confirmed before and after a restart, and one in flight, all arrive | `restart` |

mod basics;
mod capabilities;
mod check;
mod consumer;
mod groups;
mod ordering;
mod restart;
mod settling;

use std::future::Future;
use std::time::Duration;

use oncebox_core::{Error, Publisher, Received, Result, Subscriber};

pub use basics::{publish_confirm_and_receive, received_fields_round_trip};
pub use capabilities::Capabilities;
pub use consumer::consumer_settles_by_fault;
pub use groups::{groups_share_work, late_group_receives_history};
pub use ordering::per_key_order;
pub use restart::survives_restart;
pub use settling::{
    ack_stops_redelivery, dead_letter_stops_delivery, late_ack_is_harmless,
    nack_redelivers_after_delay, unacked_delivery_redelivered_after_timeout,
};

/// How a transport crate gives the suite its publisher and subscribers.
///
/// The broker is configured by the harness, above all its ack timeout: keep it short
/// (a few hundred milliseconds) so that the checks awaiting redeliveries run fast.
pub trait TransportHarness: Send + Sync {
    /// The publisher under test.
    type Publisher: Publisher;
    /// The subscriber under test.
    type Subscriber: Subscriber;

    /// What the transport can do beyond the common contract; checks needing more are
    /// skipped.
    fn capabilities(&self) -> Capabilities;

    /// The ack timeout the broker was configured with: how long after a delivery an
    /// unsettled message is redelivered.
    fn ack_timeout(&self) -> Duration;

    /// The longest anything that should happen promptly (a delivery of a published
    /// message, a publish while the broker restarts) may take. Default: 5 seconds.
    fn patience(&self) -> Duration {
        Duration::from_secs(5)
    }

    /// A topic no other check uses, created if the broker needs that (a stream, a Kafka
    /// topic, a queue binding). `label` names the check, for humans reading the broker.
    ///
    /// # Errors
    ///
    /// When the topic cannot be created.
    fn fresh_topic(&self, label: &str) -> impl Future<Output = Result<String>> + Send;

    /// A publisher. May be called several times.
    ///
    /// # Errors
    ///
    /// When the broker cannot be reached.
    fn publisher(&self) -> impl Future<Output = Result<Self::Publisher>> + Send;

    /// A member of consumer group `group` on `topic`, ready when it returns: a message
    /// published afterwards must reach it (or another member of its group).
    ///
    /// # Errors
    ///
    /// When the broker cannot be reached or refuses the subscription.
    fn subscriber(
        &self,
        topic: &str,
        group: &str,
    ) -> impl Future<Output = Result<Self::Subscriber>> + Send;

    /// The dead letters of `topic` with their reasons. Called only if
    /// [`Capabilities::dead_letter_inspection`]; the default refuses.
    ///
    /// # Errors
    ///
    /// When the dead-letter destination cannot be read.
    fn dead_letters(
        &self,
        topic: &str,
    ) -> impl Future<Output = Result<Vec<(Received, String)>>> + Send {
        let _ = topic;
        std::future::ready(Err(Error::transport_permanent(
            "this harness cannot read dead letters",
        )))
    }

    /// Restarts the broker (or cuts every connection to it) and returns once it accepts
    /// connections again; clients may still be reconnecting. Called only if
    /// [`Capabilities::restart`]; the default refuses.
    ///
    /// # Errors
    ///
    /// When the restart fails.
    fn restart(&self) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(Error::transport_permanent(
            "this harness cannot restart its broker",
        )))
    }
}

/// Runs every check, one after the other, skipping those the harness's capabilities
/// rule out.
///
/// # Errors
///
/// The first check's error.
///
/// # Panics
///
/// On the first check that fails.
pub async fn run_all<H: TransportHarness>(harness: &H) -> Result<()> {
    publish_confirm_and_receive(harness).await?;
    received_fields_round_trip(harness).await?;
    ack_stops_redelivery(harness).await?;
    nack_redelivers_after_delay(harness).await?;
    unacked_delivery_redelivered_after_timeout(harness).await?;
    late_ack_is_harmless(harness).await?;
    dead_letter_stops_delivery(harness).await?;
    per_key_order(harness).await?;
    consumer_settles_by_fault(harness).await?;
    groups_share_work(harness).await?;
    late_group_receives_history(harness).await?;
    survives_restart(harness).await
}
