//! The `oncebox-testkit` conformance suites against the MySQL / MariaDB stores: outbox, inbox,
//! durable inbox and dedup. Every check runs in a fresh database of its own.

mod common;

use std::time::Duration;

use oncebox_core::{Error, Message, MessageId, Result, Schedule};
use oncebox_mysql::{MySqlDedupStore, MySqlDurableInbox, MySqlInbox, MySqlOutbox, RowStatus};
use oncebox_testkit::dedup::DedupHarness;
use oncebox_testkit::inbox::{Connections, DurableInboxHarness, InboxHarness, TxOf};
use oncebox_testkit::outbox::{OutboxHarness, RowState as KitRowState, RowStatus as KitRowStatus};

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

    async fn enqueue_all(&self, messages: &[Message], commit: bool) -> Result<()> {
        let tx = self.db.enqueued(messages).await?;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
            self.db.store.outbox().wake();
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        Ok(())
    }
}

impl OutboxHarness for MySqlHarness {
    type Store = MySqlOutbox;

    fn store(&self) -> MySqlOutbox {
        self.db.store.outbox()
    }

    fn deleting_on_publish(&self) -> Option<MySqlOutbox> {
        Some(self.db.store.outbox().delete_on_publish(true))
    }

    async fn enqueue_scheduled(&self, message: &Message, when: Schedule) -> Result<()> {
        let outbox = self.db.store.outbox();
        let mut tx = self
            .db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)?;
        outbox.enqueue_scheduled(&mut tx, message, when).await?;
        tx.commit().await.map_err(Error::store_transient)?;
        outbox.wake();
        Ok(())
    }

    async fn cancel(&self, id: MessageId) -> Result<bool> {
        let mut tx = self
            .db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)?;
        let cancelled = self.db.store.outbox().cancel(&mut tx, id).await?;
        tx.commit().await.map_err(Error::store_transient)?;
        Ok(cancelled)
    }

    async fn cancel_kept_open(
        &self,
        id: MessageId,
        open_for: Duration,
        commit: bool,
    ) -> Result<bool> {
        let mut tx = self
            .db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)?;
        let cancelled = self.db.store.outbox().cancel(&mut tx, id).await?;
        tokio::time::sleep(open_for).await;
        if commit {
            tx.commit().await.map_err(Error::store_transient)?;
        } else {
            tx.rollback().await.map_err(Error::store_transient)?;
        }
        Ok(cancelled)
    }

    async fn enqueue(&self, messages: &[Message]) -> Result<()> {
        self.enqueue_all(messages, true).await
    }

    async fn enqueue_rolled_back(&self, messages: &[Message]) -> Result<()> {
        self.enqueue_all(messages, false).await
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
        let mut tx = self
            .db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)?;
        sqlx::query("INSERT INTO conformance_effects (`key`) VALUES (?)")
            .bind(business.to_owned())
            .execute(&mut *tx)
            .await
            .map_err(Error::store_transient)?;
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
