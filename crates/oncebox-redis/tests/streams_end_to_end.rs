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

/// An HTTP request's trace reaches the transactional inbox's handler through Redis Streams
/// (`oncebox_testkit::trace`): one trace id from the request to the handler, a duplicate
/// on it as such, a malformed `traceparent` handled in a fresh trace.
#[tokio::test]
async fn trace_of_a_request_reaches_the_handler() -> oncebox_core::Result<()> {
    let broker = StreamsHarness::new().await;
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    oncebox_testkit::trace::request_to_handler(&broker, std::sync::Arc::clone(&store), &*store)
        .await
}

/// The same through the durable inbox, with the relay replaced between two requests: the
/// context survives in the outbox and inbox tables.
#[tokio::test]
async fn trace_of_a_request_survives_the_tables() -> oncebox_core::Result<()> {
    let broker = StreamsHarness::new().await;
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    oncebox_testkit::trace::request_to_durable_handler(
        &broker,
        std::sync::Arc::clone(&store),
        &*store,
    )
    .await
}
