//! The brokers `oncebox-bench relay` publishes to, behind one trait so that the benchmark
//! is written once, each with the raw client loop the relay is measured against.
//!
//! A transport owns a place of its own on its broker (a stream, a topic, an exchange
//! and queue named for the run) and removes it in [`BenchTransport::close`]. Its raw
//! step, [`BenchTransport::publish_raw`], is what an application would write without
//! oncebox: the broker's own client publishing one claimed batch, every message in flight
//! at once with the same headers and client settings as oncebox's publisher, then
//! waiting for all the confirmations.
//!
//! Each broker's module has a type with `async fn open(url: Option<&str>) ->
//! anyhow::Result<Self>` (the `--broker-url` flag; without it, the broker's environment
//! variable, else the local default): `memory::MemoryBench` (no URL),
//! `nats::NatsBench`, `rabbitmq::RabbitMqBench`, `kafka::KafkaBench`,
//! `redis::RedisStreamsBench`, `sqs::SqsBench`.

pub(crate) mod memory;

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;
#[cfg(feature = "redis-streams")]
pub(crate) mod redis;
#[cfg(feature = "sqs")]
pub(crate) mod sqs;

use std::future::Future;

use oncebox::{Message, Publisher};

/// A broker to benchmark the relay against, in a place of its own.
pub(crate) trait BenchTransport: Send + Sync + Sized {
    /// oncebox's publisher for this broker.
    type Publisher: Publisher + Send + Sync + 'static;

    /// The topic the current run's messages carry (what [`BenchTransport::reset`] made).
    fn topic(&self) -> &str;

    /// Starts a run on a new, empty topic, so that runs share nothing on the broker.
    fn reset(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// oncebox's publisher, set up as an application would set it up.
    fn publisher(&self) -> impl Future<Output = anyhow::Result<Self::Publisher>> + Send;

    /// The raw client's step: publishes every message of `batch` with the broker's own
    /// client, all in flight at once, and returns once the broker confirmed them all.
    fn publish_raw(&self, batch: &[Message]) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// How many messages the broker holds on the current topic, to check that a run
    /// published every message (and no more).
    fn published(&self) -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// The `[broker]` section of an `oncebox relay` configuration that publishes to
    /// this transport's place (`oncebox-bench relay --processes`); brokers that have
    /// none yet say so.
    fn relay_config(&self) -> anyhow::Result<String> {
        anyhow::bail!(
            "--processes runs `oncebox relay` processes into NATS only (--transport nats)"
        )
    }

    /// Removes everything this transport created on the broker.
    fn close(self) -> impl Future<Output = anyhow::Result<()>> + Send;
}
