//! Per-key order: what the relay's ordering guarantee relies on.

use std::collections::HashMap;

use futures_util::future::try_join_all;
use oncebox_core::{Delivery, Message, MessageId, Result};

use super::TransportHarness;
use super::check::{Check, skipped};

const MESSAGES: usize = 200;
const KEYS: usize = 10;

/// One subscriber receives the messages of each key in publish order.
///
/// Publishes 200 messages on 10 keys the way the relay does: concurrently across keys,
/// one after the other within a key. Receives and acks all 200 with one subscriber;
/// for every key the ids must come in publish order, without gaps or repeats.
///
/// Skipped unless [`Capabilities::per_key_order`](super::Capabilities::per_key_order).
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// At the first key whose order differs, naming the position.
pub async fn per_key_order<H: TransportHarness>(harness: &H) -> Result<()> {
    if !harness.capabilities().per_key_order {
        return skipped("per_key_order", "per_key_order");
    }
    let check = Check::start(harness, "per_key_order").await?;
    let mut subscriber = check.subscribe("a").await?;
    let messages = check.messages(MESSAGES, KEYS);
    let mut by_key: HashMap<String, Vec<Message>> = HashMap::new();
    for message in messages {
        by_key
            .entry(message.key.clone().unwrap_or_default())
            .or_default()
            .push(message);
    }
    let lanes: Vec<(String, Vec<Message>)> = by_key.into_iter().collect();
    let ids = try_join_all(lanes.iter().map(|(_, lane)| check.publish(lane))).await?;
    let published: Vec<(&String, Vec<MessageId>)> =
        lanes.iter().map(|(key, _)| key).zip(ids).collect();

    let mut received: HashMap<String, Vec<MessageId>> = HashMap::new();
    for count in 0..MESSAGES {
        let what = format!("only {count} of {MESSAGES} messages arrived");
        let delivery = check
            .receive(&mut subscriber, check.patience(), &what)
            .await?;
        let key = delivery.received().key.clone().unwrap_or_default();
        received
            .entry(key)
            .or_default()
            .push(check.id_of(&delivery));
        delivery.ack().await?;
    }

    for (key, expected) in &published {
        let got = received
            .get(key.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some(at) =
            (0..expected.len().max(got.len())).find(|&i| expected.get(i) != got.get(i))
        {
            panic!(
                "[{}] key {key}: message {at} of {} differs: published {:?}, received {:?} ({} received for this key)",
                check.name,
                expected.len(),
                expected.get(at),
                got.get(at),
                got.len(),
            );
        }
    }
    Ok(())
}
