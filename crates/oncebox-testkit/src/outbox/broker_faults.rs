//! The relay against a broker that misbehaves: slower than the lease, down for a while,
//! slow at a stop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::Relay;
use oncebox_core::{Backoff, Error, Message, Publisher, Result};
use tokio::time::Instant;

use super::relay::{relay_options, run_relays_until};
use super::{OutboxHarness, RowStatus, STEP, TOPIC, assert_state, label, message, state};
use crate::support::{ok, within};

/// A publisher that takes `delay` per message and records, per key, which relay has a
/// publish in flight, and every moment two relays had one for the same key.
struct SlowTracking {
    inner: oncebox_core::memory::MemoryPublisher,
    relay: usize,
    delay: Duration,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    overlaps: Arc<Mutex<Vec<String>>>,
}

/// Takes the key off the in-flight map when its publish ends or is dropped.
struct Publishing<'a> {
    tracking: &'a SlowTracking,
    key: String,
}

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        let mut in_flight = self
            .tracking
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if in_flight.get(&self.key) == Some(&self.tracking.relay) {
            in_flight.remove(&self.key);
        }
    }
}

impl Publisher for SlowTracking {
    async fn publish(&self, message: &Message) -> Result<()> {
        let key = message.key.clone().unwrap_or_default();
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(other) = in_flight.insert(key.clone(), self.relay)
                && other != self.relay
            {
                self.overlaps
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{key}: relays {other} and {} at once", self.relay));
            }
        }
        let _publishing = Publishing {
            tracking: self,
            key,
        };
        tokio::time::sleep(self.delay).await;
        self.inner.publish(message).await
    }
}

/// Two relays over a broker so slow that one key's batch takes several leases to
/// publish: the relay holding the key renews its lease while it publishes, so the other
/// never claims the key meanwhile. No key is ever in flight on both relays, every
/// message is published, each key's messages in commit order, none twice.
pub async fn slow_broker_past_the_lease_never_overlaps<H: OutboxHarness>(harness: &H) {
    const KEYS: usize = 3;
    const PER_KEY: usize = 6;
    let lease = Duration::from_secs(1);
    let mut messages = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            messages.push(message(
                Some(&format!("slow-{k}")),
                &format!("slow-{k}/{i}"),
            ));
        }
    }
    ok("enqueue", harness.enqueue(&messages).await);
    let broker = MemoryBroker::new();
    let in_flight = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let relays: Vec<_> = (0..2)
        .map(|relay| {
            let publisher = SlowTracking {
                inner: broker.publisher(),
                relay,
                // Each key's six messages take 2.4 s: more than two leases.
                delay: lease * 2 / 5,
                in_flight: Arc::clone(&in_flight),
                overlaps: Arc::clone(&overlaps),
            };
            let options = relay_options(&format!("slow-relay-{relay}"))
                .lease(lease)
                .dispatch_timeout(lease / 2);
            ok("relay", Relay::new(harness.store(), publisher, options))
        })
        .collect();
    let total = messages.len();
    run_relays_until(
        "two relays over a slow broker",
        &relays,
        Duration::from_secs(30),
        || broker.published(TOPIC).len() >= total,
    )
    .await;
    let overlaps = overlaps
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(
        overlaps.is_empty(),
        "a key was in flight on two relays (a lease ended in the middle of a batch): {overlaps:?}"
    );
    let published: Vec<String> = broker.published(TOPIC).iter().map(label).collect();
    assert_eq!(
        published.len(),
        total,
        "published twice or lost: {published:?}"
    );
    for k in 0..KEYS {
        let prefix = format!("slow-{k}/");
        let order: Vec<&String> = published
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .collect();
        let expected: Vec<String> = (0..PER_KEY).map(|i| format!("{prefix}{i}")).collect();
        assert_eq!(
            order,
            expected.iter().collect::<Vec<_>>(),
            "key slow-{k} out of commit order"
        );
    }
}

/// A publisher whose broker is down for its first `down` calls (an outage: the
/// connection is refused), then up.
struct DownThenUp {
    inner: oncebox_core::memory::MemoryPublisher,
    down: std::sync::atomic::AtomicUsize,
}

impl Publisher for DownThenUp {
    async fn publish(&self, message: &Message) -> Result<()> {
        let down = self
            .down
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |left| left.checked_sub(1),
            )
            .is_ok();
        if down {
            return Err(Error::transport_outage("connection refused"));
        }
        self.inner.publish(message).await
    }
}

/// A broker outage spends no attempt: with an attempt limit of 2, a broker down for ten
/// publishes dead-letters nothing, and once it is back every message is published, in
/// commit order per key, with no attempt counted.
pub async fn broker_outage_spends_no_attempts<H: OutboxHarness>(harness: &H) {
    let messages: Vec<Message> = (0..4)
        .map(|i| message(Some("outage"), &format!("outage/{i}")))
        .collect();
    ok("enqueue", harness.enqueue(&messages).await);
    let broker = MemoryBroker::new();
    let publisher = DownThenUp {
        inner: broker.publisher(),
        down: std::sync::atomic::AtomicUsize::new(10),
    };
    let backoff = Backoff::new()
        .initial(Duration::from_millis(10))
        .max(Duration::from_millis(40))
        .jitter(0.0);
    let options = relay_options("outage").max_attempts(2).backoff(backoff);
    let relay = ok("relay", Relay::new(harness.store(), publisher, options));
    run_relays_until(
        "a relay through a broker outage",
        std::slice::from_ref(&relay),
        Duration::from_secs(15),
        || broker.published(TOPIC).len() >= messages.len(),
    )
    .await;
    let published: Vec<String> = broker.published(TOPIC).iter().map(label).collect();
    let expected: Vec<String> = messages.iter().map(label).collect();
    assert_eq!(published, expected, "published in commit order, each once");
    for m in &messages {
        let row = state(harness, m).await;
        assert_eq!(row.status, RowStatus::Done, "{}: not published", label(m));
        assert_eq!(row.attempts, 0, "{}: the outage spent attempts", label(m));
    }
}

/// A publisher that takes `delay` per message and counts the publishes it started.
struct Slow {
    inner: oncebox_core::memory::MemoryPublisher,
    delay: Duration,
    started: Arc<std::sync::atomic::AtomicUsize>,
}

impl Publisher for Slow {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.inner.publish(message).await
    }
}

/// A relay told to stop while it publishes one key's batch of ten rows, each taking
/// 300 ms, finishes the publish under way and hands the other rows back unattempted: it
/// stops in about one publish, not ten, the rows it did not start are pending with no
/// attempt counted and due at once (a second relay publishes them without waiting for a
/// lease), and nothing is published twice.
pub async fn stop_hands_back_unstarted_rows<H: OutboxHarness>(harness: &H) {
    const ROWS: usize = 10;
    let delay = Duration::from_millis(300);
    let messages: Vec<Message> = (0..ROWS)
        .map(|i| message(Some("stopping"), &format!("stopping/{i}")))
        .collect();
    ok("enqueue", harness.enqueue(&messages).await);
    let broker = MemoryBroker::new();
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let slow = Slow {
        inner: broker.publisher(),
        delay,
        started: Arc::clone(&started),
    };
    let options = relay_options("stopping-relay").batch_size(ROWS);
    let relay = ok("relay", Relay::new(harness.store(), slow, options));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = relay.run_until(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    let stopper = async {
        while started.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let at = Instant::now();
        let _ = stop.send(true);
        at
    };
    let (ended, asked) = within("a stopping relay", STEP, async {
        tokio::join!(run, stopper)
    })
    .await;
    ok("the relay's run", ended);
    let took = asked.elapsed();
    let published = broker.published(TOPIC).len();
    assert!(
        took < delay * 3,
        "the stop took {took:?}: rows not yet started were published instead of handed back"
    );
    assert!(
        (1..=2).contains(&published),
        "published {published} of {ROWS} rows while stopping: the publish under way only"
    );
    for (i, message) in messages.iter().enumerate() {
        let step = format!("row {i} after the stop");
        let expected = if i < published {
            RowStatus::Done
        } else {
            RowStatus::Pending
        };
        assert_state(&step, &state(harness, message).await, expected, 0);
    }

    // The rows handed back are not leased: another relay publishes them at once.
    let fast = ok(
        "a second relay",
        Relay::new(
            harness.store(),
            broker.publisher(),
            relay_options("after-stop"),
        ),
    );
    let drained = ok("drain", within("drain", STEP, fast.drain()).await);
    assert_eq!(drained.done, ROWS - published, "{drained:?}");
    let labels: Vec<String> = broker.published(TOPIC).iter().map(label).collect();
    let expected: Vec<String> = (0..ROWS).map(|i| format!("stopping/{i}")).collect();
    assert_eq!(labels, expected, "each row once, in order");
}

/// A batch claimed ahead waits while the batch before it is published; if that takes
/// longer than the lease, the waiting batch's lease ends unrenewed and another relay may
/// claim its rows. When its turn comes, the first relay must hand it back, not publish
/// it: here relay 1 publishes a full batch of key `slow` for 1.8 s (a 1 s lease, renewed)
/// while the batch of key `ahead` it claimed beside it waits; relay 2 starts after that
/// lease ended and publishes the `ahead` rows. No key is ever in flight on both relays,
/// and every row is published once.
pub async fn claimed_ahead_batch_past_its_lease_is_handed_back<H: OutboxHarness>(harness: &H) {
    let lease = Duration::from_secs(1);
    let messages = vec![
        message(Some("slow"), "slow/0"),
        message(Some("slow"), "slow/1"),
        message(Some("ahead"), "ahead/0"),
        message(Some("ahead"), "ahead/1"),
    ];
    ok("enqueue", harness.enqueue(&messages).await);
    let broker = MemoryBroker::new();
    let in_flight = Arc::default();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let relay = |relay: usize, delay: Duration| {
        let publisher = SlowTracking {
            inner: broker.publisher(),
            relay,
            delay,
            in_flight: Arc::clone(&in_flight),
            overlaps: Arc::clone(&overlaps),
        };
        let options = relay_options(&format!("ahead-relay-{relay}"))
            .batch_size(2)
            .lease(lease)
            // Longer than a publish (900 ms), shorter than the lease.
            .dispatch_timeout(Duration::from_millis(950))
            .poll_interval(Duration::from_millis(5), Duration::from_millis(20));
        ok("relay", Relay::new(harness.store(), publisher, options))
    };
    let first = relay(1, Duration::from_millis(900));
    let second = relay(2, Duration::from_millis(600));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let runs = async {
        let second_run = async {
            // After the `ahead` batch's lease (claimed at the start) has ended.
            tokio::time::sleep(lease + Duration::from_millis(100)).await;
            second.run_until(until_stopped(stopped.clone())).await
        };
        tokio::join!(first.run_until(until_stopped(stopped.clone())), second_run)
    };
    let watcher = async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while broker.published(TOPIC).len() < messages.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let a relay that would publish a row twice do so before stopping.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = stop.send(true);
    };
    let ((first_run, second_run), ()) = within(
        "relays with a batch claimed ahead",
        Duration::from_secs(40),
        async { tokio::join!(runs, watcher) },
    )
    .await;
    ok("relay 1", first_run);
    ok("relay 2", second_run);
    let overlaps = overlaps
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(
        overlaps.is_empty(),
        "a batch claimed ahead was published after its lease ended, beside the relay that \
         took its rows over: {overlaps:?}"
    );
    let mut published: Vec<String> = broker.published(TOPIC).iter().map(label).collect();
    published.sort();
    assert_eq!(
        published,
        ["ahead/0", "ahead/1", "slow/0", "slow/1"],
        "each row published once"
    );
}
