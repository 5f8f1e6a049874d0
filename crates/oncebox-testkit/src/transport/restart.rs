//! Broker restarts: nothing confirmed is lost, nothing in flight is forgotten.

use std::collections::HashSet;

use oncebox_core::{Delivery, Result};

use super::TransportHarness;
use super::check::{Check, skipped};

const BEFORE: usize = 5;
const AFTER: usize = 5;

/// Messages confirmed before a broker restart, messages published after it, and a
/// delivery in flight during it are all received afterwards, by the same subscriber.
///
/// Publishes 5 messages and takes one delivery without settling it; restarts the broker
/// (the delivery is lost with its connection); publishes 5 more, retrying while the
/// broker comes back; then receives until all 10 have arrived. Redeliveries are
/// expected and tolerated.
///
/// Skipped unless [`Capabilities::restart`](super::Capabilities::restart).
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If a confirmed message never arrives after the restart.
pub async fn survives_restart<H: TransportHarness>(harness: &H) -> Result<()> {
    if !harness.capabilities().restart {
        return skipped("survives_restart", "restart");
    }
    let check = Check::start(harness, "survives_restart").await?;
    let mut subscriber = check.subscribe("a").await?;
    let messages = check.messages(BEFORE + AFTER, 0);
    let mut sent = check.publish(&messages[..BEFORE]).await?;
    let in_flight = check
        .receive(
            &mut subscriber,
            check.patience(),
            "a message before the restart",
        )
        .await?;

    harness.restart().await?;
    drop(in_flight);
    sent.extend(check.publish(&messages[BEFORE..]).await?);

    let mut missing: HashSet<_> = sent.into_iter().collect();
    while !missing.is_empty() {
        let what = format!(
            "{} confirmed messages were lost in the restart",
            missing.len()
        );
        // The message in flight may only come back after its ack timeout.
        let delivery = check
            .receive(&mut subscriber, check.redelivery_wait(), &what)
            .await?;
        missing.remove(&check.id_of(&delivery));
        if let Err(error) = delivery.ack().await {
            // Redelivered later, which this loop tolerates.
            assert!(
                error.is_transient(),
                "[{}] ack after the restart failed for good: {error}",
                check.name
            );
        }
    }
    Ok(())
}
