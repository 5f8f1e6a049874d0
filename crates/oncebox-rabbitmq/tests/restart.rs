//! `survives_restart` of the transport suite, restarting the machine's RabbitMQ with
//! `rabbitmqctl stop_app` / `start_app`. Alone in this file because `cargo test` runs
//! test binaries one after the other: no other RabbitMQ test runs while the broker is
//! down. The harness starts the broker again when dropped, even after a failure.

mod common;

use common::RabbitHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_restart() -> oncebox_core::Result<()> {
    let harness = RabbitHarness::restartable();
    oncebox_testkit::transport::survives_restart(&harness).await
}
