//! The PostgreSQL backend: a new schema, dropped at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use oncebox::consumer::TxHandler;
use oncebox::postgres::cdc::{CdcConnection, CdcMode, CdcOptions, CdcRelay};
use oncebox::postgres::{PgInbox, PgOutbox, PgStore};
use oncebox::{Bytes, Error, Headers, Message, MessageId, Publisher, Received, Result};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::{Backend, redact};
use crate::bench::workload;

/// Oncebox's tables in a schema of their own (`bench_<random>`), plus the consumer
/// benchmark's effect table; the schema is dropped by [`Backend::close`].
pub(crate) struct PgBench {
    store: PgStore,
    /// The server's URL, for the log-tailing relay's replication connection.
    url: String,
    /// The outbox table, qualified.
    outbox_table: String,
    /// The inbox table, qualified.
    inbox_table: String,
    /// The effect table, qualified.
    effects_table: String,
    /// Fills the outbox in a range of message numbers: `$1` first, `$2` last, `$3` keys,
    /// `$4` topic, `$5` kind, `$6` payload.
    fill_range: String,
    /// Emits logical messages for a range of message numbers, parameters as `fill_range`.
    emit_range: String,
    /// The baseline relay's statement: `$1` limit; its commit does not wait for the WAL
    /// flush, as the relay's bookkeeping does not.
    take_batch: String,
    /// The effect handler's insert.
    insert_effect: Arc<str>,
    /// Whether a log-tailing relay's slot may have been created, to be dropped at the end.
    cdc_used: AtomicBool,
}

/// The ordering key of message number `m` in SQL, as [`workload::key`] makes it.
const KEY_SQL: &str = "format('key-%s', lpad(m::text, greatest(5, length(m::text)), '0'))";

/// Messages per transaction when the backlog of a log-tailing relay is filled: producers
/// commit small transactions, and the walsender decodes each one whole.
const CDC_FILL_CHUNK: u64 = 1000;

impl PgBench {
    /// Connects to `url` and creates oncebox's tables in a new schema.
    pub(crate) async fn open(url: &str) -> anyhow::Result<Self> {
        let store = PgStore::connect(url)
            .await
            .with_context(|| format!("connecting to PostgreSQL at {}", redact(url)))?;
        let schema = format!("bench_{:016x}", fastrand::u64(..));
        let store = store.with_schema(&schema)?;
        let outbox_table = store.outbox().table().to_owned();
        let quoted = format!("\"{schema}\"");
        let effects_table = format!("{quoted}.bench_effects");
        let bench = Self {
            fill_range: format!(
                "INSERT INTO {outbox_table} (id, topic, key, kind, headers, payload, created_at)
SELECT gen_random_uuid(), $4, {KEY_SQL}, $5, '{{}}'::jsonb, $6, statement_timestamp()
FROM generate_series($1::bigint, $2::bigint) AS n, LATERAL (SELECT n % $3::bigint AS m) AS k
ORDER BY n"
            ),
            emit_range: format!(
                "SELECT count({quoted}.emit($4, {KEY_SQL}, $5, '{{}}'::jsonb, $6))
FROM generate_series($1::bigint, $2::bigint) AS n, LATERAL (SELECT n % $3::bigint AS m) AS k"
            ),
            // Like the relay's claims and settlements, the baseline's commit does not wait
            // for the WAL flush (`synchronous_commit` off for its transaction only), so
            // that the comparison stays like for like.
            take_batch: format!(
                "WITH cfg AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM {outbox_table} WHERE seq IN (
  SELECT seq FROM {outbox_table} WHERE status = 'pending' ORDER BY seq LIMIT $1
  FOR UPDATE SKIP LOCKED) AND EXISTS (SELECT FROM cfg)
RETURNING seq, attempts, id::text AS id, topic, key, kind, headers::text AS headers, payload,
          (extract(epoch FROM created_at) * 1000000)::bigint AS created_at"
            ),
            insert_effect: format!(
                "INSERT INTO {effects_table} (message_id, key, payload) VALUES ($1, $2, $3)"
            )
            .into(),
            inbox_table: format!("{quoted}.inbox"),
            effects_table,
            outbox_table,
            store,
            url: url.to_owned(),
            cdc_used: AtomicBool::new(false),
        };
        if let Err(error) = bench.create().await {
            if let Err(cleanup) = bench.close().await {
                eprintln!("oncebox-bench: dropping the schema failed too: {cleanup:#}");
            }
            return Err(error);
        }
        Ok(bench)
    }

    /// The server's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The schema of the run's tables.
    pub(crate) fn schema(&self) -> &str {
        self.store.schema()
    }

    async fn create(&self) -> anyhow::Result<()> {
        self.store
            .migrate()
            .await
            .context("migrating the oncebox tables")?;
        self.execute(&format!(
            "CREATE TABLE {} (
                seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                message_id text NOT NULL,
                key        text,
                payload    bytea NOT NULL
            )",
            self.effects_table
        ))
        .await
        .context("creating the effect table")
    }

    /// A log-tailing relay of `mode` publishing through `publisher`, with its slot and
    /// publication (both named after the schema, so that a run removes only what it
    /// made) created now: the slot sees what is committed from here on.
    pub(crate) async fn cdc_relay<P: Publisher>(
        &self,
        mode: CdcMode,
        publisher: P,
    ) -> anyhow::Result<CdcRelay<P>> {
        self.cdc_used.store(true, Ordering::Relaxed);
        let connection =
            CdcConnection::from_url(&self.url).context("the replication connection's URL")?;
        let options = CdcOptions::new(mode, self.store.schema());
        let relay = CdcRelay::new(&self.store, connection, publisher, options)?;
        relay
            .prepare()
            .await
            .context("creating the replication slot")?;
        Ok(relay)
    }

    /// Waits until a relay streams from the slot of [`cdc_relay`](Self::cdc_relay).
    pub(crate) async fn wait_streaming(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let active: Option<bool> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(self.store.schema())
                    .fetch_optional(self.store.pool())
                    .await?;
            if active == Some(true) {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the log-tailing relay did not start streaming within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drops the slot and publication of [`cdc_relay`](Self::cdc_relay), waiting (up to
    /// 10 s) for the server to let go of a slot whose reader has just stopped, and
    /// forgets the slot, so that the next side of the bench creates it afresh.
    pub(crate) async fn drop_cdc(&self) -> anyhow::Result<()> {
        let name = self.store.schema();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.store.drop_cdc(name, name).await {
                Ok(()) => {
                    self.store.forget_cdc(name).await?;
                    return Ok(());
                }
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("dropping replication slot {name}"));
                }
            }
        }
    }

    /// Fills the backlog of a log-tailing relay of `mode` (not timed): `messages` on
    /// `topic` spread over `keys` keys, as logical messages or outbox rows, committed in
    /// transactions of [`CDC_FILL_CHUNK`] messages.
    pub(crate) async fn prefill_cdc(
        &self,
        mode: CdcMode,
        topic: &str,
        messages: u64,
        keys: u32,
    ) -> anyhow::Result<()> {
        let statement = match mode {
            CdcMode::Messages => &self.emit_range,
            CdcMode::Table => &self.fill_range,
        };
        let mut first = 0;
        while first < messages {
            let last = (first + CDC_FILL_CHUNK).min(messages) - 1;
            self.fill(statement, first..=last, keys, topic)
                .await
                .context("filling the log-tailing relay's backlog")?;
            first = last + 1;
        }
        self.checkpoint().await;
        Ok(())
    }

    /// Runs `statement` (`fill_range` or `emit_range`) for the message numbers `range`.
    async fn fill(
        &self,
        statement: &str,
        range: std::ops::RangeInclusive<u64>,
        keys: u32,
        topic: &str,
    ) -> anyhow::Result<()> {
        sqlx::query(AssertSqlSafe(statement.to_owned()))
            .bind(i64::try_from(*range.start())?)
            .bind(i64::try_from(*range.end())?)
            .bind(i64::from(keys))
            .bind(topic)
            .bind(workload::KIND)
            .bind(workload::payload())
            .execute(self.store.pool())
            .await?;
        Ok(())
    }

    /// Leaves no checkpoint debt to the timed part, where the server allows it.
    async fn checkpoint(&self) {
        if let Err(error) = self.execute("CHECKPOINT").await {
            tracing::debug!(%error, "CHECKPOINT refused; runs may differ a little more");
        }
    }

    /// A producer's transaction in the message mode: emits `message` as a logical message
    /// and commits.
    pub(crate) async fn emit_one(&self, message: &Message) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin().await?;
        self.store
            .message_outbox()
            .enqueue(&mut tx, message)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The store.
    pub(crate) fn store(&self) -> &PgStore {
        &self.store
    }

    /// The insert of the row the consumer benchmark's handler writes (`$1` message id,
    /// `$2` key, `$3` payload): the business row of `oncebox-bench enqueue`.
    pub(crate) fn business_insert(&self) -> Arc<str> {
        Arc::clone(&self.insert_effect)
    }

    /// Runs statements with the simple protocol (so that `VACUUM` works too).
    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }
}

impl Backend for PgBench {
    type Outbox = PgOutbox;
    type Inbox = PgInbox;
    type Effect = PgEffect;

    fn outbox(&self, notify: bool) -> PgOutbox {
        self.store
            .outbox()
            .delete_on_publish(true)
            .with_notify(notify)
    }

    async fn reset_outbox(&self) -> anyhow::Result<()> {
        self.execute(&format!("TRUNCATE {}", self.outbox_table))
            .await
            .context("emptying the outbox")
    }

    async fn prefill(&self, topic: &str, messages: u64, keys: u32) -> anyhow::Result<()> {
        // One statement, one transaction.
        self.fill(&self.fill_range, 0..=messages - 1, keys, topic)
            .await
            .context("filling the outbox")?;
        // Every run starts from the same state: statistics and visibility map fresh, and
        // (where allowed) no checkpoint debt left to the timed part.
        self.execute(&format!("VACUUM (ANALYZE) {}", self.outbox_table))
            .await
            .context("vacuuming the outbox")?;
        self.checkpoint().await;
        Ok(())
    }

    async fn take_batch(&self, limit: u32) -> anyhow::Result<Vec<Message>> {
        let rows = sqlx::query(AssertSqlSafe(self.take_batch.clone()))
            .bind(i64::from(limit))
            .fetch_all(self.store.pool())
            .await
            .context("claiming a batch")?;
        let mut batch = rows
            .iter()
            .map(|row| Ok((row.try_get::<i64, _>("seq")?, decode(row)?)))
            .collect::<anyhow::Result<Vec<(i64, Message)>>>()?;
        batch.sort_unstable_by_key(|(seq, _)| *seq);
        Ok(batch.into_iter().map(|(_, message)| message).collect())
    }

    async fn commit_one(
        &self,
        outbox: &PgOutbox,
        message: &Message,
        _notify: bool,
    ) -> anyhow::Result<()> {
        // With notify, the outbox itself adds `NOTIFY` to the transaction.
        let mut tx = self.store.pool().begin().await?;
        outbox.enqueue(&mut tx, message).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn commit_many(
        &self,
        outbox: &PgOutbox,
        business: &Message,
        messages: &[Message],
        batched: bool,
    ) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin().await?;
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert_effect)))
            .bind(business.id.to_string())
            .bind(business.key.clone())
            .bind(business.payload.to_vec())
            .execute(&mut *tx)
            .await
            .context("inserting the business row")?;
        if batched {
            outbox.enqueue_batch(&mut tx, messages).await?;
        } else {
            for message in messages {
                outbox.enqueue(&mut tx, message).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    fn inbox(&self) -> PgInbox {
        self.store.inbox()
    }

    fn effect(&self) -> PgEffect {
        PgEffect {
            insert: Arc::clone(&self.insert_effect),
        }
    }

    async fn reset_consumer(&self) -> anyhow::Result<()> {
        self.execute(&format!(
            "TRUNCATE {}, {}",
            self.inbox_table, self.effects_table
        ))
        .await
        .context("emptying the inbox")
    }

    async fn count_effects(&self) -> anyhow::Result<u64> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.effects_table
        )))
        .fetch_one(self.store.pool())
        .await?;
        Ok(u64::try_from(count)?)
    }

    fn postgres(&self) -> Option<&PgBench> {
        Some(self)
    }

    async fn close(self) -> anyhow::Result<()> {
        if self.cdc_used.load(Ordering::Relaxed)
            && let Err(error) = self.drop_cdc().await
        {
            eprintln!("oncebox-bench: {error:#}");
        }
        let schema = self.store.schema().to_owned();
        // Rolled-back work of an interrupted run may still hold locks for a moment.
        let dropped = self
            .execute(&format!(
                "SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
            ))
            .await
            .with_context(|| format!("dropping schema {schema}"));
        self.store.pool().close().await;
        dropped
    }
}

/// Decodes a row returned by the baseline's statement, as the relay's claim does.
fn decode(row: &sqlx::postgres::PgRow) -> anyhow::Result<Message> {
    let id: String = row.try_get("id")?;
    let headers: String = row.try_get("headers")?;
    let payload: Vec<u8> = row.try_get("payload")?;
    let created_us: i64 = row.try_get("created_at")?;
    let created_at = std::time::UNIX_EPOCH
        + std::time::Duration::from_micros(u64::try_from(created_us).unwrap_or(0));
    Ok(Message {
        id: MessageId::parse(&id)?,
        topic: row.try_get("topic")?,
        key: row.try_get("key")?,
        kind: row.try_get("kind")?,
        headers: Headers::from_json(&headers)?,
        payload: payload.into(),
        created_at,
    })
}

/// The consumer benchmark's handler on PostgreSQL: one effect row per message.
pub(crate) struct PgEffect {
    insert: Arc<str>,
}

impl TxHandler<Transaction<'static, Postgres>> for PgEffect {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<Bytes> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert)))
            .bind(message.id.map(|id| id.to_string()))
            .bind(message.key.clone())
            .bind(message.payload.to_vec())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::new())
    }
}
