//! Replaying the dead letters of the log-tailing relay: neither of its sources reads an
//! `UPDATE` of the outbox, so a replayed dead letter must reach the relay the way its
//! message first did (an insert, a logical decoding message), and be published again
//! under its id. A dead letter of the polling relay keeps its place as before.

#![cfg(feature = "cdc")]

mod common;

use std::time::Duration;

use common::TestDb;
use common::cdc::{Recorder, Slot, eventually, started};
use oncebox_core::{Message, MessageId};
use oncebox_postgres::cdc::CdcMode;

/// Emits `message` in a transaction of its own through the message outbox.
async fn emit(db: &TestDb, message: &Message) {
    let mut tx = db.store.pool().begin().await.expect("a transaction begins");
    db.store
        .message_outbox()
        .enqueue(&mut tx, message)
        .await
        .expect("the message is emitted");
    tx.commit().await.expect("the transaction commits");
}

/// Inserts `message` into the outbox table in a transaction of its own.
async fn insert(db: &TestDb, message: &Message) {
    db.enqueued(std::slice::from_ref(message))
        .await
        .expect("the message is enqueued")
        .commit()
        .await
        .expect("the transaction commits");
}

/// Waits for a dead row of message `id` whose `seq` is not `not`; its `seq`.
async fn dead_row(db: &TestDb, id: MessageId, not: Option<i64>) -> i64 {
    eventually(
        &format!("a dead row of {id} other than {not:?}"),
        || async {
            let seq: Option<i64> = sqlx::query_scalar(
                "SELECT seq FROM outbox WHERE id = $1::uuid AND status = 'dead' \
             AND seq IS DISTINCT FROM $2",
            )
            .bind(id.to_string())
            .bind(not)
            .fetch_optional(db.store.pool())
            .await
            .expect("the outbox is read");
            seq
        },
    )
    .await
}

/// Waits until the outbox table is empty.
async fn empty(db: &TestDb) {
    eventually("an empty outbox table", || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(db.store.pool())
            .await
            .expect("the rows are counted");
        (left == 0).then_some(())
    })
    .await;
}

/// Asserts that `got` is `sent`, read back.
fn same(got: &Message, sent: &Message) {
    assert_eq!(
        (got.id, &got.topic, &got.key, &got.kind, &got.payload),
        (sent.id, &sent.topic, &sent.key, &sent.kind, &sent.payload)
    );
    let drift = got
        .created_at
        .duration_since(sent.created_at)
        .unwrap_or_else(|e| e.duration());
    assert!(drift < Duration::from_micros(2), "created_at: {drift:?}");
}

/// The steps both sources share, once the relay runs and `produce` hands it a message:
/// a message the broker refuses dies; replayed once the broker accepts it, it is
/// published under its id and leaves no row; replayed while the broker still refuses
/// it, it dies again, and a second replay publishes it.
async fn replays_publish_again<F: std::future::Future<Output = ()>>(
    db: &TestDb,
    recorder: &Recorder,
    produce: impl Fn(Message) -> F,
) {
    let outbox = db.store.outbox();
    let refused = Message::new("refused", "first")
        .with_key("a")
        .with_kind("Refused");
    produce(refused.clone()).await;
    dead_row(db, refused.id, None).await;

    recorder.accepting(true);
    assert!(
        outbox.replay_dead(refused.id).await.expect("replayed"),
        "a dead letter is replayed"
    );
    let published = recorder.wait_for(1).await;
    same(&published[0], &refused);
    empty(db).await;
    assert!(
        !outbox.replay_dead(refused.id).await.expect("no error"),
        "only dead letters replay"
    );

    // Dead again after its replay: a dead letter again, under the same id.
    recorder.accepting(false);
    let again = Message::new("refused", "second").with_key("a");
    produce(again.clone()).await;
    let seq = dead_row(db, again.id, None).await;
    assert!(outbox.replay_dead(again.id).await.expect("replayed"));
    dead_row(db, again.id, Some(seq)).await;
    recorder.accepting(true);
    assert!(outbox.replay_dead(again.id).await.expect("replayed"));
    let published = recorder.wait_for(2).await;
    same(&published[1], &again);
    empty(db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(recorder.published().len(), 2, "each published once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_the_messages_source_is_published_again_when_replayed() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Messages)).await;
    replays_publish_again(&db, &recorder, |message| {
        let db = &db;
        async move { emit(db, &message).await }
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_the_table_source_is_published_again_when_replayed() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Table)).await;
    replays_publish_again(&db, &recorder, |message| {
        let db = &db;
        async move { insert(db, &message).await }
    })
    .await;
    task.abort();
}

/// Content the relay could not read is kept as it came, under an id of its own: a
/// replay emits it again as it is, so a message emitted with `transactional = false` is
/// published (under the id in its content) once replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_emitted_outside_its_transaction_is_published_when_replayed() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Messages)).await;
    let message = Message::new("orders", "o-1").with_key("o-1");
    let content = oncebox_postgres::cdc::encode(&message, &message.headers);
    sqlx::query("SELECT pg_logical_emit_message(false, $1, $2)")
        .bind(oncebox_postgres::cdc::message_prefix(&db.schema))
        .bind(content)
        .execute(db.store.pool())
        .await
        .expect("the message is emitted");
    let (id, reason): (String, String) = eventually("the dead letter", || async {
        sqlx::query_as("SELECT id::text, last_error FROM outbox WHERE status = 'dead'")
            .fetch_optional(db.store.pool())
            .await
            .expect("the outbox is read")
    })
    .await;
    assert!(reason.contains("transactional = false"), "{reason}");
    let id = MessageId::parse(&id).expect("a message id");
    assert_ne!(id, message.id, "the content's own id is not read");

    let outbox = db.store.outbox();
    assert!(outbox.replay_dead(id).await.expect("replayed"));
    let published = recorder.wait_for(1).await;
    same(&published[0], &message);
    empty(&db).await;
    assert!(!outbox.replay_dead(id).await.expect("no error"));
    task.abort();
}

/// The contrast: a dead letter of the polling relay goes back in line in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_the_polling_relay_keeps_its_place() {
    let db = TestDb::new().await;
    let message = Message::new("orders", "o-1").with_key("o-1");
    insert(&db, &message).await;
    db.exec(
        "UPDATE outbox SET status = 'dead', attempts = 3, last_error = 'refused', dead_at = now()",
    )
    .await;
    let before: i64 = sqlx::query_scalar("SELECT seq FROM outbox")
        .fetch_one(db.store.pool())
        .await
        .expect("the row is read");
    assert!(
        db.store
            .outbox()
            .replay_dead(message.id)
            .await
            .expect("replayed")
    );
    let after: (i64, String, i32, Option<String>) =
        sqlx::query_as("SELECT seq, status, attempts, last_error FROM outbox")
            .fetch_one(db.store.pool())
            .await
            .expect("the row is read");
    assert_eq!(
        after,
        (before, "pending".to_owned(), 0, Some("refused".to_owned()))
    );
}
