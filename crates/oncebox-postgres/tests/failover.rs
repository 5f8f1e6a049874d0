//! A failover under the log-tailing relay: PostgreSQL 15 carries no logical slot over
//! to a promoted standby, so the slot the relay read is gone on the new primary, with
//! whatever was committed after its confirmed position. The relay must refuse to go on
//! (never re-create the slot silently), name the range of WAL positions that may be
//! lost, and, told to re-create it, go on; in table mode the rows of that range are
//! still in the outbox table, where a polling relay publishes them.
//!
//! Each test runs a primary with a synchronous standby of its own
//! ([`oncebox_testkit::pg_pair`]), reached through an address that moves to the standby
//! once it is promoted ([`oncebox_testkit::proxy::Proxy::retarget`]).

#![cfg(feature = "cdc")]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncebox_core::memory::{MemoryBroker, MemoryPublisher};
use oncebox_core::spool::{Relay, SpoolOptions};
use oncebox_core::{Message, MessageId};
use oncebox_postgres::PgStore;
use oncebox_postgres::cdc::{CdcConnection, CdcOptions, CdcRelay, LostSlot};
use oncebox_testkit::pg_pair::{PgPair, Replication};
use oncebox_testkit::proxy::Proxy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const SCHEMA: &str = "shop";
const SLOT: &str = "shop_relay";
const KEYS: usize = 5;

/// The pair, and a store on it through the moving address.
struct Setup {
    pair: PgPair,
    address: Proxy,
    store: PgStore,
    url: String,
}

impl Setup {
    async fn new() -> Self {
        let pair = PgPair::start(Replication::Synchronous)
            .await
            .expect("a primary with a synchronous standby");
        let address = Proxy::start(pair.primary_address())
            .await
            .expect("the database's address");
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", address.port());
        let options: PgConnectOptions = url.parse().expect("a valid URL");
        let pool = PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        let store = PgStore::from_pool(pool)
            .with_schema(SCHEMA)
            .expect("a valid schema");
        store.migrate().await.expect("migrated");
        sqlx::query("CREATE TABLE shop.orders (id uuid PRIMARY KEY)")
            .execute(store.pool())
            .await
            .expect("the business table");
        Self {
            pair,
            address,
            store,
            url,
        }
    }

    fn relay(&self, broker: &MemoryBroker, lost: LostSlot) -> CdcRelay<MemoryPublisher> {
        let options = CdcOptions::table(SLOT)
            .status_interval(Duration::from_millis(100))
            .standby_poll(Duration::from_millis(100))
            .backoff(oncebox_core::Backoff::new().initial(Duration::from_millis(20)))
            .on_lost_slot(lost);
        CdcRelay::new(
            &self.store,
            CdcConnection::from_url(&self.url).expect("a valid URL"),
            broker.publisher(),
            options,
        )
        .expect("valid options")
    }

    async fn fail_over(&self) {
        self.pair.fail_over().await.expect("the standby promoted");
        self.address.retarget(self.pair.standby_address());
    }

    async fn orders(&self) -> BTreeSet<MessageId> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT id::text FROM shop.orders")
            .fetch_all(self.store.pool())
            .await
            .expect("the orders");
        ids.iter()
            .map(|id| MessageId::parse(id).expect("a message id"))
            .collect()
    }

    async fn pending(&self) -> BTreeSet<MessageId> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id::text FROM shop.outbox WHERE status = 'pending'")
                .fetch_all(self.store.pool())
                .await
                .expect("the pending rows");
        ids.iter()
            .map(|id| MessageId::parse(id).expect("a message id"))
            .collect()
    }
}

/// Writes orders and their messages, one transaction each, until stopped; keeps the
/// ids of the commits that returned success. Commits that fail (the primary gone, the
/// address not moved yet) are not retried: the audit reads what the new primary has.
fn produce(store: PgStore, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<MessageId>> {
    tokio::spawn(async move {
        let outbox = store.outbox();
        let mut acked = Vec::new();
        for n in 0usize.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let message =
                Message::new("orders", format!("order {n}")).with_key(format!("k{}", n % KEYS));
            let written = async {
                let mut tx = store.pool().begin().await?;
                sqlx::query("INSERT INTO shop.orders (id) VALUES ($1::uuid)")
                    .bind(message.id.to_string())
                    .execute(&mut *tx)
                    .await?;
                outbox
                    .enqueue(&mut tx, &message)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                tx.commit().await
            }
            .await;
            if written.is_ok() {
                acked.push(message.id);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        acked
    })
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each key's messages in the order they were published, by their payload's number.
fn per_key(published: &[Message]) -> BTreeMap<String, Vec<usize>> {
    let mut keys: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for message in published {
        let n = String::from_utf8_lossy(&message.payload)
            .trim_start_matches("order ")
            .parse()
            .expect("an order number");
        keys.entry(message.key.clone().unwrap_or_default())
            .or_default()
            .push(n);
    }
    keys
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_failover_the_table_relay_refuses_a_gone_slot_and_nothing_is_lost() {
    let setup = Setup::new().await;
    let broker = MemoryBroker::new();
    let relay = setup.relay(&broker, LostSlot::Fail);
    relay
        .prepare()
        .await
        .expect("the slot exists before the first order");
    let running = tokio::spawn(async move { relay.run_until(std::future::pending()).await });

    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(setup.store.clone(), Arc::clone(&stop));
    wait_until("200 messages published", || {
        broker.published("orders").len() >= 200
    })
    .await;
    setup.fail_over().await;
    // Orders go on on the new primary; the relay finds its slot gone there.
    let refused = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the relay stops within a minute of the failover")
        .expect("joined")
        .expect_err("the relay refuses to go on without its slot");
    stop.store(true, Ordering::SeqCst);
    let acked = producer.await.expect("joined");
    let refused = refused.to_string();
    assert!(
        refused.contains(&format!("replication slot \"{SLOT}\" is gone"))
            && refused.contains("may be lost")
            && refused.contains("on_lost_slot = \"recreate\""),
        "the error names the lost range and the way on: {refused}"
    );
    assert!(
        setup
            .store
            .replication_slots()
            .await
            .expect("slots")
            .is_empty(),
        "no slot was created again behind the operator's back"
    );

    // Synchronous replication: every commit that returned success is on the new
    // primary, and nothing was published for a transaction it does not have.
    let orders = setup.orders().await;
    let published = broker.published("orders");
    let published_ids: BTreeSet<MessageId> = published.iter().map(|m| m.id).collect();
    let missing: Vec<_> = acked.iter().filter(|id| !orders.contains(id)).collect();
    assert!(missing.is_empty(), "acknowledged commits lost: {missing:?}");
    let phantoms: Vec<_> = published_ids.difference(&orders).collect();
    assert!(
        phantoms.is_empty(),
        "published without a commit: {phantoms:?}"
    );
    // What the slot had not confirmed is still in the table: the range named is lost
    // to the log-tailing relay, not to the outbox.
    let pending = setup.pending().await;
    let unpublished: Vec<_> = orders
        .iter()
        .filter(|id| !published_ids.contains(id) && !pending.contains(id))
        .collect();
    assert!(
        unpublished.is_empty(),
        "committed, never published, not pending: {unpublished:?}"
    );
    assert!(
        !pending.is_empty(),
        "orders were committed on the new primary after the failover"
    );

    // The operator's way on: the slot created again (the loss counted), and a polling
    // relay for the rows of the range.
    let relay = setup.relay(&broker, LostSlot::Recreate);
    relay
        .prepare()
        .await
        .expect("told to, the relay creates the slot again");
    let poller = Relay::new(
        setup.store.outbox(),
        broker.publisher(),
        SpoolOptions::new().poll_interval(Duration::from_millis(20), Duration::from_millis(100)),
    )
    .expect("options");
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    let polling = tokio::spawn(async move {
        poller
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    wait_until("every order published", || {
        let ids: BTreeSet<MessageId> = broker.published("orders").iter().map(|m| m.id).collect();
        orders.is_subset(&ids)
    })
    .await;
    let _ = done.send(());
    polling
        .await
        .expect("joined")
        .expect("the polling relay stops");

    // Every order published at least once, copies under the same id (which consumers'
    // inboxes absorb), and each key in commit order by first copy.
    let published = broker.published("orders");
    let mut first = Vec::new();
    let mut seen = BTreeSet::new();
    for message in &published {
        if seen.insert(message.id) {
            first.push(message.clone());
        }
    }
    assert_eq!(seen, orders, "published exactly the committed orders");
    for (key, numbers) in per_key(&first) {
        assert!(
            numbers.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of commit order: {numbers:?}"
        );
    }
}
