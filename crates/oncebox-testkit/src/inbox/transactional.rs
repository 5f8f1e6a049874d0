//! Checks of the transactional inbox: duplicates, rollback, concurrency, purge.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use oncebox_core::consumer::{ConsumerOptions, Outcome};
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Error, Received};
use tokio::sync::Barrier;

use super::{
    EffectHandler, InboxHarness, STEP, dedup_id, effect_key, effects, handle, inbox, received,
};
use crate::support::{ok, within};

/// The first delivery runs the handler; a redelivery (another delivery count, same id)
/// skips it and returns the first result, with the effect still there once. Records are
/// scoped by consumer: a second consumer processes the same message once for itself.
pub async fn duplicate_returns_first_result<H: InboxHarness>(harness: &H) {
    let billing = EffectHandler::new("billing");
    let runs = Arc::clone(&billing.runs);
    let billing = inbox(harness, billing, ConsumerOptions::new("billing"));
    let message = received(Some("order-1"), "m1");
    let (outcome, first) = handle("first delivery", &billing, &message).await;
    assert_eq!(outcome, Outcome::Handled, "the first delivery is handled");
    assert_eq!(first.as_ref(), b"billing run 1 of m1");
    let mut again = message.clone();
    again.delivery_count = 2;
    for step in ["redelivery", "another redelivery"] {
        let (outcome, result) = handle(step, &billing, &again).await;
        assert_eq!(
            outcome,
            Outcome::Duplicate,
            "{step}: a processed id is a duplicate"
        );
        assert_eq!(
            result, first,
            "{step}: a duplicate returns the first result"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a duplicate never runs the handler"
    );
    assert_eq!(
        effects(harness, "billing", &message).await,
        1,
        "the effect is committed once"
    );

    let other = received(Some("order-1"), "m2");
    let (outcome, _) = handle("a different message", &billing, &other).await;
    assert_eq!(
        outcome,
        Outcome::Handled,
        "a different id is not a duplicate"
    );

    let shipping = inbox(
        harness,
        EffectHandler::new("shipping"),
        ConsumerOptions::new("shipping"),
    );
    let (outcome, result) =
        handle("the same message to another consumer", &shipping, &message).await;
    assert_eq!(
        outcome,
        Outcome::Handled,
        "records are per consumer: another consumer processes the message"
    );
    assert_eq!(result.as_ref(), b"shipping run 1 of m1");
    assert_eq!(effects(harness, "shipping", &message).await, 1);
    let (outcome, result) = handle("billing after shipping", &billing, &message).await;
    assert_eq!(
        (outcome, result),
        (Outcome::Duplicate, first),
        "the other consumer's record must not replace ours"
    );
}

/// A handler that fails after writing its effect leaves neither the effect nor the
/// inbox record: the redelivery runs the handler again, and only its effect stays. A
/// transaction dropped after `record` forgets the record too.
pub async fn failure_rolls_back_record_and_effect<H: InboxHarness>(harness: &H) {
    let handler = EffectHandler::new("billing").failing(1);
    let runs = Arc::clone(&handler.runs);
    let billing = inbox(harness, handler, ConsumerOptions::new("billing"));
    let message = received(None, "m1");
    match within("a failing delivery", STEP, billing.handle(&message)).await {
        Err(Error::Handler { .. }) => {}
        other => panic!("a failing handler: expected its Error::Handler, got {other:?}"),
    }
    assert_eq!(
        effects(harness, "billing", &message).await,
        0,
        "the failed run's effect must be rolled back"
    );
    let (outcome, result) = handle("redelivery after the failure", &billing, &message).await;
    assert_eq!(
        outcome,
        Outcome::Handled,
        "after a rolled-back failure the message is processed (no record was kept)"
    );
    assert_eq!(result.as_ref(), b"billing run 2 of m1");
    assert_eq!(
        effects(harness, "billing", &message).await,
        1,
        "exactly the successful run's effect is committed"
    );
    let (outcome, duplicate) = handle("a later duplicate", &billing, &message).await;
    assert_eq!(
        (outcome, duplicate),
        (Outcome::Duplicate, result),
        "the duplicate returns the successful run's result"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The store alone: a record in a transaction that is dropped does not survive.
    let store = harness.store();
    let dropped = received(None, "m2");
    let id = dedup_id(&dropped);
    let mut tx = ok("begin", store.begin().await);
    assert_eq!(
        ok("record", store.record(&mut tx, "billing", &id).await),
        Recorded::New
    );
    ok(
        "insert effect",
        H::insert_effect(&mut tx, &effect_key("billing", &dropped)).await,
    );
    ok(
        "store_result",
        store
            .store_result(&mut tx, "billing", &id, b"never committed")
            .await,
    );
    drop(tx);
    let mut tx = ok("begin", store.begin().await);
    assert_eq!(
        ok(
            "record after a rollback",
            store.record(&mut tx, "billing", &id).await
        ),
        Recorded::New,
        "a record whose transaction rolled back must not count as processed"
    );
    ok(
        "store_result",
        store
            .store_result(&mut tx, "billing", &id, b"committed")
            .await,
    );
    ok("commit", store.commit(tx).await);
    assert_eq!(
        effects(harness, "billing", &dropped).await,
        0,
        "the dropped transaction's effect must be gone"
    );
    let mut tx = ok("begin", store.begin().await);
    assert_eq!(
        ok(
            "record after a commit",
            store.record(&mut tx, "billing", &id).await
        ),
        Recorded::Duplicate {
            result: Bytes::from_static(b"committed")
        },
        "a committed record is a duplicate carrying its stored result"
    );
}

/// 8 workers receive each of 12 messages 3 times, the copies of a message at the same
/// moment on different workers (tokio tasks calling [`TransactionalInbox::handle`](oncebox_core::consumer::TransactionalInbox::handle)),
/// with a handler slow enough that the copies overlap in flight. Every call succeeds
/// (concurrent duplicates wait for the first transaction instead of failing); each
/// message has exactly one effect and one `Handled` call, and both other copies return
/// that call's result as duplicates.
pub async fn concurrent_duplicates_have_one_effect<H: InboxHarness + 'static>(harness: &H) {
    concurrent_duplicates(harness, 12, Duration::from_millis(5)).await;
}

/// [`concurrent_duplicates_have_one_effect`] at scale: 8 workers receive each of 2,000
/// messages on 50 keys 3 times, with a handler that only writes its effect.
pub async fn many_concurrent_duplicates_have_one_effect<H: InboxHarness + 'static>(harness: &H) {
    concurrent_duplicates(harness, 2_000, Duration::ZERO).await;
}

/// 8 workers, `messages` messages on at most 50 keys, 3 copies each; the handler keeps
/// its transaction open for `delay` after writing its effect.
async fn concurrent_duplicates<H: InboxHarness + 'static>(
    harness: &H,
    messages: usize,
    delay: Duration,
) {
    const WORKERS: usize = 8;
    const COPIES: usize = 3;
    let keys = (messages / 3).clamp(1, 50);
    let handler = EffectHandler::new("billing").delay(delay);
    let runs = Arc::clone(&handler.runs);
    let billing = Arc::new(inbox(harness, handler, ConsumerOptions::new("billing")));
    let count = messages;
    let messages: Vec<Received> = (0..count)
        .map(|i| received(Some(&format!("order-{}", i % keys)), &format!("m{i}")))
        .collect();
    // Copies side by side, dealt round-robin: the copies of one message go to
    // neighbouring workers at about the same time.
    let deliveries: Vec<(usize, Received)> = (0..count)
        .flat_map(|i| (0..COPIES).map(move |_| i))
        .map(|i| (i, messages[i].clone()))
        .collect();
    let barrier = Arc::new(Barrier::new(WORKERS));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let mine: Vec<(usize, Received)> = deliveries
            .iter()
            .skip(worker)
            .step_by(WORKERS)
            .cloned()
            .collect();
        let (billing, barrier) = (Arc::clone(&billing), Arc::clone(&barrier));
        workers.spawn(async move {
            barrier.wait().await;
            let mut results = Vec::new();
            for (index, message) in mine {
                match billing.handle(&message).await {
                    Ok((outcome, result)) => results.push((index, outcome, result)),
                    Err(error) => panic!(
                        "worker {worker}, message m{index}: handle failed with {error:?}; concurrent \
                         duplicates must wait for the first transaction, not fail"
                    ),
                }
            }
            results
        });
    }
    let mut results: Vec<(usize, Outcome, Bytes)> = Vec::new();
    while let Some(joined) = within(
        "8 workers handling duplicates",
        Duration::from_secs(120),
        workers.join_next(),
    )
    .await
    {
        match joined {
            Ok(done) => results.extend(done),
            Err(error) => match error.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(error) => panic!("worker task failed: {error}"),
            },
        }
    }
    for (index, message) in messages.iter().enumerate() {
        let mine: Vec<&(usize, Outcome, Bytes)> =
            results.iter().filter(|(i, ..)| *i == index).collect();
        assert_eq!(mine.len(), COPIES, "m{index}: every copy returns");
        let handled: Vec<&Bytes> = mine
            .iter()
            .filter(|(_, o, _)| *o == Outcome::Handled)
            .map(|(.., r)| r)
            .collect();
        assert_eq!(
            handled.len(),
            1,
            "m{index}: exactly one copy is handled, got {mine:?}"
        );
        for (_, outcome, result) in &mine {
            if *outcome != Outcome::Handled {
                assert_eq!(
                    *outcome,
                    Outcome::Duplicate,
                    "m{index}: the other copies are duplicates"
                );
                assert_eq!(
                    result, handled[0],
                    "m{index}: a duplicate returns the stored result"
                );
            }
        }
        assert_eq!(
            effects(harness, "billing", message).await,
            1,
            "m{index}: exactly one effect"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst) as usize,
        count,
        "the handler runs once per message"
    );
}

/// `purge` deletes one consumer's records processed before `before` and keeps later
/// ones and every other consumer's, at most `limit` per call; a purged id is processed
/// again (the record is what made it a duplicate).
pub async fn purge_is_bounded_and_selective<H: InboxHarness>(harness: &H) {
    let billing = inbox(
        harness,
        EffectHandler::new("billing"),
        ConsumerOptions::new("billing"),
    );
    // Another consumer of the same table, with a dedup window of its own.
    let shipping = inbox(
        harness,
        EffectHandler::new("shipping"),
        ConsumerOptions::new("shipping"),
    );
    let old: Vec<Received> = (0..3).map(|i| received(None, &format!("old{i}"))).collect();
    for message in &old {
        handle("handle an old message", &billing, message).await;
    }
    handle("shipping handles an old message", &shipping, &old[0]).await;
    let store = harness.store();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    assert_eq!(
        ok(
            "purge before an hour ago",
            store.purge("billing", hour_ago, 100).await
        ),
        0,
        "purge deleted young records"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = SystemTime::now();
    // Stores on a server take `before` as an age, measured when `purge` is called and
    // applied on the database's clock when its statement runs, so that the two clocks
    // need not agree; the time in between moves the cutoff later. On a loaded host that
    // was more than 20 ms: the young record comes well after `before`.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let young = received(None, "young");
    handle("handle a young message", &billing, &young).await;
    let mut batches = Vec::new();
    for _ in 0..4 {
        batches.push(ok(
            "purge with limit 2",
            store.purge("billing", before, 2).await,
        ));
    }
    assert_eq!(
        batches,
        [2, 1, 0, 0],
        "billing's purge deletes its 3 old records, 2 per call, and neither its young one \
         nor shipping's"
    );
    let (outcome, _) = handle("shipping's old message again", &shipping, &old[0]).await;
    assert_eq!(
        outcome,
        Outcome::Duplicate,
        "billing's purge deleted a record of shipping, inside shipping's window"
    );
    let (outcome, _) = handle("the young message again", &billing, &young).await;
    assert_eq!(
        outcome,
        Outcome::Duplicate,
        "a record processed after `before` must be kept"
    );
    let (outcome, _) = handle("a purged message again", &billing, &old[0]).await;
    assert_eq!(
        outcome,
        Outcome::Handled,
        "a purged record no longer deduplicates"
    );
}

/// [`TransactionalInbox::purge_older_than`](oncebox_core::consumer::TransactionalInbox::purge_older_than) refuses an age shorter than the dedup window
/// (and deletes nothing then); with an age at least the window it purges through the
/// store.
pub async fn purge_respects_dedup_window<H: InboxHarness>(harness: &H) {
    let window = Duration::from_millis(200);
    let billing = inbox(
        harness,
        EffectHandler::new("billing"),
        ConsumerOptions::new("billing").dedup_window(window),
    );
    let message = received(None, "m1");
    handle("first delivery", &billing, &message).await;
    match billing.purge_older_than(window / 2, 100).await {
        Err(Error::InvalidOptions(_)) => {}
        other => panic!(
            "purge_older_than below the dedup window: expected InvalidOptions, got {other:?}"
        ),
    }
    let (outcome, _) = handle("redelivery after the refused purge", &billing, &message).await;
    assert_eq!(
        outcome,
        Outcome::Duplicate,
        "the refused purge must delete nothing"
    );
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let purged = ok(
        "purge_older_than the window",
        billing.purge_older_than(window, 100).await,
    );
    assert_eq!(purged, 1, "records older than the window are purged");
    let (outcome, _) = handle("redelivery after the window", &billing, &message).await;
    assert_eq!(
        outcome,
        Outcome::Handled,
        "past the window the record is gone"
    );
}

/// Outside data reaches the store as data: a consumer name and dedup ids full of
/// quotes, backslashes, dollar quotes, semicolons and comment markers are recorded and
/// found again exactly (a second delivery is a duplicate with the first result, and a
/// near-miss of the id is not); an id holding a NUL is recorded too, or refused with a
/// permanent store error where the database cannot hold the character, never a panic.
pub async fn hostile_ids_round_trip<H: InboxHarness>(harness: &H) {
    use oncebox_core::consumer::IdStrategy;

    let consumer = r#"billing'; DROP TABLE x; -- \ $$ $q$ "#;
    let options = ConsumerOptions::new(consumer).id_strategy(IdStrategy::Header("x-id".into()));
    let billing = inbox(harness, EffectHandler::new(consumer), options);
    let with_id = |id: &str, label: &str| {
        let mut message = received(None, label);
        ok("a header", message.headers.insert("x-id", id));
        message
    };
    let ids = [
        r"it's",
        r"back\slash\'",
        "$$ semi; colon $tag$ -- /* */",
        "E'\\x27' || chr(39)",
        "ünïcödé ✓ 🦀",
    ];
    for (n, id) in ids.iter().enumerate() {
        let message = with_id(id, &format!("hostile{n}"));
        let (outcome, first) = handle("a hostile id", &billing, &message).await;
        assert_eq!(
            outcome,
            Outcome::Handled,
            "{id:?}: the first delivery is handled"
        );
        let (outcome, again) = handle("the hostile id again", &billing, &message).await;
        assert_eq!(outcome, Outcome::Duplicate, "{id:?}: not found again");
        assert_eq!(again, first, "{id:?}: the first result");
        let near = with_id(&format!("{id} "), &format!("near{n}"));
        let (outcome, _) = handle("a near miss", &billing, &near).await;
        assert_eq!(outcome, Outcome::Handled, "{id:?}: a near miss matched it");
    }
    // Headers refuse control characters; an id strategy of the application's own may
    // still hand the store one.
    let store = harness.store();
    let recorded = within(
        "an id with a NUL",
        STEP,
        store.begin_recorded(consumer, "nul\0byte"),
    )
    .await;
    match recorded {
        Ok((tx, Recorded::New)) => {
            ok("commit the NUL id", store.commit(tx).await);
            let (_tx, again) = ok(
                "the NUL id again",
                within(
                    "the NUL id again",
                    STEP,
                    store.begin_recorded(consumer, "nul\0byte"),
                )
                .await,
            );
            assert!(
                matches!(again, Recorded::Duplicate { .. }),
                "a NUL id kept is found again"
            );
        }
        Ok((_, recorded)) => panic!("a new id with a NUL: {recorded:?}"),
        Err(error) => assert_eq!(
            error.fault(),
            oncebox_core::Fault::Permanent,
            "an id the database cannot hold is a permanent error: {error}"
        ),
    }
}
