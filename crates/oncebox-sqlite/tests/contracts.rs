//! Compile-time contracts: the stores and their futures can move between threads.

use std::future::Future;

use oncebox_core::Message;
use oncebox_core::spool::SpoolStore;
use oncebox_core::store::{DedupStore, DurableInboxStore, InboxStore};
use oncebox_sqlite::{
    SqliteDedupStore, SqliteDurableInbox, SqliteInbox, SqliteOutbox, SqliteStore,
};

fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn stores_are_send_sync_and_clone() {
    send_sync_clone::<SqliteStore>();
    send_sync_clone::<SqliteOutbox>();
    send_sync_clone::<SqliteInbox>();
    send_sync_clone::<SqliteDurableInbox>();
    send_sync_clone::<SqliteDedupStore>();
}

fn spool<S: SpoolStore<Item = Message>>() {}
fn inbox<S: InboxStore>() {}
fn durable<S: DurableInboxStore>() {}
fn dedup<S: DedupStore>() {}

#[test]
fn stores_implement_the_core_traits() {
    spool::<SqliteOutbox>();
    inbox::<SqliteInbox>();
    durable::<SqliteDurableInbox>();
    dedup::<SqliteDedupStore>();
}

/// Never run: only type-checks that the inherent futures are `Send`.
#[allow(dead_code)]
fn inherent_futures_are_send(
    store: &SqliteStore,
    outbox: &SqliteOutbox,
    conn: &mut sqlx::SqliteConnection,
    message: &Message,
) {
    fn check<F: Future + Send>(future: F) -> F {
        future
    }
    send(&check(SqliteStore::connect("x.db")));
    send(&check(store.migrate()));
    send(&check(outbox.enqueue(conn, message)));
    send(&check(outbox.stats()));
    send(&check(outbox.dead_letters(1)));
    send(&check(outbox.replay_dead(message.id)));
    send(&check(outbox.status(message.id)));
}
