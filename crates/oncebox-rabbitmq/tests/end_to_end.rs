//! SQLite outbox → relay → RabbitMQ → transactional inbox, 10,000 messages with real
//! redeliveries (a relay that crashes after confirms, consumers that drop deliveries
//! before and after committing, nacks): every effect exactly once.

mod common;

use common::RabbitHarness;
use oncebox_testkit::e2e::{EndToEnd, outbox_to_inbox};
use oncebox_testkit::sqlite::SqliteHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outbox_to_rabbitmq_to_sqlite_inbox() -> oncebox_core::Result<()> {
    let transport = RabbitHarness::new();
    let outbox = SqliteHarness::new().await;
    let inbox = SqliteHarness::new().await;
    let report = outbox_to_inbox(&transport, &outbox, &inbox, EndToEnd::new(10_000)).await?;
    println!("RabbitMQ end to end: {report}");
    Ok(())
}

/// An HTTP request's trace reaches the transactional inbox's handler through RabbitMQ
/// (`oncebox_testkit::trace`): one trace id from the request to the handler, a duplicate
/// on it as such, a malformed `traceparent` handled in a fresh trace.
#[tokio::test]
async fn trace_of_a_request_reaches_the_handler() -> oncebox_core::Result<()> {
    let broker = RabbitHarness::new();
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    oncebox_testkit::trace::request_to_handler(&broker, std::sync::Arc::clone(&store), &*store)
        .await
}

/// The same through the durable inbox, with the relay replaced between two requests: the
/// context survives in the outbox and inbox tables.
#[tokio::test]
async fn trace_of_a_request_survives_the_tables() -> oncebox_core::Result<()> {
    let broker = RabbitHarness::new();
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    oncebox_testkit::trace::request_to_durable_handler(
        &broker,
        std::sync::Arc::clone(&store),
        &*store,
    )
    .await
}
