//! A consumer kept busy for ten dedup windows, with a count of its records watched: the
//! shared part of the checks that the consumer's cleanup keeps its tables bounded.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{Consumer, ConsumerOptions, Outcome, Process};
use oncebox_core::memory::MemoryBroker;
use oncebox_core::{Coordinates, Message, MessageId, Publisher, Received, Result};
use tokio::time::Instant;

use crate::support::{ok, within};

/// The dedup window of the run: short, so that ten of them pass in a check.
const WINDOW: Duration = Duration::from_secs(1);
/// Time between cleanup passes.
const CLEANUP: Duration = Duration::from_millis(250);
/// How long the consumer runs: ten windows.
const RUN: Duration = Duration::from_secs(10);
/// One message every this long: 100 a second, 1,000 over the run.
const PACE: Duration = Duration::from_millis(10);
/// How often the records are counted.
const SAMPLE: Duration = Duration::from_millis(250);

/// Consumer options for the run: a one-second dedup window, cleanup four times a second.
pub(crate) fn options(consumer: &str) -> ConsumerOptions {
    ConsumerOptions::new(consumer)
        .dedup_window(WINDOW)
        .cleanup_interval(CLEANUP)
}

/// Runs `processor` (built with [`options`]) under a [`Consumer`] over an in-process
/// broker for ten dedup windows at 100 messages a second, counting its records with
/// `count` four times a second, then checks:
///
/// - once two windows have passed, the count never exceeds three windows' worth of
///   messages (without cleanup it would reach the ten windows' thousand);
/// - a message handled 0.5 to 0.8 s before (inside the window, with cleanup passes
///   since) is still a duplicate when delivered again, while the consumer and its
///   cleanup still run.
pub(crate) async fn stays_bounded<P, C, F>(what: &str, processor: P, count: C)
where
    P: Process + 'static,
    C: Fn() -> F,
    F: Future<Output = Result<u64>>,
{
    let processor = Arc::new(processor);
    let broker = MemoryBroker::new();
    let topic = "conformance.steady";
    let subscriber = broker.subscribe(topic, processor.options().name());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handled: Arc<Mutex<Vec<(Instant, MessageId)>>> = Arc::default();
    let record = Arc::clone(&handled);
    let consumer =
        Consumer::new(subscriber, Arc::clone(&processor)).on_outcome(move |received, outcome| {
            if let (Outcome::Handled, Some(id)) = (outcome, received.id) {
                let mut handled = record.lock().unwrap_or_else(PoisonError::into_inner);
                handled.push((Instant::now(), id));
            }
        });
    let consumer = tokio::spawn(consumer.run_until(async {
        let _ = stopped.await;
    }));

    let publisher = broker.publisher();
    let start = Instant::now();
    let mut sent: Vec<(Instant, Message)> = Vec::new();
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut next_sample = start;
    while start.elapsed() < RUN {
        let message = Message::new(topic, format!("m{}", sent.len())).with_kind("Tick");
        ok("publish", publisher.publish(&message).await);
        sent.push((Instant::now(), message));
        if Instant::now() >= next_sample {
            let records = ok(&format!("count the {what}"), count().await);
            samples.push((start.elapsed(), records));
            next_sample += SAMPLE;
        }
        tokio::time::sleep(PACE).await;
    }
    // Checked while the consumer, and its cleanup, still run: a message handled between
    // 0.5 and 0.8 s ago, inside the window, with cleanup passes since.
    let now = Instant::now();
    let recent_id = handled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .rev()
        .find(|(at, _)| {
            let ago = now.duration_since(*at);
            ago >= Duration::from_millis(500) && ago <= Duration::from_millis(800)
        })
        .map(|(_, id)| *id)
        .expect("a message handled 0.5 to 0.8 s ago: the consumer kept up");
    let (_, recent) = sent
        .iter()
        .find(|(_, message)| message.id == recent_id)
        .expect("the handled message was sent");
    let at = Coordinates {
        source: topic.to_owned(),
        partition: None,
        position: "again".to_owned(),
    };
    let again = Received::from_message(recent, at, 2);
    let outcome = ok(
        "deliver a recent message again",
        within(
            "process a redelivery",
            Duration::from_secs(10),
            processor.process(&again),
        )
        .await,
    );
    assert_eq!(
        outcome,
        Outcome::Duplicate,
        "a message handled inside the dedup window must still be a duplicate after the \
         cleanup passes since"
    );
    let _ = stop.send(());
    ok(
        "the consumer's run",
        ok(
            "join the consumer",
            within("stop the consumer", Duration::from_secs(10), consumer).await,
        ),
    );

    let per_window = sent.len() as f64 * WINDOW.as_secs_f64() / RUN.as_secs_f64();
    let limit = (3.0 * per_window) as u64;
    let steady: Vec<_> = samples.iter().filter(|(at, _)| *at >= 2 * WINDOW).collect();
    assert!(
        steady.len() >= 10,
        "too few samples of the {what} to judge: {samples:?}"
    );
    assert!(
        samples.iter().any(|(_, records)| *records > 0),
        "the {what} were never counted above zero: {samples:?}"
    );
    let highest = steady.iter().map(|(_, records)| *records).max();
    assert!(
        highest <= Some(limit),
        "the {what} grew past three dedup windows' worth ({limit} of {} sent): \
         samples (elapsed, records) {samples:?}",
        sent.len()
    );
}
