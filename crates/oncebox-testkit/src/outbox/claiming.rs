//! Claim checks: order, per-key prefixes, concurrent claimers, lease expiry and fencing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{Claimed, LeaseToken, Settle, SpoolStore};
use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Message, MessageId};
use tokio::time::Instant;

use super::{
    LONG_LEASE, OutboxHarness, RowStatus, SHORT_LEASE, STEP, all_done, assert_state, claim, label,
    labels, message, outcome, released, settle, state,
};
use crate::support::{ok, within};

/// Claim returns due rows in commit order (the order of `seq`), each with the claim's
/// token, no more than the limit, and the message as enqueued (id, topic, key, kind,
/// headers, payload, creation time to the millisecond). Rows leased to one claim are not
/// returned to the next.
pub async fn claim_in_commit_order<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let first = vec![
        message(Some("a"), "a1"),
        message(Some("b"), "b1"),
        message(None, "n1"),
        message(Some("a"), "a2"),
    ];
    let second = vec![
        message(Some("c"), "c1"),
        message(Some("b"), "b2"),
        message(None, "n2"),
    ];
    ok(
        "enqueue the first transaction",
        harness.enqueue(&first).await,
    );
    ok(
        "enqueue the second transaction",
        harness.enqueue(&second).await,
    );
    let committed: Vec<Message> = first.iter().chain(&second).cloned().collect();

    let (first_token, head) = claim("claim with limit 3", &store, 3, LONG_LEASE).await;
    assert_eq!(
        labels(&head),
        ["a1", "b1", "n1"],
        "the first claim takes the 3 oldest rows in commit order"
    );
    let (second_token, middle) =
        claim("claim while a1 and b1 are leased", &store, 100, LONG_LEASE).await;
    assert_eq!(
        labels(&middle),
        ["c1", "n2"],
        "the second claim takes the remaining rows in commit order, except a2 and b2 whose keys are leased"
    );
    settle(
        "settle the first claim",
        &store,
        first_token,
        all_done(&head),
    )
    .await;
    let (third_token, tail) =
        claim("claim after a1 and b1 are done", &store, 100, LONG_LEASE).await;
    assert_eq!(
        labels(&tail),
        ["a2", "b2"],
        "a2 and b2 are claimable once a1 and b1 are done"
    );
    let mut rows: Vec<&Claimed<Message>> = head.iter().chain(&middle).chain(&tail).collect();
    rows.sort_by_key(|row| row.seq);
    let order: Vec<String> = rows.iter().map(|row| label(&row.item)).collect();
    assert_eq!(
        order,
        ["a1", "b1", "n1", "a2", "c1", "b2", "n2"],
        "seq must follow commit order"
    );
    for (row, sent) in rows.iter().zip(&committed) {
        let got = &row.item;
        let what = label(sent);
        assert_eq!(got.id, sent.id, "{what}: id changed in the store");
        assert_eq!(got.topic, sent.topic, "{what}: topic changed in the store");
        assert_eq!(got.key, sent.key, "{what}: key changed in the store");
        assert_eq!(got.kind, sent.kind, "{what}: kind changed in the store");
        assert_eq!(
            got.headers, sent.headers,
            "{what}: headers changed in the store"
        );
        assert_eq!(
            got.payload, sent.payload,
            "{what}: payload changed in the store"
        );
        let drift = (to_unix_millis(got.created_at) - to_unix_millis(sent.created_at)).abs();
        assert!(
            drift <= 1,
            "{what}: created_at changed by {drift} ms in the store"
        );
        assert_eq!(row.attempts, 0, "{what}: a fresh row has no attempts");
    }
    settle(
        "settle the second claim",
        &store,
        second_token,
        all_done(&middle),
    )
    .await;
    settle(
        "settle the third claim",
        &store,
        third_token,
        all_done(&tail),
    )
    .await;
    let (_, again) = claim("claim while every row is leased", &store, 100, LONG_LEASE).await;
    assert!(
        again.is_empty(),
        "leased rows were claimed again: {:?}",
        labels(&again)
    );
}

/// Each key's claimed rows form a prefix of its pending rows: while an earlier row of a
/// key is leased to another claim, or waits for a retry, no later row of that key is
/// claimed; other keys and rows without a key are not held up.
pub async fn per_key_prefix<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let [a1, b1, a2, n1, b2, a3, n2] = [
        ("a", "a1"),
        ("b", "b1"),
        ("a", "a2"),
        ("", "n1"),
        ("b", "b2"),
        ("a", "a3"),
        ("", "n2"),
    ]
    .map(|(key, name)| message((!key.is_empty()).then_some(key), name));
    ok(
        "enqueue",
        harness
            .enqueue(&[a1.clone(), b1.clone(), a2, n1, b2, a3, n2])
            .await,
    );

    let (first, rows1) = claim("first claim (limit 2)", &store, 2, LONG_LEASE).await;
    assert_eq!(
        labels(&rows1),
        ["a1", "b1"],
        "the first claim takes the two oldest rows"
    );
    let (second, rows2) = claim(
        "second claim while a1 and b1 are leased",
        &store,
        100,
        LONG_LEASE,
    )
    .await;
    assert_eq!(
        labels(&rows2),
        ["n1", "n2"],
        "while a1 and b1 are leased, only rows without a key are claimable (a2, b2, a3 must wait)"
    );

    let retry_at = SystemTime::now() + Duration::from_secs(60);
    let retry = Settle::Retry {
        at: retry_at,
        error: "broker unavailable".to_owned(),
    };
    settle(
        "settle a1 retry, b1 done",
        &store,
        first,
        vec![
            outcome(&rows1, &a1, retry),
            outcome(&rows1, &b1, Settle::Done),
        ],
    )
    .await;
    let (third, rows3) = claim("third claim after a1 failed", &store, 100, LONG_LEASE).await;
    assert_eq!(
        labels(&rows3),
        ["b2"],
        "b2 is free once b1 is done; a2 and a3 wait behind the retrying a1"
    );
    settle("settle n1, n2 done", &store, second, all_done(&rows2)).await;
    settle("settle b2 done", &store, third, all_done(&rows3)).await;
    let (_, rows4) = claim(
        "claim while a1 waits for its retry",
        &store,
        100,
        LONG_LEASE,
    )
    .await;
    assert!(
        rows4.is_empty(),
        "a retrying head blocks its key: claimed {:?}",
        labels(&rows4)
    );
}

/// Four claimers looping claim → settle over 8 keys and keyless rows never hold the
/// same row or the same key at once, always see a key's rows in commit order, and
/// deliver every row exactly once.
pub async fn concurrent_claimers_never_overlap<H: OutboxHarness>(harness: &H) {
    const CLAIMERS: usize = 4;
    const KEYS: usize = 8;
    const PER_KEY: usize = 20;
    let mut messages = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            messages.push(message(Some(&format!("key-{k}")), &format!("key-{k}/{i}")));
        }
        messages.push(message(None, &format!("free/{i}")));
    }
    for chunk in messages.chunks(12) {
        ok("enqueue", harness.enqueue(chunk).await);
    }
    let total = messages.len();

    #[derive(Default)]
    struct Seen {
        held_rows: HashSet<MessageId>,
        held_keys: HashMap<String, LeaseToken>,
        last_seq: HashMap<String, i64>,
        done: HashMap<MessageId, usize>,
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut claimers = tokio::task::JoinSet::new();
    for claimer in 0..CLAIMERS {
        let (store, seen) = (harness.store(), Arc::clone(&seen));
        claimers.spawn(async move {
            loop {
                {
                    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    if seen.done.len() == total {
                        return;
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "claimer {claimer}: rows still pending after 30 s"
                );
                let (token, rows) =
                    claim(&format!("claimer {claimer}"), &store, 5, LONG_LEASE).await;
                if rows.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                {
                    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    for row in &rows {
                        let what = label(&row.item);
                        assert!(
                            seen.held_rows.insert(row.item.id),
                            "row {what} is held by two claims at once"
                        );
                        let Some(key) = row.item.key.clone() else {
                            continue;
                        };
                        if let Some(holder) = seen.held_keys.insert(key.clone(), token) {
                            assert_eq!(
                                holder, token,
                                "key {key} is held by two claims at once (row {what})"
                            );
                        }
                        let last = seen.last_seq.insert(key.clone(), row.seq);
                        assert!(
                            last.is_none_or(|last| last < row.seq),
                            "key {key}: row {what} (seq {}) claimed after seq {last:?}",
                            row.seq
                        );
                    }
                }
                // "Publish" for a moment, so claims overlap in time.
                tokio::time::sleep(Duration::from_millis(dispatch_ms(claimer, rows.len()))).await;
                {
                    // Forget the rows before settling: they stay leased until the settle
                    // commits, so no other claim can take them in between.
                    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    for row in &rows {
                        seen.held_rows.remove(&row.item.id);
                        if let Some(key) = &row.item.key {
                            seen.held_keys.remove(key);
                        }
                        *seen.done.entry(row.item.id).or_default() += 1;
                    }
                }
                settle(
                    &format!("claimer {claimer} settles"),
                    &store,
                    token,
                    all_done(&rows),
                )
                .await;
            }
        });
    }
    while let Some(joined) = within(
        "4 concurrent claimers",
        Duration::from_secs(40),
        claimers.join_next(),
    )
    .await
    {
        if let Err(error) = joined {
            match error.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(error) => panic!("claimer task failed: {error}"),
            }
        }
    }
    {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        for m in &messages {
            assert_eq!(
                seen.done.get(&m.id).copied(),
                Some(1),
                "row {} must be delivered exactly once",
                label(m)
            );
        }
    }
    for m in &messages {
        assert_state(
            &format!("row {}", label(m)),
            &state(harness, m).await,
            RowStatus::Done,
            0,
        );
    }
}

/// A short pseudo-random dispatch time in 0..=3 ms, without a random dependency.
fn dispatch_ms(claimer: usize, rows: usize) -> u64 {
    ((claimer * 7 + rows * 3) % 4) as u64
}

/// A claim that is never settled (its relay crashed) leaves its rows leased until the
/// lease ends; then they are claimed again under a new token. The crashed claim's token
/// is fenced: its done, retry and dead settlements all change nothing.
pub async fn expired_lease_is_fenced<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let [a1, a2, n1] =
        [(Some("a"), "a1"), (Some("a"), "a2"), (None, "n1")].map(|(k, l)| message(k, l));
    ok(
        "enqueue",
        harness.enqueue(&[a1.clone(), a2.clone(), n1.clone()]).await,
    );
    let lease_start = Instant::now();
    let (crashed, rows) = claim("claim with a short lease", &store, 10, SHORT_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["a1", "a2", "n1"],
        "the first claim takes all rows"
    );
    let (late, during) = claim("claim during the lease", &store, 10, LONG_LEASE).await;
    if lease_start.elapsed() < SHORT_LEASE {
        assert!(
            during.is_empty(),
            "rows were claimed again during their lease: {:?}",
            labels(&during)
        );
    } else {
        // Too slow to tell: the lease had ended before the claim returned. Hand back.
        settle("release rows claimed late", &store, late, released(&during)).await;
    }

    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(150)).await;
    let (current, again) = claim("claim after the lease ended", &store, 10, LONG_LEASE).await;
    assert_eq!(
        labels(&again),
        ["a1", "a2", "n1"],
        "after the lease ends every row is claimable again"
    );
    assert_ne!(crashed, current, "the new claim must carry a new token");

    let stale = vec![
        outcome(
            &rows,
            &a1,
            Settle::Dead {
                reason: "stale dead".to_owned(),
            },
        ),
        outcome(&rows, &a2, Settle::Done),
        outcome(
            &rows,
            &n1,
            Settle::Retry {
                at: SystemTime::now(),
                error: "stale retry".to_owned(),
            },
        ),
    ];
    match within(
        "settle with the stale token",
        STEP,
        store.settle(crashed, &stale),
    )
    .await
    {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(other) => {
            panic!("settle with a stale token: expected Ok (ignored) or LeaseLost, got {other:?}")
        }
    }
    for m in [&a1, &a2, &n1] {
        let found = state(harness, m).await;
        assert_state(
            &format!("{} after the stale settle", label(m)),
            &found,
            RowStatus::Pending,
            0,
        );
        assert_eq!(
            found.last_error,
            None,
            "{}: the stale settle recorded an error",
            label(m)
        );
    }
    let (_, stolen) = claim(
        "claim while the new claim holds the rows",
        &store,
        10,
        LONG_LEASE,
    )
    .await;
    assert!(
        stolen.is_empty(),
        "the stale settle freed rows of the new claim: {:?}",
        labels(&stolen)
    );
    settle(
        "settle with the current token",
        &store,
        current,
        all_done(&again),
    )
    .await;
    for m in [&a1, &a2, &n1] {
        assert_state(
            &format!("{} after the current settle", label(m)),
            &state(harness, m).await,
            RowStatus::Done,
            0,
        );
    }
}
