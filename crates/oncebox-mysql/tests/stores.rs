//! The inbox, durable inbox and dedup stores beyond the conformance suite: ids compared
//! byte for byte and values too long for their columns refused, not cut.

mod common;

use std::time::Duration;

use oncebox_core::store::{
    Accepted, Begin, DedupStore, DurableInboxStore, InboxStore, Recorded, Transactional,
};
use oncebox_core::{Coordinates, Error, Fault, Message, Received};
use oncebox_mysql::ValueTooLong;

use common::TestDb;

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
