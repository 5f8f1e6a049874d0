//! The dashboard's reads of the outbox beyond the conformance suite's listing: the
//! messages published per minute.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::Message;
use oncebox_core::spool::{MinuteCount, RowFilter, RowStatus};
use oncebox_sqlite::SqliteOutbox;
use oncebox_testkit::outbox::fill_listed;

use common::{Db, db, enqueue};

/// Sets the publication times of the done rows around the current minute `m`: two in
/// `m - 10`, one in `m - 3`, one two hours ago, the rest in `m - 2`; then counts them.
#[tokio::test]
async fn published_per_minute_counts_done_rows_by_minute() {
    let db = db().await;
    let outbox = db.store.outbox();
    fill(&db, &outbox).await;
    let done = outbox
        .rows(&filter(|f| f.status = Some(RowStatus::Done)), None, 100)
        .await
        .expect("done rows");
    assert_eq!(done.len(), 7);
    let now_ms = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_millis(),
    )
    .expect("a clock before the year 292 million");
    let minute = now_ms / 60_000 * 60_000;
    let at = |minutes_ago: i64, ms: i64| minute - 60_000 * minutes_ago + ms;
    let times = [
        at(10, 5_000),
        at(10, 50_000),
        at(3, 59_500),
        at(120, 0),
        at(2, 1_000),
        at(2, 30_000),
        at(2, 59_999),
    ];
    for (row, time) in done.iter().zip(times) {
        sqlx::query("UPDATE oncebox_outbox SET done_at = ?1 WHERE id = ?2")
            .bind(time)
            .bind(row.message.id.to_string())
            .execute(db.store.pool())
            .await
            .expect("set the publication time");
    }
    let count = |minutes_ago: i64, published: u64| MinuteCount {
        minute: UNIX_EPOCH
            + Duration::from_millis(
                u64::try_from(minute - 60_000 * minutes_ago).expect("after 1970"),
            ),
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

/// Fills `outbox` as the conformance suite's listing check does.
async fn fill(db: &Db, outbox: &SqliteOutbox) -> SystemTime {
    fill_listed(outbox, "", async |messages: &[Message]| {
        enqueue(&db.store, messages).await;
        Ok(())
    })
    .await
}

fn filter(set: impl FnOnce(&mut RowFilter)) -> RowFilter {
    let mut filter = RowFilter::default();
    set(&mut filter);
    filter
}
