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

/// How long after its enqueue the message cancelled in an open transaction is due: long
/// enough for the cancel to come first, on a loaded machine.
const DUE_IN: Duration = Duration::from_secs(1);

/// How long the cancel's transaction stays open once the cancel has returned: the
/// message is due for most of it, under a relay claiming all along.
const KEPT_OPEN: Duration = Duration::from_millis(2500);

/// A cancel is kept while its caller's transaction stays open, whatever a relay claims
/// meanwhile. Twice, each time under a running relay: a message of key `c` due in 1 s,
/// and the key's next message, due at once, behind it, and the first cancelled in a
/// transaction kept open for 2.5 s (past its due time, the relay claiming all along):
///
/// - committed: the cancel returned `true`, and the message is never published; the
///   key's next one goes out once the cancel committed, not before (had the caller
///   rolled back, it would have gone out first);
/// - rolled back: the cancel returned `true`, and the message goes out once the
///   transaction ended, before its key's next one.
pub async fn cancel_in_an_open_transaction_holds<H: OutboxHarness>(harness: &H) {
    let broker = MemoryBroker::new();
    let publisher = FailingPublisher::new(broker.publisher());
    let relay = ok(
        "relay",
        Relay::new(
            harness.store(),
            publisher.clone(),
            relay_options("cancel-kept-open"),
        ),
    );
    for commit in [true, false] {
        let end = if commit { "committed" } else { "rolled back" };
        let key = if commit { "c" } else { "r" };
        let cancelled = message(Some(key), &format!("cancelled, then {end}"));
        let behind = message(Some(key), &format!("behind the one {end}"));
        let enqueued = harness.enqueue_scheduled(&cancelled, Schedule::After(DUE_IN));
        ok(
            "enqueue the message to cancel",
            within("enqueue_scheduled", STEP, enqueued).await,
        );
        ok(
            "enqueue the key's next message",
            harness.enqueue(std::slice::from_ref(&behind)).await,
        );
        let start = Instant::now();
        let ended = std::sync::atomic::AtomicBool::new(false);
        let cancel = async {
            let cancelled = harness.cancel_kept_open(cancelled.id, KEPT_OPEN, commit);
            let cancelled = within("cancel_kept_open", KEPT_OPEN + STEP, cancelled).await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            ok("cancel in a transaction kept open", cancelled)
        };
        let expected = if commit {
            vec![&behind]
        } else {
            vec![&cancelled, &behind]
        };
        let relays = run_relays_until(
            "relay while the cancel's transaction is open, and after",
            std::slice::from_ref(&relay),
            KEPT_OPEN + STEP,
            || {
                let published = broker.published(TOPIC);
                ended.load(std::sync::atomic::Ordering::SeqCst)
                    && expected
                        .iter()
                        .all(|m| published.iter().any(|p| p.id == m.id))
            },
        );
        let (took_back, ()) = tokio::join!(cancel, relays);
        assert!(
            took_back,
            "the cancel of {}, not due before {DUE_IN:?}, found nothing to cancel",
            label(&cancelled)
        );

        let published: Vec<String> = broker
            .published(TOPIC)
            .iter()
            .filter(|p| p.key.as_deref() == Some(key))
            .map(label)
            .collect();
        let first_publish = |m: &Message| {
            publisher
                .attempts_of(m.id)
                .first()
                .map(|at| at.duration_since(start))
        };
        if commit {
            assert_eq!(
                published,
                [label(&behind)],
                "a message cancelled in a transaction that then committed was published \
                 (first attempt {:?} after the cancel began; the transaction was open for \
                 {KEPT_OPEN:?} after the cancel returned true)",
                first_publish(&cancelled)
            );
        } else {
            assert_eq!(
                published,
                [label(&cancelled), label(&behind)],
                "a cancel rolled back leaves the message to go out as normal, before its \
                 key's next one"
            );
        }
        let first = expected[0];
        let at = first_publish(first).unwrap_or_default();
        assert!(
            at >= KEPT_OPEN,
            "{} went out {at:?} after the cancel began, while the cancel's transaction was \
             still open ({KEPT_OPEN:?} at least)",
            label(first)
        );
    }
}
