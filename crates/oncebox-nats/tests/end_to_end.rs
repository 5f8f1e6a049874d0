//! SQLite outbox → relay → NATS JetStream → transactional inbox, 10,000 messages with
//! real redeliveries (a relay crashing after PubAcks, consumers crashing before and after
//! committing, nacks): every message's effect exactly once.

mod support;

use oncebox_core::Result;
use oncebox_testkit::e2e::{EndToEnd, outbox_to_inbox};
use oncebox_testkit::sqlite::SqliteHarness;
use support::NatsHarness;

#[tokio::test(flavor = "multi_thread")]
async fn outbox_to_inbox_through_jetstream_effects_exactly_once() -> Result<()> {
    let broker = NatsHarness::shared().await;
    let store = SqliteHarness::new().await;
    let report = outbox_to_inbox(&broker, &store, &store, EndToEnd::new(10_000)).await;
    broker.cleanup().await;
    let report = report?;
    eprintln!("end to end through NATS JetStream: {report}");
    assert!(
        report.duplicates_skipped > 0,
        "no redelivery reached the inbox: {report}"
    );
    Ok(())
}
