//! The `oncebox-testkit` conformance suites against the MySQL / MariaDB stores: outbox, inbox,
//! durable inbox and dedup. Every check runs in a fresh database of its own.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Message, MessageId, Result, Schedule};
use oncebox_mysql::{MySqlDedupStore, MySqlDurableInbox, MySqlInbox, MySqlOutbox, RowStatus};
use oncebox_testkit::dedup::DedupHarness;
use oncebox_testkit::inbox::{Connections, DurableInboxHarness, InboxHarness, TxOf};
use oncebox_testkit::outbox::{
    Capabilities, OutboxHarness, ProducerTx, RowState as KitRowState, RowStatus as KitRowStatus,
};
use sqlx::{MySql, Transaction};

use common::TestDb;

/// A migrated database plus the suite's effects table (deliberately without a unique
/// constraint, so that a second effect is counted).
struct MySqlHarness {
    db: TestDb,
}

impl MySqlHarness {
    async fn new() -> Self {
        let db = TestDb::with_connections(10).await;
        db.exec("CREATE TABLE conformance_effects (`key` VARBINARY(255) NOT NULL, INDEX (`key`))")
            .await;
        Self { db }
    }

    async fn begin_tx(&self) -> Result<Transaction<'static, MySql>> {
        self.db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)
    }
}

/// A producer's transaction with the outbox it enqueues into.
struct MySqlProducer {
    tx: Transaction<'static, MySql>,
    outbox: MySqlOutbox,
}

impl ProducerTx for MySqlProducer {
    async fn enqueue(&mut self, message: &Message) -> Result<()> {
        self.outbox.enqueue(&mut self.tx, message).await
    }

    async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(Error::store_transient)?;
        self.outbox.wake();
        Ok(())
    }

    async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(Error::store_transient)
    }
}

impl OutboxHarness for MySqlHarness {
    type Store = MySqlOutbox;
    type Producer = MySqlProducer;

    fn store(&self) -> MySqlOutbox {
        self.db.store.outbox()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .producer_key_locks(true)
            .claim_window(true)
            .time_resolution(Duration::from_millis(1))
            .publication_times(true)
    }

    async fn begin(&self) -> Result<MySqlProducer> {
        Ok(MySqlProducer {
            tx: self.begin_tx().await?,
            outbox: self.db.store.outbox(),
        })
    }

    fn deleting_on_publish(&self) -> Option<MySqlOutbox> {
        Some(self.db.store.outbox().delete_on_publish(true))
    }

    fn windowed(&self, rows: usize) -> Result<MySqlOutbox> {
        Ok(self.db.store.outbox().with_claim_window(rows))
    }

    async fn set_published_at(&self, id: MessageId, at: SystemTime) -> Result<()> {
        sqlx::query("UPDATE oncebox_outbox SET done_at = ? WHERE id = ?")
            .bind(to_unix_millis(at))
            .bind(id.as_uuid().as_bytes().to_vec())
            .execute(self.db.store.pool())
            .await
            .map_err(Error::store_transient)?;
        Ok(())
    }

    async fn enqueue_scheduled(&self, message: &Message, when: Schedule) -> Result<()> {
        let outbox = self.db.store.outbox();
        let mut tx = self.begin_tx().await?;
        outbox.enqueue_scheduled(&mut tx, message, when).await?;
        tx.commit().await.map_err(Error::store_transient)?;
        outbox.wake();
        Ok(())
    }

    async fn cancel(&self, id: MessageId) -> Result<bool> {
        self.cancel_kept_open(id, Duration::ZERO, true).await
    }

    async fn cancel_kept_open(
        &self,
        id: MessageId,
        open_for: Duration,
        commit: bool,
    ) -> Result<bool> {
        let mut tx = self.begin_tx().await?;
        let cancelled = self.db.store.outbox().cancel(&mut tx, id).await?;
        tokio::time::sleep(open_for).await;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        Ok(cancelled)
    }

    async fn row_state(&self, id: MessageId) -> Result<Option<KitRowState>> {
        let Some(state) = self.db.store.outbox().status(id).await? else {
            return Ok(None);
        };
        let status = match state.status {
            RowStatus::Pending => KitRowStatus::Pending,
            RowStatus::Done => KitRowStatus::Done,
            RowStatus::Dead => KitRowStatus::Dead,
            other => {
                return Err(Error::store_permanent(format!(
                    "unknown row status {other:?}"
                )));
            }
        };
        Ok(Some(KitRowState {
            status,
            attempts: state.attempts,
            last_error: state.last_error,
        }))
    }

    async fn enqueue_batch(
        &self,
        business: &str,
        messages: &[Message],
        commit: bool,
    ) -> Result<()> {
        let outbox = self.db.store.outbox();
        let mut tx = self.begin_tx().await?;
        Self::insert_effect(&mut tx, business).await?;
        let batch = outbox.enqueue_batch(&mut tx, messages).await;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
            outbox.wake();
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        batch
    }

    async fn business_rows(&self, business: &str) -> Result<u64> {
        InboxHarness::count_effects(self, business).await
    }
}
impl InboxHarness for MySqlHarness {
    type Store = MySqlInbox;

    fn store(&self) -> MySqlInbox {
        self.db.store.inbox()
    }

    async fn insert_effect(tx: &mut TxOf<Self>, key: &str) -> Result<()> {
        sqlx::query("INSERT INTO conformance_effects (`key`) VALUES (?)")
            .bind(key.to_owned())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(())
    }

    async fn count_effects(&self, key: &str) -> Result<u64> {
        let count: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM conformance_effects WHERE `key` = ?")
                .bind(key.to_owned())
                .fetch_one(self.db.store.pool())
                .await
                .map_err(Error::store_transient)?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    fn connections(&self) -> Option<Connections> {
        let pool = self.db.store.pool();
        Some(Connections {
            open: pool.size(),
            idle: pool.num_idle(),
        })
    }
}

impl DurableInboxHarness for MySqlHarness {
    type Durable = MySqlDurableInbox;

    fn durable(&self, consumer: &str) -> MySqlDurableInbox {
        self.db.store.durable_inbox(consumer)
    }
}

impl DedupHarness for MySqlHarness {
    type Store = MySqlDedupStore;

    fn store(&self) -> MySqlDedupStore {
        self.db.store.dedup()
    }

    async fn count_records(&self) -> Result<Option<u64>> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_dedup")
            .fetch_one(self.db.store.pool())
            .await
            .map_err(Error::store_transient)?;
        Ok(Some(u64::try_from(count).unwrap_or_default()))
    }
}

/// One `#[tokio::test]` per check, in a module named after the suite, each in a fresh
/// database.
macro_rules! suite {
    ($suite:ident: $($check:ident),* $(,)?) => {
        mod $suite {
            use super::MySqlHarness;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    oncebox_testkit::$suite::$check(&MySqlHarness::new().await).await;
                }
            )*
        }
    };
}

oncebox_testkit::outbox_checks!(suite!(outbox:));

oncebox_testkit::inbox_checks!(suite!(inbox:));

oncebox_testkit::dedup_checks!(suite!(dedup:));
