//! The SQLite outbox: enqueue, claim, settle, purge, operations.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{LONG, SHORT, claim, db, enqueue, label, labels, msg, settle_all};
use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{Relay, Settle, Settlement, SpoolOptions, SpoolStore};
use oncebox_core::{Error, InvalidMessage, Limits, MessageId};
use oncebox_sqlite::{RowDecodeError, RowStatus};

#[tokio::test]
async fn rolled_back_enqueue_leaves_nothing_claimable() {
    let db = db().await;
    let outbox = db.store.outbox();
    let message = msg(Some("k"), "m");
    let mut tx = db.store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox.enqueue(&mut tx, &message).await.unwrap();
    tx.rollback().await.unwrap();

    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert!(rows.is_empty());
    assert_eq!(outbox.status(message.id).await.unwrap(), None);
    assert_eq!(outbox.stats().await.unwrap().pending, 0);

    // Dropping the transaction rolls back too.
    {
        let mut tx = db.store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        outbox.enqueue(&mut tx, &message).await.unwrap();
    }
    assert!(claim(&outbox, 10, LONG).await.1.is_empty());
}

#[tokio::test]
async fn enqueue_refuses_duplicates_and_invalid_messages_with_typed_errors() {
    let db = db().await;
    let outbox = db
        .store
        .outbox()
        .with_limits(Limits::new().max_payload_bytes(8));
    let first = msg(None, "first");
    enqueue(&db.store, std::slice::from_ref(&first)).await;

    let mut tx = db.store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let copy = msg(Some("other"), "copy").with_id(first.id);
    match outbox.enqueue(&mut tx, &copy).await {
        Err(Error::Duplicate { id }) => assert_eq!(id, first.id),
        other => panic!("expected Duplicate, got {other:?}"),
    }
    match outbox.enqueue(&mut tx, &msg(None, "much too large")).await {
        Err(Error::InvalidMessage(InvalidMessage::PayloadTooLarge { size: 14, limit: 8 })) => {}
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    // The transaction survives a refused message.
    let second = msg(None, "second");
    outbox.enqueue(&mut tx, &second).await.unwrap();
    tx.commit().await.unwrap();

    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["first", "second"]);
    let stored = &rows[0].item;
    assert_eq!(stored.id, first.id);
    assert_eq!(stored.kind, "OrderPlaced");
    assert_eq!(stored.headers, first.headers);
}

#[tokio::test]
async fn messages_round_trip_through_the_table() {
    let db = db().await;
    let outbox = db.store.outbox();
    let sent = msg(Some("order-1"), "payload")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .unwrap()
        .with_header("x-tab", "a\tb")
        .unwrap();
    let mut binary = msg(None, "");
    binary.payload = vec![0u8, 255, 1, 254].into();
    enqueue(&db.store, &[sent.clone(), binary.clone()]).await;

    let (_, rows) = claim(&outbox, 10, LONG).await;
    let got = &rows[0].item;
    assert_eq!(
        (got.id, &got.topic, &got.key, &got.kind),
        (sent.id, &sent.topic, &sent.key, &sent.kind)
    );
    assert_eq!(got.headers, sent.headers);
    assert_eq!(got.payload, sent.payload);
    let drift = oncebox_core::time::to_unix_millis(got.created_at)
        - oncebox_core::time::to_unix_millis(sent.created_at);
    assert_eq!(drift, 0);
    assert_eq!(rows[1].item.payload, binary.payload);
    assert_eq!(rows[0].attempts, 0);
}

#[tokio::test]
async fn claims_in_commit_order_with_a_prefix_per_key() {
    let db = db().await;
    let outbox = db.store.outbox();
    enqueue(
        &db.store,
        &[msg(Some("a"), "a1"), msg(Some("b"), "b1"), msg(None, "n1")],
    )
    .await;
    enqueue(
        &db.store,
        &[
            msg(Some("a"), "a2"),
            msg(Some("c"), "c1"),
            msg(Some("b"), "b2"),
            msg(None, "n2"),
        ],
    )
    .await;

    // A limit cuts in commit order.
    let (first, rows) = claim(&outbox, 2, LONG).await;
    assert_eq!(labels(&rows), ["a1", "b1"]);
    assert!(rows[0].seq < rows[1].seq);

    // While a1 and b1 are leased, later rows of a and b wait; other keys and unkeyed
    // rows do not.
    let (second, rows2) = claim(&outbox, 100, LONG).await;
    assert_eq!(labels(&rows2), ["n1", "c1", "n2"]);

    // Releasing a1 and b1 makes a and b claimable again, each as a prefix.
    outbox
        .settle(first, &settle_all(&rows, &Settle::Release))
        .await
        .unwrap();
    let (_, rows3) = claim(&outbox, 100, LONG).await;
    assert_eq!(labels(&rows3), ["a1", "b1", "a2", "b2"]);
    assert_eq!(rows3[0].attempts, 0, "release counts no attempt");

    // Nothing left.
    assert!(claim(&outbox, 100, LONG).await.1.is_empty());
    outbox
        .settle(second, &settle_all(&rows2, &Settle::Done))
        .await
        .unwrap();
    assert_eq!(outbox.stats().await.unwrap().done, 3);
}

#[tokio::test]
async fn a_limit_inside_a_key_leaves_the_rest_of_the_key_blocked() {
    let db = db().await;
    let outbox = db.store.outbox();
    enqueue(
        &db.store,
        &[
            msg(Some("k"), "k1"),
            msg(Some("k"), "k2"),
            msg(Some("k"), "k3"),
            msg(None, "n"),
        ],
    )
    .await;
    let (_, rows) = claim(&outbox, 2, LONG).await;
    assert_eq!(labels(&rows), ["k1", "k2"]);
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["n"], "k3 waits for k1 and k2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_never_share_a_row_or_a_key_and_keep_key_order() {
    let db = db().await;
    let outbox = db.store.outbox();
    let keys = 12;
    let per_key = 25;
    let mut messages = Vec::new();
    for i in 0..per_key {
        for k in 0..keys {
            messages.push(msg(Some(&format!("k{k}")), &format!("k{k}-{i:03}")));
        }
        messages.push(msg(None, &format!("none-{i:03}")));
    }
    for chunk in messages.chunks(50) {
        enqueue(&db.store, chunk).await;
    }
    let total = messages.len();

    // key -> claim holding it; delivered labels in delivery order.
    let held: Arc<Mutex<HashMap<String, oncebox_core::spool::LeaseToken>>> = Arc::default();
    let delivered: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (outbox, held, delivered) = (outbox.clone(), Arc::clone(&held), Arc::clone(&delivered));
        tasks.push(tokio::spawn(async move {
            let mut idle = 0;
            while idle < 20 {
                let (token, rows) = claim(&outbox, 7, LONG).await;
                if rows.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                {
                    let mut held = held.lock().unwrap();
                    let keys: HashSet<&str> =
                        rows.iter().filter_map(|r| r.item.key.as_deref()).collect();
                    for key in keys {
                        let previous = held.insert(key.to_owned(), token);
                        assert!(previous.is_none(), "key {key} leased to two claims at once");
                    }
                }
                tokio::task::yield_now().await;
                {
                    let mut delivered = delivered.lock().unwrap();
                    delivered.extend(rows.iter().map(|r| label(&r.item)));
                    let mut held = held.lock().unwrap();
                    for row in &rows {
                        if let Some(key) = &row.item.key {
                            held.remove(key);
                        }
                    }
                }
                outbox
                    .settle(token, &settle_all(&rows, &Settle::Done))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let delivered = delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), total, "every row delivered exactly once");
    let unique: HashSet<&String> = delivered.iter().collect();
    assert_eq!(unique.len(), total);
    for k in 0..keys {
        let prefix = format!("k{k}-");
        let order: Vec<&String> = delivered
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "key k{k} delivered out of order");
    }
}

#[tokio::test]
async fn an_expired_lease_is_claimable_again_and_fences_the_old_token() {
    let db = db().await;
    let outbox = db.store.outbox();
    let message = msg(Some("k"), "m");
    enqueue(&db.store, &[message.clone(), msg(Some("k"), "later")]).await;

    let (old, rows) = claim(&outbox, 1, SHORT).await;
    assert_eq!(labels(&rows), ["m"]);
    assert!(
        claim(&outbox, 10, LONG).await.1.is_empty(),
        "leased row and its key are held"
    );

    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    let (new, again) = claim(&outbox, 1, LONG).await;
    assert_eq!(labels(&again), ["m"]);
    assert_eq!(again[0].seq, rows[0].seq);
    assert_ne!(old, new);

    // The stale claim's settlements change nothing, whatever they say.
    for outcome in [
        Settle::Done,
        Settle::Dead {
            reason: "stale".into(),
        },
        Settle::Retry {
            at: SystemTime::now(),
            error: "stale".into(),
        },
        Settle::Release,
    ] {
        outbox
            .settle(old, &settle_all(&rows, &outcome))
            .await
            .unwrap();
    }
    let state = outbox.status(message.id).await.unwrap().unwrap();
    assert_eq!(
        (state.status, state.attempts, state.last_error.as_deref()),
        (RowStatus::Pending, 0, None)
    );
    assert!(
        state
            .leased_until
            .is_some_and(|until| until > SystemTime::now())
    );
    assert!(
        claim(&outbox, 10, LONG).await.1.is_empty(),
        "still leased to the new claim"
    );

    outbox
        .settle(new, &settle_all(&again, &Settle::Done))
        .await
        .unwrap();
    let state = outbox.status(message.id).await.unwrap().unwrap();
    assert_eq!(state.status, RowStatus::Done);
    assert!(state.settled_at.is_some());
    assert_eq!(state.leased_until, None);
}

#[tokio::test]
async fn retry_records_the_error_and_blocks_only_its_key_until_due() {
    let db = db().await;
    let outbox = db.store.outbox();
    let failing = msg(Some("a"), "a1");
    enqueue(
        &db.store,
        &[failing.clone(), msg(Some("a"), "a2"), msg(Some("b"), "b1")],
    )
    .await;

    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["a1", "a2", "b1"]);
    let at = SystemTime::now() + Duration::from_millis(400);
    let settlements = vec![
        Settlement {
            seq: rows[0].seq,
            outcome: Settle::Retry {
                at,
                error: "broker said no".into(),
            },
        },
        Settlement {
            seq: rows[1].seq,
            outcome: Settle::Release,
        },
        Settlement {
            seq: rows[2].seq,
            outcome: Settle::Release,
        },
    ];
    outbox.settle(token, &settlements).await.unwrap();

    let state = outbox.status(failing.id).await.unwrap().unwrap();
    assert_eq!(state.status, RowStatus::Pending);
    assert_eq!(state.attempts, 1);
    assert_eq!(state.last_error.as_deref(), Some("broker said no"));
    let drift = oncebox_core::time::to_unix_millis(state.available_at)
        - oncebox_core::time::to_unix_millis(at);
    assert_eq!(drift, 0);

    let (_, now) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&now), ["b1"], "a waits for a1's backoff; b does not");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, later) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&later), ["a1", "a2"]);
    assert_eq!(later[0].attempts, 1);
}

#[tokio::test]
async fn dead_stores_the_reason_unblocks_the_key_and_can_be_replayed() {
    let db = db().await;
    let outbox = db.store.outbox();
    let poison = msg(Some("a"), "a1");
    enqueue(&db.store, &[poison.clone(), msg(Some("a"), "a2")]).await;

    let (token, rows) = claim(&outbox, 10, LONG).await;
    let settlements = vec![
        Settlement {
            seq: rows[0].seq,
            outcome: Settle::Dead {
                reason: "payload rejected".into(),
            },
        },
        Settlement {
            seq: rows[1].seq,
            outcome: Settle::Release,
        },
    ];
    outbox.settle(token, &settlements).await.unwrap();

    let state = outbox.status(poison.id).await.unwrap().unwrap();
    assert_eq!((state.status, state.attempts), (RowStatus::Dead, 1));
    assert_eq!(state.last_error.as_deref(), Some("payload rejected"));

    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["a2"], "a dead row does not block its key");
    outbox
        .settle(token, &settle_all(&rows, &Settle::Done))
        .await
        .unwrap();

    let dead = outbox.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, poison.id);
    assert_eq!(dead[0].message.payload, poison.payload);
    assert_eq!(dead[0].reason, "payload rejected");
    assert_eq!(dead[0].attempts, 1);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.done, stats.dead), (0, 1, 1));
    assert_eq!(stats.oldest_pending_age, None);

    assert!(outbox.replay_dead(poison.id).await.unwrap());
    assert!(
        !outbox.replay_dead(poison.id).await.unwrap(),
        "no longer dead"
    );
    assert!(!outbox.replay_dead(MessageId::new()).await.unwrap());
    let state = outbox.status(poison.id).await.unwrap().unwrap();
    assert_eq!((state.status, state.attempts), (RowStatus::Pending, 0));
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["a1"]);
    assert!(outbox.dead_letters(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn purge_is_bounded_and_deletes_only_old_done_rows() {
    let db = db().await;
    let outbox = db.store.outbox();
    let messages: Vec<_> = (0..10).map(|i| msg(None, &format!("m{i}"))).collect();
    enqueue(&db.store, &messages).await;
    let (token, rows) = claim(&outbox, 8, LONG).await;
    let mut settlements = settle_all(&rows[..7], &Settle::Done);
    settlements.push(Settlement {
        seq: rows[7].seq,
        outcome: Settle::Dead { reason: "x".into() },
    });
    outbox.settle(token, &settlements).await.unwrap();

    let past = SystemTime::now() - Duration::from_secs(60);
    assert_eq!(
        outbox.purge(past, 100).await.unwrap(),
        0,
        "done too recently"
    );
    let future = SystemTime::now() + Duration::from_secs(60);
    assert_eq!(outbox.purge(future, 3).await.unwrap(), 3);
    assert_eq!(outbox.purge(future, 0).await.unwrap(), 0);
    assert_eq!(outbox.purge(future, 100).await.unwrap(), 4);
    assert_eq!(outbox.purge(future, 100).await.unwrap(), 0);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.done, stats.dead), (2, 0, 1));
    assert!(stats.oldest_pending_age.is_some());
}

#[tokio::test]
async fn an_undecodable_row_is_dead_lettered_without_stalling_the_relay() {
    let db = db().await;
    let outbox = db.store.outbox();
    enqueue(&db.store, &[msg(Some("k"), "before")]).await;
    // A producer in another language wrote a row with broken headers and a text payload.
    sqlx::query(
        "INSERT INTO oncebox_outbox (id, topic, key, kind, headers, payload, created_at, available_at)
         VALUES ('not-a-uuid', 'orders', 'k', 'Broken', '{\"bad name\": 1}', 'text', 0, 0),
                ('0190a3f4-0000-7000-8000-000000000001', 'orders', 'k', 'Text', '{}', 'as text', 0, 0)",
    )
    .execute(db.store.pool())
    .await
    .unwrap();
    enqueue(&db.store, &[msg(Some("k"), "after")]).await;

    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        ["before", "as text", "after"],
        "the broken row is skipped, the key goes on"
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.dead, 1);
    let (state,): (String,) =
        sqlx::query_as("SELECT last_error FROM oncebox_outbox WHERE status = 'dead'")
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert!(
        state.contains("undecodable row") && state.contains("id"),
        "{state}"
    );

    // Listing dead letters names the row that cannot be read.
    let error = outbox.dead_letters(10).await.unwrap_err();
    assert!(!error.is_transient());
    let Error::Store { source, .. } = &error else {
        panic!("expected a store error, got {error:?}")
    };
    let decode = source
        .downcast_ref::<RowDecodeError>()
        .expect("a RowDecodeError source");
    assert_eq!(decode.table(), "oncebox_outbox");
    assert!(decode.row().starts_with("seq "), "{}", decode.row());
    assert_eq!(decode.column(), "id");
}

/// A wake-up with nobody waiting is kept for the next wait. (A wake-up ending a wait
/// under way is the suite's `a_commit_wakes_a_waiting_relay`.)
#[tokio::test]
async fn a_wake_with_nobody_waiting_is_kept_for_the_next_wait() {
    let db = db().await;
    let producer_side = db.store.outbox();
    producer_side.wake();
    tokio::time::timeout(
        Duration::from_secs(10),
        producer_side.wait_for_work(Duration::from_secs(30)),
    )
    .await
    .expect("a pending wake-up ends the next wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_publishes_in_order_through_the_memory_broker() {
    let db = db().await;
    let outbox = db.store.outbox();
    let messages: Vec<_> = (0..20)
        .map(|i| msg(Some(&format!("k{}", i % 3)), &format!("m{i:02}")))
        .collect();
    enqueue(&db.store, &messages).await;
    let broker = MemoryBroker::new();
    let relay = Relay::new(
        outbox.clone(),
        broker.publisher(),
        SpoolOptions::new().batch_size(8),
    )
    .unwrap();
    while relay.run_once().await.unwrap().claimed > 0 {}
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.done), (0, 20));
    let published = broker.published("orders");
    assert_eq!(published.len(), 20);
    for k in 0..3 {
        let key = format!("k{k}");
        let order: Vec<String> = published
            .iter()
            .filter(|m| m.key.as_deref() == Some(&key))
            .map(label)
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
    }
}

#[tokio::test]
async fn migrations_are_idempotent_and_kept_apart() {
    let db = db().await;
    db.store.migrate().await.unwrap();
    let (applied,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM _oncebox_migrations")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    let migrations = oncebox_sqlite::migrator().iter().count();
    assert_eq!(applied, i64::try_from(migrations).unwrap());
    let (theirs,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM sqlite_master WHERE name = '_sqlx_migrations'")
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert_eq!(
        theirs, 0,
        "the application's migrations table is left alone"
    );

    // The raw schema applies on top of itself too (for teams with their own tool).
    sqlx::raw_sql(oncebox_sqlite::SCHEMA_V1)
        .execute(db.store.pool())
        .await
        .unwrap();

    // A second store on the same file sees the same tables.
    let again = oncebox_sqlite::SqliteStore::connect(db.dir.path().join("test.db"))
        .await
        .unwrap();
    again.migrate().await.unwrap();
    assert_eq!(again.outbox().stats().await.unwrap().pending, 0);
}

/// A database at schema version 1 with rows pending, one of them leased, upgrades to
/// version 2 (claims): the rows stay, the lease is dropped, and a relay publishes them all.
#[tokio::test]
async fn version_1_databases_upgrade_and_keep_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let store = oncebox_sqlite::SqliteStore::connect(&path).await.unwrap();
    sqlx::raw_sql(oncebox_sqlite::SCHEMA_V1)
        .execute(store.pool())
        .await
        .unwrap();
    // What version 1's migrator recorded, so that the migrator goes on from there.
    let mut version_1 = oncebox_sqlite::migrator();
    version_1.migrations.to_mut().truncate(1);
    version_1.run(store.pool()).await.unwrap();
    enqueue(
        &store,
        &[msg(Some("k"), "a"), msg(Some("k"), "b"), msg(None, "c")],
    )
    .await;
    sqlx::query(
        "UPDATE oncebox_outbox SET lease_token = 'old', lease_until = 9999999999999 WHERE seq = 1",
    )
    .execute(store.pool())
    .await
    .unwrap();

    store.migrate().await.unwrap();
    let outbox = store.outbox();
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.pending, 3);
    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["a", "b", "c"], "the old lease is gone");
    outbox
        .settle(token, &settle_all(&rows, &Settle::Done))
        .await
        .unwrap();
    assert_eq!(outbox.stats().await.unwrap().done, 3);
}

/// A publisher closed under the relay (its process stopping) is no fault of the message:
/// the row is handed back, not dead-lettered, and no attempt is spent on it.
#[tokio::test]
async fn a_closed_publisher_hands_the_message_back() {
    struct Closed;
    impl oncebox_core::Publisher for Closed {
        async fn publish(&self, _: &oncebox_core::Message) -> oncebox_core::Result<()> {
            Err(Error::Closed)
        }
    }
    let db = db().await;
    let outbox = db.store.outbox();
    let message = msg(Some("k"), "m");
    enqueue(&db.store, std::slice::from_ref(&message)).await;
    let relay = Relay::new(outbox.clone(), Closed, SpoolOptions::new()).unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.released, report.dead), (1, 0), "{report:?}");
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 0));
}
