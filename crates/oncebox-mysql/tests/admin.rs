//! The dashboard's reads of the outbox beyond the conformance suite's listing: the
//! plans of the listing on a large table, and the messages published per minute.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{MinuteCount, RowFilter, RowStatus};
use oncebox_core::{Message, MessageId};
use oncebox_mysql::MySqlOutbox;
use oncebox_testkit::outbox::fill_listed;

use common::{TestDb, enqueue};

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
                CONCAT('key-', (a.n * 500 + b.n) MOD 200), 'OrderPlaced', '{}', X'00',
                a.n * 500 + b.n,
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
        (
            filter(|f| {
                f.created_from = Some(UNIX_EPOCH + Duration::from_millis(100_000));
                f.created_until = Some(UNIX_EPOCH + Duration::from_millis(150_000));
            }),
            "range",
            "oncebox_outbox_created",
        ),
        (
            filter(|f| {
                f.status = Some(RowStatus::Done);
                f.created_until = Some(UNIX_EPOCH + Duration::from_millis(150_000));
            }),
            "range",
            "oncebox_outbox_created",
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

/// Fills `outbox` as the conformance suite's listing check does.
async fn fill(db: &TestDb, outbox: &MySqlOutbox) -> SystemTime {
    fill_listed(outbox, "", async |messages: &[Message]| {
        enqueue(outbox, &db.store, messages).await;
        Ok(())
    })
    .await
}

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}
