//! Checks of the durable inbox: accept, processing through the spool, fenced completion.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{ConsumerOptions, DurableInbox};
use oncebox_core::spool::{
    ClaimRequest, Claimed, LeaseToken, Settle, Settlement, SpoolOptions, SpoolStore,
};
use oncebox_core::store::{Accepted, DurableInboxStore, Transactional};
use oncebox_core::{Backoff, Error, Received};
use tokio::time::Instant;

use super::{
    DurableInboxHarness, EffectHandler, LONG_LEASE, SHORT_LEASE, STEP, dedup_id, effect_key,
    effects, label, received,
};
use crate::support::{ok, within};

async fn claim_durable<S: SpoolStore<Item = Received>>(
    step: &str,
    store: &S,
    lease: Duration,
) -> (LeaseToken, Vec<Claimed<Received>>) {
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 100,
        lease,
    };
    let rows = ok(step, within(step, STEP, store.claim(&request)).await);
    for row in &rows {
        assert_eq!(
            row.token, request.token,
            "{step}: a claimed row carries another token"
        );
    }
    (request.token, rows)
}

fn labels(rows: &[Claimed<Received>]) -> Vec<String> {
    rows.iter().map(|row| label(&row.item)).collect()
}

async fn accept<S: DurableInboxStore>(step: &str, store: &S, received: &Received) -> Accepted {
    ok(
        step,
        within(step, STEP, store.accept(&dedup_id(received), received)).await,
    )
}

/// Durable accept stores a delivery once per consumer: a second delivery of the id is
/// a duplicate (while pending, once done, once dead) and adds no row; another consumer
/// accepts it for itself. The claimed row is the delivery as accepted.
pub async fn durable_accept_dedups<H: DurableInboxHarness>(harness: &H) {
    let billing = harness.durable("billing");
    let (m1, m2) = (
        received(Some("order-1"), "m1"),
        received(Some("order-2"), "m2"),
    );
    assert_eq!(accept("accept m1", &billing, &m1).await, Accepted::New);
    let mut again = m1.clone();
    again.delivery_count = 2;
    assert_eq!(
        accept("accept m1 again", &billing, &again).await,
        Accepted::Duplicate,
        "a redelivery is a duplicate"
    );
    assert_eq!(accept("accept m2", &billing, &m2).await, Accepted::New);
    let shipping = harness.durable("shipping");
    assert_eq!(
        accept("accept m1 for another consumer", &shipping, &m1).await,
        Accepted::New,
        "ids are per consumer"
    );

    let (token, rows) = claim_durable("claim billing", &billing, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["m1", "m2"],
        "each accepted id is one row, in accept order"
    );
    for (row, sent) in rows.iter().zip([&m1, &m2]) {
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
    }
    let (_, other) = claim_durable("claim shipping", &shipping, LONG_LEASE).await;
    assert_eq!(
        labels(&other),
        ["m1"],
        "the other consumer's table holds its own row"
    );

    let mut tx = ok("begin", billing.begin().await);
    ok(
        "complete m1",
        billing.complete(&mut tx, token, rows[0].seq, b"ok").await,
    );
    ok("commit", billing.commit(tx).await);
    let dead = Settle::Dead {
        reason: "poison".to_owned(),
    };
    let settlements = [
        Settlement {
            seq: rows[0].seq,
            outcome: Settle::Done,
        },
        Settlement {
            seq: rows[1].seq,
            outcome: dead,
        },
    ];
    ok(
        "settle m1 done, m2 dead",
        billing.settle(token, &settlements).await,
    );
    assert_eq!(
        accept("accept m1 once done", &billing, &m1).await,
        Accepted::Duplicate,
        "a done row still deduplicates"
    );
    assert_eq!(
        accept("accept m2 once dead", &billing, &m2).await,
        Accepted::Duplicate,
        "a dead row still deduplicates"
    );
    let (_, rows) = claim_durable("claim after settling", &billing, LONG_LEASE).await;
    assert!(
        rows.is_empty(),
        "done and dead rows are not claimed again: {:?}",
        labels(&rows)
    );
}

/// Two processors built by [`DurableInbox::processor`] over one table, with a handler
/// whose first two runs fail, process 24 accepted deliveries (each accepted twice):
/// each has exactly one committed effect and nothing is left to claim.
pub async fn durable_processor_runs_each_effect_once<H: DurableInboxHarness>(harness: &H) {
    const MESSAGES: usize = 24;
    let messages: Vec<Received> = (0..MESSAGES)
        .map(|i| received(Some(&format!("order-{}", i % 4)), &format!("m{i}")))
        .collect();
    let store = harness.durable("billing");
    for message in &messages {
        assert_eq!(accept("accept", &store, message).await, Accepted::New);
        assert_eq!(
            accept("accept a redelivery", &store, message).await,
            Accepted::Duplicate
        );
    }
    let handler = EffectHandler::<H>::new("billing").failing(2);
    let (runs, succeeded) = (Arc::clone(&handler.runs), Arc::clone(&handler.succeeded));
    let options = |name: &str| {
        SpoolOptions::new()
            .name(name)
            .batch_size(5)
            .lease(Duration::from_secs(10))
            .dispatch_timeout(Duration::from_secs(2))
            .max_attempts(5)
            .backoff(
                Backoff::new()
                    .initial(Duration::from_millis(20))
                    .jitter(0.0),
            )
            .poll_interval(Duration::from_millis(5), Duration::from_millis(40))
    };
    let inbox_a = ok(
        "DurableInbox::new",
        DurableInbox::new(harness.durable("billing"), ConsumerOptions::new("billing")),
    );
    let inbox_b = ok(
        "DurableInbox::new",
        DurableInbox::new(harness.durable("billing"), ConsumerOptions::new("billing")),
    );
    let processors = [
        ok(
            "processor a",
            inbox_a.processor(handler.share(), options("inbox-a")),
        ),
        ok(
            "processor b",
            inbox_b.processor(handler, options("inbox-b")),
        ),
    ];
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runs_until_stopped = processors.iter().map(|processor| {
        let mut stopped = stopped.clone();
        processor.run_until(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })
    });
    let watcher = async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while succeeded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < MESSAGES
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
    };
    let (results, ()) = within(
        "two durable inbox processors",
        Duration::from_secs(40),
        async { tokio::join!(futures_util::future::join_all(runs_until_stopped), watcher) },
    )
    .await;
    for result in results {
        ok("processor run", result);
    }
    let done = succeeded
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len();
    assert_eq!(
        done, MESSAGES,
        "the processors did not handle every delivery within 20 s"
    );
    for message in &messages {
        assert_eq!(
            effects(harness, "billing", message).await,
            1,
            "{}: exactly one committed effect",
            label(message)
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst) as usize,
        MESSAGES + 2,
        "one run per delivery plus the two failed runs"
    );
    let (_, rows) = claim_durable("claim after processing", &store, LONG_LEASE).await;
    assert!(
        rows.is_empty(),
        "processed rows are claimed again: {:?}",
        labels(&rows)
    );
}

/// `complete` with a token whose lease ended (and was taken over) or that never held
/// the row fails with [`Error::LeaseLost`], and the caller's rollback undoes the
/// handler's effect; the current holder's `complete` commits with its effect once.
pub async fn durable_stale_complete_is_lease_lost<H: DurableInboxHarness>(harness: &H) {
    let store = harness.durable("billing");
    let message = received(Some("order-1"), "m1");
    let key = effect_key("billing", &message);
    assert_eq!(accept("accept", &store, &message).await, Accepted::New);
    let (stale, rows) = claim_durable("claim with a short lease", &store, SHORT_LEASE).await;
    assert_eq!(labels(&rows), ["m1"]);
    let seq = rows[0].seq;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(150)).await;
    let (current, rows) = claim_durable("claim after the lease ended", &store, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["m1"],
        "the row is claimable again after its lease"
    );
    assert_eq!(rows[0].seq, seq);

    for (what, token) in [
        ("the expired token", stale),
        ("a token that never held the row", LeaseToken::new()),
    ] {
        let mut tx = ok("begin", store.begin().await);
        ok("insert effect", H::insert_effect(&mut tx, &key).await);
        match store.complete(&mut tx, token, seq, b"stale").await {
            Err(Error::LeaseLost) => {}
            other => panic!("complete with {what}: expected Error::LeaseLost, got {other:?}"),
        }
        drop(tx);
        assert_eq!(
            ok("count effects", harness.count_effects(&key).await),
            0,
            "complete with {what}: effect not rolled back"
        );
    }
    let (_, stolen) = claim_durable(
        "claim while the current claim holds the row",
        &store,
        LONG_LEASE,
    )
    .await;
    assert!(
        stolen.is_empty(),
        "a refused complete freed the row: {:?}",
        labels(&stolen)
    );

    let mut tx = ok("begin", store.begin().await);
    ok("insert effect", H::insert_effect(&mut tx, &key).await);
    ok(
        "complete with the current token",
        store.complete(&mut tx, current, seq, b"fresh").await,
    );
    ok("commit", store.commit(tx).await);
    assert_eq!(
        ok("count effects", harness.count_effects(&key).await),
        1,
        "the current holder's effect commits"
    );
    assert_eq!(
        accept("accept after completion", &store, &message).await,
        Accepted::Duplicate
    );
    let (_, rows) = claim_durable("claim after completion", &store, LONG_LEASE).await;
    assert!(
        rows.is_empty(),
        "a completed row is claimed again: {:?}",
        labels(&rows)
    );
}

/// The inbox's dedup window is the one setting of how long processed deliveries are
/// kept: the processor keeps them that long by default, and refuses a retention shorter
/// than the window (a duplicate arriving after it would be processed again).
pub async fn durable_retention_is_the_dedup_window<H: DurableInboxHarness>(harness: &H) {
    let window = Duration::from_secs(3 * 24 * 3600);
    let inbox = ok(
        "DurableInbox::new",
        DurableInbox::new(
            harness.durable("window"),
            ConsumerOptions::new("window").dedup_window(window),
        ),
    );
    let processor = ok(
        "a processor with the default retention",
        inbox.processor(EffectHandler::<H>::new("window"), SpoolOptions::new()),
    );
    assert_eq!(
        processor.options().retention_duration(),
        window,
        "processed deliveries are kept for the dedup window"
    );
    let refused = inbox.processor(
        EffectHandler::<H>::new("window"),
        SpoolOptions::new().retention(Duration::from_secs(3600)),
    );
    assert!(
        matches!(refused, Err(Error::InvalidOptions(_))),
        "a retention shorter than the dedup window must be refused"
    );
    let longer = window * 2;
    let processor = ok(
        "a processor with a longer retention",
        inbox.processor(
            EffectHandler::<H>::new("window"),
            SpoolOptions::new().retention(longer),
        ),
    );
    assert_eq!(processor.options().retention_duration(), longer);
}
