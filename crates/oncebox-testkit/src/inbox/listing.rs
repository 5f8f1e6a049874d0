//! The check of what operators read of the durable inbox: its rows, filtered and paged.

use std::time::{Duration, SystemTime};

use oncebox_core::consumer::{InboxAdmin, InboxRow, InboxRowFilter};
use oncebox_core::spool::{ClaimRequest, LeaseToken, RowStatus, Settle, Settlement, SpoolStore};
use oncebox_core::store::{Accepted, DurableInboxStore, Transactional};

use super::{DurableInboxHarness, LONG_LEASE, STEP, dedup_id, label, received};
use crate::support::{ok, within};

/// [`InboxAdmin::inbox_rows`] lists the durable inbox rows of every consumer newest
/// first, with their consumer, dedup id, state, handler result and delivery; each filter
/// alone and combined selects what it says; pages read by `before` list every match once;
/// [`InboxAdmin::inbox_row`] reads one row as listed.
///
/// `billing` stores six deliveries (keys `k-a`, `k-b` and none in turn, every third on
/// topic `refunds`), then one is done with a result, one dead and one claimed and
/// released; `shipping` stores two.
pub async fn inbox_rows_listed_newest_first_filtered_and_paged<H: DurableInboxHarness>(
    harness: &H,
) {
    let admin = harness.store();
    let start = SystemTime::now() - Duration::from_secs(1);
    let billing = harness.durable("billing");
    for n in 0..6 {
        let key = ["k-a", "k-b", ""][n % 3];
        let mut delivery = received((!key.is_empty()).then_some(key), &format!("b{n}"));
        if n % 3 == 2 {
            delivery.topic = "refunds".to_owned();
        }
        let accepted = ok(
            "accept",
            within(
                "accept",
                STEP,
                billing.accept(&dedup_id(&delivery), &delivery),
            )
            .await,
        );
        assert_eq!(accepted, Accepted::New);
    }
    let shipping = harness.durable("shipping");
    for n in 0..2 {
        let delivery = received(Some("k-a"), &format!("s{n}"));
        let accepted = ok(
            "accept",
            within(
                "accept",
                STEP,
                shipping.accept(&dedup_id(&delivery), &delivery),
            )
            .await,
        );
        assert_eq!(accepted, Accepted::New);
    }
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 3,
        lease: LONG_LEASE,
    };
    let claimed = ok(
        "claim",
        within("claim", STEP, billing.claim(&request)).await,
    );
    assert_eq!(claimed.len(), 3, "billing's first three rows are claimed");
    let mut tx = ok("begin", billing.begin().await);
    ok(
        "complete",
        billing
            .complete(&mut tx, request.token, claimed[0].seq, b"charged")
            .await,
    );
    ok("commit", billing.commit(tx).await);
    let settlements = [
        Settlement {
            seq: claimed[1].seq,
            outcome: Settle::Dead {
                reason: "refused".to_owned(),
            },
        },
        Settlement {
            seq: claimed[2].seq,
            outcome: Settle::Release,
        },
    ];
    ok(
        "settle",
        within("settle", STEP, billing.settle(request.token, &settlements)).await,
    );
    let end = SystemTime::now() + Duration::from_secs(1);

    let rows = |filter: InboxRowFilter, before: Option<i64>, limit: usize| {
        let admin = &admin;
        async move {
            ok(
                "inbox_rows",
                within("inbox_rows", STEP, admin.inbox_rows(&filter, before, limit)).await,
            )
        }
    };
    let all = rows(InboxRowFilter::default(), None, 100).await;
    assert_eq!(
        labels(&all),
        ["s1", "s0", "b5", "b4", "b3", "b2", "b1", "b0"],
        "every row, newest first"
    );
    let done = &all[7];
    assert_eq!(
        (done.consumer.as_str(), done.state.status),
        ("billing", RowStatus::Done)
    );
    assert_eq!(
        done.dedup_id,
        dedup_id(&done.received),
        "the row keeps the id it is unique by"
    );
    assert_eq!(
        done.result.as_deref(),
        Some(&b"charged"[..]),
        "a done row keeps the handler's result"
    );
    assert!(done.state.settled_at.is_some());
    let dead = &all[6];
    assert_eq!(dead.state.status, RowStatus::Dead);
    assert_eq!(dead.state.last_error.as_deref(), Some("refused"));
    let released = &all[5];
    assert_eq!(
        (released.state.status, released.state.settled_at),
        (RowStatus::Pending, None)
    );
    for row in &all {
        assert!(
            (start..end).contains(&row.received_at),
            "{}: received at {:?}",
            label(&row.received),
            row.received_at
        );
    }
    let one = ok(
        "inbox_row",
        within("inbox_row", STEP, admin.inbox_row(dead.state.seq)).await,
    )
    .expect("the dead row");
    assert_eq!(
        (label(&one.received), one.state.clone()),
        (label(&dead.received), dead.state.clone())
    );
    let gone = ok(
        "inbox_row",
        within("inbox_row", STEP, admin.inbox_row(all[0].state.seq + 1000)).await,
    );
    assert!(gone.is_none(), "no row at an unknown position");

    let filters: [(InboxRowFilter, &[&str]); 9] = [
        (
            filter(|f| f.consumer = Some("shipping".into())),
            &["s1", "s0"],
        ),
        (filter(|f| f.status = Some(RowStatus::Done)), &["b0"]),
        (filter(|f| f.status = Some(RowStatus::Dead)), &["b1"]),
        (
            filter(|f| {
                f.consumer = Some("billing".into());
                f.status = Some(RowStatus::Pending)
            }),
            &["b5", "b4", "b3", "b2"],
        ),
        (filter(|f| f.topic = Some("refunds".into())), &["b5", "b2"]),
        (
            filter(|f| {
                f.key = Some("k-a".into());
                f.consumer = Some("billing".into())
            }),
            &["b3", "b0"],
        ),
        (
            filter(|f| f.dedup_id = Some(dedup_id(&all[3].received))),
            &["b4"],
        ),
        (
            filter(|f| {
                f.received_from = Some(start);
                f.received_until = Some(end)
            }),
            &["s1", "s0", "b5", "b4", "b3", "b2", "b1", "b0"],
        ),
        (filter(|f| f.received_from = Some(end)), &[]),
    ];
    for (filter, expected) in filters {
        let listed = rows(filter.clone(), None, 100).await;
        assert_eq!(labels(&listed), expected, "{filter:?}");
    }
    for (filter, limit) in [
        (InboxRowFilter::default(), 3),
        (filter(|f| f.consumer = Some("billing".into())), 4),
    ] {
        let expected = labels(&rows(filter.clone(), None, 100).await);
        let mut listed = Vec::new();
        let mut before = None;
        loop {
            let page = rows(filter.clone(), before, limit).await;
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            before = Some(last.state.seq);
            listed.extend(labels(&page));
        }
        assert_eq!(listed, expected, "{filter:?} in pages of {limit}");
    }
    assert!(
        rows(InboxRowFilter::default(), None, 0).await.is_empty(),
        "a limit of 0 lists nothing"
    );
}

fn filter(set: impl FnOnce(&mut InboxRowFilter)) -> InboxRowFilter {
    let mut filter = InboxRowFilter::default();
    set(&mut filter);
    filter
}

fn labels(rows: &[InboxRow]) -> Vec<String> {
    rows.iter().map(|row| label(&row.received)).collect()
}
