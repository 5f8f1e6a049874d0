//! Compile-time contracts: the stores and their futures can move between threads.

use std::future::Future;

use oncebox_core::Message;
use oncebox_core::spool::SpoolStore;
use oncebox_core::store::{DedupStore, DurableInboxStore, InboxStore};
use oncebox_postgres::{PgDedupStore, PgDurableInbox, PgInbox, PgOutbox, PgStore};

fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn stores_are_send_sync_and_clone() {
    send_sync_clone::<PgStore>();
    send_sync_clone::<PgOutbox>();
    send_sync_clone::<PgInbox>();
    send_sync_clone::<PgDurableInbox>();
    send_sync_clone::<PgDedupStore>();
}

fn spool<S: SpoolStore<Item = Message>>() {}
fn inbox<S: InboxStore>() {}
fn durable<S: DurableInboxStore>() {}
fn dedup<S: DedupStore>() {}

#[test]
fn stores_implement_the_core_traits() {
    spool::<PgOutbox>();
    inbox::<PgInbox>();
    durable::<PgDurableInbox>();
    dedup::<PgDedupStore>();
}

/// Never run: only type-checks that the inherent futures are `Send`.
#[allow(dead_code)]
fn inherent_futures_are_send(
    store: &PgStore,
    outbox: &PgOutbox,
    conn: &mut sqlx::PgConnection,
    message: &Message,
) {
    fn check<F: Future + Send>(future: F) -> F {
        future
    }
    send(&check(PgStore::connect("postgres://x")));
    send(&check(store.migrate()));
    send(&check(outbox.enqueue(conn, message)));
    send(&check(outbox.stats()));
    send(&check(outbox.dead_letters(1)));
    send(&check(outbox.replay_dead(message.id)));
    send(&check(outbox.status(message.id)));
}
