//! The consumer engine over the transport: each failure settled by its fault.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{Consumer, ConsumerOptions, Outcome, Process};
use oncebox_core::{Backoff, Error, Message, Received, Result};
use tokio::sync::Notify;

use super::TransportHarness;
use super::check::Check;

/// How the scripted processor treats each message, by its payload.
const SCRIPT: [&str; 5] = ["permanent", "transient", "outage", "panic", "ok"];

/// Outages the `outage` message meets before the store answers again.
const OUTAGES: u32 = 3;

/// Attempts before a failing message is dead-lettered.
const MAX_ATTEMPTS: u32 = 3;

/// A [`Consumer`] over the transport settles each failure by its fault, on the real
/// broker: a permanent error is dead-lettered at once (processed once); a transient one
/// is retried and dead-lettered after the attempt limit; an outage of the store holds
/// the delivery, without a nack or a spent attempt, until the store answers; a panic of
/// the handler is a failed attempt and the consumer keeps running.
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience;
/// the consumer's own error.
///
/// # Panics
///
/// If a message is settled otherwise, or not every message is settled in time.
pub async fn consumer_settles_by_fault<H: TransportHarness>(harness: &H) -> Result<()> {
    let check = Check::start(harness, "consumer_settles_by_fault").await?;
    let group = check.group("c");
    let subscriber = harness.subscriber(&check.topic, &group).await?;
    let messages: Vec<Message> = SCRIPT
        .iter()
        .map(|tag| Message::new(check.topic.clone(), *tag).with_key(*tag))
        .collect();
    check.publish(&messages).await?;

    // The outage is held for well under the ack timeout, so that the broker does not
    // hand the held delivery to another lane meanwhile (it may: a consumer's dedup
    // absorbs such copies, which this scripted one has none of).
    let step = (check.ack_timeout() / 16).min(Duration::from_millis(20));
    let scripted = Scripted {
        options: ConsumerOptions::new(group)
            .max_attempts(MAX_ATTEMPTS)
            .backoff(Backoff::new().initial(step).max(step * 2).jitter(0.0)),
        seen: Mutex::default(),
    };
    let log = Arc::new(Log::default());
    let consumer = Consumer::new(subscriber, scripted).lanes(4).on_outcome({
        let log = Arc::clone(&log);
        move |received: &Received, outcome: &Outcome| log.settled(received, outcome)
    });
    let within = check.patience() + check.redelivery_wait() * MAX_ATTEMPTS;
    let finished = tokio::time::timeout(within, consumer.run_until(log.all_final.notified())).await;
    let name = check.name;
    let outcomes = log.outcomes();
    match finished {
        Ok(ended) => ended?,
        Err(_) => panic!("[{name}] not every message was settled within {within:?}: {outcomes:?}"),
    }

    let of = |tag: &str| outcomes.get(tag).cloned().unwrap_or_default();
    let dead = |tag: &str, reason: &str| {
        let settled = of(tag);
        assert!(
            matches!(settled.last(), Some(Outcome::DeadLettered { reason: r }) if r.contains(reason)),
            "[{name}] `{tag}`: expected a dead letter saying {reason:?}, got {settled:?}"
        );
        settled
    };
    let permanent = dead("permanent", "permanent failure");
    assert_eq!(
        permanent.len(),
        1,
        "[{name}] a permanent failure was retried: {permanent:?}"
    );
    for tag in ["transient", "panic"] {
        let reason = if tag == "panic" {
            "panicked"
        } else {
            "gave up after"
        };
        let settled = dead(tag, reason);
        if harness.capabilities().delivery_count {
            // Retried until the last attempt, dead-lettered at it. A dead letter whose
            // settlement reached the broker after its ack timeout (a loaded machine) is
            // delivered and dead-lettered again: at least once, as for the healthy
            // message below.
            let first_dead = settled
                .iter()
                .position(|o| matches!(o, Outcome::DeadLettered { .. }));
            assert_eq!(
                first_dead,
                Some(MAX_ATTEMPTS as usize - 1),
                "[{name}] `{tag}` should be tried {MAX_ATTEMPTS} times: {settled:?}"
            );
            assert!(
                settled[..MAX_ATTEMPTS as usize - 1]
                    .iter()
                    .all(|o| matches!(o, Outcome::Retrying { .. }))
                    && settled[MAX_ATTEMPTS as usize - 1..]
                        .iter()
                        .all(|o| matches!(o, Outcome::DeadLettered { .. })),
                "[{name}] `{tag}` should be retried, then dead-lettered: {settled:?}"
            );
        }
    }
    let outage = of("outage");
    assert!(
        !outage.is_empty() && outage.iter().all(|o| *o == Outcome::Handled),
        "[{name}] an outage of the store must hold the delivery, not nack it: {outage:?}"
    );
    // Handled, and nothing else; handled again only if the broker redelivered it because
    // its ack came after the ack timeout on a loaded machine (at least once, and this
    // scripted consumer keeps no dedup record).
    let ok = of("ok");
    assert!(
        !ok.is_empty() && ok.iter().all(|o| *o == Outcome::Handled),
        "[{name}] the healthy message: {ok:?}"
    );
    if harness.capabilities().dead_letter_inspection {
        let dead_letters = harness.dead_letters(&check.topic).await?;
        for tag in ["permanent", "transient", "panic"] {
            assert!(
                dead_letters
                    .iter()
                    .any(|(received, _)| received.payload.as_ref() == tag.as_bytes()),
                "[{name}] `{tag}` is not among the broker's dead letters: {dead_letters:?}"
            );
        }
    }
    Ok(())
}

/// Fails each message as its payload says.
struct Scripted {
    options: ConsumerOptions,
    /// Processings so far, by tag.
    seen: Mutex<HashMap<String, u32>>,
}

impl Process for Scripted {
    fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    async fn process(&self, received: &Received) -> Result<Outcome> {
        let tag = String::from_utf8_lossy(&received.payload).into_owned();
        let seen = {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            let count = seen.entry(tag.clone()).or_default();
            *count += 1;
            *count
        };
        match tag.as_str() {
            "permanent" => Err(Error::store_permanent(
                "value too long for type character varying(255)",
            )),
            "transient" => Err(Error::store_transient("deadlock detected")),
            "outage" if seen <= OUTAGES => Err(Error::store_outage("connection refused")),
            "panic" => panic!("a bug in the handler"),
            _ => Ok(Outcome::Handled),
        }
    }
}

/// The outcomes observed, by tag, and a signal once every message is settled for good.
#[derive(Default)]
struct Log {
    by_tag: Mutex<HashMap<String, Vec<Outcome>>>,
    all_final: Notify,
}

impl Log {
    fn settled(&self, received: &Received, outcome: &Outcome) {
        let tag = String::from_utf8_lossy(&received.payload).into_owned();
        let mut by_tag = self.by_tag.lock().unwrap_or_else(PoisonError::into_inner);
        by_tag.entry(tag).or_default().push(outcome.clone());
        let finals = by_tag
            .values()
            .filter(|settled| {
                matches!(
                    settled.last(),
                    Some(Outcome::Handled | Outcome::DeadLettered { .. })
                )
            })
            .count();
        if finals == SCRIPT.len() {
            self.all_final.notify_one();
        }
    }

    fn outcomes(&self) -> HashMap<String, Vec<Outcome>> {
        self.by_tag
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
