//! Batch enqueue on MySQL / MariaDB beyond the conformance suite: the key slots are the
//! ones `enqueue` locks, taken in a fixed order.

mod common;

use std::time::Duration;

use oncebox_core::Error;

use common::{TestDb, claim, msg};

/// Two keys, ordered by their slots in `oncebox_key_locks` as the server computes them.
async fn keys_in_slot_order(db: &TestDb) -> (String, String) {
    let (a, b) = ("a".to_owned(), "b".to_owned());
    let a_first: bool = sqlx::query_scalar("SELECT (CRC32(?) & 65535) < (CRC32(?) & 65535)")
        .bind(a.as_bytes())
        .bind(b.as_bytes())
        .fetch_one(db.store.pool())
        .await
        .expect("compare the key slots");
    if a_first { (a, b) } else { (b, a) }
}

/// A batch locks the slots `enqueue` locks, in ascending slot order, not slice order:
/// while another transaction holds the lower key (enqueued one by one), a batch of
/// [higher, lower] waits for it without holding the higher slot, so the other
/// transaction can still enqueue the higher key (in slice order, the two would
/// deadlock). Per key, the rows are then published in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn batch_locks_key_slots_in_a_fixed_order() {
    let db = TestDb::new().await;
    let outbox = db.store.outbox();
    let (low, high) = keys_in_slot_order(&db).await;

    let mut holder = db.store.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut holder, &msg(Some(&low), "holder-low"))
        .await
        .unwrap();

    let batch = vec![msg(Some(&high), "batch-high"), msg(Some(&low), "batch-low")];
    let batcher = {
        let pool = db.store.pool().clone();
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            outbox.enqueue_batch(&mut tx, &batch).await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        })
    };
    // The batch is now waiting for the lower key's slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !batcher.is_finished(),
        "the batch did not wait for the slot `enqueue` locked"
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        outbox.enqueue(&mut holder, &msg(Some(&high), "holder-high")),
    )
    .await
    .expect("the higher key's slot is free while the batch waits for the lower one")
    .expect("no deadlock");
    holder.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), batcher)
        .await
        .expect("the batch finishes once the holder commits")
        .unwrap()
        .expect("the batch commits");

    let (_, rows) = claim(&outbox, 10, Duration::from_secs(30)).await;
    let of = |key: &str| -> Vec<String> {
        rows.iter()
            .filter(|r| r.item.key.as_deref() == Some(key))
            .map(|r| String::from_utf8_lossy(&r.item.payload).into_owned())
            .collect()
    };
    assert_eq!(of(&low), ["holder-low", "batch-low"]);
    assert_eq!(of(&high), ["holder-high", "batch-high"]);
}
