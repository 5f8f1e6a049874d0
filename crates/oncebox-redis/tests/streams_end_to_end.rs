//! SQLite outbox → relay → Redis Streams → SQLite transactional inbox, 10,000 messages,
//! with the relay and the consumers crashing the way real processes do: every duplicate
//! the inbox absorbs is a real redelivery by Redis (`XAUTOCLAIM` after the ack timeout,
//! a nack) or a real second `XADD` by the relay.

mod support;

use oncebox_core::Result;
use oncebox_testkit::e2e::{EndToEnd, outbox_to_inbox};
use oncebox_testkit::sqlite::SqliteHarness;
use support::StreamsHarness;

#[tokio::test(flavor = "multi_thread")]
async fn every_effect_exactly_once() -> Result<()> {
    let transport = StreamsHarness::new().await;
    let store = SqliteHarness::new().await;
    let report = outbox_to_inbox(&transport, &store, &store, EndToEnd::new(10_000)).await?;
    println!("redis streams end to end: {report}");
    assert!(
        report.published > report.messages && report.deliveries > report.messages,
        "no real redelivery happened: {report}"
    );
    Ok(())
}
