//! The `oncebox-testkit` conformance suites against the PostgreSQL stores: outbox (with
//! held claims, the default, and with leased ones), inbox, durable inbox and dedup.
//! Every check runs in a fresh schema of its own.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::{Error, MessageId, Result};
use oncebox_postgres::{PgDedupStore, PgDurableInbox, PgInbox, PgOutbox, PgStore, RowStatus};
use oncebox_testkit::outbox::Capabilities;
use sqlx::{Postgres, Transaction};

use common::TestDb;

/// A migrated schema plus the suite's effects table (deliberately without a unique
/// constraint, so that a second effect is counted), its outbox claiming with held
/// claims or leased ones.
struct PgHarness {
    db: TestDb,
    held_claims: bool,
}

impl PgHarness {
    /// With held claims, the outbox's default.
    async fn new() -> Self {
        Self::with_held_claims(true).await
    }

    /// With leased claims instead (see `PgOutbox::with_held_claims`).
    async fn leased() -> Self {
        Self::with_held_claims(false).await
    }

    async fn with_held_claims(held_claims: bool) -> Self {
        let db = TestDb::with_connections(10).await;
        db.exec("CREATE TABLE conformance_effects (key text NOT NULL)")
            .await;
        Self { db, held_claims }
    }

    fn backend(&self) -> &PgStore {
        &self.db.store
    }

    fn outbox(&self) -> PgOutbox {
        self.db.store.outbox().with_held_claims(self.held_claims)
    }

    async fn begin_tx(&self) -> Result<Transaction<'static, Postgres>> {
        self.db
            .store
            .pool()
            .begin()
            .await
            .map_err(Error::store_transient)
    }
}

oncebox_testkit::sql_store_harness! {
    harness: PgHarness,
    producer: PgProducer,
    database: Postgres,
    stores: PgOutbox, PgInbox, PgDurableInbox, PgDedupStore,
    row_status: RowStatus,
    insert_effect: "INSERT INTO conformance_effects (key) VALUES ($1)",
    count_effects: "SELECT count(*) FROM conformance_effects WHERE key = $1",
    count_records: "SELECT count(*) FROM dedup",
    outbox: {
        fn capabilities(&self) -> Capabilities {
            Capabilities::new()
                .producer_key_locks(true)
                .claim_window(true)
                .held_claims(self.held_claims)
                .keeps_enqueue_time(true)
                .time_resolution(Duration::from_micros(1))
                .publication_times(true)
        }

        fn windowed(&self, rows: usize) -> Result<PgOutbox> {
            Ok(self.outbox().with_claim_window(rows))
        }

        /// By their advisory lock keys (`hashtext(key) # table oid`).
        async fn keys_in_lock_order(&self) -> Result<(String, String)> {
            let (a, b) = ("a".to_owned(), "b".to_owned());
            let sql = format!(
                "SELECT (hashtext($1) # '{table}'::regclass::oid::int4)
                      < (hashtext($2) # '{table}'::regclass::oid::int4)",
                table = self.db.store.outbox().table()
            );
            let a_first: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(&a)
                .bind(&b)
                .fetch_one(self.db.store.pool())
                .await
                .map_err(Error::store_transient)?;
            Ok(if a_first { (a, b) } else { (b, a) })
        }

        /// Headers that are not strings.
        async fn write_undecodable_rows(&self) -> Result<Vec<(MessageId, Vec<&'static str>)>> {
            let id = "0190a3f4-0000-7000-8000-0000000000a1";
            self.db
                .exec(&format!(
                    "INSERT INTO outbox (id, topic, headers, payload)
                     VALUES ('{id}', 'orders', '{{\"n\": 1}}', '\\x00')"
                ))
                .await;
            let id = MessageId::parse(id).map_err(Error::store_permanent)?;
            Ok(vec![(id, vec!["headers"])])
        }

        async fn set_published_at(&self, id: MessageId, at: SystemTime) -> Result<()> {
            let seconds = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_err(Error::store_permanent)?
                .as_secs_f64();
            sqlx::query("UPDATE outbox SET done_at = to_timestamp($1) WHERE id = $2::uuid")
                .bind(seconds)
                .bind(id.to_string())
                .execute(self.db.store.pool())
                .await
                .map_err(Error::store_transient)?;
            Ok(())
        }
    }
}

/// One `#[tokio::test]` per check, in a module named after the suite (or as given), each
/// in a fresh schema.
macro_rules! suite {
    ($suite:ident: $($check:ident),* $(,)?) => {
        suite!($suite = $suite with new: $($check),*);
    };
    ($module:ident = $suite:ident with $constructor:ident: $($check:ident),* $(,)?) => {
        mod $module {
            use super::PgHarness;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    oncebox_testkit::$suite::$check(&PgHarness::$constructor().await).await;
                }
            )*
        }
    };
}

oncebox_testkit::outbox_checks!(suite!(outbox:));

oncebox_testkit::outbox_checks!(suite!(outbox_leased = outbox with leased:));

oncebox_testkit::inbox_checks!(suite!(inbox:));

oncebox_testkit::dedup_checks!(suite!(dedup:));
