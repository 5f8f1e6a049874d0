//! SQLite outbox → relay → Kafka → transactional inbox, 10,000 messages with real
//! redeliveries (a relay crashing after delivery reports, consumers crashing before and
//! after committing, nacks): every message's effect exactly once.
//!
//! Runs against the broker at `ONCEBOX_KAFKA_BROKERS` (tansu), three consumers in one
//! group on a three-partition topic.

mod common;

use common::KafkaHarness;
use oncebox_core::Result;
use oncebox_testkit::e2e::{EndToEnd, outbox_to_inbox};
use oncebox_testkit::sqlite::SqliteHarness;

#[tokio::test(flavor = "multi_thread")]
async fn outbox_to_inbox_through_kafka_effects_exactly_once() -> Result<()> {
    let broker = KafkaHarness::new();
    let store = SqliteHarness::new().await;
    let report = outbox_to_inbox(&broker, &store, &store, EndToEnd::new(10_000)).await;
    broker.cleanup().await;
    let report = report?;
    eprintln!("end to end through Kafka: {report}");
    assert!(
        report.duplicates_skipped > 0,
        "no redelivery reached the inbox: {report}"
    );
    Ok(())
}

/// An HTTP request's trace reaches the transactional inbox's handler through Kafka
/// (`oncebox_testkit::trace`): one trace id from the request to the handler, a duplicate
/// on it as such, a malformed `traceparent` handled in a fresh trace.
#[tokio::test]
async fn trace_of_a_request_reaches_the_handler() -> oncebox_core::Result<()> {
    let broker = KafkaHarness::new();
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    let checked =
        oncebox_testkit::trace::request_to_handler(&broker, std::sync::Arc::clone(&store), &*store)
            .await;
    broker.cleanup().await;
    checked
}

/// The same through the durable inbox, with the relay replaced between two requests: the
/// context survives in the outbox and inbox tables.
#[tokio::test]
async fn trace_of_a_request_survives_the_tables() -> oncebox_core::Result<()> {
    let broker = KafkaHarness::new();
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    let checked = oncebox_testkit::trace::request_to_durable_handler(
        &broker,
        std::sync::Arc::clone(&store),
        &*store,
    )
    .await;
    broker.cleanup().await;
    checked
}
