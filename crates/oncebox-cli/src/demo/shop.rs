//! The two services of the demo: an order service that writes orders and `OrderPlaced`
//! events in one transaction, and a payment service that charges each order.

use oncebox::consumer::TxHandler;
use oncebox::sqlite::{SqliteOutbox, SqliteStore};
use oncebox::{Bytes, Error, Message, Received, Result};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, Transaction};

/// The tables of the two services (in one database file, for the demo's sake).
pub(crate) async fn create_tables(store: &SqliteStore) -> anyhow::Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS demo_orders (
            id TEXT PRIMARY KEY,
            customer TEXT NOT NULL,
            amount_cents INTEGER NOT NULL
        )",
    )
    .execute(store.pool())
    .await?;
    // No unique constraint on order_id: only the inbox stands between a redelivery and a
    // second charge, and the audit counts what got through.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS demo_charges (
            charge_id INTEGER PRIMARY KEY AUTOINCREMENT,
            order_id TEXT NOT NULL,
            amount_cents INTEGER NOT NULL
        )",
    )
    .execute(store.pool())
    .await?;
    Ok(())
}

/// The event the order service publishes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct OrderPlaced {
    pub(crate) order_id: String,
    pub(crate) customer: String,
    pub(crate) amount_cents: i64,
}

/// Whether a checkout committed or was abandoned (rolled back).
pub(crate) enum Checkout {
    Committed,
    RolledBack,
}

/// Writes one order and its `OrderPlaced` event in one transaction; `abandon` rolls the
/// transaction back after both writes, as a checkout that fails late would.
pub(crate) async fn place_order(
    store: &SqliteStore,
    outbox: &SqliteOutbox,
    order: &OrderPlaced,
    abandon: bool,
) -> anyhow::Result<Checkout> {
    let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query("INSERT INTO demo_orders (id, customer, amount_cents) VALUES (?, ?, ?)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(order.amount_cents)
        .execute(&mut *tx)
        .await?;
    let event = Message::json("orders", order)?
        .with_key(order.customer.clone())
        .with_kind("OrderPlaced");
    outbox.enqueue(&mut tx, &event).await?;
    if abandon {
        tx.rollback().await?;
        return Ok(Checkout::RolledBack);
    }
    tx.commit().await?;
    outbox.wake();
    Ok(Checkout::Committed)
}

/// The payment service's handler: charges the order inside the inbox's transaction.
pub(crate) struct ChargeOrder;

impl TxHandler<Transaction<'static, Sqlite>> for ChargeOrder {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Sqlite>,
    ) -> Result<Bytes> {
        let order: OrderPlaced = message.payload_json().map_err(Error::handler_permanent)?;
        let charge = sqlx::query("INSERT INTO demo_charges (order_id, amount_cents) VALUES (?, ?)")
            .bind(&order.order_id)
            .bind(order.amount_cents)
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        let receipt = serde_json::json!({ "charge_id": charge.last_insert_rowid() });
        Ok(Bytes::from(receipt.to_string()))
    }
}
