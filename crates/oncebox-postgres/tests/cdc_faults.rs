//! The log-tailing relay where production stands and the happy path does not: an idle
//! outbox beside a busy database, a slot that vanished, a walsender the server ends, a
//! broker that is down at a stop, content no producer should have written.

#![cfg(feature = "cdc")]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::TestDb;
use common::cdc::{Recorder, Slot, emit, eventually, keyed, relay, spawn, started};
use oncebox_core::Message;
use oncebox_postgres::cdc::{CdcMode, LostSlot};
use sqlx::Row;

/// The slot's confirmed position and the WAL it retains, in bytes from the current
/// position.
async fn slot_state(db: &TestDb, slot: &str) -> (String, i64) {
    let row = sqlx::query(
        "SELECT confirmed_flush_lsn::text AS confirmed, \
                pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_one(db.store.pool())
    .await
    .expect("the slot is read");
    (row.get("confirmed"), row.get("retained"))
}

async fn passed(db: &TestDb, slot: &str, mark: &str) -> bool {
    sqlx::query_scalar(
        "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots \
         WHERE slot_name = $1",
    )
    .bind(slot)
    .bind(mark)
    .fetch_one(db.store.pool())
    .await
    .expect("the slot is read")
}

async fn wal_position(db: &TestDb) -> String {
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(db.store.pool())
        .await
        .expect("the WAL position is read")
}

/// The outbox is idle while another table takes 8 MB of writes: the relay's heartbeats
/// move the slot's confirmed position past them within three heartbeats, and the slot
/// retains none of the WAL the idle spell wrote once the server logged its next
/// snapshot of running transactions (every 15 s at most, from the background writer).
/// Before the fix the position stayed at the last message's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_does_not_pin_the_wal() {
    const WRITTEN: i64 = 8 * 1024 * 1024;
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let heartbeat = Duration::from_secs(1);
    let options = slot
        .options(CdcMode::Messages)
        .heartbeat(heartbeat)
        .status_interval(Duration::from_millis(500));
    let task = started(&db, recorder.clone(), options).await;
    emit(&db, &[keyed("a", 0)], true).await;
    recorder.wait_for(1).await;

    db.exec("CREATE TABLE filler (n int, pad text)").await;
    let start = wal_position(&db).await;
    let mut written = 0;
    while written < WRITTEN {
        db.exec(
            "INSERT INTO filler SELECT n, repeat('x', 1000) FROM generate_series(1, 2000) AS n",
        )
        .await;
        written = sqlx::query_scalar(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
        )
        .bind(&start)
        .fetch_one(db.store.pool())
        .await
        .expect("the WAL written is measured");
    }
    let mark = wal_position(&db).await;
    let wrote_at = tokio::time::Instant::now();
    let deadline = wrote_at + 3 * heartbeat + Duration::from_millis(500);
    while !passed(&db, &slot.name, &mark).await {
        let (confirmed, retained) = slot_state(&db, &slot.name).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "three heartbeats after {written} bytes of other writes, the slot's confirmed \
             position {confirmed} has not passed {mark} (retained WAL: {retained} bytes)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let confirmed_after = wrote_at.elapsed();

    // The slot's restart point passes the start of the idle spell: the WAL it wrote is
    // no longer kept for the slot (measured from positions, so that what other tests
    // write meanwhile does not count).
    eventually(
        "the slot to retain none of the idle spell's WAL",
        || async {
            let released: bool = sqlx::query_scalar(
            "SELECT restart_lsn >= $2::text::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot.name)
        .bind(&start)
        .fetch_one(db.store.pool())
        .await
        .expect("the slot is read");
            released.then_some(())
        },
    )
    .await;
    let released_after = wrote_at.elapsed();
    let (_, retained) = slot_state(&db, &slot.name).await;
    println!(
        "{written} bytes written while idle: confirmed past them after {confirmed_after:?}; \
         the slot released them after {released_after:?} (retained WAL then {retained} bytes)"
    );
    assert_eq!(recorder.published().len(), 1, "nothing else was published");
    task.abort();
}

/// A slot that vanished while the store remembers it was read refuses to be created
/// again over what it held; with `on_lost_slot = recreate` the relay logs the range and
/// goes on. Before the fix the relay created a fresh slot and said nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_slot_is_not_created_again_silently() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let options = slot.options(CdcMode::Messages);
    let task = started(&db, recorder.clone(), options.clone()).await;
    emit(&db, &[keyed("a", 0)], true).await;
    recorder.wait_for(1).await;
    task.abort();
    let _ = task.await;

    // What a failover to a standby without the slot (or an operator's drop) leaves:
    // the slot is gone, and messages are committed after it.
    eventually("the slot to be let go", || async {
        db.store.drop_cdc(&slot.name, &slot.name).await.ok()
    })
    .await;
    emit(&db, &[keyed("a", 1)], true).await;

    let refused = relay(&db, recorder.clone(), options.clone())
        .run_until(std::future::pending())
        .await
        .expect_err("a relay does not create the lost slot again");
    let said = refused.to_string();
    assert!(!refused.is_transient(), "{said}");
    assert!(
        said.contains("is gone") && said.contains("may be lost") && said.contains("recreate"),
        "{said}"
    );
    let range: Vec<&str> = said
        .split("WAL positions ")
        .nth(1)
        .expect("a range")
        .split(' ')
        .collect();
    assert!(range[0].contains('/') && range[2].contains('/'), "{said}");

    let task = spawn(relay(
        &db,
        recorder.clone(),
        options.clone().on_lost_slot(LostSlot::Recreate),
    ));
    eventually("the slot to be created again", || async {
        let slots = db
            .store
            .replication_slots()
            .await
            .expect("the slots are listed");
        slots.iter().any(|s| s.name == slot.name).then_some(())
    })
    .await;
    emit(&db, &[keyed("a", 2)], true).await;
    let published = recorder.wait_for(2).await;
    assert_eq!(
        published[1].payload, "a:2",
        "a:1 was committed while the slot was gone"
    );
    task.abort();
    let _ = task.await;

    // A slot retired on purpose: dropped and forgotten, a relay starts afresh on it.
    eventually("the slot to be let go", || async {
        db.store.drop_cdc(&slot.name, &slot.name).await.ok()
    })
    .await;
    assert!(db.store.forget_cdc(&slot.name).await.expect("forgotten"));
    assert!(!db.store.forget_cdc(&slot.name).await.expect("no error"));
    let task = started(&db, recorder.clone(), options).await;
    emit(&db, &[keyed("a", 3)], true).await;
    recorder.wait_for_payload("a:3").await;
    assert!(!task.is_finished(), "the relay runs");
    task.abort();
}

/// The server ends the walsender (`pg_terminate_backend`, SQLSTATE 57P01): the relay
/// starts a new session and publishes the next message, without a restart. Before the
/// fix the relay ended with a permanent error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_walsender_is_reconnected() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Messages)).await;
    emit(&db, &[keyed("a", 0)], true).await;
    recorder.wait_for(1).await;

    let terminated: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
         WHERE slot_name = $1 AND active",
    )
    .bind(&slot.name)
    .fetch_one(db.store.pool())
    .await
    .expect("the walsender is terminated");
    assert!(terminated);
    emit(&db, &[keyed("a", 1)], true).await;
    // a:0 may come again: the walsender may have ended before its confirmation.
    recorder.wait_for_payload("a:1").await;
    assert!(!task.is_finished(), "the relay runs on");
    task.abort();
}

/// A stop while the broker is down returns within the publish timeout and a few
/// seconds; the message is published by the next reader. Before the fix the stop
/// waited for the broker for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_is_bounded_while_the_broker_is_down() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    recorder.down.store(true, Ordering::SeqCst);
    let options = slot
        .options(CdcMode::Messages)
        .publish_timeout(Duration::from_secs(2));
    let relay_under_test = relay(&db, recorder.clone(), options.clone());
    relay_under_test.prepare().await.expect("the slot is ready");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay_under_test
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    emit(&db, &[keyed("a", 0)], true).await;
    eventually("a few failed attempts", || async {
        (recorder.attempts.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;

    let asked = tokio::time::Instant::now();
    stop.send(()).expect("the relay listens");
    let ended = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the stop returns while the broker is down")
        .expect("the task ends");
    ended.expect("a stop is not an error");
    println!("stopped in {:?} with the broker down", asked.elapsed());

    recorder.down.store(false, Ordering::SeqCst);
    let task = spawn(relay(&db, recorder.clone(), options));
    assert_eq!(recorder.wait_for(1).await[0].payload, "a:0");
    task.abort();
}

/// Content a producer in another language wrote (a NUL in the topic, a line break in
/// the key) is dead-lettered with its reason, storably, and the slot moves on; content
/// that cannot be decoded at all gets an id from its position, so reading it again
/// after a crash adds no second dead letter. Before the fix the NUL stopped the
/// session at every start, and each reading added a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_content_is_dead_lettered_once_and_the_slot_moves_on() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    // No confirmation reaches the server before the relay is killed.
    let options = slot
        .options(CdcMode::Messages)
        .status_interval(Duration::from_secs(3600));
    let task = started(&db, recorder.clone(), options.clone()).await;
    let prefix = oncebox_postgres::cdc::message_prefix(&db.schema);
    let content = |meta: &str| {
        format!(
            "SELECT pg_logical_emit_message(true, '{prefix}', '\\x01'::bytea || int4send(length(convert_to('{meta}', 'UTF8'))) || convert_to('{meta}', 'UTF8') || 'payload'::bytea)"
        )
    };
    let nul = uuid::Uuid::new_v4();
    db.exec(&content(&format!(
        r#"{{"id":"{nul}","topic":"or\u0000ders","key":"k"}}"#
    )))
    .await;
    let newline = uuid::Uuid::new_v4();
    db.exec(&content(&format!(
        r#"{{"id":"{newline}","topic":"orders","key":"line\nbreak"}}"#
    )))
    .await;
    db.exec(&format!(
        "SELECT pg_logical_emit_message(true, '{prefix}', '\\x02ff'::bytea)"
    ))
    .await;
    emit(&db, &[keyed("b", 0)], true).await;
    recorder.wait_for(1).await;

    let dead = || async {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT id::text, topic, last_error FROM outbox WHERE status = 'dead' ORDER BY id",
        )
        .fetch_all(db.store.pool())
        .await
        .expect("the dead letters are read");
        rows
    };
    let first = eventually("three dead letters", || async {
        let rows = dead().await;
        (rows.len() == 3).then_some(rows)
    })
    .await;
    let by_id = |id: &uuid::Uuid| {
        first
            .iter()
            .find(|(found, ..)| *found == id.to_string())
            .cloned()
    };
    let (_, topic, reason) = by_id(&nul).expect("the NUL message is dead");
    assert_eq!(topic, "or\u{FFFD}ders");
    assert!(
        reason.contains("control character") && reason.contains("U+FFFD in: topic"),
        "{reason}"
    );
    let (_, _, reason) = by_id(&newline).expect("the line break is dead");
    assert!(reason.contains("control character"), "{reason}");
    assert!(
        first
            .iter()
            .any(|(_, _, reason)| reason.contains("version byte 2")),
        "{first:?}"
    );

    // A crash before anything was confirmed: the next reader reads it all again.
    task.abort();
    let _ = task.await;
    let task = spawn(relay(&db, recorder.clone(), options));
    eventually("the message read again to be published again", || async {
        (recorder.published().len() >= 2).then_some(())
    })
    .await;
    assert_eq!(
        dead().await,
        first,
        "no second dead letter for the same content"
    );
    task.abort();
}

/// A relay reading the outbox table dead-letters a message emitted under oncebox's
/// prefix, with the reason, instead of skipping it. Before the fix it was skipped
/// without a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_relay_dead_letters_emitted_messages() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Table)).await;
    let emitted = keyed("a", 0);
    emit(&db, std::slice::from_ref(&emitted), true).await;
    db.enqueued(&[Message::new("orders", "row")])
        .await
        .expect("enqueued")
        .commit()
        .await
        .expect("the transaction commits");
    recorder.wait_for(1).await;
    let (id, reason): (String, String) =
        eventually("the emitted message's dead letter", || async {
            sqlx::query_as("SELECT id::text, last_error FROM outbox WHERE status = 'dead'")
                .fetch_optional(db.store.pool())
                .await
                .expect("the dead letters are read")
        })
        .await;
    assert_eq!(id, emitted.id.to_string());
    assert!(reason.contains("source = table"), "{reason}");
    assert_eq!(recorder.published()[0].payload, "row");
    task.abort();
}

/// The reader's lock connection and its walsender end together (a cut link, a server
/// ending its sessions): the relay reads the slot again only under the lock, never with
/// a lock connection that is gone. (The code before the fix passed too: it started new
/// sessions with the dead lock connection, as `oncebox chaos` found, but each session's
/// first lock check, at its start, ended them before they read much.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_lost_its_lock_reads_only_once_it_holds_it_again() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let task = started(&db, recorder.clone(), slot.options(CdcMode::Messages)).await;
    emit(&db, &[keyed("a", 0)], true).await;
    recorder.wait_for(1).await;

    // pg_try_advisory_lock(0x6f6e6364 ("oncd"), hashtext(slot)), as the relay takes it.
    let holder = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                  AND classid::bigint = 1869505380 \
                  AND objid::bigint = (hashtext($1)::bigint & 4294967295) AND objsubid = 2";
    let held = || async {
        sqlx::query_scalar::<_, i32>(holder)
            .bind(&slot.name)
            .fetch_optional(db.store.pool())
            .await
            .expect("the locks are read")
    };
    let lock_pid = held().await.expect("the reader holds the slot's lock");
    let reader_pid = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot.name)
        .fetch_one(db.store.pool())
        .await
        .expect("the slot is read")
    };
    let walsender = reader_pid().await.expect("the slot is read");
    for pid in [lock_pid, walsender] {
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(db.store.pool())
            .await
            .expect("the connection is terminated");
        assert!(ended);
    }

    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut read_again = false;
    while tokio::time::Instant::now() < until {
        // A new walsender (the old one may still be on its way out) reads the slot:
        // its reader must hold the lock, taken by a connection that is not the old one.
        if let Some(pid) = reader_pid().await
            && pid != walsender
        {
            read_again = true;
            let holder = held().await;
            assert!(
                holder.is_some_and(|holder| holder != lock_pid),
                "the slot is read again while nobody holds its lock"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(read_again, "the relay reads the slot again");
    emit(&db, &[keyed("a", 1)], true).await;
    recorder.wait_for_payload("a:1").await;
    task.abort();
}

/// A publisher closed under the relay (its process stopping) is no fault of the message:
/// the relay stops with `Error::Closed`, dead-letters nothing and confirms nothing past
/// the message, which the next reader publishes. The decision is the consumer's and the
/// polling relay's (`oncebox_core::retry`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_publisher_stops_the_relay_and_loses_nothing() {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    recorder.closed.store(true, Ordering::SeqCst);
    let options = slot.options(CdcMode::Messages);
    let task = started(&db, recorder.clone(), options.clone()).await;
    emit(&db, &[keyed("c", 1)], true).await;

    let ended = tokio::time::timeout(common::LONG, task)
        .await
        .expect("the relay stops")
        .expect("the relay's task ends normally");
    assert!(
        matches!(ended, Err(oncebox_core::Error::Closed)),
        "{ended:?}"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'dead'")
        .fetch_one(db.store.pool())
        .await
        .expect("the dead letters are counted");
    assert_eq!(dead, 0, "nothing is dead-lettered");

    recorder.closed.store(false, Ordering::SeqCst);
    let task = spawn(relay(&db, recorder.clone(), options));
    recorder.wait_for_payload("c:1").await;
    task.abort();
}
