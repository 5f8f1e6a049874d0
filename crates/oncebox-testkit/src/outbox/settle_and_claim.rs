//! [`SpoolStore::settle_and_claim`]: a settlement and the next claim in one call.

use std::time::{Duration, SystemTime};

use oncebox_core::spool::{ClaimRequest, LeaseToken, Settle, SpoolStore};

use super::{
    LONG_LEASE, OutboxHarness, RowStatus, STEP, all_done, claim, labels, message, outcome, state,
};
use crate::support::{ok, within};

/// `settle_and_claim` settles, then claims, and the claim sees the settlements: a key
/// settled done is claimed further, a key settled for a later retry stays blocked.
/// Settlements under a stale token change nothing; the result is what `settle` then
/// `claim` would give. Run on the store, and on its delete-on-publish handle if it has
/// one (published rows then go).
pub async fn settle_and_claim_sees_its_settlements<H: OutboxHarness>(harness: &H) {
    let handles = [Some(harness.store()), harness.deleting_on_publish()];
    for (mode, store) in ["kept", "deleted"].into_iter().zip(handles) {
        let Some(store) = store else {
            eprintln!("oncebox-testkit: no delete-on-publish handle: its round is skipped");
            continue;
        };
        let (a, b) = (format!("{mode}-a"), format!("{mode}-b"));
        let [a1, b1, a2, b2, u1] = [
            message(Some(&a), "a1"),
            message(Some(&b), "b1"),
            message(Some(&a), "a2"),
            message(Some(&b), "b2"),
            message(None, "u1"),
        ];
        let enqueued = [a1.clone(), b1.clone(), a2.clone(), b2.clone(), u1.clone()];
        ok("enqueue", harness.enqueue(&enqueued).await);

        let (token, rows) = claim(&format!("{mode}: claim 2"), &store, 2, LONG_LEASE).await;
        assert_eq!(
            labels(&rows),
            ["a1", "b1"],
            "{mode}: the first row of each key"
        );

        let later = Settle::Retry {
            at: SystemTime::now() + Duration::from_secs(3600),
            error: "broker down".to_owned(),
        };
        let settlements = vec![
            outcome(&rows, &a1, Settle::Done),
            outcome(&rows, &b1, later),
        ];
        let request = ClaimRequest {
            token: LeaseToken::new(),
            limit: 10,
            lease: LONG_LEASE,
        };
        let step = format!("{mode}: a1 done, b1 retried in an hour, and claim");
        let next = ok(
            &step,
            within(
                &step,
                STEP,
                store.settle_and_claim(token, &settlements, &request),
            )
            .await,
        );
        assert_eq!(
            labels(&next),
            ["a2", "u1"],
            "{mode}: a's next row and the row without a key, not b2 behind the retried b1"
        );
        assert!(
            next.iter().all(|row| row.token == request.token),
            "{mode}: the rows carry the new claim's token"
        );

        let step = format!("{mode}: settle under a stale token, and claim");
        let none = ok(
            &step,
            within(
                &step,
                STEP,
                store.settle_and_claim(LeaseToken::new(), &all_done(&next), &request),
            )
            .await,
        );
        assert!(
            none.is_empty(),
            "{mode}: a stale token settles nothing, so a2 and u1 stay claimed, yet the claim took {:?}",
            labels(&none)
        );

        let again = ClaimRequest {
            token: LeaseToken::new(),
            ..request
        };
        let step = format!("{mode}: settle a2 and u1, and claim");
        let none = ok(
            &step,
            within(
                &step,
                STEP,
                store.settle_and_claim(request.token, &all_done(&next), &again),
            )
            .await,
        );
        assert!(
            none.is_empty(),
            "{mode}: nothing else is due (b1 waits, b2 behind it), yet the claim took {:?}",
            labels(&none)
        );
        for published in [&a1, &a2, &u1] {
            let kept = ok("row_state", harness.row_state(published.id).await);
            match (mode, kept) {
                ("deleted", None) => {}
                ("kept", Some(row)) if row.status == RowStatus::Done => {}
                (_, other) => panic!("{mode}: a published row is {other:?}"),
            }
        }
        for waiting in [&b1, &b2] {
            let row = state(harness, waiting).await;
            assert_eq!(row.status, RowStatus::Pending, "{mode}: b's rows wait");
        }
    }
}
