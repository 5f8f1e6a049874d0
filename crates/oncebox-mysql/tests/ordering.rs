//! Ordering beyond the conformance suite, on MySQL's own means: a claim passes over the
//! rows of its process's live claims and keeps their keys. (Producers' commit order,
//! the claim window's two steps and a replay while a key is held are the suite's
//! `producers_of_a_key_commit_in_seq_order`, `claim_finds_free_keys_behind_a_held_backlog`,
//! `claim_step_two_reaches_every_key` and `replay_waits_for_the_relay_holding_its_key`.)

mod common;

use oncebox_core::spool::SpoolStore;

use common::{LONG, TestDb, claim, done, enqueue, labels, msg};

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
