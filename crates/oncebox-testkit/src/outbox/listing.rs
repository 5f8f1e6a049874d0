//! What operators read of an outbox ([`OutboxAdmin::rows`]): rows newest first, each
//! filter alone and combined, in pages. The fill and the check are public for backends
//! with tables the harness does not cover (a Debezium-style layout).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{
    OutboxAdmin, OutboxRow, RowFilter, RowStatus, Settle, Settlement, SpoolStore,
};
use oncebox_core::{Message, MessageId, Result};

use super::{OutboxHarness, claim};
use crate::support::ok;

/// How many messages [`fill_listed`] enqueues.
pub const LISTED: u64 = 12;

/// Fills an empty outbox with [`LISTED`] messages, enqueued by `enqueue`: payloads `0`,
/// `1`, …, each created a minute after the one before (from an hour ago, on a whole
/// second), but `10`, created between `2` and `3` (a producer's clock may run behind);
/// on topics `payments` (every third) and `orders` under `prefix`, with keys `k-a`,
/// `k-b` and none in turn. `1` and `5` end dead (reason `refused`), `9` and later
/// pending, the others done. Returns the first creation time.
///
/// # Panics
///
/// If the store refuses a step.
pub async fn fill_listed<S, E>(store: &S, prefix: &str, enqueue: E) -> SystemTime
where
    S: SpoolStore<Item = Message>,
    E: AsyncFn(&[Message]) -> Result<()>,
{
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    let first = UNIX_EPOCH + Duration::from_secs(now.as_secs() - 3600);
    let messages: Vec<Message> = (0..LISTED)
        .map(|n| {
            let topic = if n % 3 == 0 { "payments" } else { "orders" };
            let mut message = Message::new(format!("{prefix}{topic}"), n.to_string());
            message.created_at = if n == 10 {
                first + Duration::from_secs(150)
            } else {
                first + Duration::from_secs(60 * n)
            };
            match n % 3 {
                0 => message.with_key("k-a"),
                1 => message.with_key("k-b"),
                _ => message,
            }
        })
        .collect();
    let (settled, pending) = messages.split_at(9);
    ok("enqueue the settled messages", enqueue(settled).await);
    let (token, claimed) = claim("claim them", store, 100, Duration::from_secs(30)).await;
    assert_eq!(claimed.len(), settled.len(), "every row claimed");
    let settlements: Vec<Settlement> = claimed
        .iter()
        .map(|row| Settlement {
            seq: row.seq,
            outcome: if matches!(label(&row.item).as_str(), "1" | "5") {
                Settle::Dead {
                    reason: "refused".to_owned(),
                }
            } else {
                Settle::Done
            },
        })
        .collect();
    ok("settle the claim", store.settle(token, &settlements).await);
    ok("enqueue the pending messages", enqueue(pending).await);
    first
}

/// [`OutboxAdmin::rows`] lists the rows newest first with their state (in creation
/// order with a creation-time criterion); each filter alone and combined selects what it
/// says; a filter matching nothing lists nothing; pages read by `before` list every
/// match once, in order, full but the last.
pub async fn rows_listed_newest_first_filtered_and_paged<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    let store = harness.store();
    let first = fill_listed(&store, "", async |messages: &[Message]| {
        harness.enqueue(messages).await
    })
    .await;
    check_listing(&store, "", first).await;
}

/// Checks the listing of an outbox [`fill_listed`] filled with `prefix`; `first` is
/// what the fill returned.
///
/// # Panics
///
/// With the rule the listing broke.
pub async fn check_listing<O: OutboxAdmin>(outbox: &O, prefix: &str, first: SystemTime) {
    let all = ok(
        "every row",
        outbox.rows(&RowFilter::default(), None, 100).await,
    );
    let expected: Vec<String> = (0..LISTED).rev().map(|n| n.to_string()).collect();
    assert_eq!(labels(&all), expected, "every row, newest first");
    assert!(
        all.windows(2).all(|w| w[0].state.seq > w[1].state.seq),
        "rows are listed in descending commit order"
    );
    let status = |n: &str| match n {
        "1" | "5" => RowStatus::Dead,
        "9" | "10" | "11" => RowStatus::Pending,
        _ => RowStatus::Done,
    };
    for row in &all {
        assert_eq!(row.state.status, status(&label(&row.message)));
        assert_eq!(
            row.state.settled_at.is_some(),
            row.state.status != RowStatus::Pending,
            "settled rows, and only they, have a settlement time"
        );
    }
    let dead = all
        .iter()
        .find(|row| row.state.status == RowStatus::Dead)
        .expect("a dead row");
    assert_eq!(dead.state.last_error.as_deref(), Some("refused"));

    let minute = |n: u64| first + Duration::from_secs(60 * n);
    let orders = format!("{prefix}orders");
    let fourth = all[4].message.id;
    let filters = [
        filter(|f| f.status = Some(RowStatus::Pending)),
        filter(|f| f.status = Some(RowStatus::Done)),
        filter(|f| f.status = Some(RowStatus::Dead)),
        filter(|f| f.topic = Some(orders.clone())),
        filter(|f| f.key = Some("k-a".to_owned())),
        filter(|f| f.id = Some(fourth)),
        filter(|f| f.created_from = Some(minute(4))),
        filter(|f| f.created_until = Some(minute(8))),
        filter(|f| {
            f.status = Some(RowStatus::Done);
            f.topic = Some(orders.clone());
            f.key = Some("k-b".to_owned());
        }),
        filter(|f| {
            f.created_from = Some(minute(4));
            f.created_until = Some(minute(8));
            f.topic = Some(orders.clone());
        }),
        filter(|f| {
            f.status = Some(RowStatus::Pending);
            f.key = Some("k-a".to_owned());
        }),
        filter(|f| {
            f.id = Some(fourth);
            f.status = Some(status(&label(&all[4].message)));
        }),
    ];
    for filter in &filters {
        let expected = matching(&all, filter);
        assert!(!expected.is_empty(), "{filter:?} selects rows");
        let rows = ok("a filtered listing", outbox.rows(filter, None, 100).await);
        assert_eq!(labels(&rows), expected, "{filter:?}");
    }
    let nothing = [
        filter(|f| f.id = Some(MessageId::new())),
        filter(|f| {
            f.id = Some(fourth);
            f.status = Some(RowStatus::Dead);
        }),
        filter(|f| {
            f.status = Some(RowStatus::Dead);
            f.key = Some("k-a".to_owned());
        }),
        filter(|f| f.created_until = Some(minute(0))),
    ];
    for filter in &nothing {
        let rows = ok("a filtered listing", outbox.rows(filter, None, 100).await);
        assert!(
            rows.is_empty(),
            "{filter:?} matched {}",
            labels(&rows).join(", ")
        );
    }

    for (filter, limit) in [
        (RowFilter::default(), 5),
        (RowFilter::default(), 1),
        (filter(|f| f.status = Some(RowStatus::Done)), 2),
        (filter(|f| f.topic = Some(orders.clone())), 3),
        (filter(|f| f.status = Some(RowStatus::Pending)), 3),
        (filter(|f| f.created_from = Some(minute(1))), 2),
        (
            filter(|f| {
                f.created_until = Some(minute(9));
                f.status = Some(RowStatus::Done);
            }),
            2,
        ),
    ] {
        let expected = matching(&all, &filter);
        let mut listed = Vec::new();
        let mut before = None;
        loop {
            let page = ok("a page", outbox.rows(&filter, before, limit).await);
            assert!(page.len() <= limit, "{filter:?}: {} > {limit}", page.len());
            let Some(last) = page.last() else { break };
            if listed.len() + limit <= expected.len() {
                assert_eq!(page.len(), limit, "{filter:?}: a short page before the end");
            }
            before = Some(last.state.seq);
            listed.extend(labels(&page));
        }
        assert_eq!(listed, expected, "{filter:?} in pages of {limit}");
    }
    let none = ok(
        "a page of none",
        outbox.rows(&RowFilter::default(), None, 0).await,
    );
    assert!(none.is_empty(), "a limit of 0 lists nothing");
}

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}

/// The labels of the rows of `all` (newest first in commit order) that `filter`
/// selects, in the listing's order.
fn matching(all: &[OutboxRow], filter: &RowFilter) -> Vec<String> {
    let mut selected: Vec<&OutboxRow> = all
        .iter()
        .filter(|row| {
            let (state, message) = (&row.state, &row.message);
            filter.status.is_none_or(|status| state.status == status)
                && filter.topic.as_ref().is_none_or(|t| message.topic == *t)
                && filter
                    .key
                    .as_ref()
                    .is_none_or(|k| message.key.as_ref() == Some(k))
                && filter.id.is_none_or(|id| message.id == id)
                && filter
                    .created_from
                    .is_none_or(|from| message.created_at >= from)
                && filter
                    .created_until
                    .is_none_or(|until| message.created_at < until)
        })
        .collect();
    if filter.created_from.is_some() || filter.created_until.is_some() {
        // Newest created first, then newest committed: stable on the commit order.
        selected.sort_by_key(|row| std::cmp::Reverse(row.message.created_at));
    }
    selected.iter().map(|row| label(&row.message)).collect()
}

fn label(message: &Message) -> String {
    String::from_utf8_lossy(&message.payload).into_owned()
}

fn labels(rows: &[OutboxRow]) -> Vec<String> {
    rows.iter().map(|row| label(&row.message)).collect()
}
