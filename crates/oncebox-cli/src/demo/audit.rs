//! The audit at the end of the demo: how many times was each order charged?

use serde::Serialize;
use sqlx::Row;

use oncebox::sqlite::SqliteStore;

/// What the database says about the orders and their charges.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Charges {
    /// Committed orders.
    pub(crate) orders: u64,
    pub(crate) charged_once: u64,
    pub(crate) charged_more_than_once: u64,
    pub(crate) never_charged: u64,
    /// Charges for orders that do not exist (their checkout was rolled back).
    pub(crate) charges_without_order: u64,
}

impl Charges {
    pub(crate) async fn read(store: &SqliteStore) -> anyhow::Result<Self> {
        let row = sqlx::query(
            "WITH per_order AS (
                SELECT o.id, COUNT(c.charge_id) AS n
                FROM demo_orders o LEFT JOIN demo_charges c ON c.order_id = o.id
                GROUP BY o.id
            )
            SELECT
                (SELECT COUNT(*) FROM per_order),
                (SELECT COUNT(*) FROM per_order WHERE n = 1),
                (SELECT COUNT(*) FROM per_order WHERE n > 1),
                (SELECT COUNT(*) FROM per_order WHERE n = 0),
                (SELECT COUNT(*) FROM demo_charges
                    WHERE order_id NOT IN (SELECT id FROM demo_orders))",
        )
        .fetch_one(store.pool())
        .await?;
        let count =
            |i: usize| -> anyhow::Result<u64> { Ok(u64::try_from(row.try_get::<i64, _>(i)?)?) };
        Ok(Self {
            orders: count(0)?,
            charged_once: count(1)?,
            charged_more_than_once: count(2)?,
            never_charged: count(3)?,
            charges_without_order: count(4)?,
        })
    }

    /// Orders that have at least one charge.
    pub(crate) fn charged(&self) -> u64 {
        self.charged_once + self.charged_more_than_once
    }

    /// Every committed order charged exactly once, nothing else charged.
    pub(crate) fn exactly_once(&self) -> bool {
        self.charged_once == self.orders
            && self.charged_more_than_once == 0
            && self.never_charged == 0
            && self.charges_without_order == 0
    }
}
