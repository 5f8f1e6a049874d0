//! The SQLite backend: a new database file in a temporary directory.

use anyhow::Context as _;
use oncebox::consumer::TxHandler;
use oncebox::sqlite::{SqliteInbox, SqliteOutbox, SqliteStore};
use oncebox::time::from_unix_millis;
use oncebox::{Bytes, Error, Headers, Message, MessageId, Received, Result};
use sqlx::{Row, Sqlite, Transaction};

use super::Backend;
use crate::bench::workload;

/// Rows per transaction when filling the outbox.
const FILL_CHUNK: u64 = 10_000;

/// The baseline relay's statement: claim and delete the first pending rows, returning
/// the columns the relay's own claim returns.
const TAKE_BATCH: &str = "\
DELETE FROM oncebox_outbox WHERE seq IN (
  SELECT seq FROM oncebox_outbox WHERE status = 'pending' ORDER BY seq LIMIT ?1)
RETURNING seq, attempts, id, topic, key, kind, headers, CAST(payload AS BLOB) AS payload, created_at";

/// SQLite in a new file, removed (with its directory) when the backend is closed or
/// dropped.
pub(crate) struct SqliteBench {
    store: SqliteStore,
    dir: tempfile::TempDir,
}

impl SqliteBench {
    /// Creates the database in a new temporary directory and migrates it.
    pub(crate) async fn open() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("oncebox-bench-")
            .tempdir()
            .context("creating a temporary directory")?;
        let path = dir.path().join("bench.db");
        let store = SqliteStore::connect(&path)
            .await
            .with_context(|| format!("opening {}", path.display()))?;
        store
            .migrate()
            .await
            .context("migrating the oncebox tables")?;
        sqlx::query(
            "CREATE TABLE bench_effects (
                seq        INTEGER PRIMARY KEY AUTOINCREMENT,
                message_id TEXT NOT NULL,
                key        TEXT,
                payload    BLOB NOT NULL
            )",
        )
        .execute(store.pool())
        .await
        .context("creating the effect table")?;
        Ok(Self { store, dir })
    }
}

impl Backend for SqliteBench {
    type Outbox = SqliteOutbox;
    type Inbox = SqliteInbox;
    type Effect = SqliteEffect;

    fn outbox(&self, _notify: bool) -> SqliteOutbox {
        self.store.outbox().delete_on_publish(true)
    }

    async fn reset_outbox(&self) -> anyhow::Result<()> {
        sqlx::query("DELETE FROM oncebox_outbox")
            .execute(self.store.pool())
            .await
            .context("emptying the outbox")?;
        Ok(())
    }

    async fn prefill(&self, topic: &str, messages: u64, keys: u32) -> anyhow::Result<()> {
        let outbox = self.store.outbox();
        let mut n = 0;
        while n < messages {
            let end = (n + FILL_CHUNK).min(messages);
            let mut tx = self.store.pool().begin_with("BEGIN IMMEDIATE").await?;
            for i in n..end {
                outbox
                    .enqueue(&mut tx, &workload::message(topic, i, keys))
                    .await?;
            }
            tx.commit().await?;
            n = end;
        }
        sqlx::query("ANALYZE")
            .execute(self.store.pool())
            .await
            .context("analyzing the outbox")?;
        Ok(())
    }

    async fn take_batch(&self, limit: u32) -> anyhow::Result<Vec<Message>> {
        let rows = sqlx::query(TAKE_BATCH)
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
        outbox: &SqliteOutbox,
        message: &Message,
        notify: bool,
    ) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin_with("BEGIN IMMEDIATE").await?;
        outbox.enqueue(&mut tx, message).await?;
        tx.commit().await?;
        if notify {
            outbox.wake();
        }
        Ok(())
    }

    async fn commit_many(
        &self,
        outbox: &SqliteOutbox,
        business: &Message,
        messages: &[Message],
        batched: bool,
    ) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO bench_effects (message_id, key, payload) VALUES (?1, ?2, ?3)")
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

    fn inbox(&self) -> SqliteInbox {
        self.store.inbox()
    }

    fn effect(&self) -> SqliteEffect {
        SqliteEffect
    }

    async fn reset_consumer(&self) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM oncebox_inbox")
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM bench_effects")
            .execute(&mut *tx)
            .await?;
        tx.commit().await.context("emptying the inbox")?;
        Ok(())
    }

    async fn count_effects(&self) -> anyhow::Result<u64> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bench_effects")
            .fetch_one(self.store.pool())
            .await?;
        Ok(u64::try_from(count)?)
    }

    async fn close(self) -> anyhow::Result<()> {
        self.store.pool().close().await;
        let shown = self.dir.path().display().to_string();
        self.dir
            .close()
            .with_context(|| format!("removing {shown}"))
    }
}

/// Decodes a row returned by [`TAKE_BATCH`], as the relay's claim does.
fn decode(row: &sqlx::sqlite::SqliteRow) -> anyhow::Result<Message> {
    let id: String = row.try_get("id")?;
    let headers: String = row.try_get("headers")?;
    let payload: Vec<u8> = row.try_get("payload")?;
    Ok(Message {
        id: MessageId::parse(&id)?,
        topic: row.try_get("topic")?,
        key: row.try_get("key")?,
        kind: row.try_get("kind")?,
        headers: Headers::from_json(&headers)?,
        payload: payload.into(),
        created_at: from_unix_millis(row.try_get("created_at")?),
    })
}

/// The consumer benchmark's handler on SQLite: one effect row per message.
pub(crate) struct SqliteEffect;

impl TxHandler<Transaction<'static, Sqlite>> for SqliteEffect {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Sqlite>,
    ) -> Result<Bytes> {
        sqlx::query("INSERT INTO bench_effects (message_id, key, payload) VALUES (?1, ?2, ?3)")
            .bind(message.id.map(|id| id.to_string()))
            .bind(message.key.clone())
            .bind(message.payload.to_vec())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::new())
    }
}
