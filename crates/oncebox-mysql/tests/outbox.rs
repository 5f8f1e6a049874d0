//! The outbox beyond the conformance suite (where rows written by hand are checked), on
//! MySQL's own means: values too long for their columns, exact keys, migrations, raw
//! SQL, claims the process remembers and the claim's plans.

mod common;

use std::time::{Duration, SystemTime};

use oncebox_core::spool::{Settle, Settlement, SpoolStore};
use oncebox_core::{Error, Fault, Limits, Message};
use oncebox_mysql::{MySqlStore, ValueTooLong};
use sqlx::mysql::MySqlPoolOptions;

use common::{LONG, TestDb, claim, done, enqueue, labels, msg, settle_all};

/// Values that do not fit their columns are refused with a permanent error naming the
/// value, its length and the limit, never cut, and the transaction stays usable. (The
/// refusals every outbox makes are the suite's `refusals_keep_the_transaction_usable`.)
#[tokio::test(flavor = "multi_thread")]
async fn values_too_long_are_refused_not_cut() {
    let db = TestDb::new().await;
    let outbox = db
        .store
        .outbox()
        .with_limits(Limits::new().max_topic_len(1000));
    let mut tx = db.store.pool().begin().await.unwrap();
    let long_key = msg(Some(&"k".repeat(513)), "key");
    let mut long_topic = msg(None, "topic");
    long_topic.topic = "t".repeat(256);
    let long_kind = msg(None, "kind").with_kind("K".repeat(256));
    for (what, message, length, limit) in [
        ("key", long_key, 513, 512),
        ("topic", long_topic, 256, 255),
        ("kind", long_kind, 256, 255),
    ] {
        let err = outbox.enqueue(&mut tx, &message).await.unwrap_err();
        let Error::Store {
            source,
            fault: Fault::Permanent,
        } = &err
        else {
            panic!("{what}: expected a permanent store error, got {err}");
        };
        let too_long = source
            .downcast_ref::<ValueTooLong>()
            .unwrap_or_else(|| panic!("{what}: {source}"));
        assert_eq!(too_long.what(), what);
        assert_eq!((too_long.length(), too_long.limit()), (length, limit));
    }
    outbox
        .enqueue(&mut tx, &msg(Some("k"), "after"))
        .await
        .expect("the transaction is still usable");
    tx.commit().await.unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.pending, 1);
}

/// Keys are compared byte for byte: `k`, `K` and `k ` are three keys, so a retrying `k`
/// holds back neither of the others (a VARCHAR key under the usual collations would
/// make them one).
#[tokio::test(flavor = "multi_thread")]
async fn keys_are_exact_bytes() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let messages = [
        msg(Some("k"), "k1"),
        msg(Some("K"), "K1"),
        msg(Some("k "), "k-space1"),
        msg(Some("k"), "k2"),
    ];
    enqueue(&outbox, &db.store, &messages).await;
    let (token, rows) = claim(&outbox, 1, LONG).await;
    assert_eq!(labels(&rows), ["k1"]);
    let retry = Settlement {
        seq: rows[0].seq,
        outcome: Settle::Retry {
            at: SystemTime::now() + LONG,
            error: "later".into(),
        },
    };
    outbox.settle(token, &[retry]).await.unwrap();
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["K1", "k-space1"]);
    assert_eq!(rows[1].item.key.as_deref(), Some("k "));
}

/// Migrating again changes nothing; applied migrations are recorded in
/// `_oncebox_migrations` and nowhere else.
#[tokio::test(flavor = "multi_thread")]
async fn migrations_have_their_own_table() {
    let db = TestDb::new().await;
    db.store.migrate().await.unwrap();
    db.store.migrate().await.unwrap();
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM _oncebox_migrations")
            .fetch_all(db.store.pool())
            .await
            .unwrap();
    let migrations = oncebox_mysql::migrator().iter().count();
    let every: Vec<(i64, bool)> = (1..=i64::try_from(migrations).unwrap())
        .map(|version| (version, true))
        .collect();
    assert_eq!(applied, every);
    let sqlx_table: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
    )
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!(
        sqlx_table, 0,
        "the application's migrations table is left alone"
    );
    let slots: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncebox_key_locks")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(slots, 65_536, "every key lock slot exists, once");
}

/// A new database without tables, and a small pool on it.
async fn empty_database(prefix: &str) -> (String, sqlx::MySqlPool) {
    let name = common::create_database(prefix).await;
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect_with(common::options().database(&name))
        .await
        .expect("connect to the new database");
    (name, pool)
}

/// The shipped raw SQL builds working tables in an empty database, and running it twice
/// is harmless.
#[tokio::test(flavor = "multi_thread")]
async fn raw_sql_builds_working_tables() {
    let (name, pool) = empty_database("oncebox_raw").await;
    for _ in 0..2 {
        for schema in [oncebox_mysql::SCHEMA_V1, oncebox_mysql::SCHEMA_V2] {
            sqlx::raw_sql(schema)
                .execute(&pool)
                .await
                .expect("the raw SQL applies (again)");
        }
    }
    let store = MySqlStore::from_pool(pool.clone());
    let outbox = store.outbox();
    enqueue(&outbox, &store, &[msg(Some("k"), "raw")]).await;
    let (_, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["raw"]);
    pool.close().await;
    drop(common::drop_database(name));
}

/// A database on schema version 1, with a row under a live lease, upgrades to version 2:
/// the lease columns go, with the lease (its row is claimed again), and every row is
/// kept and then published.
#[tokio::test(flavor = "multi_thread")]
async fn version_1_databases_upgrade_and_keep_their_rows() {
    let (name, pool) = empty_database("oncebox_v1").await;
    // What version 1's migrator did, so that the migrator goes on from there.
    let mut version_1 = oncebox_mysql::migrator();
    version_1.migrations.to_mut().truncate(1);
    version_1.run(&pool).await.unwrap();
    let store = MySqlStore::from_pool(pool.clone());
    let outbox = store.outbox();
    let messages = [msg(Some("k"), "a"), msg(Some("k"), "b"), msg(None, "c")];
    enqueue(&outbox, &store, &messages).await;
    sqlx::query(
        "UPDATE oncebox_outbox SET lease_token = X'01', lease_until = 9999999999999
         WHERE seq = (SELECT MIN(seq) FROM (SELECT seq FROM oncebox_outbox) AS s)",
    )
    .execute(&pool)
    .await
    .unwrap();

    store.migrate().await.unwrap();
    let lease_columns: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns
         WHERE table_schema = DATABASE() AND column_name LIKE 'lease%'
           AND table_name IN ('oncebox_outbox', 'oncebox_durable_inbox')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(lease_columns, 0, "the lease columns are gone");
    assert_eq!(outbox.stats().await.unwrap().pending, 3);
    let (token, rows) = claim(&outbox, 10, LONG).await;
    assert_eq!(labels(&rows), ["a", "b", "c"], "the old lease is gone");
    outbox
        .settle(token, &settle_all(&rows, &Settle::Done))
        .await
        .unwrap();
    assert_eq!(outbox.stats().await.unwrap().done, 3);
    pool.close().await;
    drop(common::drop_database(name));
}

/// A claim's window, read in the request that reads the claims, passes over the rows of
/// this process's live claims. Once one of them has ended, the claims read disagree
/// with what the process remembers: the window is read again, and the ended claim's
/// rows are claimed again.
#[tokio::test(flavor = "multi_thread")]
async fn windows_pass_over_own_claims_until_they_end() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let messages: Vec<Message> = (0..6)
        .map(|n| msg(Some(&format!("k{n}")), &format!("m{n}")))
        .collect();
    enqueue(&outbox, &db.store, &messages).await;

    let (_, first) = claim(&outbox, 2, Duration::from_millis(200)).await;
    assert_eq!(labels(&first), ["m0", "m1"]);
    let (_, second) = claim(&outbox, 2, LONG).await;
    assert_eq!(
        labels(&second),
        ["m2", "m3"],
        "the first claim's rows passed over"
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, third) = claim(&outbox, 2, LONG).await;
    assert_eq!(
        labels(&third),
        ["m0", "m1"],
        "the ended claim's rows are claimed again, the live one's passed over"
    );
    let (_, fourth) = claim(&outbox, 2, LONG).await;
    assert_eq!(labels(&fourth), ["m4", "m5"]);
}

/// A relay settles a claim it made without reading the claim first, the claim's own
/// statement guarding the others. Once the claim has ended and another relay took its
/// rows, neither `settle_and_claim` nor `settle` changes them, and the other relay
/// settles them.
#[tokio::test(flavor = "multi_thread")]
async fn remembered_claims_that_ended_settle_nothing() {
    use oncebox_core::spool::{ClaimRequest, LeaseToken};

    let db = TestDb::new().await;
    let ours = db.store.outbox();
    let theirs = db.store.outbox();
    let messages = [msg(Some("a"), "a1"), msg(Some("b"), "b1")];
    enqueue(&ours, &db.store, &messages).await;
    let short = Duration::from_millis(200);
    let (first, a) = claim(&ours, 1, short).await;
    let (second, b) = claim(&ours, 1, short).await;
    assert_eq!(
        (labels(&a), labels(&b)),
        (vec!["a1".to_owned()], vec!["b1".to_owned()])
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    let (token, taken) = claim(&theirs, 10, LONG).await;
    assert_eq!(labels(&taken), ["a1", "b1"], "the ended claims' rows");
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 10,
        lease: LONG,
    };
    let next = ours
        .settle_and_claim(first, &done(&a), &request)
        .await
        .expect("settle and claim");
    assert!(next.is_empty(), "got {:?}", labels(&next));
    ours.settle(second, &done(&b)).await.expect("settle");
    let stats = ours.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.done), (2, 0), "nothing settled");

    theirs.settle(token, &done(&taken)).await.expect("settle");
    let stats = ours.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.done),
        (0, 2),
        "settled by their claim"
    );
}

/// On a table of 200,000 pending rows, the claim's first step reads the head of the
/// pending index and finds the picked rows by primary key: no scan of the table, no
/// sort. Prints the plans (the crate docs quote them).
#[tokio::test(flavor = "multi_thread")]
async fn claim_plans_use_the_indexes() {
    let db = TestDb::new().await;
    db.exec(
        "INSERT INTO oncebox_outbox (id, topic, `key`, kind, headers, payload, created_at)
         WITH RECURSIVE d (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 499)
         SELECT UNHEX(REPLACE(UUID(), '-', '')), 'orders',
                CONCAT('key-', (a.n * 500 + b.n) MOD 2000), 'OrderPlaced', '{}', X'00', 0
         FROM d AS a CROSS JOIN d AS b WHERE a.n < 400;
         ANALYZE TABLE oncebox_outbox",
    )
    .await;
    let plans = db.store.outbox().explain_claim(256).await.unwrap();
    println!("{plans}");
    let steps: Vec<&str> = plans.split("-- ").filter(|s| !s.is_empty()).collect();
    assert_eq!(steps.len(), 4, "{plans}");
    for step in &steps[..2] {
        assert!(
            step.starts_with("window") && step.contains("oncebox_outbox_pending"),
            "the window reads the head of the pending index: {plans}"
        );
    }
    assert!(
        steps[1].starts_with("window, skipping") && steps[1].contains("Using index condition"),
        "the rows passed over are left out by an index condition: {plans}"
    );
    // id, select_type, table, type, possible_keys, key, ...
    let plan = |step: &str| -> Vec<String> {
        let row = step.lines().nth(2).unwrap_or_else(|| panic!("{plans}"));
        row.split('\t').map(str::to_owned).collect()
    };
    let lock = plan(steps[2]);
    assert!(steps[2].starts_with("lock"), "{plans}");
    assert_eq!(
        (lock[3].as_str(), lock[5].as_str()),
        ("range", "PRIMARY"),
        "the listed rows are found by primary key: {plans}"
    );
    let claims = plan(steps[3]);
    assert!(steps[3].starts_with("claims"), "{plans}");
    assert_eq!(
        claims[5], "PRIMARY",
        "a table's claims are found by primary key: {plans}"
    );
    assert!(!plans.contains("filesort"), "{plans}");
}
