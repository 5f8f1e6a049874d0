//! Settlement and enqueue checks: retry, dead, release, purge, rollback, bad input.

use std::time::{Duration, SystemTime};

use oncebox_core::spool::{LeaseToken, Settle, Settlement, SpoolStore};
use oncebox_core::{Bytes, Error, InvalidMessage, Message, MessageId};

use super::{
    LONG_LEASE, OutboxHarness, RowStatus, SHORT_LEASE, all_done, assert_state, claim, label,
    labels, message, outcome, released, settle, state,
};
use crate::support::ok;

/// A retry counts the attempt, records the error, hands the row back for later and
/// holds its key: the row (and the rows behind it) is not claimed before the time the
/// retry named, and is claimed after it, with the attempt count.
pub async fn retry_counts_and_waits<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let (head, next) = (message(Some("k"), "k1"), message(Some("k"), "k2"));
    ok(
        "enqueue",
        harness.enqueue(&[head.clone(), next.clone()]).await,
    );
    let (token, rows) = claim("first claim", &store, 10, LONG_LEASE).await;
    assert_eq!(labels(&rows), ["k1", "k2"]);
    let wait = Duration::from_millis(400);
    let at = SystemTime::now() + wait;
    let retry = Settle::Retry {
        at,
        error: "broker said no".to_owned(),
    };
    settle(
        "settle k1 retry, k2 release",
        &store,
        token,
        vec![
            outcome(&rows, &head, retry),
            outcome(&rows, &next, Settle::Release),
        ],
    )
    .await;
    let found = state(harness, &head).await;
    assert_state("k1 after a retry", &found, RowStatus::Pending, 1);
    assert_eq!(
        found.last_error.as_deref(),
        Some("broker said no"),
        "k1: the retry's error must be recorded"
    );
    assert_state(
        "k2 after a release",
        &state(harness, &next).await,
        RowStatus::Pending,
        0,
    );

    let (late, early) = claim("claim before the retry time", &store, 10, LONG_LEASE).await;
    if SystemTime::now() < at {
        assert!(
            early.is_empty(),
            "rows claimed before the retry was due: {:?}",
            labels(&early)
        );
    } else {
        // Too slow to tell: the retry was due before the claim returned. Hand back.
        settle("release rows claimed late", &store, late, released(&early)).await;
    }
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    let (token, due) = claim("claim after the retry time", &store, 10, LONG_LEASE).await;
    assert_eq!(
        labels(&due),
        ["k1", "k2"],
        "once k1 is due, k1 and the rows behind it are claimed"
    );
    assert_eq!(
        (due[0].attempts, due[1].attempts),
        (1, 0),
        "claimed rows carry their attempt counts"
    );

    let retry = Settle::Retry {
        at: SystemTime::now() + LONG_LEASE,
        error: "still down".to_owned(),
    };
    settle(
        "settle k1 retry again",
        &store,
        token,
        vec![
            outcome(&due, &head, retry),
            outcome(&due, &next, Settle::Release),
        ],
    )
    .await;
    let found = state(harness, &head).await;
    assert_state("k1 after a second retry", &found, RowStatus::Pending, 2);
    assert_eq!(
        found.last_error.as_deref(),
        Some("still down"),
        "k1: the latest error replaces the earlier one"
    );
}

/// Dead-lettering counts the attempt and stores the reason; the dead row is never
/// claimed again, and the rows behind it in its key are claimable at once.
pub async fn dead_stores_reason_and_unblocks<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let (poison, next) = (message(Some("k"), "k1"), message(Some("k"), "k2"));
    ok(
        "enqueue",
        harness.enqueue(&[poison.clone(), next.clone()]).await,
    );
    let (token, rows) = claim("first claim", &store, 10, LONG_LEASE).await;
    let reason = "permanent failure: payload is not valid JSON";
    settle(
        "settle k1 dead, k2 release",
        &store,
        token,
        vec![
            outcome(
                &rows,
                &poison,
                Settle::Dead {
                    reason: reason.to_owned(),
                },
            ),
            outcome(&rows, &next, Settle::Release),
        ],
    )
    .await;
    let found = state(harness, &poison).await;
    assert_state("k1 after dead", &found, RowStatus::Dead, 1);
    assert_eq!(
        found.last_error.as_deref(),
        Some(reason),
        "k1: the dead-letter reason must be stored"
    );

    let (token, rows) = claim("claim after k1 died", &store, 10, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["k2"],
        "a dead row no longer blocks its key, and is not claimed itself"
    );
    settle("settle k2 done", &store, token, all_done(&rows)).await;
    let (_, rows) = claim("claim after everything settled", &store, 10, LONG_LEASE).await;
    assert!(
        rows.is_empty(),
        "a dead row was claimed: {:?}",
        labels(&rows)
    );
    assert_state(
        "k1 stays dead",
        &state(harness, &poison).await,
        RowStatus::Dead,
        1,
    );
}

/// Release ends the lease without counting an attempt or recording an error: the row
/// is claimable again at once.
pub async fn release_counts_nothing<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let row = message(Some("k"), "k1");
    ok("enqueue", harness.enqueue(std::slice::from_ref(&row)).await);
    for round in 1..=3 {
        let (token, rows) = claim(&format!("claim #{round}"), &store, 10, LONG_LEASE).await;
        assert_eq!(
            labels(&rows),
            ["k1"],
            "claim #{round}: a released row is claimable at once"
        );
        assert_eq!(
            rows[0].attempts, 0,
            "claim #{round}: a release must not count an attempt"
        );
        settle(
            "settle release",
            &store,
            token,
            vec![outcome(&rows, &row, Settle::Release)],
        )
        .await;
        let found = state(harness, &row).await;
        assert_state(
            &format!("after release #{round}"),
            &found,
            RowStatus::Pending,
            0,
        );
        assert_eq!(found.last_error, None, "a release must not record an error");
    }
}

/// Purge deletes done rows settled before `before` and nothing else (not pending,
/// leased, retrying or dead rows, not rows settled later), at most `limit` per call.
pub async fn purge_is_bounded_and_selective<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let done: Vec<Message> = (0..5).map(|i| message(None, &format!("done{i}"))).collect();
    let (dead, retrying) = (message(None, "dead"), message(None, "retrying"));
    let mut all = done.clone();
    all.extend([dead.clone(), retrying.clone()]);
    ok("enqueue", harness.enqueue(&all).await);
    let (token, rows) = claim("claim", &store, 100, LONG_LEASE).await;
    let mut settlements: Vec<Settlement> = done
        .iter()
        .map(|m| outcome(&rows, m, Settle::Done))
        .collect();
    settlements.push(outcome(
        &rows,
        &dead,
        Settle::Dead {
            reason: "poison".to_owned(),
        },
    ));
    let retry = Settle::Retry {
        at: SystemTime::now() + LONG_LEASE,
        error: "down".to_owned(),
    };
    settlements.push(outcome(&rows, &retrying, retry));
    settle("settle", &store, token, settlements).await;
    let (leased, pending) = (message(None, "leased"), message(None, "pending"));
    ok(
        "enqueue more",
        harness.enqueue(&[leased.clone(), pending.clone()]).await,
    );
    let (_, leased_rows) = claim("claim one more", &store, 1, LONG_LEASE).await;
    assert_eq!(labels(&leased_rows), ["leased"]);

    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let purged = ok(
        "purge rows older than an hour",
        store.purge(hour_ago, 100).await,
    );
    assert_eq!(purged, 0, "purge deleted rows settled after `before`");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = SystemTime::now();
    let mut batches = Vec::new();
    for _ in 0..5 {
        let purged = ok("purge with limit 2", store.purge(before, 2).await);
        assert!(purged <= 2, "purge deleted {purged} rows with a limit of 2");
        batches.push(purged);
    }
    assert_eq!(
        batches,
        [2, 2, 1, 0, 0],
        "purge deletes the 5 done rows, 2 per call, then nothing more"
    );
    for m in &done {
        assert_eq!(
            ok("row_state", harness.row_state(m.id).await),
            None,
            "done row {} was not purged",
            label(m)
        );
    }
    assert_state(
        "dead row after purge",
        &state(harness, &dead).await,
        RowStatus::Dead,
        1,
    );
    assert_state(
        "retrying row after purge",
        &state(harness, &retrying).await,
        RowStatus::Pending,
        1,
    );
    assert_state(
        "leased row after purge",
        &state(harness, &leased).await,
        RowStatus::Pending,
        0,
    );
    assert_state(
        "pending row after purge",
        &state(harness, &pending).await,
        RowStatus::Pending,
        0,
    );
}

/// Delete on publish: a row settled done is deleted, at once; retried and dead rows stay,
/// counted; a stale token deletes nothing; the published id may be enqueued again.
///
/// Skipped, and says so, for a store without that option
/// ([`OutboxHarness::deleting_on_publish`] is `None`).
pub async fn delete_on_publish_deletes_done_rows_only<H: OutboxHarness>(harness: &H) {
    let Some(store) = harness.deleting_on_publish() else {
        eprintln!("skipped: this store has no delete-on-publish option");
        return;
    };
    let (done, retrying, dead) = (
        message(None, "done"),
        message(None, "retrying"),
        message(None, "dead"),
    );
    ok(
        "enqueue",
        harness
            .enqueue(&[done.clone(), retrying.clone(), dead.clone()])
            .await,
    );
    let (token, rows) = claim("claim", &store, 10, LONG_LEASE).await;
    let retry = Settle::Retry {
        at: SystemTime::now() + LONG_LEASE,
        error: "later".to_owned(),
    };
    let settlements = vec![
        outcome(&rows, &done, Settle::Done),
        outcome(&rows, &retrying, retry),
        outcome(
            &rows,
            &dead,
            Settle::Dead {
                reason: "never".to_owned(),
            },
        ),
    ];
    settle(
        "settle, stale token",
        &store,
        LeaseToken::new(),
        settlements.clone(),
    )
    .await;
    assert_state(
        "done row after a stale token's settlement",
        &state(harness, &done).await,
        RowStatus::Pending,
        0,
    );

    settle("settle", &store, token, settlements).await;
    assert_eq!(
        ok("row_state", harness.row_state(done.id).await),
        None,
        "the published row was not deleted"
    );
    assert_state(
        "retrying row",
        &state(harness, &retrying).await,
        RowStatus::Pending,
        1,
    );
    assert_state("dead row", &state(harness, &dead).await, RowStatus::Dead, 1);
    ok(
        "enqueue the published id again",
        harness.enqueue_one(&done).await,
    );
    assert_state(
        "the published id, enqueued again",
        &state(harness, &done).await,
        RowStatus::Pending,
        0,
    );
}

/// Atomic enqueue: messages enqueued in a transaction that is rolled back leave no row
/// and are never claimed; a later committed transaction is unaffected.
pub async fn rolled_back_enqueue_is_never_claimed<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let ghosts = [message(Some("a"), "ghost1"), message(None, "ghost2")];
    ok(
        "enqueue and roll back",
        harness.enqueue_rolled_back(&ghosts).await,
    );
    let real = message(Some("a"), "real");
    ok(
        "enqueue and commit",
        harness.enqueue(std::slice::from_ref(&real)).await,
    );
    for ghost in &ghosts {
        assert_eq!(
            ok("row_state", harness.row_state(ghost.id).await),
            None,
            "rolled-back {} left a row",
            label(ghost)
        );
    }
    let (_, rows) = claim("claim", &store, 100, SHORT_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["real"],
        "only the committed message is claimable"
    );
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
    let (_, rows) = claim("claim after the lease", &store, 100, LONG_LEASE).await;
    assert_eq!(labels(&rows), ["real"], "rolled-back messages never appear");
    // The rolled-back ids are free: enqueueing them for real works.
    ok(
        "enqueue a rolled-back message for real",
        harness.enqueue_one(&ghosts[1]).await,
    );
}

/// Bad input is a typed error at enqueue and stores nothing: a second message with an
/// id already in the table is [`Error::Duplicate`] naming the id; a payload over the
/// limit is [`InvalidMessage::PayloadTooLarge`] (a payload exactly at the limit, and an
/// empty one, are accepted); an empty topic is [`InvalidMessage::EmptyTopic`]; a NUL in
/// the topic is [`InvalidMessage::InvalidTopic`], in the key
/// [`InvalidMessage::InvalidKey`], a line break in the kind
/// [`InvalidMessage::InvalidKind`]; headers over their limit together are
/// [`InvalidMessage::HeadersTooLarge`].
pub async fn bad_input_is_a_typed_error<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let first = message(Some("k"), "first");
    ok("enqueue", harness.enqueue_one(&first).await);
    let copy = message(Some("other"), "copy").with_id(first.id);
    match harness.enqueue_one(&copy).await {
        Err(Error::Duplicate { id }) => {
            assert_eq!(id, first.id, "Duplicate must name the duplicated id")
        }
        other => {
            panic!("enqueue of an id already present: expected Error::Duplicate, got {other:?}")
        }
    }

    let limit = harness.limits().max_payload_bytes;
    let mut big = message(None, "big");
    big.payload = Bytes::from(vec![b'x'; limit + 1]);
    match harness.enqueue_one(&big).await {
        Err(Error::InvalidMessage(InvalidMessage::PayloadTooLarge {
            size,
            limit: reported,
        })) => {
            assert_eq!(
                (size, reported),
                (limit + 1, limit),
                "PayloadTooLarge must report the size and the limit"
            );
        }
        other => {
            panic!("enqueue of a payload over the limit: expected PayloadTooLarge, got {other:?}")
        }
    }
    let mut at_limit = message(None, "at-limit");
    at_limit.payload = Bytes::from(vec![b'x'; limit]);
    ok(
        "enqueue a payload exactly at the limit",
        harness.enqueue_one(&at_limit).await,
    );
    let mut empty = message(None, "empty");
    empty.payload = Bytes::new();
    ok(
        "enqueue an empty payload",
        harness.enqueue_one(&empty).await,
    );

    let mut no_topic = message(None, "no-topic");
    no_topic.topic.clear();
    match harness.enqueue_one(&no_topic).await {
        Err(Error::InvalidMessage(InvalidMessage::EmptyTopic)) => {}
        other => panic!("enqueue with an empty topic: expected EmptyTopic, got {other:?}"),
    }
    // A control character (NUL among them, which PostgreSQL's text cannot hold and no
    // broker takes in a destination name) is refused before the store sees it.
    let mut nul_topic = message(None, "nul-topic");
    nul_topic.topic = "or\0ders".to_owned();
    match harness.enqueue_one(&nul_topic).await {
        Err(Error::InvalidMessage(InvalidMessage::InvalidTopic { .. })) => {}
        other => panic!("enqueue with a NUL in the topic: expected InvalidTopic, got {other:?}"),
    }
    let nul_key = message(Some("k\0ey"), "nul-key");
    match harness.enqueue_one(&nul_key).await {
        Err(Error::InvalidMessage(InvalidMessage::InvalidKey { .. })) => {}
        other => panic!("enqueue with a NUL in the key: expected InvalidKey, got {other:?}"),
    }
    let line_kind = message(None, "line-kind").with_kind("Order\nPlaced");
    match harness.enqueue_one(&line_kind).await {
        Err(Error::InvalidMessage(InvalidMessage::InvalidKind { .. })) => {}
        other => {
            panic!("enqueue with a line break in the kind: expected InvalidKind, got {other:?}")
        }
    }
    // Headers each within their own limit, over the limit together.
    let header_limit = harness.limits().max_header_bytes;
    let mut big_headers = message(None, "big-headers");
    for i in 0..=header_limit / (8 * 1024) {
        let header = big_headers
            .headers
            .insert(format!("x-h{i}"), "v".repeat(8 * 1024));
        ok("a header of 8 KiB", header);
    }
    match harness.enqueue_one(&big_headers).await {
        Err(Error::InvalidMessage(InvalidMessage::HeadersTooLarge { size, limit })) => {
            assert_eq!(
                (size, limit),
                (big_headers.headers.size(), header_limit),
                "HeadersTooLarge must report the size and the limit"
            );
        }
        other => {
            panic!("enqueue with headers over the limit: expected HeadersTooLarge, got {other:?}")
        }
    }
    // A refused message in a batch rolls the whole transaction back.
    let (fine, bad) = (
        message(None, "fine"),
        message(None, "bad").with_id(first.id),
    );
    match harness.enqueue(&[fine.clone(), bad]).await {
        Err(error) if error.is_duplicate() => {}
        other => panic!(
            "enqueue of a batch holding a duplicate: expected Error::Duplicate, got {other:?}"
        ),
    }
    assert_eq!(
        ok("row_state", harness.row_state(fine.id).await),
        None,
        "a batch with a refused message must be rolled back entirely"
    );
    for refused in [
        &big,
        &no_topic,
        &nul_topic,
        &nul_key,
        &line_kind,
        &big_headers,
    ] {
        assert_eq!(
            ok("row_state", harness.row_state(refused.id).await),
            None,
            "refused {} left a row",
            label(refused)
        );
    }

    let (_, rows) = claim("claim", &store, 100, LONG_LEASE).await;
    let got: Vec<MessageId> = rows.iter().map(|r| r.item.id).collect();
    assert_eq!(
        got,
        [first.id, at_limit.id, empty.id],
        "only the valid messages (first, at-limit, empty) are stored; claimed {:?}",
        labels(&rows)
    );
    let stored = &rows[0].item;
    assert_eq!(
        stored.key.as_deref(),
        Some("k"),
        "the duplicate must not have replaced the first message"
    );
    assert_eq!(
        rows[1].item.payload.len(),
        limit,
        "a payload at the limit is stored whole"
    );
    assert!(
        rows[2].item.payload.is_empty(),
        "an empty payload is stored empty"
    );
}
