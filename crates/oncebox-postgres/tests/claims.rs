//! Held and leased claims beyond the conformance suite: what a held claim's open
//! transaction gives (rows freed at once when its relay goes away, a connection held
//! only while rows are), and held and leased relays sharing one table.

mod common;

use std::time::Duration;

use common::{LONG, TestDb, claim, done, enqueue, labels, msg};
use oncebox_core::spool::SpoolStore;

/// A relay that goes away (its outbox handle dropped, as when its task is aborted) frees
/// its held rows at once, not after its lease.
#[tokio::test(flavor = "multi_thread")]
async fn dropped_relay_frees_its_rows_at_once() {
    let db = TestDb::new().await;
    let first = db.store.outbox();
    enqueue(
        &first,
        &db.store,
        &[msg(Some("k"), "k1"), msg(Some("k"), "k2"), msg(None, "n1")],
    )
    .await;
    let (_, rows) = claim(&first, 10, LONG).await;
    assert_eq!(labels(&rows), ["k1", "k2", "n1"]);
    let second = db.store.outbox();
    let (_, none) = claim(&second, 10, LONG).await;
    assert!(none.is_empty(), "held rows were claimed twice");

    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (token, rows) = claim(&second, 10, LONG).await;
        if !rows.is_empty() {
            assert_eq!(labels(&rows), ["k1", "k2", "n1"]);
            second.settle(token, &done(&rows)).await.unwrap();
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rows of a dropped relay were not freed (lease: {LONG:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A held claim keeps one pool connection until it is settled; a claim that finds
/// nothing keeps none.
#[tokio::test(flavor = "multi_thread")]
async fn held_claims_hold_a_connection_until_settled() {
    let db = TestDb::with_connections(2).await;
    let outbox = db.store.outbox();
    enqueue(
        &outbox,
        &db.store,
        &[msg(Some("a"), "a1"), msg(Some("b"), "b1")],
    )
    .await;
    let (token_a, a) = claim(&outbox, 1, LONG).await;
    let (token_b, b) = claim(&outbox, 1, LONG).await;
    assert_eq!(
        (labels(&a), labels(&b)),
        (vec!["a1".to_owned()], vec!["b1".to_owned()])
    );
    let starved = tokio::time::timeout(Duration::from_millis(300), db.store.pool().acquire()).await;
    assert!(
        starved.is_err(),
        "two held claims hold both connections of the pool"
    );
    outbox.settle(token_a, &done(&a)).await.unwrap();
    outbox.settle(token_b, &done(&b)).await.unwrap();
    for _ in 0..5 {
        let (_, none) = claim(&outbox, 10, LONG).await;
        assert!(none.is_empty());
    }
    let idle = tokio::time::timeout(Duration::from_secs(5), db.store.pool().acquire()).await;
    assert!(
        idle.is_ok(),
        "settled and empty claims give their connections back"
    );
}

/// Held and leased relays on one table never claim the same key at once, and neither
/// waits for the other's claims to be settled.
#[tokio::test(flavor = "multi_thread")]
async fn held_and_leased_claims_share_a_table() {
    let db = TestDb::new().await;
    let held = db.store.outbox();
    let leased = db.store.outbox().with_held_claims(false);
    enqueue(
        &held,
        &db.store,
        &[
            msg(Some("a"), "a1"),
            msg(Some("b"), "b1"),
            msg(Some("a"), "a2"),
            msg(Some("b"), "b2"),
            msg(Some("c"), "c1"),
        ],
    )
    .await;
    let within = Duration::from_secs(5);
    let (held_token, held_rows) = claim(&held, 1, LONG).await;
    assert_eq!(labels(&held_rows), ["a1"]);
    let (leased_token, leased_rows) = tokio::time::timeout(within, claim(&leased, 4, LONG))
        .await
        .expect("a leased claim does not wait for held claims");
    assert_eq!(
        labels(&leased_rows),
        ["b1", "b2"],
        "key a is held: a2 must wait for a1"
    );
    let (_, rest) = tokio::time::timeout(within, claim(&held, 10, LONG))
        .await
        .expect("a held claim does not wait for leased claims");
    assert_eq!(labels(&rest), ["c1"], "keys a and b are taken");
    held.settle(held_token, &done(&held_rows)).await.unwrap();
    leased
        .settle(leased_token, &done(&leased_rows))
        .await
        .unwrap();
    let (_, last) = claim(&leased, 10, LONG).await;
    assert_eq!(labels(&last), ["a2"]);
}
