//! The MySQL / MariaDB backend: a new database on the server, dropped at the end.

use anyhow::Context as _;
use oncebox::consumer::TxHandler;
use oncebox::mysql::{MySqlInbox, MySqlOutbox, MySqlStore};
use oncebox::time::from_unix_millis;
use oncebox::{Bytes, Error, Headers, Message, MessageId, Received, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{ConnectOptions as _, Connection as _, MySql, Row, Transaction};

use super::{Backend, redact};
use crate::bench::workload;

/// The server used when `--database-url` is not a MySQL URL (its default is
/// PostgreSQL's): `ONCEBOX_MYSQL_URL`, else this.
const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// Rows per statement when filling the outbox.
const FILL_CHUNK: u64 = 100_000;

/// Fills the outbox: `?` first message number, `?` count (at most [`FILL_CHUNK`]), `?`
/// keys, `?` topic, `?` kind, `?` payload. Keys and their order follow
/// [`workload::message`]; ids are `UUID()`s.
const FILL: &str =
    "INSERT INTO oncebox_outbox (id, topic, `key`, kind, headers, payload, created_at)
WITH RECURSIVE d (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 999)
SELECT UNHEX(REPLACE(UUID(), '-', '')), ?, CONCAT('key-', LPAD(m, GREATEST(5, LENGTH(m)), '0')),
       ?, '{}', ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
FROM (SELECT g.i, g.i MOD ? AS m
      FROM (SELECT ? + a.n * 1000 + b.n AS i FROM d AS a CROSS JOIN d AS b
            WHERE a.n * 1000 + b.n < ?) AS g) AS k
ORDER BY k.i";

/// The baseline relay's statement: one `DELETE ... RETURNING` (MariaDB 10.5+; MySQL 8
/// has no `RETURNING`) takes the first `?` pending rows off the table and returns the
/// columns the relay's own claim returns.
const TAKE_BATCH: &str = "DELETE FROM oncebox_outbox WHERE status = 0 ORDER BY seq LIMIT ?
RETURNING seq, id, topic, `key`, kind, headers, payload, created_at";

/// The effect handler's insert.
const INSERT_EFFECT: &str =
    "INSERT INTO bench_effects (message_id, `key`, payload) VALUES (?, ?, ?)";

/// Oncebox's tables in a database of their own (`oncebox_bench_<random>`), plus the
/// consumer benchmark's effect table; the database is dropped by [`Backend::close`].
pub(crate) struct MySqlBench {
    store: MySqlStore,
    options: MySqlConnectOptions,
    database: String,
}

impl MySqlBench {
    /// Connects to the server of `url` (or of `ONCEBOX_MYSQL_URL` if `url` is not a
    /// `mysql://` or `mariadb://` URL) and creates oncebox's tables in a new database.
    pub(crate) async fn open(url: &str) -> anyhow::Result<Self> {
        let url = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            url.to_owned()
        } else {
            std::env::var("ONCEBOX_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_owned())
        };
        let options: MySqlConnectOptions = url
            .replacen("mariadb://", "mysql://", 1)
            .parse()
            .with_context(|| format!("parsing the MySQL URL {}", redact(&url)))?;
        let database = format!("oncebox_bench_{:016x}", fastrand::u64(..));
        let mut admin = options
            .connect()
            .await
            .with_context(|| format!("connecting to MySQL at {}", redact(&url)))?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{database}`")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {database}"))?;
        admin.close().await?;
        let pool = MySqlPoolOptions::new()
            .max_connections(oncebox::mysql::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect_with(options.clone().database(&database))
            .await
            .with_context(|| format!("connecting to database {database}"))?;
        let bench = Self {
            store: MySqlStore::from_pool(pool),
            options,
            database,
        };
        if let Err(error) = bench.create().await {
            if let Err(cleanup) = bench.close().await {
                eprintln!("oncebox-bench: dropping the database failed too: {cleanup:#}");
            }
            return Err(error);
        }
        Ok(bench)
    }

    async fn create(&self) -> anyhow::Result<()> {
        self.store
            .migrate()
            .await
            .context("migrating the oncebox tables")?;
        self.execute(
            "CREATE TABLE bench_effects (
                seq        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                message_id VARCHAR(36) NULL,
                `key`      VARBINARY(512) NULL,
                payload    LONGBLOB NOT NULL
            )",
        )
        .await
        .context("creating the effect table")
    }

    /// Runs statements with the text protocol.
    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }
}

impl Backend for MySqlBench {
    type Outbox = MySqlOutbox;
    type Inbox = MySqlInbox;
    type Effect = MySqlEffect;

    fn outbox(&self, _notify: bool) -> MySqlOutbox {
        self.store.outbox().delete_on_publish(true)
    }

    async fn reset_outbox(&self) -> anyhow::Result<()> {
        self.execute("TRUNCATE TABLE oncebox_outbox")
            .await
            .context("emptying the outbox")
    }

    async fn prefill(&self, topic: &str, messages: u64, keys: u32) -> anyhow::Result<()> {
        let mut first = 0;
        while first < messages {
            let count = FILL_CHUNK.min(messages - first);
            sqlx::query(FILL)
                .bind(topic)
                .bind(workload::KIND)
                .bind(workload::payload())
                .bind(i64::from(keys.max(1)))
                .bind(i64::try_from(first)?)
                .bind(i64::try_from(count)?)
                .execute(self.store.pool())
                .await
                .context("filling the outbox")?;
            first += count;
        }
        self.execute("ANALYZE TABLE oncebox_outbox")
            .await
            .context("analyzing the outbox")
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
        outbox: &MySqlOutbox,
        message: &Message,
        notify: bool,
    ) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin().await?;
        outbox.enqueue(&mut tx, message).await?;
        tx.commit().await?;
        if notify {
            outbox.wake();
        }
        Ok(())
    }

    async fn commit_many(
        &self,
        outbox: &MySqlOutbox,
        business: &Message,
        messages: &[Message],
        batched: bool,
    ) -> anyhow::Result<()> {
        let mut tx = self.store.pool().begin().await?;
        sqlx::query(INSERT_EFFECT)
            .bind(business.id.to_string())
            .bind(business.key.as_ref().map(|key| key.as_bytes().to_vec()))
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

    fn inbox(&self) -> MySqlInbox {
        self.store.inbox()
    }

    fn effect(&self) -> MySqlEffect {
        MySqlEffect
    }

    async fn reset_consumer(&self) -> anyhow::Result<()> {
        self.execute("TRUNCATE TABLE oncebox_inbox; TRUNCATE TABLE bench_effects")
            .await
            .context("emptying the inbox")
    }

    async fn count_effects(&self) -> anyhow::Result<u64> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bench_effects")
            .fetch_one(self.store.pool())
            .await?;
        Ok(u64::try_from(count)?)
    }

    async fn close(self) -> anyhow::Result<()> {
        self.store.pool().close().await;
        let mut admin = self.options.connect().await?;
        let dropped = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS `{}`",
            self.database
        )))
        .execute(&mut admin)
        .await
        .with_context(|| format!("dropping database {}", self.database));
        admin.close().await?;
        dropped.map(drop)
    }
}

/// Decodes a row returned by [`TAKE_BATCH`], as the relay's claim does.
fn decode(row: &MySqlRow) -> anyhow::Result<Message> {
    let id: Vec<u8> = row.try_get("id")?;
    let id: String = id.iter().map(|byte| format!("{byte:02x}")).collect();
    let key: Option<Vec<u8>> = row.try_get("key")?;
    let headers: String = row.try_get("headers")?;
    let payload: Vec<u8> = row.try_get("payload")?;
    Ok(Message {
        id: MessageId::parse(&id)?,
        topic: row.try_get("topic")?,
        key: key.map(String::from_utf8).transpose()?,
        kind: row.try_get("kind")?,
        headers: Headers::from_json(&headers)?,
        payload: payload.into(),
        created_at: from_unix_millis(row.try_get("created_at")?),
    })
}

/// The consumer benchmark's handler on MySQL: one effect row per message.
pub(crate) struct MySqlEffect;

impl TxHandler<Transaction<'static, MySql>> for MySqlEffect {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, MySql>,
    ) -> Result<Bytes> {
        sqlx::query(INSERT_EFFECT)
            .bind(message.id.map(|id| id.to_string()))
            .bind(message.key.as_ref().map(|key| key.as_bytes().to_vec()))
            .bind(message.payload.to_vec())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::new())
    }
}
