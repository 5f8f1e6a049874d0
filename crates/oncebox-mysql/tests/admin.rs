//! The dashboard's reads of the outbox beyond the conformance suite's listing and
//! counts: the plans of the listing on a large table.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use oncebox_core::MessageId;
use oncebox_core::spool::{RowFilter, RowStatus};

use common::TestDb;

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

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}
