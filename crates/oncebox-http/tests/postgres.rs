//! The layer over a real HTTP server, on the PostgreSQL dedup store (`ONCEBOX_PG_URL`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`; a schema of its own per test,
//! dropped afterwards).

#[macro_use]
mod common;

use common::Fresh;
use oncebox_postgres::{PgDedupStore, PgStore};
use sqlx::Connection;

fn url() -> String {
    std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Drops the test's schema when the test ends (from a thread of its own: drop cannot
/// await).
struct DropSchema(String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let schema = std::mem::take(&mut self.0);
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(mut conn) = sqlx::PgConnection::connect(&url()).await else {
                    return;
                };
                let sql =
                    format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                {
                    eprintln!("could not drop test schema {schema}: {error}");
                }
                let _ = conn.close().await;
            });
        });
        let _ = dropper.join();
    }
}

async fn postgres() -> Fresh<PgDedupStore> {
    let schema = format!("t_http_{}", uuid::Uuid::new_v4().simple());
    let store = PgStore::connect(&url())
        .await
        .expect("connect to PostgreSQL (set ONCEBOX_PG_URL)")
        .with_schema(&schema)
        .expect("a valid schema name");
    let guard = DropSchema(schema);
    store.migrate().await.expect("migrate");
    Fresh {
        store: store.dedup(),
        keep: Box::new(guard),
    }
}

scenarios!(postgres().await);
