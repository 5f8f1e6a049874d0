//! Batch enqueue on PostgreSQL beyond the conformance suite (where the key locks' fixed
//! order is checked): a duplicate from a concurrent transaction, the notification, a
//! Debezium-style table.

mod common;

use std::time::Duration;

use oncebox_core::{Error, Message};
use oncebox_postgres::DebeziumLayout;
use sqlx::postgres::PgListener;

use common::{LONG, TestDb, claim, labels, msg};

/// A batch holding an id that a concurrent transaction enqueued and has not committed
/// waits for it; when it commits, the batch is refused as a duplicate naming that id,
/// and nothing of it is written.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_duplicate_is_named() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let racer = msg(None, "racer");
    let mut first = db.store.pool().begin().await.unwrap();
    outbox.enqueue(&mut first, &racer).await.unwrap();

    let batch = vec![
        msg(Some("k"), "fresh-1"),
        msg(Some("j"), "copy").with_id(racer.id),
        msg(Some("k"), "fresh-2"),
    ];
    let batcher = {
        let pool = db.store.pool().clone();
        let outbox = outbox.clone();
        let batch = batch.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let result = outbox.enqueue_batch(&mut tx, &batch).await;
            tx.rollback().await.unwrap();
            result
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.commit().await.unwrap();
    match tokio::time::timeout(LONG, batcher).await.unwrap().unwrap() {
        Err(Error::Duplicate { id }) => assert_eq!(id, racer.id),
        other => panic!("expected Error::Duplicate, got {other:?}"),
    }
    for m in [&batch[0], &batch[2]] {
        assert!(outbox.status(m.id).await.unwrap().is_none());
    }
}

/// With notifications on, a committed batch wakes a listener.
#[tokio::test(flavor = "multi_thread")]
async fn batch_notifies() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_notify(true);
    let mut listener = PgListener::connect_with(db.store.pool()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let batch: Vec<Message> = (0..100)
        .map(|i| msg(Some(&format!("k{}", i % 7)), &format!("m{i}")))
        .collect();
    let mut tx = db.store.pool().begin().await.unwrap();
    outbox.enqueue_batch(&mut tx, &batch).await.unwrap();
    tx.commit().await.unwrap();
    let notification = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification for the batch")
        .unwrap();
    assert_eq!(notification.channel(), outbox.channel());
}

/// A Debezium-style table takes batches: topic prefix and JSON payload checked for the
/// whole batch, rows in slice order, aggregates as keys.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_table_takes_batches() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE outbox_events (
            id            uuid         PRIMARY KEY,
            aggregatetype varchar(255) NOT NULL,
            aggregateid   varchar(255) NOT NULL,
            type          varchar(255) NOT NULL,
            payload       jsonb,
            \"timestamp\" timestamptz  NOT NULL DEFAULT now()
        )",
    )
    .await;
    let layout = DebeziumLayout::new(&format!("{}.outbox_events", db.schema))
        .timestamp_column("timestamp")
        .topic_prefix("outbox.event.");
    db.store.migrate_debezium(&layout).await.unwrap();
    let outbox = db.store.debezium_outbox_with(&layout).unwrap();
    let line = |key: Option<&str>, i: u32| {
        let m = Message::new("outbox.event.order", format!(r#"{{"line": {i}}}"#));
        match key {
            Some(key) => m.with_key(key),
            None => m,
        }
    };
    let mut batch: Vec<Message> = (0..50)
        .map(|i| line([Some("o-1"), Some("o-2"), None][(i % 3) as usize], i))
        .collect();

    let mut tx = db.store.pool().begin().await.unwrap();
    let mut not_json = batch.clone();
    not_json[20] = Message::new("outbox.event.order", "not json").with_key("o-1");
    let err = outbox.enqueue_batch(&mut tx, &not_json).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    let mut elsewhere = batch.clone();
    elsewhere[30] = Message::new("elsewhere", "{}");
    let err = outbox.enqueue_batch(&mut tx, &elsewhere).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
    outbox.enqueue_batch(&mut tx, &batch).await.unwrap();
    tx.commit().await.unwrap();

    let (_, rows) = claim(&outbox, 100, LONG).await;
    let got: Vec<(Option<String>, String)> = rows
        .iter()
        .map(|r| {
            (
                r.item.key.clone(),
                String::from_utf8_lossy(&r.item.payload).into_owned(),
            )
        })
        .collect();
    let want: Vec<(Option<String>, String)> = batch
        .drain(..)
        .map(|m| (m.key, String::from_utf8_lossy(&m.payload).into_owned()))
        .collect();
    assert_eq!(got, want, "rows in slice order: {:?}", labels(&rows));
}
