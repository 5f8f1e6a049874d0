//! Scheduled messages: published when due and not before, behind nothing but their key,
//! cancelled before they go out, counted apart from the pending ones.

use std::time::Duration;

use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{OutboxAdmin, Relay};
use oncebox_core::{Message, Schedule};
use tokio::time::Instant;

use super::relay::{FailingPublisher, relay_options, run_relays_until};
use super::{
    LONG_LEASE, OutboxHarness, RowStatus, STEP, TOPIC, all_done, assert_state, claim, label,
    message, settle, state,
};
use crate::support::{ok, within};

/// How far ahead the scheduled messages are due: long enough for the enqueues and the
/// first figures to be done before, on a loaded machine.
const AHEAD: Duration = Duration::from_secs(4);

/// Under a running relay:
///
/// - `later`, scheduled 4 s ahead, is published after 4 s and not before;
/// - `k1`, scheduled 4 s ahead, holds back `k2`, enqueued after it on the same key and
///   due at once: `k2` goes out after `k1`, never before;
/// - `now`, without a key and due at once, goes out at once, behind nothing;
/// - `cancelled`, scheduled 2 s ahead and cancelled, is never published (a second cancel,
///   and the cancel of a published message, find nothing);
/// - until they are due, [`OutboxAdmin::stats`] counts `later` and `k1` as scheduled,
///   not pending, and the age of the oldest pending row does not count from `later`'s
///   creation, an hour back.
pub async fn scheduled_messages_wait_for_their_time<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    let mut later = message(None, "later");
    later.created_at = std::time::SystemTime::now() - Duration::from_secs(3600);
    let (k1, k2) = (message(Some("k"), "k1"), message(Some("k"), "k2"));
    let now = message(None, "now");
    let cancelled = message(Some("c"), "cancelled");
    let start = Instant::now();
    for (scheduled, ahead) in [(&later, AHEAD), (&k1, AHEAD), (&cancelled, AHEAD / 2)] {
        let enqueued = harness.enqueue_scheduled(scheduled, Schedule::After(ahead));
        ok(
            &format!("enqueue {} scheduled", label(scheduled)),
            within("enqueue_scheduled", STEP, enqueued).await,
        );
    }
    ok(
        "enqueue k2 and now",
        harness.enqueue(&[k2.clone(), now.clone()]).await,
    );
    let took_back = ok(
        "cancel",
        within("cancel", STEP, harness.cancel(cancelled.id)).await,
    );
    assert!(
        took_back,
        "a scheduled message that has not gone out is cancelled"
    );
    let again = ok(
        "cancel again",
        within("cancel", STEP, harness.cancel(cancelled.id)).await,
    );
    assert!(!again, "a cancelled message cannot be cancelled twice");

    let outbox = harness.store();
    let stats = ok("stats", within("stats", STEP, outbox.stats()).await);
    assert_eq!(
        (stats.scheduled, stats.pending),
        (2, 2),
        "later and k1 are scheduled; k2 and now are pending; the cancelled one is gone: {stats:?}"
    );
    if let Some(age) = stats.oldest_pending_age {
        assert!(
            age < AHEAD,
            "the oldest pending age does not count a scheduled row from its creation: {stats:?}"
        );
    }

    let broker = MemoryBroker::new();
    let publisher = FailingPublisher::new(broker.publisher());
    let relay = ok(
        "relay",
        Relay::new(
            outbox.clone(),
            publisher.clone(),
            relay_options("scheduled"),
        ),
    );
    let expected = [&now, &later, &k1, &k2];
    let all_out = || {
        let published = broker.published(TOPIC);
        expected
            .iter()
            .all(|m| published.iter().any(|p| p.id == m.id))
    };
    run_relays_until(
        "publish the due and the scheduled messages",
        std::slice::from_ref(&relay),
        AHEAD + Duration::from_secs(5),
        all_out,
    )
    .await;
    // The cancelled message was due 2 s after the start: give a relay time to find it.
    let past_due = start + AHEAD / 2 + Duration::from_millis(500);
    run_relays_until(
        "look for the cancelled message",
        std::slice::from_ref(&relay),
        Duration::from_secs(2),
        || Instant::now() >= past_due,
    )
    .await;

    let first_publish = |m: &Message| {
        publisher
            .attempts_of(m.id)
            .first()
            .map(|at| at.duration_since(start))
            .unwrap_or_else(|| panic!("{} was never published", label(m)))
    };
    assert!(
        first_publish(&now) < AHEAD,
        "a message due at once goes out at once, behind no scheduled one: {:?}",
        first_publish(&now)
    );
    for scheduled in [&later, &k1] {
        let at = first_publish(scheduled);
        assert!(
            at >= AHEAD,
            "{} was published {at:?} after the start, before its time ({AHEAD:?})",
            label(scheduled)
        );
    }
    let order: Vec<String> = broker
        .published(TOPIC)
        .iter()
        .filter(|p| p.key.as_deref() == Some("k"))
        .map(label)
        .collect();
    assert_eq!(
        order,
        ["k1", "k2"],
        "k2, due first, waits behind k1, scheduled earlier on its key"
    );
    assert!(first_publish(&k2) >= AHEAD, "k2 went out before k1 was due");
    assert!(
        !broker.published(TOPIC).iter().any(|p| p.id == cancelled.id),
        "a cancelled message is never published"
    );
    let published = ok("cancel a published message", harness.cancel(now.id).await);
    assert!(!published, "a published message cannot be cancelled");
    let stats = ok("stats", within("stats", STEP, outbox.stats()).await);
    assert_eq!(
        (stats.scheduled, stats.pending),
        (0, 0),
        "nothing is scheduled or pending once all went out: {stats:?}"
    );
}

/// A cancel never takes back a message a relay is publishing: with the message claimed
/// (and settled done 300 ms later, as a relay would after the broker's confirm), the
/// cancel finds nothing to cancel — at once where the claim is a lease, after the
/// claim's end where it holds the row in a transaction — and the row ends published.
pub async fn cancel_never_takes_a_claimed_message<H: OutboxHarness>(harness: &H) {
    let claimed = message(Some("c"), "claimed");
    ok(
        "enqueue",
        harness.enqueue(std::slice::from_ref(&claimed)).await,
    );
    let store = harness.store();
    let (token, rows) = claim("claim the message", &store, 10, LONG_LEASE).await;
    assert_eq!(rows.len(), 1, "the message is claimed");
    let cancel = async {
        ok(
            "cancel a claimed message",
            within("cancel", STEP, harness.cancel(claimed.id)).await,
        )
    };
    let publish = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        settle("settle the claim done", &store, token, all_done(&rows)).await;
    };
    let (cancelled, ()) = tokio::join!(cancel, publish);
    assert!(!cancelled, "a message being published cannot be cancelled");
    assert_state(
        "the claimed message after the cancel",
        &state(harness, &claimed).await,
        RowStatus::Done,
        0,
    );
}
