//! The log-tailing relay against the real server: both modes, rollbacks, large
//! transactions, a relay that dies mid-stream, a standby that takes over, dead letters,
//! the slot's lifecycle.

#![cfg(feature = "cdc")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::TestDb;
use common::cdc::{Recorder, Slot, emit, eventually, keyed, relay, spawn, started};
use oncebox_core::Message;
use oncebox_postgres::cdc::CdcMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_publish_what_commits_in_order_and_nothing_that_rolls_back() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Messages)).await;

    emit(&db, &[Message::new("orders", "rolled back")], false).await;
    let big: Vec<Message> = (0..1000).map(|n| keyed("big", n)).collect();
    emit(&db, &big, true).await;
    emit(&db, &[Message::new("orders", "also rolled back")], false).await;
    // A producer in SQL, with the migration's function and its defaults.
    db.exec(&format!(
        "SELECT \"{}\".emit('payments', 'p-1', 'PaymentTaken', '{{\"traceparent\":\"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}}', 'paid')",
        db.schema
    ))
    .await;

    let published = recorder.wait_for(1001).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        recorder.published().len(),
        1001,
        "nothing more, nothing rolled back"
    );
    let (in_big, others): (Vec<_>, Vec<_>) = published
        .iter()
        .partition(|m| m.key.as_deref() == Some("big"));
    assert!(
        in_big.iter().map(|m| m.id).eq(big.iter().map(|m| m.id)),
        "all 1,000, in order"
    );
    assert_eq!(in_big[0].payload, big[0].payload);
    let from_sql = others[0];
    assert_eq!(
        (
            from_sql.topic.as_str(),
            from_sql.key.as_deref(),
            from_sql.kind.as_str(),
            &from_sql.payload[..]
        ),
        ("payments", Some("p-1"), "PaymentTaken", &b"paid"[..])
    );
    assert!(from_sql.headers.get("traceparent").is_some());
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_mode_publishes_inserted_rows_and_deletes_them() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(
        &db,
        recorder.clone(),
        slot.options(CdcMode::Table).delete_batch(50),
    )
    .await;

    let rolled_back = db
        .enqueued(&[Message::new("orders", "no")])
        .await
        .expect("enqueued");
    rolled_back
        .rollback()
        .await
        .expect("the transaction rolls back");
    let messages: Vec<Message> = (0..300).map(|n| keyed(&format!("k{}", n % 7), n)).collect();
    for chunk in messages.chunks(100) {
        db.enqueued(chunk)
            .await
            .expect("enqueued")
            .commit()
            .await
            .expect("the transaction commits");
    }
    let published = recorder.wait_for(300).await;
    assert_eq!(published.len(), 300);
    for key in 0..7 {
        let key = format!("k{key}");
        let sent: Vec<_> = messages
            .iter()
            .filter(|m| m.key.as_deref() == Some(&key))
            .map(|m| m.id)
            .collect();
        let got: Vec<_> = published
            .iter()
            .filter(|m| m.key.as_deref() == Some(&key))
            .map(|m| m.id)
            .collect();
        assert_eq!(got, sent, "key {key} in commit order");
    }
    let first = messages[0].clone();
    let got = published.iter().find(|m| m.id == first.id).expect("found");
    assert_eq!((&got.payload, &got.kind), (&first.payload, &first.kind));
    let drift = got
        .created_at
        .duration_since(first.created_at)
        .unwrap_or_else(|e| e.duration());
    assert!(
        drift < Duration::from_micros(2),
        "created_at read back: {drift:?}"
    );

    // Published rows are deleted.
    eventually("the published rows to be deleted", || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(db.store.pool())
            .await
            .expect("the rows are counted");
        (left == 0).then_some(())
    })
    .await;
    task.abort();
}

/// Publishes `count` keyed messages from `producers` concurrent producers while the
/// relay is killed (its task aborted: its connections close, as a killed process's do)
/// and started again `kills` times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_dies_is_resumed_from_the_slot_and_order_holds() {
    const KEYS: usize = 20;
    const PER_KEY: usize = 100;
    let db = TestDb::with_connections(10).await;
    let slot = Slot::new();
    // A broker slow enough that each kill finds publications in flight.
    let recorder = Recorder::slow(Duration::from_millis(2));
    let options = slot.options(CdcMode::Messages);
    relay(&db, recorder.clone(), options.clone())
        .prepare()
        .await
        .expect("the slot and publication are ready");

    let producers: Vec<_> = (0..4)
        .map(|producer| {
            let store = db.store.clone();
            tokio::spawn(async move {
                let outbox = store.message_outbox();
                for key in (producer..KEYS).step_by(4) {
                    for n in 0..PER_KEY {
                        let mut tx = store.pool().begin().await.expect("a transaction begins");
                        let message =
                            Message::new("orders", n.to_string()).with_key(format!("k{key}"));
                        outbox
                            .enqueue(&mut tx, &message)
                            .await
                            .expect("the message is enqueued");
                        tx.commit().await.expect("the transaction commits");
                    }
                }
            })
        })
        .collect();

    let mut task = spawn(relay(&db, recorder.clone(), options.clone()));
    for kill in 1..=3 {
        recorder.wait_for(kill * 300).await;
        task.abort();
        let _ = task.await;
        task = spawn(relay(&db, recorder.clone(), options.clone()));
    }
    for producer in producers {
        producer.await.expect("the producer ends");
    }
    recorder.wait_for(KEYS * PER_KEY).await;
    let published = eventually("every message published", || async {
        let published = recorder.published();
        let distinct: std::collections::HashSet<_> = published.iter().map(|m| m.id).collect();
        (distinct.len() == KEYS * PER_KEY).then_some(published)
    })
    .await;
    task.abort();

    // Per key: each publication is at most one past the furthest so far (a restart
    // replays a suffix of what was unconfirmed, never skips ahead).
    let mut furthest: HashMap<String, i64> = HashMap::new();
    for message in &published {
        let n: i64 = std::str::from_utf8(&message.payload)
            .expect("a number")
            .parse()
            .expect("a number");
        let seen = furthest
            .entry(message.key.clone().expect("clone"))
            .or_insert(-1);
        assert!(n <= *seen + 1, "key {:?}: {n} after {seen}", message.key);
        *seen = (*seen).max(n);
    }
    let copies = published.len() - KEYS * PER_KEY;
    // Unconfirmed at each kill: at most what was in flight plus a status interval's worth.
    assert!(copies <= 3 * options_window(), "{copies} copies");
}

fn options_window() -> usize {
    1024 + 500
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_relay_stands_by_and_takes_over_when_the_first_dies() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let first = Recorder::default();
    let second = Recorder::default();
    let options = slot.options(CdcMode::Messages);
    let leader = started(&db, first.clone(), options.clone()).await;
    emit(&db, &[keyed("a", 0)], true).await;
    first.wait_for(1).await;

    let standby = spawn(relay(&db, second.clone(), options.clone()));
    emit(&db, &[keyed("a", 1)], true).await;
    first.wait_for(2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        second.published().is_empty(),
        "the standby reads nothing while the leader lives"
    );

    leader.abort();
    let _ = leader.await;
    emit(&db, &[keyed("a", 2)], true).await;
    let taken = second.wait_for(1).await;
    assert_eq!(taken.last().expect("a last message").payload, "a:2");
    assert!(
        taken.iter().all(|m| m.payload != "a:0"),
        "what the leader confirmed is not published again"
    );
    standby.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_published_is_dead_lettered_with_its_reason() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(
        &db,
        recorder.clone(),
        slot.options(CdcMode::Messages).max_attempts(2),
    )
    .await;

    let refused = Message::new("refused", "x").with_key("a");
    emit(&db, &[refused.clone(), keyed("a", 1)], true).await;
    let prefix = oncebox_postgres::cdc::message_prefix(&db.schema);
    db.exec(&format!(
        "SELECT pg_logical_emit_message(true, '{prefix}', '\\x02ff'::bytea)"
    ))
    .await;
    db.exec(&format!(
        "SELECT pg_logical_emit_message(false, '{prefix}', '\\x01'::bytea)"
    ))
    .await;
    emit(&db, &[keyed("a", 2)], true).await;

    let published = recorder.wait_for(2).await;
    assert_eq!(
        published
            .iter()
            .map(|m| m.payload.clone())
            .collect::<Vec<_>>(),
        ["a:1", "a:2"],
        "the key goes on past its dead message"
    );
    let reasons: Vec<(String, String)> = eventually("three dead letters", || async {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT id::text, last_error FROM outbox WHERE status = 'dead' ORDER BY dead_at",
        )
        .fetch_all(db.store.pool())
        .await
        .expect("the dead letters are read");
        (rows.len() == 3).then_some(rows)
    })
    .await;
    assert_eq!(reasons[0].0, refused.id.to_string());
    assert!(reasons[0].1.contains("refuses"), "{reasons:?}");
    assert!(
        reasons.iter().any(|(_, r)| r.contains("version byte 2")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|(_, r)| r.contains("transactional = false")),
        "{reasons:?}"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_left_behind_is_listed_with_its_wal_and_can_be_dropped() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let options = slot.options(CdcMode::Messages);
    relay(&db, Recorder::default(), options.clone())
        .prepare()
        .await
        .expect("the slot and publication are ready");
    // WAL written after the slot's creation, which nobody reads.
    emit(
        &db,
        &(0..200).map(|n| keyed("w", n)).collect::<Vec<_>>(),
        true,
    )
    .await;

    let slots = db
        .store
        .replication_slots()
        .await
        .expect("the slots are listed");
    let found = slots
        .iter()
        .find(|s| s.name == slot.name)
        .expect("the slot is listed");
    assert!(!found.active);
    assert!(
        found.retained_wal_bytes > 0 && found.lag_bytes > 0,
        "{found:?}"
    );

    db.store
        .drop_cdc(&slot.name, &slot.name)
        .await
        .expect("the slot is dropped");
    let slots = db
        .store
        .replication_slots()
        .await
        .expect("the slots are listed");
    assert!(slots.iter().all(|s| s.name != slot.name));
    assert!(
        db.store
            .drop_cdc("Bad-Name", "x")
            .await
            .unwrap_err()
            .is_invalid_input()
    );
}
