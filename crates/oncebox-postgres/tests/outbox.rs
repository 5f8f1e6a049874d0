//! The outbox beyond the conformance suite, on PostgreSQL's own means: NOTIFY wake-ups,
//! rows written by hand, schemas, raw SQL and creation times from clocks far off.

mod common;

use std::time::{Duration, Instant, SystemTime};

use oncebox_core::Error;
use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{Relay, SpoolOptions, SpoolStore};
use oncebox_postgres::{PgStore, RowStatus};
use sqlx::postgres::PgPoolOptions;

use common::{LONG, TestDb, claim, done, enqueue, labels, msg};

/// With NOTIFY, a relay polling every 30 s publishes a message within moments of its
/// commit.
#[tokio::test(flavor = "multi_thread")]
async fn notify_wakes_a_relay_before_its_poll_interval() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_notify(true);
    let broker = MemoryBroker::new();
    let poll = Duration::from_secs(30);
    let options = SpoolOptions::new()
        .poll_interval(poll, poll)
        .dispatch_timeout(Duration::from_secs(5));
    let relay = Relay::new(outbox.clone(), broker.publisher(), options).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    // Let the relay make its first (empty) claim, start listening and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 0..3 {
        let message = msg(Some("k"), &format!("m{round}"));
        let committed = Instant::now();
        enqueue(&outbox, &db.store, std::slice::from_ref(&message)).await;
        loop {
            if broker
                .published("orders")
                .iter()
                .any(|m| m.id == message.id)
            {
                break;
            }
            assert!(
                committed.elapsed() < Duration::from_secs(10),
                "round {round}: not published within 10 s of the commit (poll interval {poll:?})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!(
            "round {round}: published {:?} after the commit",
            committed.elapsed()
        );
    }
    let _ = stop.send(());
    running.await.unwrap().unwrap();
}

/// A listener whose connection is killed reconnects: relays keep waking on commits.
#[tokio::test(flavor = "multi_thread")]
async fn notify_survives_a_killed_listener_connection() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox().with_notify(true);
    let broker = MemoryBroker::new();
    let poll = Duration::from_secs(30);
    let options = SpoolOptions::new()
        .poll_interval(poll, poll)
        .dispatch_timeout(Duration::from_secs(5));
    let relay = Relay::new(outbox.clone(), broker.publisher(), options).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listen = format!("LISTEN \"{}\"", outbox.channel());
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1",
    )
    .bind(listen)
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    assert_eq!(
        killed,
        [true],
        "the listener's connection was found and killed"
    );
    // The listener notices, waits half a second and listens again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let message = msg(Some("k"), "after the kill");
    let committed = Instant::now();
    enqueue(&outbox, &db.store, std::slice::from_ref(&message)).await;
    while !broker
        .published("orders")
        .iter()
        .any(|m| m.id == message.id)
    {
        assert!(
            committed.elapsed() < Duration::from_secs(10),
            "not published within 10 s of the commit (poll interval {poll:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(());
    running.await.unwrap().unwrap();
}

/// Two stores in two schemas of one database see only their own rows; each schema has
/// its own migrations table; migrating again changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn schemas_are_isolated() {
    let db = TestDb::new().await;
    let other_schema = common::unique_schema();
    let other = db.store.clone().with_schema(&other_schema).unwrap();
    assert_eq!(other.schema(), other_schema);
    other.migrate().await.unwrap();
    other.migrate().await.unwrap();
    db.store.migrate().await.unwrap();
    let a = db.store.outbox();
    let b = other.outbox();
    assert_ne!(a.table(), b.table());
    enqueue(&a, &db.store, &[msg(Some("k"), "in a")]).await;
    enqueue(&b, &other, &[msg(Some("k"), "in b")]).await;
    let (_, rows) = claim(&b, 10, LONG).await;
    assert_eq!(labels(&rows), ["in b"]);
    let (_, rows) = claim(&a, 10, LONG).await;
    assert_eq!(labels(&rows), ["in a"]);
    for schema in [db.schema.as_str(), other_schema.as_str()] {
        let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{schema}\"._oncebox_migrations"
        )))
        .fetch_one(db.store.pool())
        .await
        .unwrap();
        let migrations = oncebox_postgres::migrator(schema).unwrap().iter().count();
        assert_eq!(applied, i64::try_from(migrations).unwrap(), "{schema}");
    }
    drop(common::drop_schema(other_schema));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_schema_names_are_refused() {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy(&common::url())
        .unwrap();
    let store = PgStore::from_pool(pool);
    assert_eq!(store.schema(), "oncebox");
    assert!(store.outbox().table().contains("\"oncebox\".\"outbox\""));
    for bad in [
        "",
        "Upper",
        "1st",
        "with space",
        "semi;colon",
        "quote\"d",
        "pg_catalog",
        "dash-ed",
        &"x".repeat(64),
    ] {
        let err = store.clone().with_schema(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidOptions(_)), "{bad:?}: {err}");
    }
    assert!(oncebox_postgres::schema_sql("bad name").is_err());
    assert!(oncebox_postgres::migrator("bad name").is_err());
}

/// The shipped raw SQL, with the schema filled in, builds the same tables, and the
/// stores work on them.
#[tokio::test(flavor = "multi_thread")]
async fn raw_sql_builds_working_tables() {
    let db = TestDb::new().await;
    let schema = common::unique_schema();
    let sql = oncebox_postgres::schema_sql(&schema).unwrap();
    assert!(!sql.contains(oncebox_postgres::SCHEMA_PLACEHOLDER));
    assert!(oncebox_postgres::SCHEMA_V1.contains(":\"schema\".outbox"));
    db.exec(&sql).await;
    db.exec(&sql).await; // idempotent
    let store = db.store.clone().with_schema(&schema).unwrap();
    let outbox = store.outbox();
    enqueue(&outbox, &store, &[msg(Some("k"), "raw")]).await;
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["raw"]);
    drop(common::drop_schema(schema));
}

/// Rows written by hand with explicit NULLs: a NULL where the table wants a value (id,
/// topic, kind, headers, payload, created_at) is refused by the database at the
/// producer's INSERT (`not_null_violation`), so no such row exists to stall a relay; NULL
/// in the optional columns (key, lease, error) is an unordered row published as usual;
/// JSON `null` as headers is a row the relay marks dead, naming the column.
#[tokio::test(flavor = "multi_thread")]
async fn hand_written_rows_with_explicit_nulls() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let columns = ["id", "topic", "kind", "headers", "payload", "created_at"];
    for column in columns {
        let values = columns.map(|c| match c {
            _ if c == column => "NULL",
            "id" => "gen_random_uuid()",
            "topic" => "'orders'",
            "kind" => "''",
            "headers" => "'{}'",
            "payload" => "'\\x00'",
            _ => "now()",
        });
        let sql = format!(
            "INSERT INTO outbox ({}) VALUES ({})",
            columns.join(", "),
            values.join(", ")
        );
        let error = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(db.store.pool())
            .await
            .expect_err("NULL in a NOT NULL column");
        let code = error
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("23502"), "{column}: {error}");
    }
    db.exec(
        "INSERT INTO outbox (id, topic, key, kind, headers, payload, lease_token, lease_until, last_error)
         VALUES ('0190a3f4-0000-7000-8000-000000000001', 'orders', NULL, 'Nulls', '{}', 'nulls', NULL, NULL, NULL),
                ('0190a3f4-0000-7000-8000-000000000002', 'orders', 'k', 'JsonNull', 'null', 'json null', NULL, NULL, NULL)",
    )
    .await;
    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        ["nulls"],
        "the row with JSON null headers is not handed out"
    );
    assert_eq!(rows[0].item.key, None);
    outbox.settle(token, &done(&rows)).await.expect("settle");
    let id =
        oncebox_core::MessageId::parse("0190a3f4-0000-7000-8000-000000000002").expect("a UUID");
    let state = outbox.status(id).await.expect("status").expect("the row");
    assert_eq!(state.status, RowStatus::Dead);
    let reason = state.last_error.expect("a reason");
    assert!(reason.contains("headers"), "{reason}");
}

/// Producers whose clocks are far off (a day ahead, thirty years behind, before 1970):
/// rows go out in commit order whatever their creation times say. The oldest pending
/// age is the first pending row's (in commit order), from the later of its producer's
/// creation time and the time it became due by the database's clock: zero for a row
/// created "in the future", not an error, and the time since its enqueue, not thirty
/// years, for one from a clock far behind.
#[tokio::test(flavor = "multi_thread")]
async fn creation_times_from_clocks_far_off_keep_commit_order() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let day = Duration::from_secs(24 * 3600);
    let mut ahead = msg(Some("k"), "a day ahead");
    ahead.created_at = SystemTime::now() + day;
    let mut behind = msg(Some("k"), "thirty years behind");
    behind.created_at = SystemTime::now() - day * 365 * 30;
    let mut before_1970 = msg(Some("k"), "before 1970");
    before_1970.created_at = SystemTime::UNIX_EPOCH - day;
    enqueue(&outbox, &db.store, &[ahead, behind, before_1970.clone()]).await;
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(stats.oldest_pending_age, Some(Duration::ZERO));
    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(
        labels(&rows),
        ["a day ahead", "thirty years behind", "before 1970"],
        "commit order, not creation time"
    );
    assert_eq!(rows[2].item.created_at, before_1970.created_at);
    outbox
        .settle(token, &done(&rows[..1]))
        .await
        .expect("settle the first");
    let stats = outbox.stats().await.expect("stats");
    assert!(stats.oldest_pending_age.expect("an age") < Duration::from_secs(60));
}
