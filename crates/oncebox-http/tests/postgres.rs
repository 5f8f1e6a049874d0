//! The layer over a real HTTP server, on the PostgreSQL dedup store (`ONCEBOX_PG_URL`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`; a schema of its own per test,
//! dropped afterwards).

#[macro_use]
mod common;

use common::Fresh;
use oncebox_postgres::{PgDedupStore, PgStore};
use oncebox_testkit::fresh::{self, Cleanup};
use sqlx::Connection;

fn url() -> String {
    std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn postgres() -> Fresh<PgDedupStore> {
    let schema = fresh::unique_name("t_http");
    let store = PgStore::connect(&url())
        .await
        .expect("connect to PostgreSQL (set ONCEBOX_PG_URL)")
        .with_schema(&schema)
        .expect("a valid schema name");
    let sql = format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let guard = Cleanup::new(format!("test schema {schema}"), move || async move {
        let mut conn = sqlx::PgConnection::connect(&url()).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await
    });
    store.migrate().await.expect("migrate");
    Fresh {
        store: store.dedup(),
        keep: Box::new(guard),
    }
}

scenarios!(postgres().await);
