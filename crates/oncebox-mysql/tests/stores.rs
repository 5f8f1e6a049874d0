//! The inbox, durable inbox and dedup stores beyond the conformance suite: ids compared
//! byte for byte, values too long for their columns refused, not cut.

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
