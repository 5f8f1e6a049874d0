//! The in-process broker: a new one per run.

use oncebox::Publisher as _;
use oncebox::memory::{MemoryBroker, MemoryPublisher};

use super::BenchTransport;
use crate::bench::workload;

/// The in-process broker of the current run.
pub(crate) struct MemoryBench {
    broker: MemoryBroker,
}

impl MemoryBench {
    pub(crate) fn open() -> Self {
        Self {
            broker: MemoryBroker::new(),
        }
    }
}

impl BenchTransport for MemoryBench {
    type Publisher = MemoryPublisher;

    fn topic(&self) -> &str {
        workload::TOPIC
    }

    async fn reset(&mut self) -> anyhow::Result<()> {
        self.broker = MemoryBroker::new();
        Ok(())
    }

    async fn publisher(&self) -> anyhow::Result<MemoryPublisher> {
        Ok(self.broker.publisher())
    }

    /// In process there is nothing to pipeline: one publish after the other.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let publisher = self.broker.publisher();
        for message in batch {
            publisher.publish(message).await?;
        }
        Ok(())
    }

    async fn published(&self) -> anyhow::Result<u64> {
        Ok(self.broker.stats().published)
    }

    async fn close(self) -> anyhow::Result<()> {
        Ok(())
    }
}
