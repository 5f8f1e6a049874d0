//! The `oncebox-testkit` conformance suites against the SQLite stores: outbox, inbox,
//! durable inbox and dedup. Every check runs on a fresh database file of its own.

use oncebox_testkit::sqlite::SqliteHarness;

/// One `#[tokio::test]` per check, in a module named after the suite, each on a fresh
/// database.
macro_rules! suite {
    ($suite:ident: $($check:ident),* $(,)?) => {
        mod $suite {
            use super::SqliteHarness;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    oncebox_testkit::$suite::$check(&SqliteHarness::new().await).await;
                }
            )*
        }
    };
}

oncebox_testkit::outbox_checks!(suite!(outbox:));

oncebox_testkit::inbox_checks!(suite!(inbox:));

oncebox_testkit::dedup_checks!(suite!(dedup:));
