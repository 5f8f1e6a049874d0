//! `cancel` against claims: a claim made while a cancel's transaction is still open
//! passes over the cancelled row and the rest of its key, whatever that transaction
//! then does.

mod common;

use oncebox_core::Message;

use common::{LONG, TestDb, claim, enqueue, labels, msg};

/// The messages of each case: `a1` is cancelled, `a2` waits behind it on key `a`, `u1`
/// (no key) and `b1` wait for nothing.
fn messages() -> [Message; 4] {
    [
        msg(Some("a"), "a1"),
        msg(Some("a"), "a2"),
        msg(None, "u1"),
        msg(Some("b"), "b1"),
    ]
}

/// With `a1` cancelled in a transaction kept open, a claim takes `u1` and `b1` only,
/// and so does a second claim of another handle (the first claim recorded no more);
/// once the transaction has committed, `a2` is claimed and `a1` never is; once it has
/// rolled back, `a1` then `a2` are.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_passes_over_a_row_whose_cancel_is_open() {
    for commit in [true, false] {
        let db = TestDb::new().await;
        let outbox = db.store.outbox();
        let messages = messages();
        enqueue(&outbox, &db.store, &messages).await;

        let mut tx = db.store.pool().begin().await.expect("begin");
        let cancelled = outbox
            .cancel(&mut tx, messages[0].id)
            .await
            .expect("cancel");
        assert!(cancelled, "a1 is pending and held by no claim");

        let (_, first) = claim(&outbox, 10, LONG).await;
        assert_eq!(
            labels(&first),
            ["u1", "b1"],
            "the claim passes over a1, whose cancel is open, and a2 behind it (commit {commit})"
        );
        let (_, second) = claim(&db.store.outbox(), 10, LONG).await;
        assert!(
            second.is_empty(),
            "a second claim finds a1 still held and the rest claimed: {:?}",
            labels(&second)
        );

        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let (_, after) = claim(&outbox, 10, LONG).await;
        let expected: &[&str] = if commit { &["a2"] } else { &["a1", "a2"] };
        assert_eq!(labels(&after), expected, "commit {commit}");
    }
}
