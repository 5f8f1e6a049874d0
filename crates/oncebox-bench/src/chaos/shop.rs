//! The chaos run's two services: the order service (in the controlling process) and the
//! payment service's handler (in each `oncebox-bench chaos-payments` process), with the
//! tables they share in the run's schema.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use oncebox::consumer::TxHandler;
use oncebox::postgres::cdc::PgMessageOutbox;
use oncebox::postgres::{PgOutbox, PgStore};
use oncebox::{Bytes, Error, Message, Received, Result};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::report::Published;

/// The topic of the order events.
pub(crate) const TOPIC: &str = "orders";

/// The event of an order: customer `customer`'s order number `seq` (from 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OrderPlaced {
    pub(crate) order_id: String,
    pub(crate) customer: String,
    pub(crate) seq: i64,
    pub(crate) amount_cents: i64,
}

impl OrderPlaced {
    /// Customer `customer`'s order number `seq`.
    pub(crate) fn new(customer: u32, seq: i64) -> Self {
        Self {
            order_id: format!("c{customer}-{seq}"),
            customer: format!("c{customer}"),
            seq,
            amount_cents: 100 + seq,
        }
    }
}

/// Creates the services' tables in `store`'s schema.
pub(crate) async fn create_tables(store: &PgStore) -> anyhow::Result<()> {
    let schema = store.schema();
    // No unique constraint on charges.order_id: only the inbox stands between a
    // redelivery and a second charge, and the audit counts what got through.
    let sql = format!(
        r#"CREATE TABLE "{schema}".orders (
            id text PRIMARY KEY, customer text NOT NULL, seq bigint NOT NULL,
            amount_cents bigint NOT NULL);
        CREATE TABLE "{schema}".charges (
            charge_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            order_id text NOT NULL, customer text NOT NULL, seq bigint NOT NULL,
            amount_cents bigint NOT NULL, charged_at timestamptz NOT NULL DEFAULT now());
        CREATE INDEX ON "{schema}".charges (order_id);
        CREATE TABLE "{schema}".charge_progress (
            customer text PRIMARY KEY, last_seq bigint NOT NULL, out_of_order bigint NOT NULL DEFAULT 0);"#
    );
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(store.pool())
        .await
        .context("creating the chaos run's tables")?;
    Ok(())
}

/// How the order service writes an order's event, in the order's transaction.
#[derive(Debug, Clone)]
pub(crate) enum EventOutbox {
    /// A row of the outbox table: for polling relays, and for log-tailing relays that
    /// read the table's inserts.
    Table(PgOutbox),
    /// A logical decoding message and no row, for log-tailing relays that read them.
    Messages(PgMessageOutbox),
}

impl EventOutbox {
    async fn enqueue(&self, conn: &mut sqlx::PgConnection, message: &Message) -> Result<()> {
        match self {
            Self::Table(outbox) => outbox.enqueue(conn, message).await,
            Self::Messages(outbox) => outbox.enqueue(conn, message).await,
        }
    }
}

/// Places `order`: the order row and its event in one transaction. Retries through
/// failures until it is committed, and tells a commit whose reply was lost (the
/// connection died during `COMMIT`) by looking for the order before trying again, so
/// that each order is committed exactly once. Returns the failed attempts.
pub(crate) async fn place(store: &PgStore, outbox: &EventOutbox, order: &OrderPlaced) -> u64 {
    let mut failures = 0;
    loop {
        match try_place(store, outbox, order).await {
            Ok(()) => return failures,
            Err(error) => {
                failures += 1;
                tracing::debug!(order = %order.order_id, error = %format!("{error:#}"), "placing an order failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(true) = exists(store, order).await {
                    return failures;
                }
            }
        }
    }
}

async fn try_place(
    store: &PgStore,
    outbox: &EventOutbox,
    order: &OrderPlaced,
) -> anyhow::Result<()> {
    let schema = store.schema();
    let mut tx = store.pool().begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        r#"INSERT INTO "{schema}".orders (id, customer, seq, amount_cents) VALUES ($1, $2, $3, $4)"#
    )))
    .bind(&order.order_id)
    .bind(&order.customer)
    .bind(order.seq)
    .bind(order.amount_cents)
    .execute(&mut *tx)
    .await?;
    let event = Message::json(TOPIC, order)?
        .with_key(order.customer.clone())
        .with_kind("OrderPlaced");
    outbox.enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    Ok(())
}

async fn exists(store: &PgStore, order: &OrderPlaced) -> anyhow::Result<bool> {
    let schema = store.schema();
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT EXISTS (SELECT FROM "{schema}".orders WHERE id = $1)"#
    )))
    .bind(&order.order_id)
    .fetch_one(store.pool())
    .await?)
}

/// The payment service's handler: charges the order inside the inbox's transaction, and
/// notes when a customer's orders arrive out of their order.
pub(crate) struct ChargeOrder {
    insert_charge: String,
    progress: String,
}

impl ChargeOrder {
    /// The handler for the tables in `schema`.
    pub(crate) fn new(schema: &str) -> Self {
        Self {
            insert_charge: format!(
                r#"INSERT INTO "{schema}".charges (order_id, customer, seq, amount_cents) VALUES ($1, $2, $3, $4)"#
            ),
            // The last order number charged per customer; an order that is not the next
            // one counts as out of order (it is charged all the same).
            progress: format!(
                r#"INSERT INTO "{schema}".charge_progress AS p (customer, last_seq, out_of_order)
                   VALUES ($1, $2, CASE WHEN $2 = 1 THEN 0 ELSE 1 END)
                   ON CONFLICT (customer) DO UPDATE SET
                     last_seq = greatest(p.last_seq, EXCLUDED.last_seq),
                     out_of_order = p.out_of_order + CASE WHEN EXCLUDED.last_seq = p.last_seq + 1 THEN 0 ELSE 1 END"#
            ),
        }
    }
}

impl TxHandler<Transaction<'static, Postgres>> for ChargeOrder {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<Bytes> {
        // A payload that is not an order is a permanent error: it is dead-lettered.
        let order: OrderPlaced = message.payload_json().map_err(Error::handler_permanent)?;
        sqlx::query(AssertSqlSafe(self.insert_charge.as_str()))
            .bind(&order.order_id)
            .bind(&order.customer)
            .bind(order.seq)
            .bind(order.amount_cents)
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        sqlx::query(AssertSqlSafe(self.progress.as_str()))
            .bind(&order.customer)
            .bind(order.seq)
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::from(format!("charged {}", order.order_id)))
    }
}

/// What the audit found in the tables.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Ledger {
    /// Orders committed.
    pub(crate) committed: u64,
    /// Committed orders charged exactly once.
    pub(crate) charged_once: u64,
    /// Committed orders never charged.
    pub(crate) never_charged: u64,
    /// Committed orders charged more than once.
    pub(crate) charged_twice: u64,
    /// Charges of orders that were never committed.
    pub(crate) phantom_charges: u64,
    /// Charges that reached the payment service before an earlier order of the same
    /// customer (with several payment processes on a broker that hands a key's messages
    /// to any of them, arrival order is the broker's, not the relay's).
    pub(crate) charged_out_of_order: u64,
}

/// What reached the payment service, read from its side, for a broker the audit cannot
/// read back (SQS, whose queue the payment processes consume and delete): the orders
/// found are the committed orders charged, those out of order the charges that came
/// before an earlier order of their customer, the duplicates those the inbox of `group`
/// skipped, and an order the database does not have one charged all the same.
/// `unreadable` is what the payment service dead-lettered as no order, which the caller
/// counts on the broker.
pub(crate) async fn delivered(
    store: &PgStore,
    group: &str,
    ledger: &Ledger,
    unreadable: u64,
) -> anyhow::Result<Published> {
    let schema = store.schema();
    let (skipped, phantoms): (Option<i64>, i64) = sqlx::query_as(AssertSqlSafe(format!(
        r#"SELECT
             (SELECT sum(skipped)::bigint FROM "{schema}".inbox_duplicates WHERE consumer = $1),
             (SELECT count(DISTINCT c.order_id) FROM "{schema}".charges c
              WHERE NOT EXISTS (SELECT FROM "{schema}".orders o WHERE o.id = c.order_id))"#
    )))
    .bind(group)
    .fetch_one(store.pool())
    .await
    .context("reading what reached the payment service")?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Published {
        orders: ledger.charged_once + ledger.charged_twice,
        duplicates: count(skipped.unwrap_or(0)),
        missing: ledger.never_charged,
        out_of_order: ledger.charged_out_of_order,
        unreadable,
        not_in_database: count(phantoms),
    })
}

/// Counts the charges of every order.
pub(crate) async fn ledger(store: &PgStore) -> anyhow::Result<Ledger> {
    let schema = store.schema();
    let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        r#"WITH per_order AS (
             SELECT o.id, count(c.charge_id) AS charges
             FROM "{schema}".orders o LEFT JOIN "{schema}".charges c ON c.order_id = o.id
             GROUP BY o.id)
           SELECT
             (SELECT count(*) FROM per_order),
             (SELECT count(*) FROM per_order WHERE charges = 1),
             (SELECT count(*) FROM per_order WHERE charges = 0),
             (SELECT count(*) FROM per_order WHERE charges > 1),
             (SELECT count(*) FROM "{schema}".charges c
               WHERE NOT EXISTS (SELECT FROM "{schema}".orders o WHERE o.id = c.order_id)),
             (SELECT coalesce(sum(out_of_order), 0)::bigint FROM "{schema}".charge_progress)"#
    )))
    .fetch_one(store.pool())
    .await
    .context("auditing the charges")?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Ledger {
        committed: count(row.0),
        charged_once: count(row.1),
        never_charged: count(row.2),
        charged_twice: count(row.3),
        phantom_charges: count(row.4),
        charged_out_of_order: count(row.5),
    })
}

/// The ids of the committed orders, for the audit of the broker's log.
pub(crate) async fn committed_ids(
    store: &PgStore,
) -> anyhow::Result<std::collections::HashSet<String>> {
    let schema = store.schema();
    let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT id FROM "{schema}".orders"#
    )))
    .fetch_all(store.pool())
    .await
    .context("reading the committed orders")?;
    Ok(ids.into_iter().collect())
}

/// Orders charged at least once, to follow the drain.
pub(crate) async fn charged(store: &PgStore) -> anyhow::Result<u64> {
    let schema = store.schema();
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT count(DISTINCT order_id) FROM "{schema}".charges"#
    )))
    .fetch_one(store.pool())
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Order writers, each owning a share of the customers.
const WRITERS: u32 = 8;

/// The order service: `orders` orders spread over `customers` customers, order `i` due
/// at `i / rate` seconds; writer `w` places the orders of the customers `c` with
/// `c % WRITERS == w`, one at a time, so each customer's orders commit in order. Returns
/// the WAL position read once the last order committed.
pub(crate) async fn place_orders(
    store: PgStore,
    outbox: EventOutbox,
    orders: u64,
    customers: u32,
    rate: u32,
    placed: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
) -> String {
    let start = tokio::time::Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (store, outbox) = (store.clone(), outbox.clone());
        let (placed, retries) = (Arc::clone(&placed), Arc::clone(&retries));
        writers.spawn(async move {
            for i in 0..orders {
                let customer = u32::try_from(i % u64::from(customers)).unwrap_or(0);
                if customer % WRITERS != writer {
                    continue;
                }
                let due = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
                tokio::time::sleep_until(due).await;
                let seq = i64::try_from(i / u64::from(customers)).unwrap_or(i64::MAX) + 1;
                let order = OrderPlaced::new(customer, seq);
                let failed = place(&store, &outbox, &order).await;
                retries.fetch_add(failed, Ordering::Relaxed);
                placed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while writers.join_next().await.is_some() {}
    super::cdc::wal_position(&store).await
}
