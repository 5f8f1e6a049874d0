//! Four relays over one outbox, killed and restarted at random while producers enqueue
//! 20,000 messages on 500 keys (the testkit's
//! [`multi_relay`](oncebox_testkit::multi_relay) scenario): every message is published,
//! each key's messages reach the broker in commit order, and no key is ever being
//! published by two relays at once. A killed relay's rows stay leased for the 1 s lease,
//! then other relays take them over.
//!
//! Keys share the outbox's lock slots, so two producer transactions may now and then
//! deadlock on slots taken in different orders: InnoDB rolls one back (1213), which the
//! harness reports as transient, and the scenario retries it, as an application does.

mod common;

use std::collections::HashMap;

use oncebox_core::{Error, Message, Result};
use oncebox_mysql::MySqlOutbox;
use oncebox_testkit::multi_relay::{self, KEYS, MultiRelayHarness};

use common::TestDb;

struct Harness {
    db: TestDb,
}

impl Harness {
    async fn new() -> Self {
        let db = TestDb::with_connections(14).await;
        db.exec(
            "CREATE TABLE key_versions (`key` VARBINARY(64) PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)",
        )
        .await;
        db.exec(&format!(
            "INSERT INTO key_versions (`key`)
             WITH RECURSIVE i (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < {})
             SELECT CONCAT('key-', n) FROM i",
            KEYS - 1
        ))
        .await;
        Self { db }
    }
}

impl MultiRelayHarness for Harness {
    type Outbox = MySqlOutbox;

    fn relay_outbox(&self) -> MySqlOutbox {
        self.db.store.outbox()
    }

    /// Enqueues, then takes the versions of `keys` (row locks held to the commit, so
    /// versions follow commit order), and commits.
    async fn produce(&self, messages: &[Message], keys: &[String]) -> Result<HashMap<String, i64>> {
        let mut tx = self.db.enqueued(messages).await?;
        let mut versions = HashMap::new();
        for key in keys {
            sqlx::query("UPDATE key_versions SET n = n + 1 WHERE `key` = ?")
                .bind(key.clone())
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            let n: i64 = sqlx::query_scalar("SELECT n FROM key_versions WHERE `key` = ?")
                .bind(key.clone())
                .fetch_one(&mut *tx)
                .await
                .map_err(classify)?;
            versions.insert(key.clone(), n);
        }
        tx.commit().await.map_err(classify)?;
        self.db.store.outbox().wake();
        Ok(versions)
    }

    async fn pending(&self) -> Result<u64> {
        Ok(self.db.store.outbox().stats().await?.pending)
    }
}

/// Deadlocks (1213) are transient: the transaction was rolled back and may be retried.
fn classify(error: sqlx::Error) -> Error {
    let deadlock = error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|db| db.number() == 1213);
    if deadlock {
        Error::store_transient(error)
    } else {
        Error::store_permanent(error)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_killed_at_random_keep_per_key_order() {
    multi_relay::relays_killed_at_random_keep_per_key_order(Harness::new().await).await;
}
