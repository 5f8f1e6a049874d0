//! Ordering beyond the conformance suite, on PostgreSQL's own means: a claim skips a
//! row another transaction locked, and a head row rewritten during a claim keeps its
//! key's later rows back. (Producers' commit order, the claim window's two steps and a
//! replay while a key is held are the suite's `producers_of_a_key_commit_in_seq_order`,
//! `claim_finds_free_keys_behind_a_held_backlog`, `claim_step_two_reaches_every_key` and
//! `replay_waits_for_the_relay_holding_its_key`.)

mod common;

use std::time::{Duration, Instant};

use oncebox_core::Message;
use oncebox_core::spool::{Settle, SpoolStore};

use common::{LONG, TestDb, claim, enqueue, labels, msg};
use oncebox_testkit::fixtures::settle_all;

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
