//! 8 workers receive each of 2,000 messages 3 times, the copies at about the same moment
//! on different workers, through `MySqlInbox` and the transactional inbox engine: the
//! handler's row exists exactly once per message.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::consumer::{ConsumerOptions, Outcome, TransactionalInbox, TxHandler};
use oncebox_core::{Bytes, Coordinates, Error, Message, Received, Result};
use sqlx::{MySql, Transaction};
use tokio::sync::Barrier;

use common::TestDb;

const WORKERS: usize = 8;
const MESSAGES: usize = 2_000;
const COPIES: usize = 3;

/// Inserts one effect row per run into a table without a unique constraint, so that a
/// second effect would be counted, not refused.
struct Charge;

impl TxHandler<Transaction<'static, MySql>> for Charge {
    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, MySql>,
    ) -> Result<Bytes> {
        let order = String::from_utf8_lossy(&message.payload).into_owned();
        sqlx::query("INSERT INTO charges (order_id) VALUES (?)")
            .bind(order.clone())
            .execute(&mut **tx)
            .await
            .map_err(Error::store_transient)?;
        Ok(Bytes::from(format!("charged {order}")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_have_exactly_one_effect() {
    let db = TestDb::with_connections(10).await;
    db.exec("CREATE TABLE charges (order_id VARBINARY(64) NOT NULL)")
        .await;
    let inbox = Arc::new(
        TransactionalInbox::new(db.store.inbox(), Charge, ConsumerOptions::new("billing"))
            .expect("valid options"),
    );
    let messages: Vec<Received> = (0..MESSAGES)
        .map(|i| {
            let message =
                Message::new("payments", format!("order-{i}")).with_key(format!("k{}", i % 50));
            let at = Coordinates {
                source: "payments".into(),
                partition: Some(0),
                position: i.to_string(),
            };
            Received::from_message(&message, at, 1)
        })
        .collect();
    // The copies of a message side by side, dealt round-robin: neighbouring workers get
    // the copies of one message at about the same time.
    let deliveries: Vec<(usize, Received)> = (0..MESSAGES)
        .flat_map(|i| std::iter::repeat_n(i, COPIES))
        .map(|i| (i, messages[i].clone()))
        .collect();
    let barrier = Arc::new(Barrier::new(WORKERS));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let mine: Vec<(usize, Received)> = deliveries
            .iter()
            .skip(worker)
            .step_by(WORKERS)
            .cloned()
            .collect();
        let (inbox, barrier) = (Arc::clone(&inbox), Arc::clone(&barrier));
        workers.spawn(async move {
            barrier.wait().await;
            let mut outcomes = Vec::with_capacity(mine.len());
            for (index, message) in mine {
                let (outcome, result) = inbox
                    .handle(&message)
                    .await
                    .unwrap_or_else(|e| panic!("worker {worker}, message {index}: {e:?}"));
                outcomes.push((index, outcome, result));
            }
            outcomes
        });
    }
    let mut outcomes = Vec::with_capacity(MESSAGES * COPIES);
    while let Some(joined) = tokio::time::timeout(Duration::from_secs(120), workers.join_next())
        .await
        .expect("workers finish within 2 minutes")
    {
        outcomes.extend(joined.expect("worker"));
    }
    assert_eq!(outcomes.len(), MESSAGES * COPIES);

    let mut handled = vec![0usize; MESSAGES];
    for (index, outcome, result) in &outcomes {
        assert_eq!(result.as_ref(), format!("charged order-{index}").as_bytes());
        match outcome {
            Outcome::Handled => handled[*index] += 1,
            Outcome::Duplicate => {}
            other => panic!("message {index}: unexpected outcome {other:?}"),
        }
    }
    for (index, count) in handled.iter().enumerate() {
        assert_eq!(*count, 1, "message {index} was handled {count} times");
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT CAST(order_id AS CHAR) AS order_id, COUNT(*) FROM charges GROUP BY order_id",
    )
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    let effects: HashMap<String, i64> = rows.into_iter().collect();
    assert_eq!(effects.len(), MESSAGES, "every message has its effect");
    for i in 0..MESSAGES {
        assert_eq!(
            effects.get(&format!("order-{i}")).copied(),
            Some(1),
            "order-{i}: exactly one effect row"
        );
    }
}
