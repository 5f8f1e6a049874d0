//! The broker's behaviours, faults included, on a paused clock.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::*;
use crate::{Delivery, MessageId, Publisher, Subscriber};

const ACK_TIMEOUT: Duration = Duration::from_secs(10);

fn broker() -> MemoryBroker {
    MemoryBroker::with_ack_timeout(ACK_TIMEOUT)
}

async fn publish(broker: &MemoryBroker, topic: &str, count: usize) -> Vec<MessageId> {
    let publisher = broker.publisher();
    let mut ids = Vec::new();
    for i in 0..count {
        let message = Message::new(topic, i.to_string()).with_key(format!("k{}", i % 3));
        publisher.publish(&message).await.unwrap();
        ids.push(message.id);
    }
    ids
}

/// The next delivery within `wait`, or `None`.
async fn within(sub: &mut MemorySubscriber, wait: Duration) -> Option<MemoryDelivery> {
    timeout(wait, sub.next())
        .await
        .ok()
        .map(|next| next.unwrap())
}

async fn take(sub: &mut MemorySubscriber) -> MemoryDelivery {
    within(sub, 3 * ACK_TIMEOUT).await.expect("a delivery")
}

fn id(delivery: &MemoryDelivery) -> MessageId {
    delivery.received().id.unwrap()
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<MemoryBroker>();
    send_sync::<MemoryPublisher>();
    send_sync::<MemoryDelivery>();
    send::<MemorySubscriber>();
}

#[tokio::test(start_paused = true)]
async fn one_subscriber_receives_in_publish_order_with_coordinates() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 50).await;
    for (i, expected) in ids.iter().enumerate() {
        let delivery = take(&mut sub).await;
        let received = delivery.received();
        assert_eq!(received.id, Some(*expected));
        assert_eq!(received.delivery_count, 1);
        assert_eq!(
            received.coordinates,
            Coordinates {
                source: "orders".into(),
                partition: None,
                position: (i + 1).to_string()
            }
        );
        delivery.ack().await.unwrap();
    }
    assert!(within(&mut sub, 3 * ACK_TIMEOUT).await.is_none());
    let stats = broker.stats();
    assert_eq!(
        (
            stats.published,
            stats.delivered,
            stats.acked,
            stats.redelivered
        ),
        (50, 50, 50, 0)
    );
    assert_eq!(broker.unsettled("orders", "billing"), 0);
    assert_eq!(
        broker
            .published("orders")
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>(),
        ids
    );
}

#[tokio::test(start_paused = true)]
async fn each_group_gets_everything_even_when_created_late() {
    let broker = broker();
    let mut early = broker.subscribe("orders", "early");
    let ids = publish(&broker, "orders", 5).await;
    let mut late = broker.subscribe("orders", "late");
    assert_eq!(broker.unsettled("orders", "late"), 5);
    assert_eq!(broker.unsettled("orders", "not-yet"), 5);
    for sub in [&mut early, &mut late] {
        for expected in &ids {
            let delivery = take(sub).await;
            assert_eq!(id(&delivery), *expected);
            delivery.ack().await.unwrap();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn members_of_a_group_share_the_work() {
    let broker = broker();
    let mut a = broker.subscribe("orders", "billing");
    let mut b = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 2).await;
    let (first, second) = (take(&mut a).await, take(&mut b).await);
    assert_eq!([id(&first), id(&second)], [ids[0], ids[1]]);
    assert!(within(&mut a, ACK_TIMEOUT / 2).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn unsettled_delivery_comes_back_after_the_ack_timeout_and_late_settling_is_ignored() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    publish(&broker, "orders", 1).await;
    let started = Instant::now();
    let first = take(&mut sub).await;
    let second = take(&mut sub).await;
    assert_eq!(started.elapsed(), ACK_TIMEOUT);
    assert_eq!(
        (id(&first), second.received().delivery_count),
        (id(&second), 2)
    );
    first.ack().await.unwrap(); // stale: a no-op
    assert_eq!(broker.unsettled("orders", "billing"), 1);
    second.ack().await.unwrap();
    assert_eq!(broker.unsettled("orders", "billing"), 0);
    let stats = broker.stats();
    assert_eq!(
        (stats.redelivered, stats.acked, stats.stale_settlements),
        (1, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn nack_redelivers_after_its_delay() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    publish(&broker, "orders", 1).await;
    let delay = Duration::from_secs(2);
    take(&mut sub).await.nack(delay).await.unwrap();
    let nacked = Instant::now();
    let again = take(&mut sub).await;
    assert_eq!(nacked.elapsed(), delay);
    assert_eq!(again.received().delivery_count, 2);
    assert_eq!(broker.stats().nacked, 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_subscriber_wakes_for_a_nack_due_sooner() {
    let broker = broker();
    let mut a = broker.subscribe("orders", "billing");
    let mut b = broker.subscribe("orders", "billing");
    publish(&broker, "orders", 1).await;
    let delivery = take(&mut a).await;
    // b sleeps until the ack timeout; the nack must wake it for the shorter delay.
    let waiting = tokio::spawn(async move { (take(&mut b).await, Instant::now()) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    delivery.nack(Duration::ZERO).await.unwrap();
    let nacked = Instant::now();
    let (again, at) = waiting.await.unwrap();
    assert_eq!((again.received().delivery_count, at), (2, nacked));
}

#[tokio::test(start_paused = true)]
async fn dead_letters_are_kept_with_their_reason_and_never_delivered_again() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 2).await;
    take(&mut sub)
        .await
        .dead_letter("card declined")
        .await
        .unwrap();
    let next = take(&mut sub).await;
    assert_eq!(id(&next), ids[1]);
    next.ack().await.unwrap();
    assert!(within(&mut sub, 3 * ACK_TIMEOUT).await.is_none());
    let dead = broker.dead_letters("orders");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].0.id, dead[0].1.as_str()),
        (Some(ids[0]), "card declined")
    );
    assert_eq!(broker.stats().dead_lettered, 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_deliveries_come_back_and_nothing_is_lost() {
    let broker = broker();
    broker.set_seed(1);
    broker.set_faults(Faults {
        drop: 0.5,
        ..Faults::none()
    });
    let mut sub = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 40).await;
    let mut seen = HashSet::new();
    while seen.len() < ids.len() {
        let delivery = take(&mut sub).await;
        seen.insert(id(&delivery));
        delivery.ack().await.unwrap();
    }
    let stats = broker.stats();
    assert!(stats.dropped > 5, "{stats:?}");
    // Each dropped delivery came back (a message dropped twice comes back once).
    assert!(
        stats.redelivered > 0 && stats.redelivered <= stats.dropped,
        "{stats:?}"
    );
    assert_eq!(stats.acked, 40);
    assert_eq!(broker.unsettled("orders", "billing"), 0);
}

#[tokio::test(start_paused = true)]
async fn duplicates_are_separate_deliveries_settled_once() {
    let broker = broker();
    broker.set_faults(Faults {
        duplicate: 1.0,
        ..Faults::none()
    });
    let mut a = broker.subscribe("orders", "billing");
    let mut b = broker.subscribe("orders", "billing");
    publish(&broker, "orders", 1).await;
    let (first, copy) = (take(&mut a).await, take(&mut b).await);
    assert_eq!(id(&first), id(&copy));
    assert_eq!(
        (
            first.received().delivery_count,
            copy.received().delivery_count
        ),
        (1, 2)
    );
    first.ack().await.unwrap();
    copy.ack().await.unwrap();
    assert!(within(&mut a, 3 * ACK_TIMEOUT).await.is_none());
    let stats = broker.stats();
    assert_eq!(
        (
            stats.delivered,
            stats.duplicated,
            stats.acked,
            stats.stale_settlements
        ),
        (2, 1, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn delays_hold_deliveries_back_and_reorder_them() {
    let broker = broker();
    broker.set_seed(3);
    let max_delay = Duration::from_secs(1);
    broker.set_faults(Faults {
        delay: 1.0,
        max_delay,
        ..Faults::none()
    });
    let mut sub = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 20).await;
    let started = Instant::now();
    let mut order = Vec::new();
    for _ in 0..ids.len() {
        let delivery = take(&mut sub).await;
        assert_eq!(delivery.received().delivery_count, 1);
        order.push(id(&delivery));
        delivery.ack().await.unwrap();
    }
    assert!(started.elapsed() <= max_delay);
    assert_ne!(order, ids, "held-back deliveries should be overtaken");
    assert_eq!(order.iter().collect::<HashSet<_>>(), ids.iter().collect());
    assert_eq!(broker.stats().delayed, 20);
}

#[tokio::test(start_paused = true)]
async fn an_outage_fails_calls_transiently_and_loses_nothing() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    let ids = publish(&broker, "orders", 2).await;
    let in_flight = take(&mut sub).await;

    broker.set_down(true);
    let refused = broker
        .publisher()
        .publish(&Message::new("orders", "x"))
        .await
        .unwrap_err();
    assert!(refused.is_transient());
    assert!(within(&mut sub, 2 * ACK_TIMEOUT).await.is_none());
    assert!(in_flight.ack().await.unwrap_err().is_transient());
    broker.set_down(false);

    // The message that was waiting comes first, then the one in flight at the outage,
    // whose ack timeout passed meanwhile.
    let mut received = Vec::new();
    for _ in 0..2 {
        let delivery = take(&mut sub).await;
        received.push(id(&delivery));
        delivery.ack().await.unwrap();
    }
    assert_eq!(received, [ids[1], ids[0]]);
    assert_eq!(broker.published("orders").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_waiting_through_an_outage_receives_after_it() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    broker.set_down(true);
    let waiting = tokio::spawn(async move { take(&mut sub).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.set_down(false);
    let ids = publish(&broker, "orders", 1).await;
    assert_eq!(id(&waiting.await.unwrap()), ids[0]);
}

#[tokio::test(start_paused = true)]
async fn cancelling_next_loses_nothing() {
    let broker = broker();
    let mut sub = broker.subscribe("orders", "billing");
    for _ in 0..10 {
        assert!(within(&mut sub, Duration::from_millis(1)).await.is_none());
    }
    let ids = publish(&broker, "orders", 1).await;
    let delivery = take(&mut sub).await;
    assert_eq!(
        (id(&delivery), delivery.received().delivery_count),
        (ids[0], 1)
    );
}

#[tokio::test(start_paused = true)]
async fn refuses_invalid_messages_permanently() {
    let broker = broker();
    let too_big = Message::new("orders", vec![0u8; 2 * 1024 * 1024]);
    let refused = broker.publisher().publish(&too_big).await.unwrap_err();
    assert!(matches!(
        refused,
        Error::Transport {
            fault: crate::Fault::Permanent,
            ..
        }
    ));
    assert!(broker.published("orders").is_empty());
}
