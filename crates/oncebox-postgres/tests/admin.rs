//! The dashboard's reads of the outbox beyond the conformance suite's listing: the
//! messages published per minute, on oncebox's own table and on a Debezium-style one, and
//! the listing of a Debezium-style table.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::Message;
use oncebox_core::spool::{MinuteCount, RowFilter, RowStatus};
use oncebox_postgres::{DebeziumLayout, PgOutbox};
use oncebox_testkit::outbox::{check_listing, fill_listed};

use common::{TestDb, enqueue};

#[tokio::test(flavor = "multi_thread")]
async fn published_per_minute_counts_done_rows_by_minute() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    fill(&db, &outbox, "").await;
    check_published_per_minute(&db, &outbox, "outbox", "done_at").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn debezium_tables_are_listed_and_counted_alike() {
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
    db.store
        .migrate_debezium(&layout)
        .await
        .expect("migrate the Debezium-style table");
    let outbox = db
        .store
        .debezium_outbox_with(&layout)
        .expect("a Debezium-style outbox");
    let created = fill(&db, &outbox, "outbox.event.").await;
    check_listing(&outbox, "outbox.event.", created).await;

    // Topics outside the prefix, and the empty key (how the table stores "no key"),
    // match no row.
    for filter in [
        RowFilter {
            topic: Some("orders".to_owned()),
            ..RowFilter::default()
        },
        RowFilter {
            key: Some(String::new()),
            ..RowFilter::default()
        },
    ] {
        let rows = outbox.rows(&filter, None, 100).await.expect("rows");
        assert!(rows.is_empty(), "{filter:?} matched {} rows", rows.len());
    }
    check_published_per_minute(&db, &outbox, "outbox_events", "oncebox_done_at").await;
}

/// Fills `outbox` as the conformance suite's listing check does, with topics under
/// `prefix`; returns the first creation time.
async fn fill(db: &TestDb, outbox: &PgOutbox, prefix: &str) -> SystemTime {
    fill_listed(outbox, prefix, async |messages: &[Message]| {
        enqueue(outbox, &db.store, messages).await;
        Ok(())
    })
    .await
}

/// Sets the publication times of the done rows of the outbox [`fill`] made (`column` of
/// `table`) around the database's current minute `m`: two in `m - 10`, one in `m - 3`,
/// one two hours ago, the rest in `m - 2`; then counts them.
async fn check_published_per_minute(db: &TestDb, outbox: &PgOutbox, table: &str, column: &str) {
    let done = outbox
        .rows(&filter(|f| f.status = Some(RowStatus::Done)), None, 100)
        .await
        .expect("done rows");
    assert_eq!(done.len(), 7);
    let minute: i64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM date_trunc('minute', statement_timestamp()))::bigint",
    )
    .fetch_one(db.store.pool())
    .await
    .expect("the database's minute");
    let at = |minutes_ago: i64, seconds: f64| (minute - 60 * minutes_ago) as f64 + seconds;
    let times = [
        at(10, 5.0),
        at(10, 50.0),
        at(3, 59.5),
        at(120, 0.0),
        at(2, 1.0),
        at(2, 30.0),
        at(2, 59.999),
    ];
    let update = format!("UPDATE {table} SET {column} = to_timestamp($1) WHERE id = $2::uuid");
    for (row, time) in done.iter().zip(times) {
        sqlx::query(sqlx::AssertSqlSafe(update.clone()))
            .bind(time)
            .bind(row.message.id.to_string())
            .execute(db.store.pool())
            .await
            .expect("set the publication time");
    }
    let count = |minutes_ago: i64, published: u64| MinuteCount {
        minute: UNIX_EPOCH
            + Duration::from_secs(u64::try_from(minute - 60 * minutes_ago).expect("after 1970")),
        published,
    };
    let hour = outbox
        .published_per_minute(SystemTime::now() - Duration::from_secs(3600))
        .await
        .expect("published per minute");
    assert_eq!(hour, [count(10, 2), count(3, 1), count(2, 3)]);
    let recent = outbox
        .published_per_minute(SystemTime::now() - Duration::from_secs(300))
        .await
        .expect("published per minute");
    assert_eq!(recent, [count(3, 1), count(2, 3)]);
    let future = outbox
        .published_per_minute(SystemTime::now() + Duration::from_secs(60))
        .await
        .expect("published per minute");
    assert!(future.is_empty());
}

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}
