//! The `oncebox-testkit` conformance suites against the MySQL / MariaDB stores: outbox, inbox,
//! durable inbox and dedup. Every check runs in a fresh database of its own.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, MessageId, Result};
use oncebox_mysql::{
    MySqlDedupStore, MySqlDurableInbox, MySqlInbox, MySqlOutbox, MySqlStore, RowStatus,
};
use oncebox_testkit::outbox::Capabilities;
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

    fn backend(&self) -> &MySqlStore {
        &self.db.store
    }

    fn outbox(&self) -> MySqlOutbox {
        self.db.store.outbox()
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

oncebox_testkit::sql_store_harness! {
    harness: MySqlHarness,
    producer: MySqlProducer,
    database: MySql,
    stores: MySqlOutbox, MySqlInbox, MySqlDurableInbox, MySqlDedupStore,
    row_status: RowStatus,
    insert_effect: "INSERT INTO conformance_effects (`key`) VALUES (?)",
    count_effects: "SELECT COUNT(*) FROM conformance_effects WHERE `key` = ?",
    count_records: "SELECT COUNT(*) FROM oncebox_dedup",
    outbox: {
        fn capabilities(&self) -> Capabilities {
            Capabilities::new()
                .producer_key_locks(true)
                .claim_window(true)
                .time_resolution(Duration::from_millis(1))
                .publication_times(true)
        }

        fn windowed(&self, rows: usize) -> Result<MySqlOutbox> {
            Ok(self.outbox().with_claim_window(rows))
        }

        /// By their slots in `oncebox_key_locks`, as the server computes them.
        async fn keys_in_lock_order(&self) -> Result<(String, String)> {
            let (a, b) = ("a".to_owned(), "b".to_owned());
            let a_first: bool =
                sqlx::query_scalar("SELECT (CRC32(?) & 65535) < (CRC32(?) & 65535)")
                    .bind(a.as_bytes())
                    .bind(b.as_bytes())
                    .fetch_one(self.db.store.pool())
                    .await
                    .map_err(Error::store_transient)?;
            Ok(if a_first { (a, b) } else { (b, a) })
        }

        /// Headers that are not strings, and a key that is not UTF-8.
        async fn write_undecodable_rows(&self) -> Result<Vec<(MessageId, Vec<&'static str>)>> {
            let ids = [
                "0190a3f4-0000-7000-8000-0000000000a1",
                "0190a3f4-0000-7000-8000-0000000000a2",
            ];
            self.db
                .exec(&format!(
                    "INSERT INTO oncebox_outbox (id, topic, headers, payload, created_at)
                     VALUES (UNHEX(REPLACE('{}', '-', '')), 'orders', '{{\"n\": 1}}', X'00', 0);
                     INSERT INTO oncebox_outbox (id, topic, `key`, headers, payload, created_at)
                     VALUES (UNHEX(REPLACE('{}', '-', '')), 'orders', X'FF', '{{}}', X'00', 0)",
                    ids[0], ids[1]
                ))
                .await;
            let id = |text| MessageId::parse(text).map_err(Error::store_permanent);
            Ok(vec![
                (id(ids[0])?, vec!["headers"]),
                (id(ids[1])?, vec!["key", "UTF-8"]),
            ])
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
