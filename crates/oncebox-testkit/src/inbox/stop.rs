//! What a consumer's stop does with the deliveries queued behind a slow handler.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{Consumer, ConsumerOptions, Outcome};
use oncebox_core::memory::MemoryBroker;
use oncebox_core::{Message, Publisher};

use super::{EffectHandler, InboxHarness, STEP, effect_key, inbox};
use crate::support::{ok, within};

/// Deliveries queued behind the slow handler.
const MESSAGES: usize = 20;
/// Lanes of the consumer.
const LANES: usize = 2;

/// A transactional inbox under a [`Consumer`] of 2 lanes, stopped while its handler
/// (500 ms a run) works through 20 deliveries: each lane finishes the delivery it had
/// started and starts no other; the ones not started are handed back to the broker at
/// once, and a second run handles each of them: every message's effect is committed
/// once, and neither run counts a failure or dead-letters anything.
pub async fn stop_hands_back_queued_deliveries<H: InboxHarness + 'static>(harness: &H) {
    let broker = MemoryBroker::new();
    let topic = "conformance.stopping";
    let publisher = broker.publisher();
    for i in 0..MESSAGES {
        let message = Message::new(topic, format!("m{i}"));
        ok("publish", publisher.publish(&message).await);
    }

    let slow = EffectHandler::<H>::new("stopping").delay(Duration::from_millis(500));
    let runs = Arc::clone(&slow.runs);
    let options = || ConsumerOptions::new("stopping");
    let (consumer, first) = observed(Consumer::new(
        broker.subscribe(topic, "stopping"),
        inbox(harness, slow, options()),
    ));
    let started = async {
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let stopped = within(
        "the stop",
        Duration::from_secs(60),
        consumer.lanes(LANES).run_until(started),
    )
    .await;
    ok("the first run", stopped);
    let ran = runs.load(Ordering::SeqCst);
    let first = take(&first);
    assert!(
        ran as usize <= LANES,
        "no delivery started after the stop: {ran} handler runs, {} outcomes",
        first.len()
    );
    assert_eq!(
        first,
        vec![Outcome::Handled; ran as usize],
        "each delivery started before the stop finished"
    );

    let quick = EffectHandler::<H>::new("stopping");
    let (consumer, second) = observed(Consumer::new(
        broker.subscribe(topic, "stopping"),
        inbox(harness, quick, options()),
    ));
    let all_handled = async {
        for i in 0..MESSAGES {
            let key = effect_key("stopping", &super::received(None, &format!("m{i}")));
            while ok("count_effects", harness.count_effects(&key).await) == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let rerun = within(
        "the handed back deliveries coming back (not after the broker's 30 s ack timeout)",
        STEP,
        consumer.lanes(LANES).run_until(all_handled),
    )
    .await;
    ok("the second run", rerun);
    for i in 0..MESSAGES {
        let key = effect_key("stopping", &super::received(None, &format!("m{i}")));
        let effects = ok("count_effects", harness.count_effects(&key).await);
        assert_eq!(effects, 1, "the effect of m{i}, once");
    }
    let second = take(&second);
    assert!(
        second.iter().all(|outcome| *outcome == Outcome::Handled),
        "a handed back delivery is no failure: {second:?}"
    );
    assert_eq!(second.len(), MESSAGES - ran as usize, "{second:?}");
    assert!(broker.dead_letters(topic).is_empty());
}

type Outcomes = Arc<Mutex<Vec<Outcome>>>;

/// `consumer`, recording its outcomes.
fn observed<S, P>(consumer: Consumer<S, P>) -> (Consumer<S, P>, Outcomes)
where
    S: oncebox_core::Subscriber,
    P: oncebox_core::consumer::Process + 'static,
{
    let outcomes = Outcomes::default();
    let seen = Arc::clone(&outcomes);
    let consumer = consumer.on_outcome(move |_, outcome| {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(outcome.clone());
    });
    (consumer, outcomes)
}

fn take(outcomes: &Outcomes) -> Vec<Outcome> {
    outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
