//! `PgInbox`: the record is part of the transaction, a duplicate leaves the connection
//! clean, consumer names and ids of any text are bind parameters, recorded exactly as
//! given, and the purge per consumer has its index.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::Fault;
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_postgres::PgInbox;
use sqlx::Row;

use common::TestDb;

const CONSUMER: &str = "billing";

async fn records(db: &TestDb, id: &str) -> i64 {
    records_of(db, CONSUMER, id).await
}

async fn records_of(db: &TestDb, consumer: &str, id: &str) -> i64 {
    sqlx::query("SELECT count(*) FROM inbox WHERE consumer = $1 AND message_id = $2")
        .bind(consumer)
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

/// Consumer names and ids that SQL text would have to escape are stored exactly as
/// given: the table holds the very text (plain SQL reading the table finds it), each pair
/// once.
#[tokio::test]
async fn consumers_and_ids_of_any_text_are_stored_as_given() {
    let db = TestDb::new().await;
    let inbox: PgInbox = db.store.inbox();
    let texts = [
        "it's",
        "x'); DROP TABLE inbox; --",
        r"back\slash \x41",
        "$$dollar$$; $q$ $q$",
        "a;b; COMMIT; BEGIN",
        "ünïcödé € 𝄞",
        "",
    ];
    for consumer in texts {
        for id in texts {
            let (tx, recorded) = inbox.begin_recorded(consumer, id).await.unwrap();
            assert_eq!(recorded, Recorded::New, "{consumer:?}, {id:?}");
            inbox.commit(tx).await.unwrap();
        }
    }
    for consumer in texts {
        for id in texts {
            assert_eq!(
                records_of(&db, consumer, id).await,
                1,
                "{consumer:?}, {id:?} stored as given"
            );
        }
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(total, (texts.len() * texts.len()) as i64);
}

#[tokio::test]
async fn a_nul_is_a_permanent_error_not_a_stuck_connection() {
    let db = TestDb::with_connections(1).await;
    let inbox: PgInbox = db.store.inbox();
    for (consumer, id) in [(CONSUMER, "nul\0byte"), ("nul\0consumer", "id")] {
        let error = inbox
            .begin_recorded(consumer, id)
            .await
            .expect_err("PostgreSQL text cannot hold NUL");
        assert_eq!(error.fault(), Fault::Permanent, "{error:?}");
        assert!(error.to_string().contains("0x00"), "{error}");
        let mut tx = inbox.begin().await.unwrap();
        let error = inbox
            .record(&mut tx, consumer, id)
            .await
            .expect_err("record refuses it too");
        assert_eq!(error.fault(), Fault::Permanent, "{error:?}");
        let error = inbox
            .store_result(&mut tx, consumer, id, b"result")
            .await
            .expect_err("store_result refuses it too");
        assert_eq!(error.fault(), Fault::Permanent, "{error:?}");
    }
    let error = inbox
        .purge("nul\0consumer", SystemTime::now(), 10)
        .await
        .expect_err("purge refuses it too");
    assert_eq!(error.fault(), Fault::Permanent, "{error:?}");
    let (tx, recorded) = inbox.begin_recorded(CONSUMER, "next").await.unwrap();
    assert_eq!(recorded, Recorded::New, "the connection is usable");
    inbox.commit(tx).await.unwrap();
}

/// A caller that stops waiting for `begin_recorded` while its statement runs (here, while
/// it waits for a transaction holding the same id) leaves nothing in the pool: once the
/// holder rolls back, the statement inserts the record and begins a transaction, and
/// that transaction is rolled back, not committed by the pool's next user.
#[tokio::test]
async fn a_record_given_up_on_leaves_no_transaction_in_the_pool() {
    let db = TestDb::with_connections(2).await;
    let inbox: PgInbox = db.store.inbox();
    let (holder, _) = inbox.begin_recorded(CONSUMER, "contended").await.unwrap();
    let given_up = tokio::time::timeout(
        Duration::from_millis(300),
        inbox.begin_recorded(CONSUMER, "contended"),
    )
    .await;
    assert!(given_up.is_err(), "the second record waits for the first");
    holder.rollback().await.unwrap();
    // The given-up statement goes on on the server: its insert, then its BEGIN.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The pool's next users, on both of its connections, commit work of their own.
    let mut first = db.store.pool().begin().await.unwrap();
    let mut second = db.store.pool().begin().await.unwrap();
    for tx in [&mut first, &mut second] {
        sqlx::query("SELECT 1").execute(&mut **tx).await.unwrap();
    }
    first.commit().await.unwrap();
    second.commit().await.unwrap();
    assert_eq!(
        records(&db, "contended").await,
        0,
        "the given-up record was committed by the pool's next user"
    );
}

/// The consumer name and the id never reach a statement's text as text: they are bound
/// as parameters, or, in the message that records and begins at once (a simple query,
/// which has no parameters), written as hexadecimal digits. While the record's
/// transaction is open, no session's statement text holds either (the server shows each
/// session's last statement in `pg_stat_activity`), though it does show text sent in a
/// statement.
#[tokio::test]
async fn consumers_and_ids_never_reach_the_statement_text() {
    let db = TestDb::new().await;
    let inbox: PgInbox = db.store.inbox();
    let marker = format!("marker-{}", uuid::Uuid::new_v4().simple());
    let consumer = format!("{marker}-consumer");
    let id = format!("{marker}-id");
    let statements_with_marker = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT query FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND strpos(query, $1) > 0",
        )
        .bind(&marker)
        .fetch_all(db.store.pool())
        .await
        .expect("read pg_stat_activity")
    };

    let (mut tx, recorded) = inbox.begin_recorded(&consumer, &id).await.unwrap();
    assert_eq!(recorded, Recorded::New);
    assert_eq!(
        statements_with_marker().await,
        Vec::<String>::new(),
        "the record's statements hold no outside data"
    );
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    let recording: String = sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND strpos(query, $1) > 0",
    )
    .bind(&hex)
    .fetch_one(db.store.pool())
    .await
    .expect("the recording statement, by the id's hex digits");
    assert!(
        recording.starts_with("INSERT INTO") && recording.ends_with("; BEGIN"),
        "{recording}"
    );
    inbox
        .store_result(&mut tx, &consumer, &id, b"result")
        .await
        .unwrap();
    assert_eq!(statements_with_marker().await, Vec::<String>::new());
    inbox.commit(tx).await.unwrap();
    let (tx, recorded) = inbox.begin_recorded(&consumer, &id).await.unwrap();
    assert_eq!(
        recorded,
        Recorded::Duplicate {
            result: "result".into()
        }
    );
    assert_eq!(statements_with_marker().await, Vec::<String>::new());
    drop(tx);

    // The probe sees text written into a statement.
    let mut tx = inbox.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SELECT '{marker}'")))
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(statements_with_marker().await.len(), 1);
    tx.rollback().await.unwrap();
}

/// A schema migrated before version 2 gets the index of the purge per consumer, and loses
/// the one on the processed time alone; its records stay.
#[tokio::test]
async fn version_1_schemas_get_the_purge_index() {
    let db = TestDb::new().await;
    let schema = common::unique_schema();
    let v1 = oncebox_postgres::SCHEMA_V1.replace(
        oncebox_postgres::SCHEMA_PLACEHOLDER,
        &format!("\"{schema}\""),
    );
    db.exec(&format!("CREATE SCHEMA \"{schema}\"; {v1}")).await;
    let store = db.store.clone().with_schema(&schema).unwrap();
    let inbox = store.inbox();
    let (tx, _) = inbox.begin_recorded(CONSUMER, "before").await.unwrap();
    inbox.commit(tx).await.unwrap();
    let indexes = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'inbox'
             ORDER BY indexname",
        )
        .bind(&schema)
        .fetch_all(db.store.pool())
        .await
        .unwrap()
    };
    assert!(
        indexes().await.iter().any(|i| i.contains("(processed_at)")),
        "{:?}",
        indexes().await
    );

    store.migrate().await.unwrap();
    let indexes = indexes().await;
    assert!(
        indexes
            .iter()
            .any(|i| i.contains("(consumer, processed_at)")),
        "{indexes:?}"
    );
    assert!(
        !indexes.iter().any(|i| i.contains("(processed_at)")),
        "{indexes:?}"
    );
    let later = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(inbox.purge("other", later, 10).await.unwrap(), 0);
    assert_eq!(inbox.purge(CONSUMER, later, 10).await.unwrap(), 1);
    drop(common::drop_schema(schema));
}
