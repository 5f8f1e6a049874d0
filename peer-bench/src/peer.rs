//! The peer: `outbox-core` 0.6 with its PostgreSQL storage, `outbox-postgres` 0.3, as a
//! user sets them up: their table (with the trigger that notifies on each insert and
//! update) in the run's schema, and the processor's drain loop, the one its manager runs
//! on each wake-up: [`OutboxProcessor::process_pending_events`] until it finds nothing.
//! Its batch size is the run's `--batch`; everything else is the crate's default (the
//! README's feature `dlq`, which would add a failure count to every publish, is off).
//! Its pool is a default `PgPool` of its own.
//!
//! Its transport publishes each event to oncebox's in-process broker, as oncebox's relay
//! does: the event's payload (the same JSON document as oncebox's messages, written
//! again from the decoded `serde_json::Value`) becomes a message of the bench's topic,
//! with the event's id and type.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use oncebox::memory::MemoryBroker;
use oncebox::{Bytes, Message, MessageId, Publisher};
use outbox_core::prelude::{Event, OutboxConfig, OutboxError, OutboxProcessor, Transport};
use outbox_postgres::PostgresOutbox;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::workload::{KIND, PAYLOAD, TOPIC};
use crate::{Contender, Run, Side};

/// The peer, as the report names it.
pub(crate) const NAME: &str = "outbox-core 0.6 + outbox-postgres 0.3";

/// The peer's table, in the run's schema.
const TABLE: &str = "outbox_events";

/// The tables, type, function and trigger outbox-postgres 0.3's migrations create, in the
/// run's schema (the connections' `search_path`).
const MIGRATION: &str = "
CREATE TYPE status AS ENUM ('Pending', 'Processing', 'Sent');
CREATE TABLE outbox_events (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    idempotency_token text DEFAULT NULL,
    event_type        text NOT NULL,
    payload           jsonb NOT NULL,
    status            status NOT NULL DEFAULT 'Pending',
    created_at        timestamptz NOT NULL DEFAULT now(),
    locked_until      timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX idx_outbox_processing_queue ON outbox_events (locked_until ASC, status)
    WHERE status IN ('Pending', 'Processing');
CREATE UNIQUE INDEX idx_outbox_idempotency ON outbox_events (idempotency_token);
CREATE FUNCTION notify_outbox_event() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('outbox_event', 'ping');
    RETURN new;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER outbox_events_notify_trigger AFTER INSERT OR UPDATE ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION notify_outbox_event();
";

/// The peer's outbox in the run's schema.
pub(crate) struct PeerOutbox {
    /// The peer's connections, whose `search_path` is the run's schema.
    pool: PgPool,
    config: Arc<OutboxConfig<Value>>,
}

impl PeerOutbox {
    /// Connects and creates the peer's table in `schema` (which exists); with
    /// `async_commit`, its connections commit without waiting for the WAL flush.
    pub(crate) async fn open(
        url: &str,
        schema: &str,
        batch: u32,
        async_commit: bool,
    ) -> anyhow::Result<Self> {
        let mut options = crate::connect_options(url, schema)?;
        if async_commit {
            options = options.options([("synchronous_commit", "off")]);
        }
        let pool = PgPoolOptions::new()
            .connect_with(options)
            .await
            .context("connecting outbox-postgres")?;
        sqlx::raw_sql(MIGRATION)
            .execute(&pool)
            .await
            .context("creating outbox-postgres's table")?;
        let mut config = OutboxConfig::default();
        config.batch_size = batch;
        Ok(Self {
            pool,
            config: Arc::new(config),
        })
    }

    /// Closes the peer's pool.
    pub(crate) async fn close(self) {
        self.pool.close().await;
    }
}

impl Contender for PeerOutbox {
    fn table(&self) -> &str {
        TABLE
    }

    /// Fills the (empty) table with `messages` pending events, in one statement (the
    /// peer has no ordering keys).
    async fn prefill(&self, messages: u64, _keys: u32) -> anyhow::Result<()> {
        let payload = std::str::from_utf8(PAYLOAD).context("the payload is not UTF-8")?;
        sqlx::query(
            "INSERT INTO outbox_events (event_type, payload)
             SELECT $1, $2::jsonb FROM generate_series(1, $3::bigint)",
        )
        .bind(KIND)
        .bind(payload)
        .bind(i64::try_from(messages)?)
        .execute(&self.pool)
        .await
        .context("filling outbox-postgres's table")?;
        Ok(())
    }

    /// Times the processor's drain loop over the backlog, publishing to `broker`.
    async fn drain(&self, broker: &MemoryBroker, round: u32) -> anyhow::Result<Run> {
        let transport = Arc::new(PeerTransport {
            publisher: broker.publisher(),
        });
        let storage = PostgresOutbox::new(self.pool.clone(), Arc::clone(&self.config));
        let processor =
            OutboxProcessor::new(Arc::new(storage), transport, Arc::clone(&self.config));
        let started = Instant::now();
        while processor
            .process_pending_events()
            .await
            .context("outbox-core's processor")?
            > 0
        {}
        let elapsed = started.elapsed();
        Ok(Run::new(
            Side::Peer,
            round,
            broker.stats().published,
            elapsed,
        ))
    }
}

/// outbox-core's transport over an oncebox publisher: one event, one publish.
struct PeerTransport<P> {
    publisher: P,
}

#[async_trait::async_trait]
impl<P: Publisher> Transport<Value> for PeerTransport<P> {
    async fn publish(&self, event: Event<Value>) -> Result<(), OutboxError> {
        let payload = serde_json::to_vec(event.payload.as_value())
            .map_err(|error| OutboxError::BrokerError(error.to_string()))?;
        let message = Message::new(TOPIC, Bytes::from(payload))
            .with_id(MessageId::from_uuid(event.id.as_uuid()))
            .with_kind(event.event_type.as_str());
        self.publisher
            .publish(&message)
            .await
            .map_err(|error| OutboxError::BrokerError(error.to_string()))
    }
}
