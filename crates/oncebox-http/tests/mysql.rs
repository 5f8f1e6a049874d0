//! The layer over a real HTTP server, on the MySQL / MariaDB dedup store
//! (`ONCEBOX_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`; a database of its
//! own per test, dropped afterwards; at most four tests hold one at a time, each with a
//! small pool, to stay far below the server's `max_connections`).

#[macro_use]
mod common;

use common::Fresh;
use oncebox_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use oncebox_mysql::sqlx::{self, ConnectOptions, Connection};
use oncebox_mysql::{MySqlDedupStore, MySqlStore};
use tokio::sync::Semaphore;

static SLOTS: Semaphore = Semaphore::const_new(4);

fn options() -> MySqlConnectOptions {
    std::env::var("ONCEBOX_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
        .parse()
        .expect("a valid ONCEBOX_MYSQL_URL")
}

/// Drops the test's database when the test ends (from a thread of its own: drop cannot
/// await).
struct DropDatabase(String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.0);
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(mut conn) = options().connect().await else {
                    return;
                };
                let sql = format!("DROP DATABASE IF EXISTS `{name}`");
                if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                {
                    eprintln!("could not drop test database {name}: {error}");
                }
                let _ = conn.close().await;
            });
        });
        let _ = dropper.join();
    }
}

async fn mysql() -> Fresh<MySqlDedupStore> {
    let slot = SLOTS.acquire().await.expect("never closed");
    let name = format!("oncebox_http_{}", uuid::Uuid::new_v4().simple());
    let mut admin = options()
        .connect()
        .await
        .expect("connect to MySQL / MariaDB (set ONCEBOX_MYSQL_URL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let guard = DropDatabase(name.clone());
    let pool = MySqlPoolOptions::new()
        .max_connections(5)
        .connect_with(options().database(&name))
        .await
        .expect("connect to the test database");
    let store = MySqlStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    Fresh {
        store: store.dedup(),
        // Dropped in order: the database goes, then the slot frees.
        keep: Box::new((guard, slot)),
    }
}

scenarios!(mysql().await);
