//! Every MySQL statement of the natural idempotency guide
//! (`oncebox/src/docs/natural_idempotency.md`), run against the real server, with the
//! outcomes the guide claims: rows-affected counts under sqlx's `CLIENT_FOUND_ROWS`,
//! duplicate-key errors that leave the transaction usable, the order of `ON DUPLICATE
//! KEY UPDATE` assignments, and what `INSERT IGNORE` does to bad rows.
//!
//! The statements are read from the guide (each follows a `<!-- sql: name -->` marker),
//! so the guide cannot show a statement these tests do not run.

mod common;

use sqlx::mysql::{MySqlDatabaseError, MySqlPool};

use common::TestDb;

const GUIDE: &str = include_str!("../../../oncebox/src/docs/natural_idempotency.md");

/// The guide's tables, created in each test's database.
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

fn error_number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

async fn payment(pool: &MySqlPool, id: &str) -> Option<(String, i64)> {
    sqlx::query_as("SELECT order_id, amount_cents FROM payments WHERE payment_id = ?")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read a payment")
}

async fn balance(pool: &MySqlPool, account: &str) -> (i64, i64) {
    sqlx::query_as("SELECT balance_cents, version FROM account_balances WHERE account_id = ?")
        .bind(account)
        .fetch_one(pool)
        .await
        .expect("read a balance")
}

/// Each MySQL statement of the guide is run by a test below (the list is checked
/// against the guide, both ways).
#[test]
fn every_mysql_statement_of_the_guide_is_tested() {
    let tested = [
        "mysql_insert_if_absent",
        "mysql_plain_insert",
        "mysql_upsert_forward",
        "mysql_upsert_forward_wrong_order",
        "mysql_insert_ignore",
        "mysql_optimistic_update",
        "mysql_apply_versioned",
    ];
    let tested: Vec<&str> = tested.into_iter().chain(TABLES).collect();
    oncebox_testkit::guide::every_statement_is_tested(GUIDE, &["pg_"], &tested);
}

/// The no-op upsert: a duplicate is no error and changes nothing; and the rows-affected
/// table of the guide, as sqlx (`CLIENT_FOUND_ROWS`) sees it: 1 inserted, 2 changed, 1
/// left as it was.
#[tokio::test(flavor = "multi_thread")]
async fn on_duplicate_key_update_and_its_row_counts() {
    let db = with_tables().await;
    let pool = db.store.pool();
    let insert = |order: &'static str, amount: i64| {
        sqlx::query(statement("mysql_insert_if_absent"))
            .bind("p-1")
            .bind(order)
            .bind(amount)
    };
    assert_eq!(
        insert("o-1", 500)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        1
    );
    let duplicate = insert("o-2", 999).execute(pool).await.unwrap();
    assert_eq!(
        duplicate.rows_affected(),
        1,
        "with CLIENT_FOUND_ROWS an unchanged row counts 1, like an insert"
    );
    assert_eq!(payment(pool, "p-1").await, Some(("o-1".to_owned(), 500)));

    let upsert = |version: i64, balance: i64| {
        sqlx::query(statement("mysql_upsert_forward"))
            .bind("acct-1")
            .bind(balance)
            .bind(version)
    };
    assert_eq!(
        upsert(1, 100).execute(pool).await.unwrap().rows_affected(),
        1,
        "inserted"
    );
    assert_eq!(
        upsert(2, 250).execute(pool).await.unwrap().rows_affected(),
        2,
        "changed"
    );
    assert_eq!(
        upsert(2, 250).execute(pool).await.unwrap().rows_affected(),
        1,
        "left as it was"
    );
    assert_eq!(balance(pool, "acct-1").await, (250, 2));
}

/// A plain INSERT's duplicate is error 1062, which fails the statement only: the
/// transaction goes on and commits.
#[tokio::test(flavor = "multi_thread")]
async fn plain_insert_duplicate_keeps_the_transaction() {
    let db = with_tables().await;
    let pool = db.store.pool();
    let mut tx = pool.begin().await.unwrap();
    let insert = |id: &'static str| {
        sqlx::query(statement("mysql_plain_insert"))
            .bind(id)
            .bind("o-1")
            .bind(500_i64)
    };
    insert("p-1").execute(&mut *tx).await.unwrap();
    let error = insert("p-1").execute(&mut *tx).await.unwrap_err();
    assert_eq!(error_number(&error), Some(1062), "{error}");
    insert("p-2")
        .execute(&mut *tx)
        .await
        .expect("the transaction goes on");
    tx.commit().await.unwrap();
    assert!(payment(pool, "p-1").await.is_some() && payment(pool, "p-2").await.is_some());
}

/// The forward-only upsert ignores duplicates and older events and applies newer ones;
/// with the assignments the other way round, the balance never moves.
#[tokio::test(flavor = "multi_thread")]
async fn upsert_moves_forward_only_with_its_assignments_in_order() {
    let db = with_tables().await;
    let pool = db.store.pool();
    for (name, account) in [
        ("mysql_upsert_forward", "right"),
        ("mysql_upsert_forward_wrong_order", "wrong"),
    ] {
        for (version, amount) in [(1, 100), (3, 300), (3, 300), (2, 200)] {
            sqlx::query(statement(name))
                .bind(account)
                .bind(amount)
                .bind(version)
                .execute(pool)
                .await
                .unwrap();
        }
    }
    assert_eq!(
        balance(pool, "right").await,
        (300, 3),
        "newest version wins"
    );
    assert_eq!(
        balance(pool, "wrong").await,
        (100, 3),
        "the version moved, the balance did not"
    );
}

/// INSERT IGNORE skips the duplicate, and also stores a cut order id and a NULL amount
/// as 0, with a warning only, in strict mode.
#[tokio::test(flavor = "multi_thread")]
async fn insert_ignore_hides_more_than_duplicates() {
    let db = with_tables().await;
    let pool = db.store.pool();
    let mode: String = sqlx::query_scalar("SELECT @@SESSION.sql_mode")
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(mode.contains("STRICT_TRANS_TABLES"), "strict mode: {mode}");
    let ignore = |id: &'static str, order: &'static str, amount: Option<i64>| {
        sqlx::query(statement("mysql_insert_ignore"))
            .bind(id)
            .bind(order)
            .bind(amount)
    };
    assert_eq!(
        ignore("p-1", "o-1", Some(500))
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        1
    );
    assert_eq!(
        ignore("p-1", "o-2", Some(999))
            .execute(pool)
            .await
            .unwrap()
            .rows_affected(),
        0,
        "the duplicate is skipped"
    );
    assert_eq!(payment(pool, "p-1").await, Some(("o-1".to_owned(), 500)));

    let long_order = "order-0123456789"; // 16 characters fit...
    let longer = "order-0123456789-XY"; // ...these 19 do not.
    assert_eq!(long_order.len(), 16);
    ignore("p-2", longer, Some(700))
        .execute(pool)
        .await
        .expect("no error");
    assert_eq!(
        payment(pool, "p-2").await,
        Some((long_order.to_owned(), 700)),
        "cut"
    );
    ignore("p-3", "o-3", None)
        .execute(pool)
        .await
        .expect("no error");
    assert_eq!(
        payment(pool, "p-3").await,
        Some(("o-3".to_owned(), 0)),
        "NULL became 0"
    );

    // Without IGNORE, both are errors.
    let plain = sqlx::query(statement("mysql_plain_insert"))
        .bind("p-4")
        .bind(longer)
        .bind(700_i64)
        .execute(pool)
        .await
        .unwrap_err();
    assert_eq!(error_number(&plain), Some(1406), "data too long: {plain}");
}

/// Optimistic locking: the writer holding the current version wins, the stale one
/// affects 0 rows; and an UPDATE that changes nothing counts 1 under sqlx.
#[tokio::test(flavor = "multi_thread")]
async fn version_numbers_decide_who_won() {
    let db = with_tables().await;
    let pool = db.store.pool();
    sqlx::query("INSERT INTO orders (id, status, version) VALUES ('o-1', 'placed', 1)")
        .execute(pool)
        .await
        .unwrap();
    let update = |status: &'static str, read_version: i64| {
        sqlx::query(statement("mysql_optimistic_update"))
            .bind(status)
            .bind("o-1")
            .bind(read_version)
    };
    // Two writers read version 1; the first to write wins.
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

    let unchanged = sqlx::query("UPDATE orders SET status = 'paid' WHERE id = 'o-1'")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        unchanged.rows_affected(),
        1,
        "matched, not changed, counts under sqlx"
    );
}

/// Versioned events: newer applies, a duplicate or an older one affects 0 rows.
#[tokio::test(flavor = "multi_thread")]
async fn versioned_events_apply_once_and_forward() {
    let db = with_tables().await;
    let pool = db.store.pool();
    sqlx::query("INSERT INTO account_balances VALUES ('acct-1', 100, 1)")
        .execute(pool)
        .await
        .unwrap();
    let apply = |version: i64, amount: i64| {
        sqlx::query(statement("mysql_apply_versioned"))
            .bind(amount)
            .bind(version)
            .bind("acct-1")
            .bind(version)
    };
    assert_eq!(
        apply(3, 300).execute(pool).await.unwrap().rows_affected(),
        1
    );
    assert_eq!(
        apply(3, 300).execute(pool).await.unwrap().rows_affected(),
        0,
        "duplicate"
    );
    assert_eq!(
        apply(2, 200).execute(pool).await.unwrap().rows_affected(),
        0,
        "older"
    );
    assert_eq!(balance(pool, "acct-1").await, (300, 3));
}
