//! Settling deliveries: ack, nack, the ack timeout, late acks, dead letters.

use std::time::Duration;

use oncebox_core::{Delivery, Result};
use tokio::time::{Instant, sleep};

use super::TransportHarness;
use super::check::{Check, skipped};

/// An acked message is not delivered again, not even after the ack timeout.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If the message does not arrive, or arrives again after its ack.
pub async fn ack_stops_redelivery<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "ack_stops_redelivery").await?;
    let mut subscriber = check.subscribe("a").await?;
    check.publish(&check.messages(1, 0)).await?;
    let delivery = check
        .receive(&mut subscriber, check.patience(), "the published message")
        .await?;
    delivery.ack().await?;
    check
        .expect_nothing(
            &mut subscriber,
            check.quiet_period(),
            "an acked message was delivered again",
        )
        .await
}

/// A nacked message comes back: after the nack's delay if the transport honours delays
/// ([`Capabilities::nack_delay`](super::Capabilities::nack_delay)), and in any case
/// sooner than the ack timeout (a nack that is silently ignored fails this check).
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If the redelivery is missing, early, or only comes with the ack timeout.
pub async fn nack_redelivers_after_delay<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "nack_redelivers_after_delay").await?;
    let mut subscriber = check.subscribe("a").await?;
    let sent = check.publish(&check.messages(1, 0)).await?;
    let first = check
        .receive(&mut subscriber, check.patience(), "the published message")
        .await?;
    let delay = check.ack_timeout() / 3;
    first.nack(delay).await?;
    let nacked = Instant::now();

    let again = check
        .receive(
            &mut subscriber,
            check.redelivery_wait(),
            "the nacked message was not redelivered",
        )
        .await?;
    let after = nacked.elapsed();
    let name = check.name;
    assert_eq!(
        check.id_of(&again),
        sent[0],
        "[{name}] expected the nacked message again"
    );
    check.assert_redelivery_count(&again);
    if harness.capabilities().nack_delay {
        // A tenth of slack for brokers whose timers round.
        assert!(
            after + delay / 10 >= delay,
            "[{name}] redelivered {after:?} after a nack asking for {delay:?}"
        );
    }
    // Halfway between the delay and the ack timeout: an ignored nack comes back with the
    // timeout, measured from the delivery, just before a full ack timeout after the nack.
    let limit = delay + (check.ack_timeout() - delay) / 2;
    assert!(
        after < limit,
        "[{name}] the nack was ignored or late: redelivered {after:?} after it, asking for {delay:?}"
    );
    again.ack().await
}

/// A delivery that is never settled (the consumer died) is not redelivered while it is
/// held within the ack timeout, and is redelivered once the consumer drops it and the
/// timeout passes.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If the message is redelivered while held, or not redelivered after being dropped.
pub async fn unacked_delivery_redelivered_after_timeout<H: TransportHarness>(
    harness: &H,
) -> Result<()> {
    let check = Check::start(harness, "unacked_delivery_redelivered_after_timeout").await?;
    let mut subscriber = check.subscribe("a").await?;
    let sent = check.publish(&check.messages(1, 0)).await?;
    let held = check
        .receive(&mut subscriber, check.patience(), "the published message")
        .await?;
    let within_timeout = check.ack_timeout() / 2;
    check
        .expect_nothing(
            &mut subscriber,
            within_timeout,
            "redelivered while still within its ack timeout",
        )
        .await?;
    drop(held);

    let again = check
        .receive(
            &mut subscriber,
            check.redelivery_wait(),
            "a delivery dropped unsettled was not redelivered",
        )
        .await?;
    assert_eq!(
        check.id_of(&again),
        sent[0],
        "[{}] expected the dropped message again",
        check.name
    );
    check.assert_redelivery_count(&again);
    again.ack().await
}

/// Settling a delivery late, once its ack timeout passed and the message was delivered
/// again, is harmless: that ack succeeds or fails transiently, the redelivery can be
/// acked, and the message then stops coming.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If the late ack fails permanently, or the message keeps coming.
pub async fn late_ack_is_harmless<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "late_ack_is_harmless").await?;
    let mut subscriber = check.subscribe("a").await?;
    let sent = check.publish(&check.messages(1, 0)).await?;
    let late = check
        .receive(&mut subscriber, check.patience(), "the published message")
        .await?;
    let again = check
        .receive(
            &mut subscriber,
            check.redelivery_wait(),
            "not redelivered after the ack timeout",
        )
        .await?;
    assert_eq!(
        check.id_of(&again),
        sent[0],
        "[{}] expected the same message again",
        check.name
    );

    if let Err(error) = late.ack().await {
        assert!(
            error.is_transient(),
            "[{}] acking a delivery after its ack timeout failed for good: {error}",
            check.name
        );
    }
    again.ack().await?;
    check
        .expect_nothing(
            &mut subscriber,
            check.quiet_period(),
            "delivered again after both deliveries were acked",
        )
        .await
}

/// A dead-lettered message is never delivered again, the subscription goes on with the
/// next message, and, if the harness can inspect dead letters, the message is there with
/// the reason given.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If the message comes back, the next one does not arrive, or the dead letter is
/// missing or lacks the reason.
pub async fn dead_letter_stops_delivery<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "dead_letter_stops_delivery").await?;
    let name = check.name;
    let mut subscriber = check.subscribe("a").await?;
    let sent = check.publish(&check.messages(2, 0)).await?;
    let poison = check
        .receive(&mut subscriber, check.patience(), "the first message")
        .await?;
    assert_eq!(
        check.id_of(&poison),
        sent[0],
        "[{name}] expected the first message first"
    );
    let reason = "conformance: payment refused";
    poison.dead_letter(reason).await?;

    let next = check
        .receive(
            &mut subscriber,
            check.patience(),
            "the message after a dead letter",
        )
        .await?;
    assert_eq!(
        check.id_of(&next),
        sent[1],
        "[{name}] the dead-lettered message came back"
    );
    next.ack().await?;
    check
        .expect_nothing(
            &mut subscriber,
            check.quiet_period(),
            "a dead-lettered message was delivered again",
        )
        .await?;

    if !harness.capabilities().dead_letter_inspection {
        return skipped(
            "dead_letter_stops_delivery (inspection part)",
            "dead_letter_inspection",
        );
    }
    // Some brokers move dead letters asynchronously (RabbitMQ dead-letter exchanges).
    let deadline = Instant::now() + check.patience();
    loop {
        let dead = harness.dead_letters(&check.topic).await?;
        if let Some((_, got)) = dead
            .iter()
            .find(|(received, _)| received.id == Some(sent[0]))
        {
            assert!(
                got.contains(reason),
                "[{name}] dead letter reason {got:?} does not contain {reason:?}"
            );
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "[{name}] the message is not among the dead letters of {}: {dead:?}",
            check.topic
        );
        sleep(Duration::from_millis(50)).await;
    }
}
