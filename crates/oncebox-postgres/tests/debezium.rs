//! Relaying a table in Debezium's outbox layout: producers keep inserting Debezium's
//! columns only; the relay publishes aggregate type → topic, aggregate id → key,
//! type → kind, in per-aggregate commit order.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{Relay, SpoolOptions};
use oncebox_core::{Error, Message};
use oncebox_postgres::{DebeziumLayout, DebeziumPayload, RowStatus};

use common::{LONG, TestDb, claim, labels};

const CREATE: &str = "CREATE TABLE outbox_events (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    \"timestamp\" timestamptz  NOT NULL DEFAULT now()
)";

/// What a Debezium-era producer runs: Debezium's columns and nothing else.
async fn produce(db: &TestDb, aggregate: &str, id: &str, kind: &str, payload: &str) {
    sqlx::query(
        "INSERT INTO outbox_events (id, aggregatetype, aggregateid, type, payload)
         VALUES (gen_random_uuid(), $1, $2, $3, $4::jsonb)",
    )
    .bind(aggregate.to_owned())
    .bind(id.to_owned())
    .bind(kind.to_owned())
    .bind(payload.to_owned())
    .execute(db.store.pool())
    .await
    .expect("a Debezium-style insert");
}

fn layout(db: &TestDb) -> DebeziumLayout {
    DebeziumLayout::new(&format!("{}.outbox_events", db.schema))
        .timestamp_column("timestamp")
        .topic_prefix("outbox.event.")
}

#[tokio::test(flavor = "multi_thread")]
async fn debezium_producers_are_relayed_in_order() {
    let db = TestDb::new().await;
    db.exec(CREATE).await;
    // Rows Debezium already published before the switch.
    produce(&db, "order", "o-1", "OrderPlaced", r#"{"old": true}"#).await;
    produce(&db, "order", "o-2", "OrderPlaced", r#"{"old": true}"#).await;

    let layout = layout(&db);
    db.store.migrate_debezium(&layout).await.unwrap();
    db.store
        .migrate_debezium(&layout)
        .await
        .expect("idempotent");
    let outbox = db.store.debezium_outbox_with(&layout).unwrap();
    assert!(outbox.table().ends_with("\"outbox_events\""));
    assert_eq!(
        outbox.stats().await.unwrap().done,
        2,
        "existing rows count as published"
    );

    for i in 0..5 {
        produce(
            &db,
            "order",
            "o-1",
            "OrderLine",
            &format!(r#"{{"line": {i}}}"#),
        )
        .await;
        produce(
            &db,
            "customer",
            "c-9",
            "CustomerSeen",
            &format!(r#"{{"n": {i}}}"#),
        )
        .await;
    }
    // An oncebox producer on the same table, with trace context.
    let message = Message::new("outbox.event.order", r#"{"line":5}"#)
        .with_key("o-1")
        .with_kind("OrderLine")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .unwrap();
    let mut tx = db.store.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, &message).await.unwrap();
    let err = outbox
        .enqueue(
            &mut tx,
            &Message::new("outbox.event.order", "not json").with_key("o-1"),
        )
        .await
        .unwrap_err();
    assert!(
        err.is_invalid_input(),
        "a jsonb payload must be JSON: {err}"
    );
    let err = outbox
        .enqueue(&mut tx, &Message::new("elsewhere", "{}"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
    tx.commit().await.unwrap();

    let broker = MemoryBroker::new();
    let relays: Vec<_> = (0..2)
        .map(|i| {
            Relay::new(
                db.store.debezium_outbox_with(&layout).unwrap(),
                broker.publisher(),
                SpoolOptions::new().name(format!("relay-{i}")).batch_size(3),
            )
            .unwrap()
        })
        .collect();
    for _ in 0..20 {
        for relay in &relays {
            relay.run_once().await.unwrap();
        }
    }
    let orders = broker.published("outbox.event.order");
    let customers = broker.published("outbox.event.customer");
    let order_lines: Vec<String> = orders
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(
        order_lines,
        [
            r#"{"line": 0}"#,
            r#"{"line": 1}"#,
            r#"{"line": 2}"#,
            r#"{"line": 3}"#,
            r#"{"line": 4}"#,
            r#"{"line": 5}"#
        ],
        "jsonb payloads as PostgreSQL renders them, in commit order, old rows not republished"
    );
    assert!(orders.iter().all(|m| m.key.as_deref() == Some("o-1")));
    assert!(orders.iter().all(|m| m.kind == "OrderLine"));
    assert_eq!(orders[5].id, message.id);
    assert_eq!(
        orders[5].headers, message.headers,
        "oncebox producers keep their headers"
    );
    assert_eq!(customers.len(), 5);
    assert!(
        customers
            .iter()
            .all(|m| m.key.as_deref() == Some("c-9") && m.kind == "CustomerSeen")
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.done), (0, 13));
    assert_eq!(
        outbox.status(message.id).await.unwrap().unwrap().status,
        RowStatus::Done
    );
}

/// The trigger takes the aggregate's lock before allocating the seq, so concurrent
/// Debezium-era producers of one aggregate commit in seq order.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_trigger_keeps_commit_order() {
    let db = TestDb::new().await;
    db.exec(CREATE).await;
    let layout = layout(&db);
    db.store.migrate_debezium(&layout).await.unwrap();
    let outbox = db.store.debezium_outbox_with(&layout).unwrap();

    let insert = "INSERT INTO outbox_events (id, aggregatetype, aggregateid, type, payload)
                  VALUES (gen_random_uuid(), 'order', 'o-1', 'Step', $1::jsonb)";
    let mut first = db.store.pool().begin().await.unwrap();
    sqlx::query(insert)
        .bind(r#"{"step": "first"}"#)
        .execute(&mut *first)
        .await
        .unwrap();
    let second = {
        let pool = db.store.pool().clone();
        tokio::spawn(async move {
            sqlx::query(insert)
                .bind(r#"{"step": "second"}"#)
                .execute(&pool)
                .await
                .unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second producer waits for the aggregate's lock"
    );
    first.commit().await.unwrap();
    second.await.unwrap();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        [r#"{"step": "first"}"#, r#"{"step": "second"}"#],
        "published in commit order"
    );
}

/// A `bytea` payload and no timestamp column; an empty aggregate id means no key.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_bytea_payloads() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE events (id uuid PRIMARY KEY, aggregatetype text NOT NULL,
         aggregateid text NOT NULL, type text NOT NULL, payload bytea)",
    )
    .await;
    let layout =
        DebeziumLayout::new(&format!("{}.events", db.schema)).payload(DebeziumPayload::Bytea);
    db.store.migrate_debezium(&layout).await.unwrap();
    db.exec(
        "INSERT INTO events (id, aggregatetype, aggregateid, type, payload)
         VALUES (gen_random_uuid(), 'audit', '', 'Seen', '\\xff00'),
                (gen_random_uuid(), 'audit', 'a', 'Seen', NULL)",
    )
    .await;
    let outbox = db.store.debezium_outbox_with(&layout).unwrap();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].item.topic, "audit");
    assert_eq!(rows[0].item.key, None);
    assert_eq!(&rows[0].item.payload[..], &[0xff, 0x00]);
    assert_eq!(rows[1].item.key.as_deref(), Some("a"));
    assert!(rows[1].item.payload.is_empty());

    let mut by_topic: HashMap<String, usize> = HashMap::new();
    for row in &rows {
        *by_topic.entry(row.item.topic.clone()).or_default() += 1;
    }
    assert_eq!(by_topic["audit"], 2);
    assert!(db.store.debezium_outbox("Bad.Name").is_err());
}

/// A dead row of a Debezium-style table (which has no `cdc_source`: the log-tailing
/// relay does not read such tables) is replayed in its place, as for the polling relay.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_dead_letters_are_replayed_in_place() {
    let db = TestDb::new().await;
    db.exec(CREATE).await;
    let layout = layout(&db);
    db.store.migrate_debezium(&layout).await.unwrap();
    produce(&db, "order", "o-1", "OrderPlaced", r#"{"n": 1}"#).await;
    db.exec(
        "UPDATE outbox_events SET oncebox_status = 'dead', oncebox_attempts = 3,
         oncebox_last_error = 'refused', oncebox_dead_at = now()",
    )
    .await;
    let (id, seq): (String, i64) =
        sqlx::query_as("SELECT id::text, oncebox_seq FROM outbox_events")
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    let id = oncebox_core::MessageId::parse(&id).unwrap();
    let outbox = db.store.debezium_outbox_with(&layout).unwrap();
    assert!(outbox.replay_dead(id).await.unwrap());
    let state = outbox.status(id).await.unwrap().expect("the row is kept");
    assert_eq!(
        (
            state.seq,
            state.status,
            state.attempts,
            state.last_error.as_deref()
        ),
        (seq, RowStatus::Pending, 0, Some("refused"))
    );
    assert!(
        !outbox.replay_dead(id).await.unwrap(),
        "only dead rows replay"
    );
}
