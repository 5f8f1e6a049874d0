//! `oncebox-testkit`'s transport suite against a Kafka-protocol broker
//! (`ONCEBOX_KAFKA_BROKERS`, default `127.0.0.1:9092`; `scripts/services.sh kafka`
//! starts tansu with in-memory storage). Every check runs on topics and groups of its
//! own, deleted afterwards, so the checks run in parallel and can be rerun.

mod common;

use common::KafkaHarness;

macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() -> oncebox_core::Result<()> {
                let harness = KafkaHarness::new();
                let result = oncebox_testkit::transport::$check(&harness).await;
                harness.cleanup().await;
                result
            }
        )*
    };
}

oncebox_testkit::transport_checks!(suite!());
// Skipped by capability: tansu's in-memory storage does not survive a restart.
suite!(survives_restart);
