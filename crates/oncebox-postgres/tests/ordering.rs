//! Ordering beyond the conformance suite: commit order of concurrent producers, the
//! claim's two steps, its skipping of locked rows, and replay while a key is held.

mod common;

use std::time::{Duration, Instant};

use oncebox_core::Message;
use oncebox_core::spool::{Settle, Settlement, SpoolStore};
use oncebox_postgres::RowStatus;

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

/// A row locked by another transaction (a settle in progress after its lease ended) is
/// skipped, and so are the later rows of its key; other keys are claimed.
#[tokio::test(flavor = "multi_thread")]
async fn claim_skips_a_key_behind_a_locked_row() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let (k1, k2, j1) = (
        msg(Some("k"), "k1"),
        msg(Some("k"), "k2"),
        msg(Some("j"), "j1"),
    );
    enqueue(&outbox, &db.store, &[k1.clone(), k2, j1]).await;
    let (_, all) = claim(&outbox, 10, Duration::from_millis(100)).await;
    assert_eq!(labels(&all), ["k1", "k2", "j1"]);
    tokio::time::sleep(Duration::from_millis(250)).await;

    let mut settler = db.store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox WHERE id = $1::uuid FOR UPDATE")
        .bind(k1.id.to_string())
        .execute(&mut *settler)
        .await
        .unwrap();
    let started = Instant::now();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the claim never waits on row locks"
    );
    assert_eq!(labels(&rows), ["j1"], "k2 must not be claimed without k1");
    settler.rollback().await.unwrap();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["k1", "k2"]);
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

/// A dead row replayed while a relay holds later rows of its key with a held claim: the
/// replay waits until that claim is settled, so the key is never on two relays at once;
/// then the replayed row goes first.
#[tokio::test(flavor = "multi_thread")]
async fn replay_waits_for_the_held_claim_on_its_key() {
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
    let (holder, held) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&held), ["k2"], "k2 is free once k1 is dead");
    let replay = {
        let (outbox, id) = (outbox.clone(), k1.id);
        tokio::spawn(async move { outbox.replay_dead(id).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !replay.is_finished(),
        "the replay must wait for the claim holding k2"
    );
    let release = Settlement {
        seq: held[0].seq,
        outcome: Settle::Release,
    };
    outbox.settle(holder, &[release]).await.unwrap();
    let replayed = tokio::time::timeout(Duration::from_secs(5), replay)
        .await
        .expect("the replay goes on once the claim is settled")
        .unwrap()
        .unwrap();
    assert!(replayed);
    assert!(
        !outbox.replay_dead(k1.id).await.unwrap(),
        "only dead rows replay"
    );
    let (_, after) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&after), ["k1", "k2"], "k1 goes first again");
    let state = outbox.status(k1.id).await.unwrap().unwrap();
    assert_eq!((state.status, state.attempts), (RowStatus::Pending, 0));
    assert_eq!(state.last_error.as_deref(), Some("poison"));
}

/// A dead row replayed while a relay holds later rows of its key with a leased claim
/// waits for that relay's lease, so the key is never on two relays at once; then it goes
/// first.
#[tokio::test(flavor = "multi_thread")]
async fn replay_waits_for_the_lease_on_its_key() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_held_claims(false);
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
