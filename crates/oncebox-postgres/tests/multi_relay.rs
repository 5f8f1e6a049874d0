//! Four relays over one outbox, killed and restarted at random while producers enqueue
//! 20,000 messages on 500 keys (the testkit's
//! [`multi_relay`](oncebox_testkit::multi_relay) scenario): every message is published,
//! each key's messages reach the broker in commit order, and no key is ever being
//! published by two relays at once.
//!
//! A killed relay's rows are taken over at once with held claims (their transactions end
//! with the relay), after the 1 s lease with leased claims. The test runs with both.

mod common;

use std::collections::HashMap;

use oncebox_core::{Error, Message, Result};
use oncebox_postgres::PgOutbox;
use oncebox_testkit::multi_relay::{self, KEYS, MultiRelayHarness};

use common::TestDb;

struct Harness {
    db: TestDb,
    held: bool,
}

impl Harness {
    async fn new(held: bool) -> Self {
        let db = TestDb::with_connections(14).await;
        db.exec("CREATE TABLE key_versions (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
            .await;
        db.exec(&format!(
            "INSERT INTO key_versions (key) SELECT 'key-' || i FROM generate_series(0, {}) AS i",
            KEYS - 1
        ))
        .await;
        Self { db, held }
    }
}

impl MultiRelayHarness for Harness {
    type Outbox = PgOutbox;

    fn relay_outbox(&self) -> PgOutbox {
        self.db.store.outbox().with_held_claims(self.held)
    }

    async fn produce(&self, messages: &[Message], keys: &[String]) -> Result<HashMap<String, i64>> {
        let mut tx = self.db.enqueued(messages).await?;
        let mut versions = HashMap::new();
        for key in keys {
            let n: i64 =
                sqlx::query_scalar("UPDATE key_versions SET n = n + 1 WHERE key = $1 RETURNING n")
                    .bind(key.clone())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(Error::store_permanent)?;
            versions.insert(key.clone(), n);
        }
        tx.commit().await.map_err(Error::store_permanent)?;
        Ok(versions)
    }

    async fn pending(&self) -> Result<u64> {
        Ok(self.db.store.outbox().stats().await?.pending)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_killed_at_random_keep_per_key_order() {
    multi_relay::relays_killed_at_random_keep_per_key_order(Harness::new(true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_leasing_relays_killed_at_random_keep_per_key_order() {
    multi_relay::relays_killed_at_random_keep_per_key_order(Harness::new(false).await).await;
}
