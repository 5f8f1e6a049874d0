//! A producer's transaction as an application holds it: refusals leave it usable, and
//! its commit wakes a waiting relay.

use std::time::Duration;

use oncebox_core::spool::SpoolStore;
use oncebox_core::{Bytes, Error, InvalidMessage};
use tokio::time::Instant;

use super::{LONG_LEASE, OutboxHarness, ProducerTx, claim, labels, message};
use crate::support::{ok, within};

/// In one producer transaction, a duplicate id, a payload over the limit and a NUL in
/// the key are each refused with their typed error and write nothing, and the
/// transaction goes on: a message enqueued after them commits with the first.
pub async fn refusals_keep_the_transaction_usable<H: OutboxHarness>(harness: &H) {
    let first = message(Some("k"), "first");
    ok("enqueue first", harness.enqueue_one(&first).await);
    let mut producer = ok("begin", harness.begin().await);
    match producer.enqueue(&first).await {
        Err(Error::Duplicate { id }) if id == first.id => {}
        other => panic!("enqueue of an id already present: expected Duplicate, got {other:?}"),
    }
    let mut big = message(None, "big");
    big.payload = Bytes::from(vec![b'x'; harness.limits().max_payload_bytes + 1]);
    match producer.enqueue(&big).await {
        Err(Error::InvalidMessage(InvalidMessage::PayloadTooLarge { .. })) => {}
        other => {
            panic!("enqueue of a payload over the limit: expected PayloadTooLarge, got {other:?}")
        }
    }
    match producer.enqueue(&message(Some("k\0ey"), "nul")).await {
        Err(Error::InvalidMessage(InvalidMessage::InvalidKey { .. })) => {}
        other => panic!("enqueue with a NUL in the key: expected InvalidKey, got {other:?}"),
    }
    ok(
        "enqueue after the refusals (the transaction must still be usable)",
        producer.enqueue(&message(Some("k"), "after")).await,
    );
    ok("commit", producer.commit().await);
    let (_, rows) = claim("claim", &harness.store(), 10, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["first", "after"],
        "the refused messages wrote nothing; the one after them committed"
    );
}

/// A relay waiting for work ([`SpoolStore::wait_for_work`], 30 s) on one handle wakes
/// at once when a producer of the same process commits through another handle.
pub async fn a_commit_wakes_a_waiting_relay<H: OutboxHarness>(harness: &H) {
    let waiter = {
        let relay_side = harness.store();
        tokio::spawn(async move {
            let started = Instant::now();
            relay_side.wait_for_work(Duration::from_secs(30)).await;
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    ok("enqueue", harness.enqueue(&[message(None, "wake")]).await);
    let waited = within(
        "the wait for work after a commit",
        Duration::from_secs(5),
        waiter,
    )
    .await
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
    assert!(
        waited < Duration::from_secs(5),
        "the wait ended after {waited:?}, not at the commit"
    );
}
