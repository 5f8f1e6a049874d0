//! `PgInbox::begin_recorded`: the record and `BEGIN` in one message. The record is part
//! of the transaction, a duplicate leaves the connection clean, and ids of any text are
//! recorded exactly as given.

mod common;

use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_postgres::PgInbox;
use sqlx::Row;

use common::TestDb;

const CONSUMER: &str = "billing";

async fn records(db: &TestDb, id: &str) -> i64 {
    sqlx::query("SELECT count(*) FROM inbox WHERE consumer = $1 AND message_id = $2")
        .bind(CONSUMER)
        .bind(id)
        .fetch_one(db.store.pool())
        .await
        .expect("count the records")
        .get(0)
}

#[tokio::test]
async fn the_record_commits_and_rolls_back_with_the_transaction() {
    let db = TestDb::new().await;
    let inbox: PgInbox = db.store.inbox();

    let (tx, recorded) = inbox.begin_recorded(CONSUMER, "rolled-back").await.unwrap();
    assert_eq!(recorded, Recorded::New);
    tx.rollback().await.unwrap();
    assert_eq!(
        records(&db, "rolled-back").await,
        0,
        "rolled back with the tx"
    );

    let (tx, recorded) = inbox.begin_recorded(CONSUMER, "committed").await.unwrap();
    assert_eq!(recorded, Recorded::New);
    inbox.commit(tx).await.unwrap();
    assert_eq!(records(&db, "committed").await, 1);
}

#[tokio::test]
async fn a_duplicate_gets_the_first_result_and_leaves_the_connection_clean() {
    // One connection: the duplicate's failed message and everything after share it.
    let db = TestDb::with_connections(1).await;
    let inbox: PgInbox = db.store.inbox();
    let (mut tx, _) = inbox.begin_recorded(CONSUMER, "order-7").await.unwrap();
    inbox
        .store_result(&mut tx, CONSUMER, "order-7", b"charged")
        .await
        .unwrap();
    inbox.commit(tx).await.unwrap();

    for _ in 0..3 {
        let (tx, recorded) = inbox.begin_recorded(CONSUMER, "order-7").await.unwrap();
        assert_eq!(
            recorded,
            Recorded::Duplicate {
                result: "charged".into()
            }
        );
        inbox.commit(tx).await.unwrap();
    }
    let (tx, recorded) = inbox.begin_recorded(CONSUMER, "order-8").await.unwrap();
    assert_eq!(recorded, Recorded::New, "the connection is usable");
    inbox.commit(tx).await.unwrap();
    assert_eq!(records(&db, "order-7").await, 1);
    assert_eq!(records(&db, "order-8").await, 1);
}

#[tokio::test]
async fn ids_of_any_text_are_recorded_as_given() {
    let db = TestDb::new().await;
    let inbox: PgInbox = db.store.inbox();
    let ids = [
        "it's",
        "x'); DROP TABLE inbox; --",
        r"back\slash \x41",
        "$$dollar$$",
        "ünïcödé € 𝄞",
        "",
    ];
    for id in ids {
        let (tx, recorded) = inbox.begin_recorded(CONSUMER, id).await.unwrap();
        assert_eq!(recorded, Recorded::New, "{id:?}");
        inbox.commit(tx).await.unwrap();
    }
    for id in ids {
        assert_eq!(records(&db, id).await, 1, "{id:?} stored as given");
        let mut tx = inbox.begin().await.unwrap();
        let recorded = inbox.record(&mut tx, CONSUMER, id).await.unwrap();
        assert!(
            matches!(recorded, Recorded::Duplicate { .. }),
            "{id:?}: {recorded:?}"
        );
    }
}

#[tokio::test]
async fn an_id_the_server_cannot_store_is_an_error_not_a_stuck_connection() {
    let db = TestDb::with_connections(1).await;
    let inbox: PgInbox = db.store.inbox();
    let error = inbox
        .begin_recorded(CONSUMER, "nul\0byte")
        .await
        .expect_err("PostgreSQL text cannot hold NUL");
    assert!(error.to_string().contains("0x00"), "{error}");
    let (tx, recorded) = inbox.begin_recorded(CONSUMER, "next").await.unwrap();
    assert_eq!(recorded, Recorded::New, "the connection is usable");
    inbox.commit(tx).await.unwrap();
}
