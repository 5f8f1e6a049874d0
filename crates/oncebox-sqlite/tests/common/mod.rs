//! Helpers shared by the backend's own tests: a fresh database per test.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use oncebox_core::Message;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, SpoolStore};
use oncebox_sqlite::{SqliteOutbox, SqliteStore};
use tempfile::TempDir;

pub const LONG: Duration = Duration::from_secs(60);
pub const SHORT: Duration = Duration::from_millis(200);

/// A migrated database in its own temporary directory (dropped with it).
pub struct Db {
    pub store: SqliteStore,
    pub dir: TempDir,
}

pub async fn db() -> Db {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::connect(dir.path().join("test.db"))
        .await
        .expect("open the database");
    store.migrate().await.expect("migrate");
    Db { store, dir }
}

/// A message whose payload is its label.
pub fn msg(key: Option<&str>, label: &str) -> Message {
    let message = Message::new("orders", label.to_owned()).with_kind("OrderPlaced");
    match key {
        Some(key) => message.with_key(key),
        None => message,
    }
}

pub fn label(message: &Message) -> String {
    String::from_utf8_lossy(&message.payload).into_owned()
}

pub fn labels(rows: &[Claimed<Message>]) -> Vec<String> {
    rows.iter().map(|r| label(&r.item)).collect()
}

/// Enqueues `messages` in one committed transaction.
pub async fn enqueue(store: &SqliteStore, messages: &[Message]) {
    let outbox = store.outbox();
    let mut tx = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("begin");
    for message in messages {
        outbox.enqueue(&mut tx, message).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
}

pub async fn claim(
    outbox: &SqliteOutbox,
    limit: usize,
    lease: Duration,
) -> (LeaseToken, Vec<Claimed<Message>>) {
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit,
        lease,
    };
    let rows = outbox.claim(&request).await.expect("claim");
    for row in &rows {
        assert_eq!(row.token, request.token);
    }
    (request.token, rows)
}
