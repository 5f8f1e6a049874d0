//! Checks of the idempotent receiver running over the store.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::consumer::{
    ConsumerOptions, Handler, IdempotentReceiver, Outcome, process_delivery,
};
use oncebox_core::store::DedupStore;
use oncebox_core::{Bytes, Coordinates, Delivery, Error, Message, Received, Result};
use tokio::sync::Barrier;

use super::{DedupHarness, LONG_LEASE, STEP, assert_completed};
use crate::support::{ok, within};

/// A handler that counts its runs, sleeps to widen the race window, and returns the
/// number of the run as its result. While `failures` is above zero it fails instead.
struct CountingHandler {
    runs: Arc<AtomicU32>,
    failures: AtomicU32,
    delay: Duration,
}

impl Handler for CountingHandler {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
        {
            return Err(Error::handler("injected handler failure"));
        }
        Ok(Bytes::from(format!("run {run}")))
    }
}

/// How the receiver settled a [`TestDelivery`].
#[derive(Debug, Clone, PartialEq)]
enum Settled {
    Acked,
    Nacked(Duration),
    DeadLettered(String),
}

/// A delivery that records how it was settled, standing in for a broker's.
struct TestDelivery {
    received: Received,
    settled: Arc<Mutex<Option<Settled>>>,
}

impl TestDelivery {
    fn new(received: Received) -> (Self, Arc<Mutex<Option<Settled>>>) {
        let settled = Arc::new(Mutex::new(None));
        (
            Self {
                received,
                settled: Arc::clone(&settled),
            },
            settled,
        )
    }

    fn settle(self, how: Settled) {
        let mut slot = self
            .settled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(slot.is_none(), "a delivery was settled twice");
        *slot = Some(how);
    }
}

impl Delivery for TestDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    async fn ack(self) -> Result<()> {
        self.settle(Settled::Acked);
        Ok(())
    }

    async fn nack(self, delay: Duration) -> Result<()> {
        self.settle(Settled::Nacked(delay));
        Ok(())
    }

    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.settle(Settled::DeadLettered(reason.to_owned()));
        Ok(())
    }
}

/// Delivers `received` to `receiver` like a broker would: again after every nack (after
/// at most 20 ms, whatever delay was asked), until it is acked. Returns the outcomes.
async fn deliver_until_acked<S: DedupStore, Hd: Handler>(
    receiver: &IdempotentReceiver<S, Hd>,
    received: &Received,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for delivery_count in 1..=500 {
        let (outcome, settled) = deliver_once(receiver, received, delivery_count).await;
        outcomes.push(outcome);
        match settled {
            Some(Settled::Acked) => return outcomes,
            Some(Settled::Nacked(delay)) => {
                tokio::time::sleep(delay.min(Duration::from_millis(20))).await
            }
            Some(Settled::DeadLettered(reason)) => {
                panic!("the receiver dead-lettered the message: {reason}")
            }
            None => panic!("the receiver returned without settling the delivery"),
        }
    }
    panic!("the message was still not acked after 500 deliveries; outcomes: {outcomes:?}")
}

/// Delivers one copy of `received` and returns the outcome and how it was settled.
async fn deliver_once<S: DedupStore, Hd: Handler>(
    receiver: &IdempotentReceiver<S, Hd>,
    received: &Received,
    delivery_count: u32,
) -> (Outcome, Option<Settled>) {
    let mut copy = received.clone();
    copy.delivery_count = delivery_count;
    let (delivery, settled) = TestDelivery::new(copy);
    let outcome = ok(
        "IdempotentReceiver::process",
        process_delivery(receiver, delivery).await,
    );
    let settled = settled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    (outcome, settled)
}

fn received(topic: &str) -> Received {
    let message = Message::new(topic, "{\"amount\":42}").with_kind("PaymentRequested");
    let at = Coordinates {
        source: topic.to_owned(),
        partition: None,
        position: "1".to_owned(),
    };
    Received::from_message(&message, at, 1)
}

/// The [`IdempotentReceiver`] over this store, with 8 workers each receiving 3 copies of
/// one message at once (redelivering after every nack), runs the handler exactly once;
/// every copy is finally acked, one as `Handled` and the rest as duplicates.
pub async fn receiver_runs_handler_once<H: DedupHarness>(harness: &H) {
    const WORKERS: usize = 8;
    const COPIES: usize = 3;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = CountingHandler {
        runs: Arc::clone(&runs),
        failures: AtomicU32::new(0),
        delay: Duration::from_millis(100),
    };
    let options = ConsumerOptions::new("conformance").lease(Duration::from_secs(10));
    let receiver = Arc::new(ok(
        "IdempotentReceiver::new",
        IdempotentReceiver::new(harness.store(), handler, options),
    ));
    let message = received("payments");
    let barrier = Arc::new(Barrier::new(WORKERS));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let (receiver, message, barrier) =
            (Arc::clone(&receiver), message.clone(), Arc::clone(&barrier));
        workers.spawn(async move {
            barrier.wait().await;
            let mut outcomes = Vec::new();
            for _ in 0..COPIES {
                outcomes.extend(deliver_until_acked(&receiver, &message).await);
            }
            outcomes
        });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = within(
        "8 workers receiving duplicates",
        Duration::from_secs(30),
        workers.join_next(),
    )
    .await
    {
        outcomes.extend(ok("join worker", joined));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler must run once for {} copies; outcomes: {outcomes:?}",
        WORKERS * COPIES
    );
    let handled = outcomes.iter().filter(|o| **o == Outcome::Handled).count();
    let duplicates = outcomes
        .iter()
        .filter(|o| **o == Outcome::Duplicate)
        .count();
    assert_eq!(
        handled, 1,
        "exactly one delivery is Handled; outcomes: {outcomes:?}"
    );
    assert_eq!(
        duplicates,
        WORKERS * COPIES - 1,
        "every other copy is acked as a duplicate; outcomes: {outcomes:?}"
    );
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            Outcome::Handled | Outcome::Duplicate | Outcome::InProgress { .. }
        )),
        "unexpected outcomes: {outcomes:?}"
    );
    let id = message.id.map(|id| id.to_string()).unwrap_or_default();
    assert_completed(
        "begin after the receiver finished",
        receiver.store().begin(&id, LONG_LEASE).await,
        b"run 1",
    );
}

/// When the handler fails, the [`IdempotentReceiver`] abandons the id, so the very next
/// delivery runs the handler again instead of waiting for the lease; the successful
/// run's result is what later duplicates find.
pub async fn receiver_failure_frees_id<H: DedupHarness>(harness: &H) {
    let runs = Arc::new(AtomicU32::new(0));
    let handler = CountingHandler {
        runs: Arc::clone(&runs),
        failures: AtomicU32::new(1),
        delay: Duration::ZERO,
    };
    // A lease far longer than the check: only abandon can free the id in time.
    let options = ConsumerOptions::new("conformance").lease(Duration::from_secs(60));
    let receiver = ok(
        "IdempotentReceiver::new",
        IdempotentReceiver::new(harness.store(), handler, options),
    );
    let message = received("emails");

    let (outcome, settled) =
        within("first delivery", STEP, deliver_once(&receiver, &message, 1)).await;
    assert!(
        matches!(
            (&outcome, &settled),
            (Outcome::Retrying { .. }, Some(Settled::Nacked(_)))
        ),
        "a failing handler is retried: expected Retrying and a nack, got {outcome:?} / {settled:?}"
    );
    let (outcome, settled) = within(
        "second delivery",
        STEP,
        deliver_once(&receiver, &message, 2),
    )
    .await;
    assert_eq!(
        (&outcome, &settled),
        (&Outcome::Handled, &Some(Settled::Acked)),
        "the redelivery right after a failure must run the handler (the failure abandons the id)"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the handler runs once failing, once succeeding"
    );
    let (outcome, settled) =
        within("third delivery", STEP, deliver_once(&receiver, &message, 3)).await;
    assert_eq!(
        (&outcome, &settled),
        (&Outcome::Duplicate, &Some(Settled::Acked)),
        "a later copy is acked as a duplicate"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "a duplicate never runs the handler"
    );
    let id = message.id.map(|id| id.to_string()).unwrap_or_default();
    assert_completed(
        "begin after the receiver finished",
        receiver.store().begin(&id, LONG_LEASE).await,
        b"run 2",
    );
}

/// A handler slower than its lease keeps the id: a copy delivered after the lease would
/// have ended finds it in progress (nacked, the handler not run again), and once the
/// first run completed, a copy is a duplicate. At most one execution at a time.
pub async fn receiver_keeps_its_lease_while_the_handler_runs<H: DedupHarness>(harness: &H) {
    let lease = Duration::from_secs(1);
    let runs = Arc::new(AtomicU32::new(0));
    let handler = CountingHandler {
        runs: Arc::clone(&runs),
        failures: AtomicU32::new(0),
        delay: lease * 5 / 2,
    };
    let options = ConsumerOptions::new("conformance").lease(lease);
    let receiver = ok(
        "IdempotentReceiver::new",
        IdempotentReceiver::new(harness.store(), handler, options),
    );
    let message = received("slow-jobs");
    let copy = async {
        tokio::time::sleep(lease * 3 / 2).await;
        deliver_once(&receiver, &message, 2).await
    };
    let ((first, _), (second, settled)) = within("a slow handler and a copy", STEP, async {
        tokio::join!(deliver_once(&receiver, &message, 1), copy)
    })
    .await;
    assert_eq!(first, Outcome::Handled, "the slow handler's own delivery");
    assert!(
        matches!(second, Outcome::InProgress { .. }) && matches!(settled, Some(Settled::Nacked(_))),
        "a copy delivered while the slow handler runs past its first lease must wait, \
         got {second:?} / {settled:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran twice: a duplicate ran beside a handler that outlived its lease"
    );
    let (third, _) = within("a later copy", STEP, deliver_once(&receiver, &message, 3)).await;
    assert_eq!(third, Outcome::Duplicate, "a copy after completion");
}

/// A handler that sleeps past the consumer's
/// [`handler_timeout`](ConsumerOptions::handler_timeout) is stopped: each delivery fails
/// as transient and frees the id at once (the lease is far longer, so only the receiver's
/// abandon can free it in time), and the attempt limit dead-letters the message with the
/// timeout as its reason. No record is left behind.
pub async fn receiver_handler_timeout_frees_the_id<H: DedupHarness>(harness: &H) {
    const ATTEMPTS: u32 = 3;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = CountingHandler {
        runs: Arc::clone(&runs),
        failures: AtomicU32::new(0),
        delay: Duration::from_secs(60),
    };
    let options = ConsumerOptions::new("conformance")
        .lease(Duration::from_secs(60))
        .handler_timeout(Duration::from_millis(200))
        .max_attempts(ATTEMPTS);
    let receiver = ok(
        "IdempotentReceiver::new",
        IdempotentReceiver::new(harness.store(), handler, options),
    );
    let message = received("slow-payments");
    for attempt in 1..=ATTEMPTS {
        let (outcome, settled) = within(
            "a delivery to a handler past its timeout",
            STEP,
            deliver_once(&receiver, &message, attempt),
        )
        .await;
        if attempt < ATTEMPTS {
            assert!(
                matches!(
                    (&outcome, &settled),
                    (Outcome::Retrying { .. }, Some(Settled::Nacked(_)))
                ),
                "attempt {attempt}: a timed-out handler is retried, got {outcome:?} / {settled:?}"
            );
        } else {
            let Some(Settled::DeadLettered(reason)) = settled else {
                panic!("the last attempt is dead-lettered, got {outcome:?} / {settled:?}");
            };
            assert!(
                reason.contains("did not finish within 200ms"),
                "the dead letter names the timeout: {reason}"
            );
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        ATTEMPTS,
        "every delivery ran the handler: each timeout freed the id"
    );
    let id = message.id.map(|id| id.to_string()).unwrap_or_default();
    let record = ok(
        "inspect after the dead letter",
        receiver.store().inspect(&id).await,
    );
    assert_eq!(record, None, "a timed-out id keeps no record");
}

/// An [`IdempotentReceiver`] under a [`Consumer`](oncebox_core::consumer::Consumer) with
/// a one-second dedup window runs ten windows at 100 messages a second: the store's
/// records stay under three windows' worth (the consumer's cleanup deletes the expired
/// ones, or the store expires them itself), and a message handled inside the window is
/// still a duplicate. Skipped for stores that do not count their records
/// ([`DedupHarness::count_records`]).
pub async fn receiver_cleanup_keeps_the_window<H: DedupHarness>(harness: &H) {
    if ok("count_records", harness.count_records().await).is_none() {
        eprintln!("receiver_cleanup_keeps_the_window: skipped, the harness does not count records");
        return;
    }
    let handler = CountingHandler {
        runs: Arc::default(),
        failures: AtomicU32::new(0),
        delay: Duration::ZERO,
    };
    let receiver = ok(
        "IdempotentReceiver::new",
        IdempotentReceiver::new(harness.store(), handler, crate::steady::options("ticks")),
    );
    let count = || async { Ok(harness.count_records().await?.unwrap_or_default()) };
    crate::steady::stays_bounded("dedup records", receiver, count).await;
}
