//! Compile-time contracts: the stores and their futures can move between threads.

use std::future::Future;

use oncebox_core::Message;
use oncebox_core::spool::SpoolStore;
use oncebox_core::store::{DedupStore, DurableInboxStore, InboxStore};
use oncebox_mysql::{MySqlDedupStore, MySqlDurableInbox, MySqlInbox, MySqlOutbox, MySqlStore};

fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn stores_are_send_sync_and_clone() {
    send_sync_clone::<MySqlStore>();
    send_sync_clone::<MySqlOutbox>();
    send_sync_clone::<MySqlInbox>();
    send_sync_clone::<MySqlDurableInbox>();
    send_sync_clone::<MySqlDedupStore>();
}

fn spool<S: SpoolStore<Item = Message>>() {}
fn inbox<S: InboxStore>() {}
fn durable<S: DurableInboxStore>() {}
fn dedup<S: DedupStore>() {}

#[test]
fn stores_implement_the_core_traits() {
    spool::<MySqlOutbox>();
    inbox::<MySqlInbox>();
    durable::<MySqlDurableInbox>();
    dedup::<MySqlDedupStore>();
}

/// Never run: only type-checks that the inherent futures are `Send`.
#[allow(dead_code)]
fn inherent_futures_are_send(
    store: &MySqlStore,
    outbox: &MySqlOutbox,
    conn: &mut sqlx::MySqlConnection,
    message: &Message,
) {
    fn check<F: Future + Send>(future: F) -> F {
        future
    }
    send(&check(MySqlStore::connect("mysql://x")));
    send(&check(store.migrate()));
    send(&check(outbox.enqueue(conn, message)));
    send(&check(outbox.stats()));
    send(&check(outbox.dead_letters(1)));
    send(&check(outbox.replay_dead(message.id)));
    send(&check(outbox.status(message.id)));
    send(&check(outbox.explain_claim(1)));
}
