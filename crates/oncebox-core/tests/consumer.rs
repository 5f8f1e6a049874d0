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
