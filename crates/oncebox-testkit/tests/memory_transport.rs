//! The transport conformance suite against the in-process broker: once per check in real
//! time with a 300 ms ack timeout, once whole on a paused clock, and the checks that
//! tolerate redeliveries once more under injected faults.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oncebox_core::memory::{Faults, MemoryBroker, MemoryPublisher, MemorySubscriber};
use oncebox_core::{Received, Result};
use oncebox_testkit::transport::{self, Capabilities, TransportHarness};

const ACK_TIMEOUT: Duration = Duration::from_millis(300);

/// A fresh broker per harness, so tests share nothing.
struct MemoryHarness {
    broker: MemoryBroker,
    topics: AtomicU64,
}

impl MemoryHarness {
    fn new() -> Self {
        Self {
            broker: MemoryBroker::with_ack_timeout(ACK_TIMEOUT),
            topics: AtomicU64::new(0),
        }
    }

    fn with_faults(faults: Faults) -> Self {
        let harness = Self::new();
        harness.broker.set_seed(7);
        harness.broker.set_faults(faults);
        harness
    }
}

impl TransportHarness for MemoryHarness {
    type Publisher = MemoryPublisher;
    type Subscriber = MemorySubscriber;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    fn ack_timeout(&self) -> Duration {
        self.broker.ack_timeout()
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        Ok(format!(
            "{label}-{}",
            self.topics.fetch_add(1, Ordering::Relaxed)
        ))
    }

    async fn publisher(&self) -> Result<MemoryPublisher> {
        Ok(self.broker.publisher())
    }

    async fn subscriber(&self, topic: &str, group: &str) -> Result<MemorySubscriber> {
        Ok(self.broker.subscribe(topic, group))
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        Ok(self.broker.dead_letters(topic))
    }

    /// An outage of 50 ms: the in-process broker keeps its state, as a durable broker
    /// does across a restart.
    async fn restart(&self) -> Result<()> {
        self.broker.set_down(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.broker.set_down(false);
        Ok(())
    }
}

/// One `#[tokio::test]` per check, named after it.
macro_rules! each_check {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $check() -> Result<()> {
            transport::$check(&MemoryHarness::new()).await
        }
    )*};
}

oncebox_testkit::transport_checks!(each_check!());
each_check!(survives_restart);

#[tokio::test(start_paused = true)]
async fn whole_suite_on_a_paused_clock() -> Result<()> {
    transport::run_all(&MemoryHarness::new()).await
}

#[tokio::test]
async fn confirmed_messages_arrive_despite_faults() -> Result<()> {
    let faults = Faults {
        drop: 0.2,
        duplicate: 0.2,
        delay: 0.2,
        max_delay: Duration::from_millis(50),
    };
    let harness = MemoryHarness::with_faults(faults);
    transport::publish_confirm_and_receive(&harness).await?;
    transport::late_group_receives_history(&harness).await?;
    transport::survives_restart(&harness).await?;
    let stats = harness.broker.stats();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.delayed > 0,
        "{stats:?}"
    );
    Ok(())
}

/// The end-to-end driver itself, on the in-process broker: SQLite outbox → relay →
/// broker → transactional inbox.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread")]
async fn end_to_end_sqlite_outbox_to_inbox() -> Result<()> {
    use oncebox_testkit::e2e::{self, EndToEnd};
    use oncebox_testkit::sqlite::SqliteHarness;

    let store = SqliteHarness::new().await;
    let report =
        e2e::outbox_to_inbox(&MemoryHarness::new(), &store, &store, EndToEnd::new(2_000)).await?;
    println!("{report}");
    assert!(
        report.duplicates_skipped > 0,
        "no duplicate reached the inbox: {report:?}"
    );
    Ok(())
}

/// The trace checks on the in-process broker, the reference the real brokers' runs are
/// read against.
#[cfg(all(feature = "sqlite", feature = "otel"))]
mod trace {
    use std::sync::Arc;

    use oncebox_core::Result;
    use oncebox_testkit::sqlite::SqliteHarness;

    use super::MemoryHarness;

    #[tokio::test]
    async fn request_to_handler_is_one_trace() -> Result<()> {
        let store = Arc::new(SqliteHarness::new().await);
        oncebox_testkit::trace::request_to_handler(
            &MemoryHarness::new(),
            Arc::clone(&store),
            &*store,
        )
        .await
    }

    #[tokio::test]
    async fn request_to_receiver_is_one_trace() -> Result<()> {
        let store = Arc::new(SqliteHarness::new().await);
        oncebox_testkit::trace::request_to_receiver(&MemoryHarness::new(), store).await
    }

    #[tokio::test]
    async fn request_to_durable_handler_is_one_trace_across_relays() -> Result<()> {
        let store = Arc::new(SqliteHarness::new().await);
        oncebox_testkit::trace::request_to_durable_handler(
            &MemoryHarness::new(),
            Arc::clone(&store),
            &*store,
        )
        .await
    }
}
