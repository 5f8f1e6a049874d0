//! The inbox, durable inbox and dedup stores beyond the conformance suite: ids compared
//! byte for byte, values too long for their columns refused, not cut, and each
//! consumer's figures adding up both inboxes.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::consumer::{ConsumerStats, InboxAdmin};
use oncebox_core::spool::{Settle, Settlement, SpoolStore};
use oncebox_core::store::{
    Accepted, Begin, DedupStore, DurableInboxStore, InboxStore, Recorded, Transactional,
};
use oncebox_core::{Coordinates, Error, Fault, Message, Received};
use oncebox_mysql::ValueTooLong;

use common::{LONG, TestDb, claim};

/// One millisecond, the resolution of stored times.
const MILLI: Duration = Duration::from_millis(1);

fn too_long(error: &Error) -> &ValueTooLong {
    match error {
        Error::Store {
            source,
            fault: Fault::Permanent,
        } => source
            .downcast_ref::<ValueTooLong>()
            .unwrap_or_else(|| panic!("not a ValueTooLong: {source}")),
        other => panic!("expected a permanent store error, got {other}"),
    }
}

fn received(key: Option<&str>) -> Received {
    let mut message = Message::new("payments", "p");
    message.key = key.map(str::to_owned);
    let at = Coordinates {
        source: "payments".into(),
        partition: Some(0),
        position: "0".into(),
    };
    Received::from_message(&message, at, 1)
}

/// `a`, `A` and `a ` are three ids for the inbox and the dedup store (a VARCHAR id
/// under the usual collations would make them one, and report false duplicates).
#[tokio::test(flavor = "multi_thread")]
async fn ids_are_exact_bytes() {
    let db = TestDb::new().await;
    let inbox = db.store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    for id in ["a", "A", "a "] {
        let recorded = inbox.record(&mut tx, "billing", id).await.unwrap();
        assert_eq!(recorded, Recorded::New, "{id:?}");
    }
    let again = inbox.record(&mut tx, "billing", "a").await.unwrap();
    assert!(matches!(again, Recorded::Duplicate { .. }));
    inbox.commit(tx).await.unwrap();

    let dedup = db.store.dedup();
    for id in ["a", "A", "a "] {
        let begun = dedup.begin(id, Duration::from_secs(30)).await.unwrap();
        assert!(matches!(begun, Begin::Started(_)), "{id:?}: {begun:?}");
    }

    let durable = db.store.durable_inbox("billing");
    for id in ["a", "A", "a "] {
        let accepted = durable.accept(id, &received(Some("k"))).await.unwrap();
        assert_eq!(accepted, Accepted::New, "{id:?}");
    }
}

/// Ids, consumers and keys longer than their columns are refused with a typed error
/// before anything is written; the longest that fit are stored whole.
#[tokio::test(flavor = "multi_thread")]
async fn long_values_are_refused_not_cut() {
    let db = TestDb::new().await;
    let dedup = db.store.dedup();
    let longest = "i".repeat(1024);
    assert!(matches!(
        dedup
            .begin(&longest, Duration::from_secs(30))
            .await
            .unwrap(),
        Begin::Started(_)
    ));
    let error = dedup
        .begin(&format!("{longest}x"), Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(
        (too_long(&error).what(), too_long(&error).limit()),
        ("dedup id", 1024)
    );

    let inbox = db.store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    let error = inbox
        .record(&mut tx, &"c".repeat(256), "id")
        .await
        .unwrap_err();
    assert_eq!(too_long(&error).what(), "consumer");
    assert_eq!(
        inbox.record(&mut tx, "billing", &longest).await.unwrap(),
        Recorded::New
    );
    inbox.commit(tx).await.unwrap();

    let durable = db.store.durable_inbox("billing");
    let error = durable
        .accept("id", &received(Some(&"k".repeat(513))))
        .await
        .unwrap_err();
    assert_eq!(too_long(&error).what(), "key");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_durable_inbox")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing was written");
}

/// The inbox's purge reads about as many index entries as it deletes, however many old
/// records the consumer has: it walks `(consumer, processed_at)` in order and stops at
/// the limit (the server counts the rows its handlers read, per session).
#[tokio::test(flavor = "multi_thread")]
async fn inbox_purge_reads_what_it_deletes() {
    // One connection: the purge and the counters share its session.
    let db = TestDb::with_connections(1).await;
    db.exec(
        "INSERT INTO oncebox_inbox (consumer, message_id, processed_at)
         SELECT c.consumer, CONCAT('id-', a.d, b.d, e.d, f.d), 1000 + a.d * 1000 + b.d * 100
         FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
               UNION ALL SELECT 8 UNION ALL SELECT 9) AS a
         CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
               UNION ALL SELECT 8 UNION ALL SELECT 9) AS b
         CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
               UNION ALL SELECT 8 UNION ALL SELECT 9) AS e
         CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
               UNION ALL SELECT 8 UNION ALL SELECT 9) AS f
         CROSS JOIN (SELECT 'billing' AS consumer UNION ALL SELECT 'shipping') AS c;
         ANALYZE TABLE oncebox_inbox",
    )
    .await;
    let inbox = db.store.inbox();
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    db.exec("FLUSH STATUS").await;
    assert_eq!(inbox.purge("billing", later, 100).await.unwrap(), 100);
    let read: Vec<(String, String)> = sqlx::query_as("SHOW SESSION STATUS LIKE 'Handler_read%'")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    let rows: u64 = read
        .iter()
        .filter(|(name, _)| name != "Handler_read_rnd_deleted")
        .map(|(_, value)| value.parse::<u64>().unwrap_or(0))
        .sum();
    assert!(
        rows < 1_000,
        "a purge of 100 of 10,000 old records read {rows} rows: {read:?}"
    );
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_inbox")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 20_000 - 100);
}

/// `billing` has one inbox record and a durable row in each status (one done, one dead,
/// two pending of which one was claimed and released); `shipping` has three inbox
/// records. Handled counts the records and the done rows; the last handled time is the
/// later of the last record and the last done row (times in whole milliseconds, so the
/// bounds start a millisecond early).
#[tokio::test]
async fn each_consumer_has_its_figures_in_name_order() {
    let db = TestDb::new().await;
    let inbox = db.store.inbox();
    assert_eq!(
        inbox.consumers().await.expect("the figures"),
        [],
        "an empty inbox has no consumers"
    );

    let start = SystemTime::now()
        .checked_sub(MILLI)
        .expect("a time after the epoch");
    for (consumer, id) in [
        ("shipping", "s-1"),
        ("shipping", "s-2"),
        ("billing", "b-1"),
        ("shipping", "s-3"),
    ] {
        let (tx, recorded) = inbox
            .begin_recorded(consumer, id)
            .await
            .expect("record the id");
        assert_eq!(recorded, Recorded::New);
        inbox.commit(tx).await.expect("commit the record");
    }
    let durable = db.store.durable_inbox("billing");
    for id in ["d-1", "d-2", "d-3", "d-4"] {
        let accepted = durable.accept(id, &received(None)).await.expect("accept");
        assert_eq!(accepted, Accepted::New);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before_done = SystemTime::now()
        .checked_sub(MILLI)
        .expect("a time after the epoch");
    let (token, rows) = claim(&durable, 3, LONG).await;
    let outcomes = [
        Settle::Done,
        Settle::Dead {
            reason: "refused".into(),
        },
        Settle::Release,
    ];
    let settlements: Vec<Settlement> = rows
        .iter()
        .zip(outcomes)
        .map(|(row, outcome)| Settlement {
            seq: row.seq,
            outcome,
        })
        .collect();
    durable
        .settle(token, &settlements)
        .await
        .expect("settle the claim");
    let end = SystemTime::now();

    let figures = inbox.consumers().await.expect("the figures");
    let names: Vec<&str> = figures.iter().map(|f| f.consumer.as_str()).collect();
    assert_eq!(names, ["billing", "shipping"]);
    let billing_last = figures[0]
        .last_handled_at
        .expect("billing handled messages");
    let shipping_last = figures[1]
        .last_handled_at
        .expect("shipping handled messages");
    assert!(
        (before_done..=end).contains(&billing_last),
        "billing's last is its done row: {billing_last:?}"
    );
    assert!(
        (start..before_done).contains(&shipping_last),
        "shipping's last is its last record: {shipping_last:?}"
    );
    assert_eq!(
        figures,
        [
            ConsumerStats {
                consumer: "billing".into(),
                handled: 2,
                pending: 2,
                dead: 1,
                last_handled_at: Some(billing_last),
            },
            ConsumerStats {
                consumer: "shipping".into(),
                handled: 3,
                pending: 0,
                dead: 0,
                last_handled_at: Some(shipping_last),
            },
        ]
    );
}
