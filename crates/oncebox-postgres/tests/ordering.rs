//! Ordering beyond the conformance suite: commit order of concurrent producers, the
//! claim's two steps, its skipping of locked rows, and replay while a key is held.

mod common;

use std::time::{Duration, Instant};

use oncebox_core::Message;
use oncebox_core::spool::{Settle, Settlement, SpoolStore};
use oncebox_postgres::RowStatus;

use common::{LONG, TestDb, claim, done, enqueue, label, labels, msg};
use oncebox_testkit::fixtures::settle_all;

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

/// Keys whose head row another relay keeps rewriting while claims run: each rewrite is
/// the settlement of a retry already due (one more attempt, due at once), committed
/// between some claim statement's snapshot and its row locks. The lock then takes the
/// row's new version, which the statement's snapshot cannot see. Every claim, held or
/// leased, by each of its paths (the fast claim, step 1, step 2), must still return each
/// key as a prefix of its rows: never a key's later rows without its head.
#[tokio::test(flavor = "multi_thread")]
async fn a_head_rewritten_during_a_claim_keeps_its_later_rows_back() {
    const KEYS: usize = 32;
    const TAILS: usize = 3;
    const ROUNDS: usize = 400;
    let db = TestDb::new().await;
    let writer = db.store.outbox();
    // Key `x` first. With `x1` locked by another transaction, a held claim's fast claim
    // is blocked and step 1 runs (a leased claim has no fast claim); with a window of
    // `x`'s four rows, step 2 runs.
    let mut messages: Vec<Message> = (1..=4).map(|i| msg(Some("x"), &format!("x{i}"))).collect();
    messages.extend((0..KEYS).map(|k| msg(Some(&format!("k{k}")), &format!("k{k}/0"))));
    for t in 1..=TAILS {
        messages.extend((0..KEYS).map(|k| msg(Some(&format!("k{k}")), &format!("k{k}/{t}"))));
    }
    enqueue(&writer, &db.store, &messages).await;
    let heads: Vec<String> = (0..KEYS).map(|k| format!("k{k}/0")).collect();

    // The other relay: settles the heads no claim holds as retries already due.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rewriter = {
        let (pool, stop, heads) = (db.store.pool().clone(), stop.clone(), heads.clone());
        tokio::spawn(async move {
            let mut rewrites = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sqlx::query(
                    "UPDATE outbox SET attempts = attempts + 1, last_error = 'retry',
                            available_at = statement_timestamp()
                     WHERE seq IN (
                       SELECT seq FROM outbox
                       WHERE convert_from(payload, 'UTF8') = ANY($1) AND status = 'pending'
                         AND (lease_until IS NULL OR lease_until <= statement_timestamp())
                       FOR UPDATE SKIP LOCKED)",
                )
                .bind(&heads)
                .execute(&pool)
                .await
                .expect("rewrite the heads");
                rewrites += 1;
            }
            rewrites
        })
    };

    let cases = [
        ("held, fast claim", true, None, false),
        ("held, step 1", true, None, true),
        ("held, step 2", true, Some(4), true),
        ("leased, step 1", false, None, false),
        ("leased, step 2", false, Some(4), true),
    ];
    let mut broken = Vec::new();
    for (case, held, window, lock_x1) in cases {
        let mut outbox = db.store.outbox().with_held_claims(held);
        if let Some(rows) = window {
            outbox = outbox.with_claim_window(rows);
        }
        let mut blocker = db.store.pool().begin().await.expect("begin");
        if lock_x1 {
            sqlx::query(
                "SELECT 1 FROM outbox WHERE convert_from(payload, 'UTF8') = 'x1' FOR UPDATE",
            )
            .execute(&mut *blocker)
            .await
            .expect("lock x1");
        }
        for _ in 0..ROUNDS {
            let (token, rows) = claim(&outbox, 200, LONG).await;
            let claimed = labels(&rows);
            for k in 0..KEYS {
                let key = format!("k{k}/");
                let has_head = claimed.contains(&format!("{key}0"));
                let of_key = claimed.iter().filter(|l| l.starts_with(&key)).count();
                if of_key > 0 && !has_head {
                    broken.push(format!("{case}: k{k}'s later rows without its head"));
                }
            }
            let release = settle_all(&rows, &Settle::Release);
            outbox.settle(token, &release).await.expect("release");
        }
        blocker.rollback().await.expect("rollback");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = rewriter.await.expect("the rewriter");
    assert!(rewrites > 0, "the heads were rewritten");
    assert!(
        broken.is_empty(),
        "{} claims broke per-key order: {:?}",
        broken.len(),
        &broken[..broken.len().min(10)]
    );
}
