//! PostgreSQL unreachable at each step: at enqueue, at the relay's claim, at the inbox's
//! record. The tests reach the server through a proxy of their own
//! ([`oncebox_testkit::proxy`]), which they cut (open connections dropped, new ones
//! closed at once) and restore; the shared server itself is never stopped.

mod common;

use std::time::Duration;

use oncebox_core::consumer::{ConsumerOptions, Outcome, TransactionalInbox, process_delivery};
use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::{ClaimRequest, LeaseToken, Relay, SpoolOptions, SpoolStore};
use oncebox_core::store::InboxStore;
use oncebox_core::{Publisher, Received, Result, Subscriber};
use oncebox_postgres::{PgStore, RowStatus};
use oncebox_testkit::proxy::Proxy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use common::{TestDb, enqueue, msg};

/// A proxy to the PostgreSQL server, for this test's clients only.
async fn proxy() -> Proxy {
    let options: PgConnectOptions = common::url().parse().expect("a valid ONCEBOX_PG_URL");
    let server = format!("{}:{}", options.get_host(), options.get_port());
    Proxy::start(server).await.expect("a proxy")
}

/// A store on `schema` (already migrated) whose connections go through `proxy`.
fn store_through(proxy: &Proxy, schema: &str) -> PgStore {
    let options: PgConnectOptions = common::url().parse().expect("a valid ONCEBOX_PG_URL");
    let options = options
        .host("127.0.0.1")
        .port(proxy.port())
        .options([("search_path", format!("{schema},public"))]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    PgStore::from_pool(pool)
        .with_schema(schema)
        .expect("a valid schema name")
}

/// The connection of the producer's transaction is cut before `enqueue`: the enqueue is
/// a store error classified as an outage (the transaction is lost with it; the caller
/// retries the whole transaction), and no row is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_down_at_enqueue_is_an_outage() {
    let db = TestDb::new().await;
    let proxy = proxy().await;
    let store = store_through(&proxy, &db.schema);
    let outbox = store.outbox();
    let mut tx = store.pool().begin().await.expect("begin through the proxy");
    proxy.cut();
    let message = msg(Some("k"), "lost with its transaction");
    let error = outbox
        .enqueue(&mut tx, &message)
        .await
        .expect_err("the connection is gone");
    assert!(error.is_outage(), "expected an outage, got {error:?}");
    drop(tx);
    proxy.restore();
    assert!(
        db.store
            .outbox()
            .status(message.id)
            .await
            .expect("status")
            .is_none(),
        "nothing was stored"
    );
}

/// The relay's claim and the inbox's record while the server is unreachable are store
/// errors classified as outages; a relay started while the server is down waits it out
/// and publishes once it is back, without spending an attempt.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_down_at_claim_and_record_is_an_outage_and_waited_out() {
    let db = TestDb::new().await;
    let message = msg(Some("k"), "waits for the store");
    enqueue(
        &db.store.outbox(),
        &db.store,
        std::slice::from_ref(&message),
    )
    .await;
    let proxy = proxy().await;
    let store = store_through(&proxy, &db.schema);
    proxy.cut();

    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 10,
        lease: Duration::from_secs(30),
    };
    let error = store
        .outbox()
        .claim(&request)
        .await
        .expect_err("no server to claim from");
    assert!(
        error.is_outage(),
        "claim: expected an outage, got {error:?}"
    );
    let error = store
        .inbox()
        .begin_recorded("billing", "order-1")
        .await
        .expect_err("no server to record in");
    assert!(
        error.is_outage(),
        "record: expected an outage, got {error:?}"
    );

    let broker = MemoryBroker::new();
    let options = SpoolOptions::new()
        .poll_interval(Duration::from_millis(50), Duration::from_millis(200))
        .max_attempts(2);
    let relay = Relay::new(store.outbox(), broker.publisher(), options).expect("options");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !running.is_finished(),
        "the relay gave up on a store outage"
    );
    assert!(broker.published("orders").is_empty());
    proxy.restore();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while broker.published("orders").is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not published within 20 s of the store's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    running
        .await
        .expect("joined")
        .expect("the relay ends cleanly");
    let state = db
        .store
        .outbox()
        .status(message.id)
        .await
        .expect("status")
        .expect("the row");
    assert_eq!(state.status, RowStatus::Done);
    assert_eq!(state.attempts, 0, "the outage spent no attempt");
}

async fn charge(message: &Received, tx: &mut Transaction<'static, Postgres>) -> Result<()> {
    sqlx::query("INSERT INTO charges (payload) VALUES ($1)")
        .bind(message.payload.to_vec())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A transactional inbox whose store is down when a delivery arrives holds the delivery
/// (no attempt spent, nothing dead-lettered) and handles it once the store is back.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_down_at_the_inbox_record_holds_the_delivery() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE charges (payload bytea NOT NULL)")
        .await;
    let proxy = proxy().await;
    let store = store_through(&proxy, &db.schema);
    let inbox = TransactionalInbox::new(
        store.inbox(),
        oncebox_core::consumer::handler_fn(charge),
        ConsumerOptions::new("billing").max_attempts(2),
    )
    .expect("options");
    let broker = MemoryBroker::new();
    let mut subscriber = broker.subscribe("orders", "billing");
    broker
        .publisher()
        .publish(&msg(Some("k"), "charge once"))
        .await
        .expect("published");
    let delivery = subscriber.next().await.expect("delivered");
    proxy.cut();
    let processing = tokio::spawn(async move { process_delivery(&inbox, delivery).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!processing.is_finished(), "the delivery was not held");
    proxy.restore();
    let outcome = tokio::time::timeout(Duration::from_secs(30), processing)
        .await
        .expect("handled within 30 s of the store's return")
        .expect("joined")
        .expect("settled");
    assert!(matches!(outcome, Outcome::Handled), "{outcome:?}");
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(db.store.pool())
        .await
        .expect("count");
    assert_eq!(charges, 1);
    assert!(broker.dead_letters("orders").is_empty());
}
