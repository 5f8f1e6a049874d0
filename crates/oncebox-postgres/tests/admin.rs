//! The dashboard's reads of a Debezium-style outbox table: its listing and the messages
//! published per minute, checked as the suite checks oncebox's own table.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{OutboxAdmin, RowFilter};
use oncebox_core::{Error, Message};
use oncebox_postgres::{DebeziumLayout, PgOutbox};
use oncebox_testkit::outbox::{check_listing, check_published_per_minute, fill_listed};

use common::{TestDb, enqueue};

/// A Debezium-style table is listed, and its published rows counted per minute, as
/// oncebox's own table is by the suite (`rows_listed_newest_first_filtered_and_paged`,
/// `published_per_minute_counts_done_rows_by_minute`).
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
    check_published_per_minute(&outbox, async |id, at| {
        let seconds = at
            .duration_since(UNIX_EPOCH)
            .map_err(Error::store_permanent)?
            .as_secs_f64();
        sqlx::query(
            "UPDATE outbox_events SET oncebox_done_at = to_timestamp($1) WHERE id = $2::uuid",
        )
        .bind(seconds)
        .bind(id.to_string())
        .execute(db.store.pool())
        .await
        .map_err(Error::store_transient)?;
        Ok(())
    })
    .await;
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
