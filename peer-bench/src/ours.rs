//! oncebox's side: `PgStore`'s outbox with its defaults in the run's schema, filled
//! through `enqueue_batch`, drained by a [`Relay`] as `oncebox-bench relay`'s engine is
//! (`Relay::drain`: claim, publish, settle with the next claim, until a claim finds
//! nothing).

use std::time::Instant;

use anyhow::Context as _;
use oncebox::memory::MemoryBroker;
use oncebox::postgres::{PgOutbox, PgStore};
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::{Bytes, Message};

use crate::workload::{KIND, PAYLOAD, TOPIC};
use crate::{Contender, Run, Side};

/// Messages enqueued per transaction while filling.
const FILL_CHUNK: u64 = 1000;

/// oncebox's outbox in the run's schema.
pub(crate) struct Ours {
    store: PgStore,
    outbox: PgOutbox,
    batch: u32,
}

impl Ours {
    /// Connects and creates oncebox's tables in `schema` (which exists); the relay
    /// deletes published rows if `delete_on_publish`, else marks them done.
    pub(crate) async fn open(
        url: &str,
        schema: &str,
        batch: u32,
        delete_on_publish: bool,
    ) -> anyhow::Result<Self> {
        let store = PgStore::connect(url)
            .await
            .context("connecting oncebox's store")?
            .with_schema(schema)?;
        store.migrate().await.context("creating oncebox's tables")?;
        Ok(Self {
            outbox: store.outbox().delete_on_publish(delete_on_publish),
            store,
            batch,
        })
    }

    /// Closes the store's pool.
    pub(crate) async fn close(self) {
        self.store.pool().close().await;
    }
}

impl Contender for Ours {
    /// The outbox table, qualified.
    fn table(&self) -> &str {
        self.outbox.table()
    }

    /// Fills the (empty) outbox with `messages`, spread over `keys` ordering keys, in
    /// transactions of a thousand.
    async fn prefill(&self, messages: u64, keys: u32) -> anyhow::Result<()> {
        let mut next = 0;
        while next < messages {
            let end = (next + FILL_CHUNK).min(messages);
            let chunk: Vec<Message> = (next..end)
                .map(|n| {
                    Message::new(TOPIC, Bytes::from_static(PAYLOAD))
                        .with_key(format!("key-{:05}", n % u64::from(keys)))
                        .with_kind(KIND)
                })
                .collect();
            let mut tx = self.store.pool().begin().await?;
            self.outbox.enqueue_batch(&mut tx, &chunk).await?;
            tx.commit().await?;
            next = end;
        }
        Ok(())
    }

    /// Times the relay draining the backlog to `broker`.
    async fn drain(&self, broker: &MemoryBroker, round: u32) -> anyhow::Result<Run> {
        let options = SpoolOptions::new()
            .name("peer-bench")
            .batch_size(self.batch as usize);
        let relay = Relay::new(self.outbox.clone(), broker.publisher(), options)?;
        let started = Instant::now();
        let report = relay.drain().await?;
        let elapsed = started.elapsed();
        anyhow::ensure!(
            report.done == report.claimed,
            "the relay failed to publish some rows: {report:?}"
        );
        Ok(Run::new(
            Side::Oncebox,
            round,
            broker.stats().published,
            elapsed,
        ))
    }
}
