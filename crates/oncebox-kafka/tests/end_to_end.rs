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
