//! The layer over a real HTTP server, on the MySQL / MariaDB dedup store
//! (`ONCEBOX_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`; a database of its
//! own per test, dropped afterwards, within the bounds of `oncebox_testkit::fresh`).

#[macro_use]
mod common;

use common::Fresh;
use oncebox_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use oncebox_mysql::sqlx::{self, ConnectOptions, Connection};
use oncebox_mysql::{MySqlDedupStore, MySqlStore};
use oncebox_testkit::fresh::{self, Cleanup};

fn options() -> MySqlConnectOptions {
    std::env::var("ONCEBOX_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
        .parse()
        .expect("a valid ONCEBOX_MYSQL_URL")
}

async fn mysql() -> Fresh<MySqlDedupStore> {
    let slot = fresh::slot().await;
    let name = fresh::unique_name("oncebox_http");
    let mut admin = options()
        .connect()
        .await
        .expect("connect to MySQL / MariaDB (set ONCEBOX_MYSQL_URL)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let sql = format!("DROP DATABASE IF EXISTS `{name}`");
    let guard = Cleanup::new(format!("test database {name}"), move || async move {
        let mut conn = options().connect().await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await
    });
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
