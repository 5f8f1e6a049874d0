//! Publishing and receiving: confirmed messages arrive, with every field intact.

use std::collections::HashSet;
use std::time::Duration;

use oncebox_core::{Bytes, Delivery, Headers, Message, Result, TRACEPARENT};

use super::TransportHarness;
use super::check::Check;

/// Every message whose publish returned `Ok` (the broker's confirmation) is delivered.
///
/// Publishes 10 messages, then receives and acks until each has arrived (a redelivery
/// is tolerated, a message nobody published is not).
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// When a message is missing or unknown.
pub async fn publish_confirm_and_receive<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "publish_confirm_and_receive").await?;
    let mut subscriber = check.subscribe("a").await?;
    let sent = check.publish(&check.messages(10, 0)).await?;
    let mut missing: HashSet<_> = sent.iter().copied().collect();
    while !missing.is_empty() {
        let delivery = check
            .receive(
                &mut subscriber,
                check.patience(),
                &format!("{} confirmed messages never arrived", missing.len()),
            )
            .await?;
        let id = check.id_of(&delivery);
        assert!(
            sent.contains(&id),
            "[{}] received a message nobody published: {:?}",
            check.name,
            delivery.received()
        );
        missing.remove(&id);
        delivery.ack().await?;
    }
    Ok(())
}

/// The [`Received`](oncebox_core::Received) fields equal the published message's: id,
/// topic, key, kind, headers (exactly: the transport removes the ones it used to carry
/// the other fields), binary payload, creation time (to the second); the coordinates
/// name the topic; a first delivery counts 1. Also for a bare message: no key, no kind,
/// no headers, empty payload.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// On the first field that differs.
pub async fn received_fields_round_trip<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "received_fields_round_trip").await?;
    let mut subscriber = check.subscribe("a").await?;
    let full = Message::new(
        check.topic.clone(),
        Bytes::from_static(&[0, 0x9f, 0x92, 0x96, 0xff, b'\n', 0]),
    )
    .with_key("customer-7")
    .with_kind("OrderPlaced")
    .with_header(
        TRACEPARENT,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )?
    .with_header("x-tenant", "acme corp")?;
    let bare = Message::new(check.topic.clone(), Bytes::new());
    check.publish(&[full.clone(), bare.clone()]).await?;

    let mut pending = vec![full, bare];
    while !pending.is_empty() {
        let delivery = check
            .receive(
                &mut subscriber,
                check.patience(),
                "a published message never arrived",
            )
            .await?;
        let id = check.id_of(&delivery);
        let Some(index) = pending.iter().position(|m| m.id == id) else {
            // A redelivery of a message already checked.
            delivery.ack().await?;
            continue;
        };
        assert_same(&check, &pending.swap_remove(index), &delivery);
        delivery.ack().await?;
    }
    Ok(())
}

fn assert_same<H: TransportHarness>(
    check: &Check<'_, H>,
    sent: &Message,
    delivery: &super::check::DeliveryOf<H>,
) {
    let got = delivery.received();
    let name = check.name;
    assert_eq!(got.topic, sent.topic, "[{name}] topic");
    assert_eq!(got.key, sent.key, "[{name}] key");
    assert_eq!(got.kind, sent.kind, "[{name}] kind");
    assert_eq!(got.payload, sent.payload, "[{name}] payload");
    assert_eq!(
        names_and_values(&got.headers),
        names_and_values(&sent.headers),
        "[{name}] headers"
    );
    assert_eq!(
        got.coordinates.source, sent.topic,
        "[{name}] coordinates.source should name the topic"
    );
    if let Some(created_at) = got.created_at {
        let skew = match created_at.duration_since(sent.created_at) {
            Ok(later) => later,
            Err(earlier) => earlier.duration(),
        };
        assert!(
            skew < Duration::from_secs(1),
            "[{name}] created_at {created_at:?} is {skew:?} off the published {:?}",
            sent.created_at
        );
    }
    if check.harness.capabilities().delivery_count {
        assert_eq!(
            got.delivery_count, 1,
            "[{name}] delivery_count of a first delivery"
        );
    } else {
        assert!(
            got.delivery_count >= 1,
            "[{name}] delivery_count is at least 1"
        );
    }
}

/// Headers as comparable pairs (`Headers`' `Debug` hides values).
fn names_and_values(headers: &Headers) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}
