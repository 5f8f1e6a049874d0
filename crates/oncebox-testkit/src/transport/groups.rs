//! Consumer groups: members share a group's messages, every group gets them all.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncebox_core::{Delivery, MessageId, Result, Subscriber};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout_at};

use super::TransportHarness;
use super::check::{Check, RETRY_PAUSE, skipped};

const MESSAGES: usize = 40;

/// Handling time per message, so that one member cannot take every message before the
/// other asks (as a real consumer would not).
const WORK: Duration = Duration::from_millis(5);

/// Two subscribers in one group each receive some of the messages and, acking them,
/// together receive each exactly once; a second group receives every message exactly
/// once too.
///
/// The messages have distinct keys, so that partitioned brokers spread them.
///
/// Skipped unless [`Capabilities::consumer_groups`](super::Capabilities::consumer_groups).
///
/// # Errors
///
/// A transport error that is not transient.
///
/// # Panics
///
/// If a group misses messages, receives one twice, or one member gets nothing.
pub async fn groups_share_work<H: TransportHarness>(harness: &H) -> Result<()> {
    if !harness.capabilities().consumer_groups {
        return skipped("groups_share_work", "consumer_groups");
    }
    let check = Check::start(harness, "groups_share_work").await?;
    let (mut first, mut second) = (
        check.subscribe("shared").await?,
        check.subscribe("shared").await?,
    );
    let mut alone = check.subscribe("alone").await?;
    let sent = check.publish(&check.messages(MESSAGES, MESSAGES)).await?;

    let (pair, solo) = (Team::new(MESSAGES), Team::new(MESSAGES));
    let (got_first, got_second, got_alone) = tokio::try_join!(
        pair.member(&check, &mut first),
        pair.member(&check, &mut second),
        solo.member(&check, &mut alone),
    )?;

    let name = check.name;
    assert!(
        !got_first.is_empty() && !got_second.is_empty(),
        "[{name}] one member of the group got every message ({} and {})",
        got_first.len(),
        got_second.len(),
    );
    let shared: Vec<_> = got_first.into_iter().chain(got_second).collect();
    assert_exactly_once(name, "the group of two", &sent, &shared);
    assert_exactly_once(name, "the second group", &sent, &got_alone);
    Ok(())
}

/// A group created after messages were published receives them all.
///
/// Skipped unless [`Capabilities::retained_log`](super::Capabilities::retained_log).
///
/// # Errors
///
/// A transport error that is not transient, or persists beyond the harness's patience.
///
/// # Panics
///
/// If a message published before the group existed does not reach it.
pub async fn late_group_receives_history<H: TransportHarness>(harness: &H) -> Result<()> {
    if !harness.capabilities().retained_log {
        return skipped("late_group_receives_history", "retained_log");
    }
    let check = Check::start(harness, "late_group_receives_history").await?;
    let sent = check.publish(&check.messages(5, 0)).await?;
    let mut late = check.subscribe("late").await?;
    let mut missing: HashSet<_> = sent.into_iter().collect();
    while !missing.is_empty() {
        let what = format!(
            "{} messages published before the group was created never reached it",
            missing.len()
        );
        let delivery = check.receive(&mut late, check.patience(), &what).await?;
        missing.remove(&check.id_of(&delivery));
        delivery.ack().await?;
    }
    Ok(())
}

/// The members of one group working through `total` messages together.
struct Team {
    total: usize,
    handled: AtomicUsize,
    done: watch::Sender<bool>,
}

impl Team {
    fn new(total: usize) -> Self {
        Self {
            total,
            handled: AtomicUsize::new(0),
            done: watch::Sender::new(false),
        }
    }

    /// Receives, "handles" and acks until the team has handled `total` messages; returns
    /// the ids this member handled.
    async fn member<H: TransportHarness>(
        &self,
        check: &Check<'_, H>,
        subscriber: &mut H::Subscriber,
    ) -> Result<Vec<MessageId>> {
        let mut done = self.done.subscribe();
        let limit = check.patience() + WORK * u32::try_from(self.total).unwrap_or(u32::MAX);
        let deadline = Instant::now() + limit;
        let mut mine = Vec::new();
        loop {
            let next = tokio::select! {
                biased;
                _ = done.wait_for(|done| *done) => return Ok(mine),
                next = timeout_at(deadline, subscriber.next()) => next,
            };
            let delivery = match next {
                Ok(Ok(delivery)) => delivery,
                Ok(Err(error)) if error.is_transient() => {
                    sleep(RETRY_PAUSE).await;
                    continue;
                }
                Ok(Err(error)) => return Err(error),
                Err(_) => panic!(
                    "[{}] a group received only {} of {} messages within {limit:?}",
                    check.name,
                    self.handled.load(Ordering::SeqCst),
                    self.total,
                ),
            };
            sleep(WORK).await;
            mine.push(check.id_of(&delivery));
            delivery.ack().await?;
            if self.handled.fetch_add(1, Ordering::SeqCst) + 1 >= self.total {
                self.done.send_replace(true);
            }
        }
    }
}

fn assert_exactly_once(check: &str, who: &str, sent: &[MessageId], got: &[MessageId]) {
    let unique: HashSet<_> = got.iter().collect();
    let missing = sent.iter().filter(|id| !unique.contains(id)).count();
    let repeats = got.len() - unique.len();
    let unknown = unique.iter().filter(|id| !sent.contains(id)).count();
    assert!(
        missing == 0 && repeats == 0 && unknown == 0,
        "[{check}] {who} should receive each of {} messages exactly once: {missing} missing, {repeats} repeated, {unknown} unknown",
        sent.len(),
    );
}
