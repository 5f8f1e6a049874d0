//! The dashboard's reads of the outbox: rows newest first, filtered and paged, and the
//! messages published per minute.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{
    MinuteCount, OutboxAdmin, OutboxRow, RowFilter, RowStatus, Settle, Settlement, SpoolStore,
};
use oncebox_core::{Message, MessageId};
use oncebox_mysql::MySqlOutbox;

use common::{LONG, TestDb, claim, enqueue};

/// Messages in the outbox of these tests.
const MESSAGES: u64 = 12;

#[tokio::test(flavor = "multi_thread")]
async fn rows_are_listed_newest_first_filtered_and_paged() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let created = fill(&db, &outbox).await;
    check_listing(&outbox, created).await;
}

/// On a table of 250,000 rows, mostly published, a page at any depth is read from
/// `before` on in the index that fits the filter: no sort, and rows of a status from the
/// `(status, seq)` index range, not every row of the status (which MariaDB chose for
/// published rows before the index hint).
#[tokio::test(flavor = "multi_thread")]
async fn listing_plans_read_an_index_from_before() {
    let db = TestDb::new().await;
    db.exec(
        "INSERT INTO oncebox_outbox
           (id, topic, `key`, kind, headers, payload, created_at, status, done_at)
         WITH RECURSIVE d (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 499)
         SELECT UNHEX(REPLACE(UUID(), '-', '')), 'orders',
                CONCAT('key-', (a.n * 500 + b.n) MOD 200), 'OrderPlaced', '{}', X'00', 0,
                CASE WHEN a.n >= 495 THEN 0 WHEN b.n = 250 THEN 2 ELSE 1 END, 1
         FROM d AS a CROSS JOIN d AS b;
         ANALYZE TABLE oncebox_outbox",
    )
    .await;
    let outbox = db.store.outbox();
    let mid = Some(125_000);
    let id: String = sqlx::query_scalar("SELECT HEX(id) FROM oncebox_outbox WHERE seq = 1000")
        .fetch_one(db.store.pool())
        .await
        .expect("an id");
    let id = MessageId::parse(&id).expect("a UUID");
    let cases = [
        (RowFilter::default(), "range", "PRIMARY"),
        (
            filter(|f| f.status = Some(RowStatus::Done)),
            "range",
            "oncebox_outbox_pending",
        ),
        (
            filter(|f| f.status = Some(RowStatus::Dead)),
            "range",
            "oncebox_outbox_pending",
        ),
        (
            filter(|f| {
                f.status = Some(RowStatus::Done);
                f.topic = Some("orders".to_owned());
            }),
            "range",
            "oncebox_outbox_pending",
        ),
        (
            filter(|f| {
                f.status = Some(RowStatus::Pending);
                f.key = Some("key-7".to_owned());
            }),
            "range",
            "oncebox_outbox_pending_key",
        ),
        (
            filter(|f| {
                f.id = Some(id);
                f.status = Some(RowStatus::Done);
            }),
            "const",
            "oncebox_outbox_id",
        ),
    ];
    for (filter, access, index) in cases {
        let plan = outbox
            .explain_rows(&filter, mid, 50)
            .await
            .expect("explain the listing");
        println!("{filter:?}\n{plan}");
        // id, select_type, table, type, possible_keys, key, key_len, ...
        let row: Vec<&str> = plan
            .lines()
            .find(|line| line.split('\t').nth(2) == Some("t"))
            .unwrap_or_else(|| panic!("no step reads the outbox: {plan}"))
            .split('\t')
            .collect();
        assert_eq!((row[3], row[5]), (access, index), "{filter:?}: {plan}");
        assert!(!plan.contains("filesort"), "{filter:?} sorts: {plan}");
    }
}

/// Sets the publication times of the done rows around the database's current minute `m`: two in
/// `m - 10`, one in `m - 3`, one two hours ago, the rest in `m - 2`; then counts them.
#[tokio::test(flavor = "multi_thread")]
async fn published_per_minute_counts_done_rows_by_minute() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    fill(&db, &outbox).await;
    let done = outbox
        .rows(&filter(|f| f.status = Some(RowStatus::Done)), None, 100)
        .await
        .expect("done rows");
    assert_eq!(done.len(), 7);
    let minute: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
                DIV 60000000 * 60000",
    )
    .fetch_one(db.store.pool())
    .await
    .expect("the database's minute");
    let at = |minutes_ago: i64, ms: i64| minute - 60_000 * minutes_ago + ms;
    let times = [
        at(10, 5_000),
        at(10, 50_000),
        at(3, 59_500),
        at(120, 0),
        at(2, 1_000),
        at(2, 30_000),
        at(2, 59_999),
    ];
    for (row, time) in done.iter().zip(times) {
        sqlx::query("UPDATE oncebox_outbox SET done_at = ? WHERE id = ?")
            .bind(time)
            .bind(row.message.id.as_uuid().as_bytes().to_vec())
            .execute(db.store.pool())
            .await
            .expect("set the publication time");
    }
    let count = |minutes_ago: i64, published: u64| MinuteCount {
        minute: UNIX_EPOCH
            + Duration::from_millis(
                u64::try_from(minute - 60_000 * minutes_ago).expect("after 1970"),
            ),
        published,
    };
    let hour = outbox
        .published_per_minute(SystemTime::now() - Duration::from_secs(3600))
        .await
        .expect("published per minute");
    assert_eq!(hour, [count(10, 2), count(3, 1), count(2, 3)]);
    let recent = outbox
        .published_per_minute(SystemTime::now() - Duration::from_secs(300))
        .await
        .expect("published per minute");
    assert_eq!(recent, [count(3, 1), count(2, 3)]);
    let future = outbox
        .published_per_minute(SystemTime::now() + Duration::from_secs(60))
        .await
        .expect("published per minute");
    assert!(future.is_empty());
}

/// Fills the outbox with [`MESSAGES`] messages `0`, `1`, …, each created a minute after
/// the one before (from an hour ago), on topics `payments` (every third) and `orders`,
/// with keys `k-a`, `k-b` and none in turn; `1` and `5` are dead, `9` and later pending,
/// the others done. Returns the first creation time.
async fn fill(db: &TestDb, outbox: &MySqlOutbox) -> SystemTime {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    let first = UNIX_EPOCH + Duration::from_secs(now.as_secs() - 3600);
    let messages: Vec<Message> = (0..MESSAGES)
        .map(|n| {
            let topic = if n % 3 == 0 { "payments" } else { "orders" };
            let mut message = Message::new(topic, n.to_string());
            message.created_at = first + Duration::from_secs(60 * n);
            match n % 3 {
                0 => message.with_key("k-a"),
                1 => message.with_key("k-b"),
                _ => message,
            }
        })
        .collect();
    let (settled, pending) = messages.split_at(9);
    enqueue(outbox, &db.store, settled).await;
    let (token, claimed) = claim(outbox, 100, LONG).await;
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
    outbox
        .settle(token, &settlements)
        .await
        .expect("settle the claim");
    enqueue(outbox, &db.store, pending).await;
    first
}

/// The listing of the outbox [`fill`] made, with each filter alone and combined, in
/// pages.
async fn check_listing<O: OutboxAdmin>(outbox: &O, first: SystemTime) {
    let all = outbox
        .rows(&RowFilter::default(), None, 100)
        .await
        .expect("rows");
    let expected: Vec<String> = (0..MESSAGES).rev().map(|n| n.to_string()).collect();
    assert_eq!(labels(&all), expected, "every row, newest first");
    assert!(all.windows(2).all(|w| w[0].state.seq > w[1].state.seq));
    let status = |n: &str| match n {
        "1" | "5" => RowStatus::Dead,
        "9" | "10" | "11" => RowStatus::Pending,
        _ => RowStatus::Done,
    };
    for row in &all {
        assert_eq!(row.state.status, status(&label(&row.message)));
        assert_eq!(
            row.state.settled_at.is_some(),
            row.state.status != RowStatus::Pending
        );
    }
    let dead = all
        .iter()
        .find(|row| row.state.status == RowStatus::Dead)
        .expect("a dead row");
    assert_eq!(dead.state.last_error.as_deref(), Some("refused"));

    let minute = |n: u64| first + Duration::from_secs(60 * n);
    let orders = "orders".to_owned();
    let filters = [
        filter(|f| f.status = Some(RowStatus::Pending)),
        filter(|f| f.status = Some(RowStatus::Done)),
        filter(|f| f.status = Some(RowStatus::Dead)),
        filter(|f| f.topic = Some(orders.clone())),
        filter(|f| f.key = Some("k-a".to_owned())),
        filter(|f| f.id = Some(all[4].message.id)),
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
            f.id = Some(all[4].message.id);
            f.status = Some(status(&label(&all[4].message)));
        }),
    ];
    for filter in &filters {
        let expected = matching(&all, filter);
        assert!(!expected.is_empty(), "{filter:?} selects rows");
        let rows = outbox.rows(filter, None, 100).await.expect("rows");
        assert_eq!(labels(&rows), expected, "{filter:?}");
    }
    let nothing = [
        filter(|f| f.id = Some(MessageId::new())),
        filter(|f| {
            f.id = Some(all[4].message.id);
            f.status = Some(RowStatus::Dead);
        }),
        filter(|f| {
            f.status = Some(RowStatus::Dead);
            f.key = Some("k-a".to_owned());
        }),
        filter(|f| f.created_until = Some(minute(0))),
    ];
    for filter in &nothing {
        let rows = outbox.rows(filter, None, 100).await.expect("rows");
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
    ] {
        let expected = matching(&all, &filter);
        let mut listed = Vec::new();
        let mut before = None;
        loop {
            let page = outbox.rows(&filter, before, limit).await.expect("a page");
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
    assert!(
        outbox
            .rows(&RowFilter::default(), None, 0)
            .await
            .expect("rows")
            .is_empty()
    );
}

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}

/// The labels of the rows of `all` that `filter` selects, in their order.
fn matching(all: &[OutboxRow], filter: &RowFilter) -> Vec<String> {
    let rows: Vec<OutboxRow> = all
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
        .cloned()
        .collect();
    labels(&rows)
}

fn label(message: &Message) -> String {
    String::from_utf8_lossy(&message.payload).into_owned()
}

fn labels(rows: &[OutboxRow]) -> Vec<String> {
    rows.iter().map(|row| label(&row.message)).collect()
}
