//! Ordering beyond the conformance suite: commit order of concurrent producers, the
//! claim's two steps, its skipping of locked rows, and replay while a key is held.

mod common;

use std::time::{Duration, Instant};

use oncebox_core::Message;
use oncebox_core::spool::{Settle, Settlement, SpoolStore};
use oncebox_mysql::RowStatus;

use common::{LONG, TestDb, claim, done, enqueue, label, labels, msg};

/// Two transactions enqueueing the same key: the second waits for the first to commit,
/// so `seq` order is commit order; a transaction on another key does not wait.
#[tokio::test(flavor = "multi_thread")]
async fn same_key_producers_commit_in_seq_order() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let first = msg(Some("k"), "first");
    let second = msg(Some("k"), "second");
    let mut t1 = db.store.pool().begin().await.unwrap();
    outbox.enqueue(&mut t1, &first).await.unwrap();

    let other = {
        let (store, outbox) = (db.store.clone(), outbox.clone());
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            outbox
                .enqueue(&mut tx, &msg(Some("j"), "other"))
                .await
                .unwrap();
            outbox.enqueue(&mut tx, &msg(None, "free")).await.unwrap();
            tx.commit().await.unwrap();
        })
    };
    tokio::time::timeout(Duration::from_secs(5), other)
        .await
        .expect("other keys and unkeyed messages do not wait for the key lock")
        .unwrap();

    let waiter = {
        let (store, outbox, second) = (db.store.clone(), outbox.clone(), second.clone());
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            outbox.enqueue(&mut tx, &second).await.unwrap();
            tx.commit().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "a second producer of the same key must wait for the first to commit"
    );
    t1.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the second producer goes on once the first committed")
        .unwrap();
    let a = outbox.status(first.id).await.unwrap().unwrap();
    let b = outbox.status(second.id).await.unwrap().unwrap();
    assert!(
        a.seq < b.seq,
        "seq follows commit order: {} then {}",
        a.seq,
        b.seq
    );
}

/// A claim's window passes over the rows of the live claims its process made, whose
/// keys it remembers: a later row of such a key is not claimed, as it is not by a
/// process that reads those rows; other keys are.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_passes_over_its_own_claims_and_keeps_their_keys() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let (k1, k2, j1) = (
        msg(Some("k"), "k1"),
        msg(Some("k"), "k2"),
        msg(Some("j"), "j1"),
    );
    enqueue(&outbox, &db.store, &[k1, k2, j1]).await;
    let (token, first) = claim(&outbox, 1, LONG).await;
    assert_eq!(labels(&first), ["k1"]);

    // Another handle is another process as far as claims go: it reads k1's row.
    let elsewhere = db.store.outbox();
    let (_, rows) = claim(&elsewhere, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        ["j1"],
        "k2 must not be claimed while k1 is held"
    );

    let (_, rows) = claim(&outbox.clone(), 10, LONG).await;
    assert!(rows.is_empty(), "k2 stays held back: {:?}", labels(&rows));

    outbox.settle(token, &done(&first)).await.unwrap();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["k2"]);
}

/// When the first pending rows all belong to keys held by other relays, the claim's
/// second step finds the free keys (and unordered rows) behind them.
#[tokio::test(flavor = "multi_thread")]
async fn claim_finds_free_keys_behind_a_held_backlog() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_claim_window(8);
    let mut messages: Vec<Message> = (0..40)
        .map(|i| {
            msg(
                Some(&format!("hot-{}", i % 2)),
                &format!("hot-{}/{i}", i % 2),
            )
        })
        .collect();
    messages.extend((0..3).map(|i| msg(Some(&format!("cold-{i}")), &format!("cold-{i}"))));
    messages.push(msg(None, "free"));
    messages.push(msg(Some("cold-0"), "cold-0/again"));
    enqueue(&outbox, &db.store, &messages).await;

    let (_, held) = claim(&outbox, 2, LONG).await;
    assert_eq!(
        labels(&held),
        ["hot-0/0", "hot-1/1"],
        "another relay holds both hot keys"
    );
    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        ["cold-0", "cold-1", "cold-2", "free", "cold-0/again"],
        "keys beyond the window are found, each as a prefix of its rows"
    );
    outbox.settle(token, &done(&rows)).await.unwrap();
    let (_, none) = claim(&outbox, 10, LONG).await;
    assert!(
        none.is_empty(),
        "only held keys remain: {:?}",
        labels(&none)
    );
}

/// Many keys beyond the window: successive claims move the key cursor on, so every key
/// is reached even though each claim probes a bounded number of keys.
#[tokio::test(flavor = "multi_thread")]
async fn claim_step_two_reaches_every_key() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_claim_window(4);
    let mut messages: Vec<Message> = (0..20)
        .map(|i| msg(Some("hot"), &format!("hot/{i}")))
        .collect();
    messages.extend((0..600).map(|i| msg(Some(&format!("k{i:03}")), &format!("k{i:03}"))));
    enqueue(&outbox, &db.store, &messages).await;
    let (_, held) = claim(&outbox, 1, LONG).await;
    assert_eq!(labels(&held), ["hot/0"]);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        let (token, rows) = claim(&outbox, 7, LONG).await;
        for row in &rows {
            assert!(
                seen.insert(label(&row.item)),
                "claimed twice: {}",
                label(&row.item)
            );
        }
        outbox.settle(token, &done(&rows)).await.unwrap();
        if seen.len() == 600 {
            break;
        }
    }
    assert_eq!(seen.len(), 600, "every free key is claimed in the end");
}

/// A dead row replayed while a relay holds later rows of its key waits for that relay's
/// lease, so the key is never on two relays at once; then it goes first.
#[tokio::test(flavor = "multi_thread")]
async fn replay_waits_for_the_relay_holding_its_key() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let (k1, k2) = (msg(Some("k"), "k1"), msg(Some("k"), "k2"));
    enqueue(&outbox, &db.store, &[k1.clone(), k2.clone()]).await;
    let (token, rows) = claim(&outbox, 1, LONG).await;
    let dead = Settlement {
        seq: rows[0].seq,
        outcome: Settle::Dead {
            reason: "poison".into(),
        },
    };
    outbox.settle(token, &[dead]).await.unwrap();
    let lease = Duration::from_millis(600);
    let (_, holder) = claim(&outbox, 10, lease).await;
    assert_eq!(labels(&holder), ["k2"], "k2 is free once k1 is dead");
    let replayed_at = Instant::now();
    assert!(outbox.replay_dead(k1.id).await.unwrap());
    assert!(
        !outbox.replay_dead(k1.id).await.unwrap(),
        "only dead rows replay"
    );
    let (_, early) = claim(&outbox, 10, LONG).await;
    if replayed_at.elapsed() < lease {
        assert!(
            early.is_empty(),
            "k1 was claimed while k2's relay held the key"
        );
    }
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let (_, after) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&after),
        ["k1", "k2"],
        "after the lease k1 goes first again"
    );
    let state = outbox.status(k1.id).await.unwrap().unwrap();
    assert_eq!((state.status, state.attempts), (RowStatus::Pending, 0));
    assert_eq!(state.last_error.as_deref(), Some("poison"));
}
