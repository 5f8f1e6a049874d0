//! The log-tailing relay publishes a commit only once other sessions can see it. With
//! synchronous replication, logical decoding hands a commit out while its producer
//! still waits for the standby; if the primary failed then, the standby taking over
//! would not have the transaction, and a message published for it would announce a
//! change that never happened.
//!
//! The server is set up as with a synchronous standby that never answers
//! (`synchronous_standby_names` names nobody that exists), but only sessions that ask
//! for it wait: `synchronous_commit` defaults to `local` while the test runs, and the
//! producer sets it `on`. The settings are put back when the test ends. This test binary
//! holds only these tests, since they change the server's settings.

#![cfg(feature = "cdc")]

mod common;

use std::time::Duration;

use common::TestDb;
use common::cdc::{Recorder, Slot, eventually, keyed, started};
use oncebox_core::Message;
use oncebox_postgres::cdc::CdcMode;
use sqlx::Connection;

/// `synchronous_standby_names` naming a standby that never answers, for the test's
/// length; `synchronous_commit = local` by default meanwhile, so that only a session
/// that sets it `on` waits. Put back on drop.
struct NoStandbyAnswers;

impl NoStandbyAnswers {
    async fn set(db: &TestDb) -> Self {
        for statement in [
            "ALTER SYSTEM SET synchronous_commit = 'local'",
            "ALTER SYSTEM SET synchronous_standby_names = 'oncebox_standby_that_never_answers'",
            "SELECT pg_reload_conf()",
        ] {
            db.exec(statement).await;
        }
        // A reload reaches every session at its next command: let it arrive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Self
    }
}

impl Drop for NoStandbyAnswers {
    fn drop(&mut self) {
        let _ = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&common::url()).await?;
                for statement in [
                    "ALTER SYSTEM RESET synchronous_standby_names",
                    "ALTER SYSTEM RESET synchronous_commit",
                    "SELECT pg_reload_conf()",
                ] {
                    sqlx::query(statement).execute(&mut conn).await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .join();
    }
}

/// Commits `message` on a connection of its own that waits for the synchronous
/// standby; returns the task (it ends once the wait is cancelled) and the backend's pid.
async fn commit_waiting_for_the_standby(
    db: &TestDb,
    mode: CdcMode,
    message: Message,
) -> (tokio::task::JoinHandle<()>, i32) {
    let mut conn = db
        .store
        .pool()
        .acquire()
        .await
        .expect("a connection")
        .detach();
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut conn)
        .await
        .expect("set");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("the pid is read");
    let store = db.store.clone();
    let task = tokio::spawn(async move {
        let mut tx = conn.begin().await.expect("a transaction begins");
        match mode {
            CdcMode::Messages => store.message_outbox().enqueue(&mut tx, &message).await,
            CdcMode::Table => store.outbox().enqueue(&mut tx, &message).await,
        }
        .expect("the message is enqueued");
        // Ends when the wait for the standby is cancelled: the commit is then local
        // only, and the server says so with a warning.
        tx.commit()
            .await
            .expect("the commit returns once the wait is cancelled");
    });
    (task, pid)
}

async fn nothing_published_while_the_producer_waits(mode: CdcMode) {
    let db = TestDb::new().await;
    let slot = Slot::new();
    let recorder = Recorder::default();
    let relay = started(&db, recorder.clone(), slot.options(mode)).await;
    let _settings = NoStandbyAnswers::set(&db).await;

    let (producer, pid) = commit_waiting_for_the_standby(&db, mode, keyed("a", 0)).await;
    // The commit is in the WAL, and so decoded, while the producer waits.
    eventually("the producer to wait for the standby", || async {
        let waiting: Option<String> =
            sqlx::query_scalar("SELECT wait_event FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(db.store.pool())
                .await
                .expect("the activity is read");
        (waiting.as_deref() == Some("SyncRep")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        recorder.published().is_empty(),
        "{mode:?}: published while its producer still waits for the standby"
    );
    assert!(!producer.is_finished());

    let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
        .bind(pid)
        .fetch_one(db.store.pool())
        .await
        .expect("the wait is cancelled");
    assert!(cancelled);
    producer.await.expect("the producer ends");
    let published = recorder.wait_for(1).await;
    assert_eq!(published[0].payload, "a:0");
    relay.abort();
}

/// Both sources in one test: the settings are the server's, so the two never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_published_only_once_other_sessions_see_it() {
    nothing_published_while_the_producer_waits(CdcMode::Messages).await;
    nothing_published_while_the_producer_waits(CdcMode::Table).await;
}
