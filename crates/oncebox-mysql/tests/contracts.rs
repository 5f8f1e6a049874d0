//! Compile-time contracts: the stores and their futures can move between threads.

use std::future::Future;

use oncebox_core::Message;
use oncebox_mysql::{MySqlDedupStore, MySqlDurableInbox, MySqlInbox, MySqlOutbox, MySqlStore};

fn send<T: Send>(_: &T) {}

#[test]
fn stores_are_send_sync_clone_and_implement_the_core_traits() {
    oncebox_testkit::checks::store_contracts::<
        MySqlStore,
        MySqlOutbox,
        MySqlInbox,
        MySqlDurableInbox,
        MySqlDedupStore,
    >();
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
