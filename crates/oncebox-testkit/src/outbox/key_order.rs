//! Key order beyond one claim: producers of a key, claims past a window of held keys,
//! and a replay while a relay holds the key.

use std::collections::HashSet;
use std::time::Duration;

use oncebox_core::Message;
use oncebox_core::spool::{OutboxAdmin, Settle};
use tokio::time::Instant;

use super::capabilities::skipped;
use super::{
    LONG_LEASE, OutboxHarness, ProducerTx, RowStatus, STEP, all_done, assert_state, claim, label,
    labels, message, outcome, released, settle, state,
};
use crate::support::{ok, within};

/// How long a transaction that should wait is watched before it is judged waiting.
const WATCH: Duration = Duration::from_millis(300);

/// Two transactions enqueueing one key: the second waits for the first to commit, so
/// `seq` order is commit order; a transaction on another key, or without a key, does
/// not wait. Needs [`producer_key_locks`](super::Capabilities::producer_key_locks).
pub async fn producers_of_a_key_commit_in_seq_order<H: OutboxHarness>(harness: &H) {
    if !harness.capabilities().producer_key_locks {
        return skipped(
            "producers_of_a_key_commit_in_seq_order",
            "producer_key_locks",
        );
    }
    let first = message(Some("k"), "first");
    let second = message(Some("k"), "second");
    let mut holder = ok("begin the first producer", harness.begin().await);
    ok("enqueue first", holder.enqueue(&first).await);

    let others = [message(Some("j"), "other"), message(None, "free")];
    let other_keys = harness.enqueue(&others);
    ok(
        "a producer of other keys and of no key",
        within(
            "a producer of other keys while k's producer is open (it must not wait for it)",
            Duration::from_secs(5),
            other_keys,
        )
        .await,
    );

    let mut waiter = ok("begin the second producer", harness.begin().await);
    let waiting = {
        let second = second.clone();
        tokio::spawn(async move {
            waiter.enqueue(&second).await?;
            waiter.commit().await
        })
    };
    tokio::time::sleep(WATCH).await;
    assert!(
        !waiting.is_finished(),
        "a second producer of key k must wait for the first to commit"
    );
    ok("commit the first producer", holder.commit().await);
    let joined = within(
        "the second producer, once the first committed",
        Duration::from_secs(5),
        waiting,
    )
    .await;
    ok(
        "the second producer",
        joined.unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic())),
    );

    let store = harness.store();
    let (_, rows) = claim("claim everything", &store, 10, LONG_LEASE).await;
    let claimed = labels(&rows);
    let at = |label: &str| claimed.iter().position(|l| l == label);
    assert!(
        at("first").is_some() && at("first") < at("second") && at("other").is_some(),
        "seq follows commit order on key k (first, then second), all four rows claimed: {claimed:?}"
    );
}

/// When the first pending rows all belong to keys another relay holds, a claim finds
/// the free keys (and the rows without a key) behind them, each key as a prefix of its
/// rows. Needs [`claim_window`](super::Capabilities::claim_window).
pub async fn claim_finds_free_keys_behind_a_held_backlog<H: OutboxHarness>(harness: &H) {
    if !harness.capabilities().claim_window {
        return skipped(
            "claim_finds_free_keys_behind_a_held_backlog",
            "claim_window",
        );
    }
    let store = ok("a store with a window of 8 rows", harness.windowed(8));
    let mut messages: Vec<Message> = (0..40)
        .map(|i| {
            message(
                Some(&format!("hot-{}", i % 2)),
                &format!("hot-{}/{i}", i % 2),
            )
        })
        .collect();
    messages.extend((0..3).map(|i| message(Some(&format!("cold-{i}")), &format!("cold-{i}"))));
    messages.push(message(None, "free"));
    messages.push(message(Some("cold-0"), "cold-0/again"));
    ok("enqueue", harness.enqueue(&messages).await);

    let (_, held) = claim("another relay claims 2 rows", &store, 2, LONG_LEASE).await;
    assert_eq!(
        labels(&held),
        ["hot-0/0", "hot-1/1"],
        "another relay holds both hot keys"
    );
    let (token, rows) = claim("claim behind the hot keys", &store, 10, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["cold-0", "cold-1", "cold-2", "free", "cold-0/again"],
        "keys beyond the window are found, each as a prefix of its rows"
    );
    settle("settle them", &store, token, all_done(&rows)).await;
    let (_, none) = claim("claim again", &store, 10, LONG_LEASE).await;
    assert!(
        none.is_empty(),
        "only held keys remain, yet the claim took {:?}",
        labels(&none)
    );
}

/// Many keys beyond the window: successive claims move on through the keys, so every
/// key is reached although each claim looks at a bounded number of them; none is
/// claimed twice. Needs [`claim_window`](super::Capabilities::claim_window).
pub async fn claim_step_two_reaches_every_key<H: OutboxHarness>(harness: &H) {
    if !harness.capabilities().claim_window {
        return skipped("claim_step_two_reaches_every_key", "claim_window");
    }
    const KEYS: usize = 600;
    let store = ok("a store with a window of 4 rows", harness.windowed(4));
    let mut messages: Vec<Message> = (0..20)
        .map(|i| message(Some("hot"), &format!("hot/{i}")))
        .collect();
    messages.extend((0..KEYS).map(|i| message(Some(&format!("k{i:03}")), &format!("k{i:03}"))));
    ok("enqueue", harness.enqueue(&messages).await);
    let (_, held) = claim("another relay claims 1 row", &store, 1, LONG_LEASE).await;
    assert_eq!(labels(&held), ["hot/0"], "another relay holds the hot key");
    let mut seen = HashSet::new();
    for round in 0..100 {
        let (token, rows) = claim(&format!("claim {round}"), &store, 7, LONG_LEASE).await;
        for row in &rows {
            assert!(
                seen.insert(label(&row.item)),
                "{} was claimed twice",
                label(&row.item)
            );
        }
        settle(
            &format!("settle claim {round}"),
            &store,
            token,
            all_done(&rows),
        )
        .await;
        if seen.len() == KEYS {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        KEYS,
        "every free key is claimed in the end (the hot key stays held)"
    );
}

/// A dead row replayed while a relay holds later rows of its key: the key is never on
/// two relays at once, and once that relay is gone the replayed row goes first again,
/// pending, unattempted, its last error kept. With
/// [`held_claims`](super::Capabilities::held_claims) the replay waits until the claim
/// is settled; without, it returns at once and the row is not claimed before the
/// holder's lease ends.
pub async fn replay_waits_for_the_relay_holding_its_key<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    let store = harness.store();
    let (k1, k2) = (message(Some("k"), "k1"), message(Some("k"), "k2"));
    ok("enqueue", harness.enqueue(&[k1.clone(), k2.clone()]).await);
    let (token, rows) = claim("claim k1", &store, 1, LONG_LEASE).await;
    let poison = Settle::Dead {
        reason: "poison".into(),
    };
    settle("k1 dead", &store, token, vec![outcome(&rows, &k1, poison)]).await;

    if harness.capabilities().held_claims {
        let (holder, held) = claim("another relay claims k2", &store, 10, LONG_LEASE).await;
        assert_eq!(labels(&held), ["k2"], "k2 is free once k1 is dead");
        let replay = {
            let (store, id) = (harness.store(), k1.id);
            tokio::spawn(async move { store.replay_dead(id).await })
        };
        tokio::time::sleep(WATCH).await;
        assert!(
            !replay.is_finished(),
            "the replay of k1 must wait for the claim holding k2"
        );
        settle("release k2", &store, holder, released(&held)).await;
        let replayed = within("the replay, once k2 is released", STEP, replay).await;
        let replayed =
            replayed.unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
        assert!(ok("replay k1", replayed), "the dead k1 replays");
    } else {
        let lease = Duration::from_millis(600);
        let (_, held) = claim("another relay claims k2", &store, 10, lease).await;
        assert_eq!(labels(&held), ["k2"], "k2 is free once k1 is dead");
        let replayed_at = Instant::now();
        assert!(
            ok("replay k1", store.replay_dead(k1.id).await),
            "the dead k1 replays"
        );
        let (_, early) = claim("claim during k2's lease", &store, 10, LONG_LEASE).await;
        if replayed_at.elapsed() < lease {
            assert!(
                early.is_empty(),
                "{:?} was claimed while k2's relay held the key",
                labels(&early)
            );
        }
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
    }
    assert!(
        !ok("replay k1 again", store.replay_dead(k1.id).await),
        "only dead rows replay"
    );
    let (_, after) = claim("claim after the holder", &store, 10, LONG_LEASE).await;
    assert_eq!(labels(&after), ["k1", "k2"], "k1 goes first again");
    let replayed = state(harness, &k1).await;
    assert_state("the replayed k1", &replayed, RowStatus::Pending, 0);
    assert_eq!(
        replayed.last_error.as_deref(),
        Some("poison"),
        "a replayed row keeps its last error"
    );
}

/// A batch takes its keys' locks in a fixed order, the store's, not the slice's: while
/// a producer holds the lock of the lower key, a batch of [higher, lower] waits for it
/// without holding the higher one, so the producer can still enqueue the higher key (in
/// slice order the two would deadlock). Per key, the rows are then claimed in commit
/// order. Needs [`producer_key_locks`](super::Capabilities::producer_key_locks), and the
/// harness's [`keys_in_lock_order`](OutboxHarness::keys_in_lock_order).
pub async fn batch_takes_key_locks_in_a_fixed_order<H: OutboxHarness>(harness: &H) {
    if !harness.capabilities().producer_key_locks {
        return skipped(
            "batch_takes_key_locks_in_a_fixed_order",
            "producer_key_locks",
        );
    }
    let (low, high) = ok("two keys in lock order", harness.keys_in_lock_order().await);
    let mut holder = ok("begin the holder", harness.begin().await);
    ok(
        "the holder enqueues the lower key",
        holder.enqueue(&message(Some(&low), "holder-low")).await,
    );
    let batch = [
        message(Some(&high), "batch-high"),
        message(Some(&low), "batch-low"),
    ];
    let batching = harness.enqueue_batch("locks-in-order", &batch, true);
    tokio::pin!(batching);
    assert!(
        tokio::time::timeout(WATCH, &mut batching).await.is_err(),
        "the batch must wait for the lower key's lock, which the holder's enqueue took"
    );
    let holder_high = message(Some(&high), "holder-high");
    ok(
        "the holder enqueues the higher key (a batch locking in slice order deadlocks here)",
        within(
            "the holder's enqueue of the higher key while the batch waits",
            STEP,
            holder.enqueue(&holder_high),
        )
        .await,
    );
    ok("commit the holder", holder.commit().await);
    ok(
        "the batch, once the holder committed",
        within("the batch, once the holder committed", STEP, batching).await,
    );

    let store = harness.store();
    let (_, rows) = claim("claim everything", &store, 10, LONG_LEASE).await;
    let of = |key: &str| -> Vec<String> {
        rows.iter()
            .filter(|row| row.item.key.as_deref() == Some(key))
            .map(|row| label(&row.item))
            .collect()
    };
    assert_eq!(
        of(&low),
        ["holder-low", "batch-low"],
        "the lower key's rows"
    );
    assert_eq!(
        of(&high),
        ["holder-high", "batch-high"],
        "the higher key's rows"
    );
}
