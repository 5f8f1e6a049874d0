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
