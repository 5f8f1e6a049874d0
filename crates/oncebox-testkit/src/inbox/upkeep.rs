//! What keeps a consumer from holding on forever: the handler timeout and the cleanup of
//! records past the dedup window.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{
    Consumer, ConsumerOptions, DurableInbox, InboxAdmin, InboxRowFilter, Outcome,
};
use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{RowStatus, SpoolOptions};
use oncebox_core::store::{Accepted, DurableInboxStore};
use oncebox_core::{Backoff, Message, Publisher};

use super::{DurableInboxHarness, EffectHandler, InboxHarness, STEP, effects, inbox};
use crate::steady;
use crate::support::{ok, within};

/// A handler that writes its effect, then sleeps a minute, under a [`Consumer`] with a
/// 200 ms [`handler_timeout`](ConsumerOptions::handler_timeout) and 3 attempts: each
/// attempt is stopped and retried, the third dead-lettered with the timeout as its
/// reason; no effect is committed, no inbox record kept, and every connection the
/// attempts used is back in the pool.
pub async fn handler_timeout_rolls_back_and_dead_letters<H: InboxHarness + 'static>(harness: &H) {
    const ATTEMPTS: u32 = 3;
    let broker = MemoryBroker::new();
    let topic = "conformance.slow";
    let subscriber = broker.subscribe(topic, "payments");
    let options = ConsumerOptions::new("payments")
        .handler_timeout(Duration::from_millis(200))
        .max_attempts(ATTEMPTS)
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(20))
                .jitter(0.0),
        );
    let handler = EffectHandler::<H>::new("payments").delay(Duration::from_secs(60));
    let runs = Arc::clone(&handler.runs);
    let processor = inbox(harness, handler, options);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&outcomes);
    let consumer = Consumer::new(subscriber, processor).on_outcome(move |_, outcome| {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(outcome.clone());
    });
    let message = ok(
        "a test message",
        Message::new(topic, "stuck")
            .with_kind("PaymentRequested")
            .with_header("x", "1"),
    );
    ok("publish", broker.publisher().publish(&message).await);
    let dead_lettered = async {
        while broker.dead_letters(topic).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    ok(
        "the consumer's run",
        within(
            "three attempts past the timeout",
            Duration::from_secs(20),
            consumer.run_until(dead_lettered),
        )
        .await,
    );

    let outcomes = outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(
        outcomes.len(),
        ATTEMPTS as usize,
        "one outcome per attempt: {outcomes:?}"
    );
    assert!(
        outcomes[..2]
            .iter()
            .all(|o| matches!(o, Outcome::Retrying { .. })),
        "the first attempts are retried: {outcomes:?}"
    );
    let Outcome::DeadLettered { reason } = &outcomes[2] else {
        panic!("the last attempt is dead-lettered: {outcomes:?}");
    };
    assert!(
        reason.contains("gave up after 3 attempts")
            && reason.contains("did not finish within 200ms"),
        "the dead letter says why: {reason}"
    );
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        ATTEMPTS,
        "the handler ran once per attempt"
    );
    let received = oncebox_core::Received::from_message(
        &message,
        oncebox_core::Coordinates {
            source: topic.to_owned(),
            partition: None,
            position: "1".to_owned(),
        },
        1,
    );
    assert_eq!(
        effects(harness, "payments", &received).await,
        0,
        "a stopped handler's effect is rolled back"
    );
    let figures = ok(
        "the figures",
        within("consumers", STEP, harness.store().consumers()).await,
    );
    assert!(
        figures
            .iter()
            .all(|f| f.consumer != "payments" || f.handled == 0),
        "a stopped handler leaves no inbox record: {figures:?}"
    );
    if let Some(first) = harness.connections() {
        let returned = async {
            loop {
                let now = harness.connections().unwrap_or(first);
                if now.idle == now.open as usize {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        within(
            "every connection back in the pool after the stopped attempts",
            Duration::from_secs(5),
            returned,
        )
        .await;
    }
}

/// A transactional inbox under a [`Consumer`] with a one-second dedup window runs ten
/// windows at 100 messages a second: its records stay under three windows' worth (the
/// cleanup deletes the older ones), and a message handled inside the window is still a
/// duplicate.
pub async fn cleanup_keeps_the_window<H: InboxHarness + 'static>(harness: &H) {
    let processor = inbox(
        harness,
        EffectHandler::new("ticks"),
        steady::options("ticks"),
    );
    let admin = harness.store();
    let count = || async {
        let figures = admin.consumers().await?;
        Ok(figures
            .iter()
            .find(|f| f.consumer == "ticks")
            .map_or(0, |f| f.handled))
    };
    steady::stays_bounded("inbox records", processor, count).await;
}

/// A durable inbox's processor stops a handler past the consumer's
/// [`handler_timeout`](ConsumerOptions::handler_timeout) (200 ms, the spool's dispatch
/// timeout being 5 s): each attempt fails and is retried, the row is dead after the
/// spool's 2 attempts with the timeout in its reason, and no effect is committed.
pub async fn durable_handler_timeout_fails_the_attempt<H>(harness: &H)
where
    H: DurableInboxHarness + 'static,
{
    let message = super::received(None, "stuck");
    let store = harness.durable("slow");
    let accepted = within(
        "accept",
        STEP,
        store.accept(&super::dedup_id(&message), &message),
    )
    .await;
    assert_eq!(ok("accept", accepted), Accepted::New);
    let inbox = ok(
        "DurableInbox::new",
        DurableInbox::new(
            harness.durable("slow"),
            ConsumerOptions::new("slow").handler_timeout(Duration::from_millis(200)),
        ),
    );
    let options = SpoolOptions::new()
        .name("slow")
        .lease(Duration::from_secs(10))
        .dispatch_timeout(Duration::from_secs(5))
        .max_attempts(2)
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(20))
                .jitter(0.0),
        )
        .poll_interval(Duration::from_millis(5), Duration::from_millis(40));
    let handler = EffectHandler::<H>::new("slow").delay(Duration::from_secs(60));
    let processor = ok("processor", inbox.processor(handler, options));
    let admin = harness.store();
    let filter = InboxRowFilter {
        consumer: Some("slow".to_owned()),
        ..InboxRowFilter::default()
    };
    let dead = async {
        loop {
            let rows = ok("inbox_rows", admin.inbox_rows(&filter, None, 10).await);
            if rows.iter().any(|row| row.state.status == RowStatus::Dead) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let run = processor.run_until(dead);
    let ran = within(
        "two attempts past the timeout",
        Duration::from_secs(20),
        run,
    )
    .await;
    ok("the processor's run", ran);
    let rows = ok("inbox_rows", admin.inbox_rows(&filter, None, 10).await);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let state = &rows[0].state;
    assert_eq!(
        (state.status, state.attempts),
        (RowStatus::Dead, 2),
        "{state:?}"
    );
    let reason = state.last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("did not finish within 200ms"),
        "the reason names the timeout: {reason}"
    );
    assert_eq!(
        effects(harness, "slow", &message).await,
        0,
        "a stopped handler's effect is rolled back"
    );
}
