//! The consumer loop over the in-process broker: what ends it, and what does not.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncebox_core::consumer::{
    Consumer, ConsumerOptions, IdempotentReceiver, Outcome, Process, handler_fn, process_delivery,
};
use oncebox_core::memory::{MemoryBroker, MemoryDedupStore};
use oncebox_core::{Error, Message, Publisher, Received, Result, Subscriber};

#[derive(serde::Deserialize)]
struct Order {
    #[allow(dead_code)]
    amount: u64,
}

async fn publish(broker: &MemoryBroker, topic: &str, payloads: &[&'static str]) {
    let publisher = broker.publisher();
    for payload in payloads {
        publisher
            .publish(&Message::new(topic, *payload).with_key(*payload))
            .await
            .expect("published");
    }
}

#[tokio::test]
async fn a_payload_that_does_not_decode_is_dead_lettered_as_permanent() {
    let broker = MemoryBroker::new();
    let runs = Arc::new(AtomicU32::new(0));
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::new(100),
        handler_fn({
            let runs = Arc::clone(&runs);
            move |msg: &Received| {
                runs.fetch_add(1, Ordering::SeqCst);
                let order = msg.payload_json::<Order>();
                async move {
                    order?;
                    Ok(())
                }
            }
        }),
        ConsumerOptions::new("payments"),
    )
    .expect("options");
    publish(&broker, "orders", &["not json"]).await;
    let delivery = broker
        .subscribe("orders", "payments")
        .next()
        .await
        .expect("delivered");
    let outcome = process_delivery(&receiver, delivery)
        .await
        .expect("settled");
    let Outcome::DeadLettered { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        reason.starts_with("permanent failure") && reason.contains("JSON"),
        "{reason}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a permanent failure was retried"
    );
}

/// Fails with [`Error::Closed`], as a store whose pool was closed does.
struct ClosedStore(ConsumerOptions);

impl Process for ClosedStore {
    fn options(&self) -> &ConsumerOptions {
        &self.0
    }

    async fn process(&self, _: &Received) -> Result<Outcome> {
        Err(Error::Closed)
    }
}

#[tokio::test]
async fn a_closed_store_ends_the_consumer_with_an_error_and_dead_letters_nothing() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    publish(&broker, "closed", &["a"]).await;
    let consumer = Consumer::new(
        broker.subscribe("closed", "c"),
        ClosedStore(ConsumerOptions::new("c")),
    );
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        consumer.run_until(std::future::pending()),
    )
    .await
    .expect("the consumer kept running with a closed store");
    assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    assert_eq!(broker.stats().dead_lettered, 0);
}

#[tokio::test]
async fn a_lane_lost_outside_the_handler_ends_the_consumer_with_an_error() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    publish(&broker, "lost", &["a", "b"]).await;
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::new(100),
        handler_fn(|_: &Received| async { Ok(()) }),
        ConsumerOptions::new("c"),
    )
    .expect("options");
    let consumer = Consumer::new(broker.subscribe("lost", "c"), receiver)
        .lanes(2)
        .on_outcome(|_, _| panic!("a bug in the observer"));
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        consumer.run_until(std::future::pending()),
    )
    .await
    .expect("the consumer kept running without a lane");
    assert!(
        matches!(&ended, Err(Error::TaskLost(what)) if what.contains("lane")),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_panicking_handler_is_a_failed_attempt_and_the_consumer_runs_on() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    publish(&broker, "panics", &["boom", "fine"]).await;
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::new(100),
        handler_fn(|msg: &Received| {
            let boom = msg.payload.as_ref() == b"boom";
            async move {
                assert!(!boom, "a bug in the handler");
                Ok(())
            }
        }),
        ConsumerOptions::new("c")
            .max_attempts(2)
            .backoff(oncebox_core::Backoff::new().initial(Duration::from_millis(10))),
    )
    .expect("options");
    let outcomes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = Arc::new(tokio::sync::Notify::new());
    let consumer = Consumer::new(broker.subscribe("panics", "c"), receiver)
        .lanes(1)
        .on_outcome({
            let (outcomes, done) = (Arc::clone(&outcomes), Arc::clone(&done));
            move |received: &Received, outcome: &Outcome| {
                let mut outcomes = outcomes.lock().expect("lock");
                outcomes.push((received.payload.clone(), outcome.clone()));
                if outcomes.len() == 3 {
                    done.notify_one();
                }
            }
        });
    tokio::time::timeout(Duration::from_secs(10), consumer.run_until(done.notified()))
        .await
        .expect("the consumer stopped settling")
        .expect("the consumer ended with an error");
    let outcomes = outcomes.lock().expect("lock").clone();
    let boom: Vec<_> = outcomes
        .iter()
        .filter(|(p, _)| p.as_ref() == b"boom")
        .collect();
    assert!(
        matches!(boom[0].1, Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(&boom[1].1, Outcome::DeadLettered { reason } if reason.contains("panicked")),
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|(p, o)| p.as_ref() == b"fine" && *o == Outcome::Handled),
        "{outcomes:?}"
    );
}

/// What a [`stop_test_receiver`] did: handler runs begun, effects per payload.
#[derive(Default)]
struct StopTestLog {
    runs: AtomicU32,
    effects: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

/// An idempotent receiver whose handler counts its run, waits `delay`, then records its
/// effect; `started` is told of every run.
fn stop_test_receiver(
    dedup: Arc<MemoryDedupStore>,
    log: Arc<StopTestLog>,
    delay: Duration,
    started: Arc<tokio::sync::Notify>,
) -> impl Process + 'static {
    IdempotentReceiver::new(
        dedup,
        handler_fn(move |msg: &Received| {
            let (log, started) = (Arc::clone(&log), Arc::clone(&started));
            let payload = String::from_utf8_lossy(&msg.payload).into_owned();
            async move {
                log.runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                tokio::time::sleep(delay).await;
                *log.effects
                    .lock()
                    .expect("lock")
                    .entry(payload)
                    .or_default() += 1;
                Ok(())
            }
        }),
        ConsumerOptions::new("stopping"),
    )
    .expect("options")
}

/// Collects a consumer's outcomes, calling `then` after each.
fn outcomes_of<Sub: Subscriber, P: Process + 'static>(
    consumer: Consumer<Sub, P>,
    then: impl Fn() + Send + Sync + 'static,
) -> (Consumer<Sub, P>, Arc<std::sync::Mutex<Vec<Outcome>>>) {
    let outcomes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&outcomes);
    let consumer = consumer.on_outcome(move |_, outcome| {
        seen.lock().expect("lock").push(outcome.clone());
        then();
    });
    (consumer, outcomes)
}

/// A stop while a slow handler runs and more deliveries wait behind it than its lane
/// queues (70): the running one finishes, no other starts, and the ones not started are
/// handed back at once (the broker's 30 s ack timeout would bring dropped ones back too
/// late for this test): the next run handles each of them once, and neither run counts
/// a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_hands_back_the_deliveries_not_started() {
    const MESSAGES: usize = 70;
    let broker = MemoryBroker::new();
    let publisher = broker.publisher();
    for i in 0..MESSAGES {
        publisher
            .publish(&Message::new("stopping", format!("m{i}")))
            .await
            .expect("published");
    }
    let dedup = Arc::new(MemoryDedupStore::new(1000));
    let log = Arc::new(StopTestLog::default());
    let started = Arc::new(tokio::sync::Notify::new());
    let slow = stop_test_receiver(
        Arc::clone(&dedup),
        Arc::clone(&log),
        Duration::from_millis(200),
        Arc::clone(&started),
    );
    let (consumer, first) = outcomes_of(
        Consumer::new(broker.subscribe("stopping", "stopping"), slow).lanes(1),
        || {},
    );
    tokio::time::timeout(
        Duration::from_secs(60),
        consumer.run_until(started.notified()),
    )
    .await
    .expect("the stop did not end")
    .expect("the consumer ended with an error");
    let runs = log.runs.load(Ordering::SeqCst);
    let first = first.lock().expect("lock").clone();
    assert_eq!(
        (runs, first.as_slice()),
        (1, [Outcome::Handled].as_slice()),
        "the running delivery finished and none started after the stop"
    );

    let done = Arc::new(tokio::sync::Notify::new());
    let quick = stop_test_receiver(
        Arc::clone(&dedup),
        Arc::clone(&log),
        Duration::ZERO,
        Arc::new(tokio::sync::Notify::new()),
    );
    let (consumer, second) = outcomes_of(
        Consumer::new(broker.subscribe("stopping", "stopping"), quick).lanes(1),
        {
            let (log, done) = (Arc::clone(&log), Arc::clone(&done));
            move || {
                if log.effects.lock().expect("lock").len() == MESSAGES {
                    done.notify_one();
                }
            }
        },
    );
    tokio::time::timeout(Duration::from_secs(10), consumer.run_until(done.notified()))
        .await
        .expect("the handed back deliveries did not come back")
        .expect("the consumer ended with an error");
    let effects = log.effects.lock().expect("lock").clone();
    assert!(
        (0..MESSAGES).all(|i| effects.get(&format!("m{i}")) == Some(&1)),
        "each message's effect once: {effects:?}"
    );
    let second = second.lock().expect("lock").clone();
    assert!(
        second.iter().all(|outcome| *outcome == Outcome::Handled),
        "no failure counted: {second:?}"
    );
    assert!(broker.dead_letters("stopping").is_empty());
}
