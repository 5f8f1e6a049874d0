//! Rows oncebox did not write: what the store does with rows it cannot decode.

use oncebox_core::spool::OutboxAdmin;

use super::capabilities::skipped;
use super::{LONG_LEASE, OutboxHarness, RowStatus, all_done, claim, labels, message, settle};
use crate::support::ok;

/// Rows written by hand that the store cannot decode (the harness's
/// [`write_undecodable_rows`](OutboxHarness::write_undecodable_rows)) are not handed out
/// but dead-lettered, with a reason naming what is wrong; the rows around them are
/// handed out as usual; reading the dead letters fails naming the column; the counts
/// count them dead. Skipped if the harness writes no such rows.
pub async fn undecodable_rows_are_dead_lettered_not_handed_out<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    let store = harness.store();
    ok(
        "enqueue",
        harness
            .enqueue(&[message(Some("k"), "old"), message(None, "new")])
            .await,
    );
    let written = ok(
        "write undecodable rows",
        harness.write_undecodable_rows().await,
    );
    let Some((_, first_words)) = written.first() else {
        return skipped(
            "undecodable_rows_are_dead_lettered_not_handed_out",
            "write_undecodable_rows",
        );
    };
    let (token, rows) = claim("claim everything", &store, 10, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["old", "new"],
        "the undecodable rows must not be handed out"
    );
    settle("settle the decodable rows", &store, token, all_done(&rows)).await;
    let error = store
        .dead_letters(None, 10)
        .await
        .expect_err("the dead rows cannot be decoded either");
    assert!(
        error.to_string().contains(first_words[0]),
        "reading the dead letters must name {:?}: {error}",
        first_words[0]
    );
    let stats = ok("stats", store.stats().await);
    assert_eq!(
        (stats.pending, stats.done, stats.dead),
        (0, 2, written.len() as u64),
        "counts (pending, done, dead)"
    );
    for (id, words) in &written {
        let state = ok("row state", harness.row_state(*id).await)
            .unwrap_or_else(|| panic!("the hand-written row {id} is gone"));
        assert_eq!(state.status, RowStatus::Dead, "row {id}");
        let reason = state.last_error.unwrap_or_default();
        for word in words {
            assert!(
                reason.contains(word),
                "the reason of row {id} must name {word:?}: {reason:?}"
            );
        }
    }
}
