//! The idempotent receiver over the in-memory dedup store and the in-process broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncebox_core::consumer::{
    ConsumerOptions, Handler, IdempotentReceiver, Outcome, StoreFailure, process_delivery,
};
use oncebox_core::memory::{MemoryBroker, MemoryDedupStore};
use oncebox_core::{Bytes, Error, Message, Publisher, Received, Result, Subscriber};

/// Counts its runs; answers with the run number.
#[derive(Clone, Default)]
struct CountRuns(Arc<AtomicU32>);

impl Handler for CountRuns {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        let run = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(Bytes::from(run.to_string()))
    }
}

fn options() -> ConsumerOptions {
    ConsumerOptions::new("mailer")
}

async fn deliver(broker: &MemoryBroker, topic: &str) -> oncebox_core::memory::MemoryDelivery {
    let message = Message::new(topic, "hello").with_key("k");
    broker
        .publisher()
        .publish(&message)
        .await
        .expect("published");
    let mut subscriber = broker.subscribe(topic, "mailer");
    subscriber.next().await.expect("delivered")
}

#[tokio::test]
async fn fail_closed_does_not_run_the_handler_while_the_store_is_down() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    let store = Arc::new(MemoryDedupStore::default());
    let runs = CountRuns::default();
    let receiver =
        IdempotentReceiver::new(Arc::clone(&store), runs.clone(), options()).expect("options");
    store.set_down(true);
    let delivery = deliver(&broker, "mail-closed").await;
    let back = {
        let (store, runs) = (Arc::clone(&store), runs.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                runs.0.load(Ordering::SeqCst),
                0,
                "fail-closed ran the handler"
            );
            store.set_down(false);
        }
    };
    let (outcome, ()) = tokio::join!(process_delivery(&receiver, delivery), back);
    // Held through the outage and handled once the store answered: no nack, no attempt
    // spent, the handler ran once.
    assert_eq!(outcome.expect("settled"), Outcome::Handled);
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
    assert_eq!(broker.stats().nacked, 0);
}

#[tokio::test]
async fn fail_open_runs_the_handler_unguarded() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    let store = Arc::new(MemoryDedupStore::default());
    let runs = CountRuns::default();
    let receiver = IdempotentReceiver::new(
        Arc::clone(&store),
        runs.clone(),
        options().on_store_failure(StoreFailure::FailOpen),
    )
    .expect("options");
    store.set_down(true);
    let outcome = process_delivery(&receiver, deliver(&broker, "mail-open").await)
        .await
        .expect("settled");
    assert_eq!(outcome, Outcome::HandledUnguarded);
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
    assert_eq!(broker.stats().acked, 1);
}

#[tokio::test]
async fn duplicates_get_the_first_result_and_concurrent_copies_wait() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    let runs = CountRuns::default();
    let receiver = Arc::new(
        IdempotentReceiver::new(MemoryDedupStore::default(), runs.clone(), options())
            .expect("options"),
    );
    let message = Message::new("mail-dup", "hello");
    let publisher = broker.publisher();
    for _ in 0..8 {
        publisher.publish(&message).await.expect("published");
    }
    // Eight workers each take one copy at once.
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let mut subscriber = broker.subscribe("mail-dup", "mailer");
        let receiver = Arc::clone(&receiver);
        workers.spawn(async move {
            let delivery = subscriber.next().await.expect("delivered");
            process_delivery(&receiver, delivery)
                .await
                .expect("settled")
        });
    }
    let outcomes = workers.join_all().await;
    assert_eq!(
        runs.0.load(Ordering::SeqCst),
        1,
        "handler ran more than once: {outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Handled).count(),
        1
    );
    assert!(outcomes.iter().all(|o| matches!(
        o,
        Outcome::Handled | Outcome::Duplicate | Outcome::InProgress { .. }
    )));
}

/// A handler that always fails with the given permanence.
struct Fails {
    permanent: bool,
}

impl Handler for Fails {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        Err(if self.permanent {
            Error::handler_permanent("bad data")
        } else {
            Error::handler("flaky")
        })
    }
}

#[tokio::test]
async fn failures_back_off_then_dead_letter_with_the_reason() {
    let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
    let opts = options().max_attempts(3).backoff(
        oncebox_core::Backoff::new()
            .initial(Duration::from_millis(10))
            .max(Duration::from_millis(10)),
    );
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::default(),
        Fails { permanent: false },
        opts,
    )
    .expect("options");
    broker
        .publisher()
        .publish(&Message::new("mail-fail", "x"))
        .await
        .expect("published");
    let mut subscriber = broker.subscribe("mail-fail", "mailer");
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let delivery = tokio::time::timeout(Duration::from_secs(2), subscriber.next())
            .await
            .expect("redelivered after the nack")
            .expect("delivery");
        outcomes.push(
            process_delivery(&receiver, delivery)
                .await
                .expect("settled"),
        );
    }
    assert!(
        matches!(outcomes[0], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    let Outcome::DeadLettered { reason } = &outcomes[2] else {
        panic!("{outcomes:?}")
    };
    assert!(
        reason.contains("gave up after 3") && reason.contains("flaky"),
        "{reason}"
    );
    let dead = broker.dead_letters("mail-fail");
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].1, reason);

    // A permanent failure is dead-lettered on the first delivery.
    let receiver = IdempotentReceiver::new(
        MemoryDedupStore::default(),
        Fails { permanent: true },
        options(),
    )
    .expect("options");
    let outcome = process_delivery(&receiver, deliver(&broker, "mail-poison").await)
        .await
        .expect("settled");
    assert!(
        matches!(outcome, Outcome::DeadLettered { ref reason } if reason.contains("permanent")),
        "{outcome:?}"
    );
}
