//! Every PostgreSQL statement of the natural idempotency guide
//! (`oncebox/src/docs/natural_idempotency.md`), run against the real server, with the
//! outcomes the guide claims.
//!
//! The statements are read from the guide (each follows a `<!-- sql: name -->` marker),
//! so the guide cannot show a statement these tests do not run.

mod common;

use std::time::Duration;

use sqlx::postgres::PgPool;

use common::TestDb;

const GUIDE: &str = include_str!("../../../oncebox/src/docs/natural_idempotency.md");

/// The guide's tables, created in each test's schema.
const TABLES: [&str; 3] = ["payments", "account_balances", "orders"];

/// The SQL block after `<!-- sql: name -->` in the guide.
fn statement(name: &str) -> &'static str {
    oncebox_testkit::guide::statement(GUIDE, name)
}

async fn with_tables() -> TestDb {
    let db = TestDb::new().await;
    for table in TABLES {
        db.exec(statement(table)).await;
    }
    db
}

async fn payment(pool: &PgPool, id: &str) -> Option<(String, i64)> {
    sqlx::query_as("SELECT order_id, amount_cents FROM payments WHERE payment_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read a payment")
}

async fn balance(pool: &PgPool, account: &str) -> (i64, i64) {
    sqlx::query_as("SELECT balance_cents, version FROM account_balances WHERE account_id = $1")
        .bind(account)
        .fetch_one(pool)
        .await
        .expect("read a balance")
}

/// Each PostgreSQL statement of the guide is run by a test below (the list is checked
/// against the guide, both ways).
#[test]
fn every_postgres_statement_of_the_guide_is_tested() {
    let tested = [
        "pg_insert_if_absent",
        "pg_insert_if_absent_returning",
        "pg_upsert_forward",
        "pg_optimistic_update",
        "pg_apply_versioned",
    ];
    let tested: Vec<&str> = tested.into_iter().chain(TABLES).collect();
    oncebox_testkit::guide::every_statement_is_tested(GUIDE, &["mysql_"], &tested);
}

/// `ON CONFLICT DO NOTHING`: 1 row, then 0 for the duplicate, and the transaction stays
/// usable; `RETURNING` says which; other errors still fail.
#[tokio::test(flavor = "multi_thread")]
async fn on_conflict_do_nothing() {
    let db = with_tables().await;
    let pool = db.store.pool();
    let mut tx = pool.begin().await.unwrap();
    let insert = |id: &'static str, order: &'static str| {
        sqlx::query(statement("pg_insert_if_absent"))
            .bind(id)
            .bind(order)
            .bind(500_i64)
    };
    assert_eq!(
        insert("p-1", "o-1")
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected(),
        1
    );
    assert_eq!(
        insert("p-1", "o-2")
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected(),
        0
    );
    insert("p-2", "o-2")
        .execute(&mut *tx)
        .await
        .expect("the transaction goes on");
    tx.commit().await.unwrap();
    assert_eq!(payment(pool, "p-1").await, Some(("o-1".to_owned(), 500)));

    let returning = |id: &'static str| {
        sqlx::query_scalar::<_, String>(statement("pg_insert_if_absent_returning"))
            .bind(id)
            .bind("o-3")
            .bind(300_i64)
    };
    assert_eq!(
        returning("p-3")
            .fetch_optional(pool)
            .await
            .unwrap()
            .as_deref(),
        Some("p-3")
    );
    assert_eq!(returning("p-3").fetch_optional(pool).await.unwrap(), None);

    let null_amount = sqlx::query(statement("pg_insert_if_absent"))
        .bind("p-4")
        .bind("o-4")
        .bind(None::<i64>)
        .execute(pool)
        .await;
    assert!(null_amount.is_err(), "a NOT NULL violation is not absorbed");
}

/// Concurrent duplicates: the second waits for the first; it inserts nothing if the
/// first commits, and inserts if the first rolls back.
#[tokio::test(flavor = "multi_thread")]
async fn on_conflict_waits_for_the_first_writer() {
    let db = with_tables().await;
    let pool = db.store.pool().clone();
    for commit_first in [true, false] {
        let id = if commit_first {
            "p-commit"
        } else {
            "p-rollback"
        };
        let mut first = pool.begin().await.unwrap();
        sqlx::query(statement("pg_insert_if_absent"))
            .bind(id)
            .bind("first")
            .bind(1_i64)
            .execute(&mut *first)
            .await
            .unwrap();
        let second = {
            let pool = pool.clone();
            tokio::spawn(async move {
                sqlx::query(statement("pg_insert_if_absent"))
                    .bind(id)
                    .bind("second")
                    .bind(2_i64)
                    .execute(&pool)
                    .await
                    .unwrap()
                    .rows_affected()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "the second writer waits on the key");
        if commit_first {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let inserted = second.await.unwrap();
        let (order, _) = payment(&pool, id).await.unwrap();
        if commit_first {
            assert_eq!((inserted, order.as_str()), (0, "first"));
        } else {
            assert_eq!((inserted, order.as_str()), (1, "second"));
        }
    }
}

/// `ON CONFLICT DO UPDATE ... WHERE`: newer versions apply (1 row), duplicates and older
/// ones affect 0 rows.
#[tokio::test(flavor = "multi_thread")]
async fn upsert_moves_forward_only() {
    let db = with_tables().await;
    let pool = db.store.pool();
    let mut counts = Vec::new();
    for (version, amount) in [(1_i64, 100_i64), (3, 300), (3, 300), (2, 200)] {
        let done = sqlx::query(statement("pg_upsert_forward"))
            .bind("acct-1")
            .bind(amount)
            .bind(version)
            .execute(pool)
            .await
            .unwrap();
        counts.push(done.rows_affected());
    }
    assert_eq!(counts, [1, 1, 0, 0]);
    assert_eq!(balance(pool, "acct-1").await, (300, 3));
}

/// Optimistic locking: the writer holding the current version wins, the stale one
/// affects 0 rows; versioned events apply once and only forward.
#[tokio::test(flavor = "multi_thread")]
async fn version_numbers() {
    let db = with_tables().await;
    let pool = db.store.pool();
    sqlx::query("INSERT INTO orders (id, status, version) VALUES ('o-1', 'placed', 1)")
        .execute(pool)
        .await
        .unwrap();
    let update = |status: &'static str, read_version: i64| {
        sqlx::query(statement("pg_optimistic_update"))
            .bind(status)
            .bind("o-1")
            .bind(read_version)
    };
    assert_eq!(
        update("paid", 1)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        1
    );
    assert_eq!(
        update("cancelled", 1)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        0
    );
    let (status, version): (String, i64) =
        sqlx::query_as("SELECT status, version FROM orders WHERE id = 'o-1'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), version), ("paid", 2));

    sqlx::query("INSERT INTO account_balances VALUES ('acct-1', 100, 1)")
        .execute(pool)
        .await
        .unwrap();
    let apply = |version: i64, amount: i64| {
        sqlx::query(statement("pg_apply_versioned"))
            .bind(amount)
            .bind(version)
            .bind("acct-1")
    };
    assert_eq!(
        apply(3, 300).execute(pool).await.unwrap().rows_affected(),
        1
    );
    assert_eq!(
        apply(3, 300).execute(pool).await.unwrap().rows_affected(),
        0
    );
    assert_eq!(
        apply(2, 200).execute(pool).await.unwrap().rows_affected(),
        0
    );
    assert_eq!(balance(pool, "acct-1").await, (300, 3));
}
