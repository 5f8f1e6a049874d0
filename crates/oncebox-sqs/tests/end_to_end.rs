//! SQLite outbox → relay → SQS (a FIFO queue) → transactional inbox, 2,000 messages with
//! real redeliveries (a relay crashing after SQS's answers, consumers crashing before and
//! after committing, nacks): every message's effect exactly once.

mod support;

use oncebox_core::Result;
use oncebox_testkit::e2e::{EndToEnd, outbox_to_inbox};
use oncebox_testkit::sqlite::SqliteHarness;
use support::SqsHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_to_inbox_through_sqs_effects_exactly_once() -> Result<()> {
    let broker = SqsHarness::new(true).await;
    let store = SqliteHarness::new().await;
    let report = outbox_to_inbox(&broker, &store, &store, EndToEnd::new(2_000)).await;
    broker.cleanup().await;
    let report = report?;
    eprintln!("end to end through SQS: {report}");
    assert!(
        report.duplicates_skipped > 0,
        "no redelivery reached the inbox: {report}"
    );
    Ok(())
}

/// An HTTP request's trace reaches the transactional inbox's handler through SQS
/// (`oncebox_testkit::trace`): one trace id from the request to the handler, a duplicate
/// on it as such, a malformed `traceparent` handled in a fresh trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_of_a_request_reaches_the_handler() -> Result<()> {
    let broker = SqsHarness::new(false).await;
    let store = std::sync::Arc::new(SqliteHarness::new().await);
    let checked =
        oncebox_testkit::trace::request_to_handler(&broker, std::sync::Arc::clone(&store), &*store)
            .await;
    broker.cleanup().await;
    checked
}
