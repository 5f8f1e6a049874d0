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

suite!(
    publish_confirm_and_receive,
    received_fields_round_trip,
    ack_stops_redelivery,
    nack_redelivers_after_delay,
    unacked_delivery_redelivered_after_timeout,
    late_ack_is_harmless,
    dead_letter_stops_delivery,
    per_key_order,
    groups_share_work,
    late_group_receives_history,
    // Skipped by capability: tansu's in-memory storage does not survive a restart.
    survives_restart,
);
