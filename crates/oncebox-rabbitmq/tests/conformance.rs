//! The `oncebox-testkit` transport suite against a real RabbitMQ (`ONCEBOX_AMQP_URL`,
//! default `amqp://guest:guest@127.0.0.1:5672/%2f`), one test per check, each on an
//! exchange and queues of its own. `survives_restart` restarts the broker, so it runs
//! alone, in `tests/restart.rs`; here it is skipped (the harness does not declare
//! `restart`).

mod common;

use common::RabbitHarness;

macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() -> oncebox_core::Result<()> {
                let harness = RabbitHarness::new();
                oncebox_testkit::transport::$check(&harness).await
            }
        )*
    };
}

oncebox_testkit::transport_checks!(suite!());
