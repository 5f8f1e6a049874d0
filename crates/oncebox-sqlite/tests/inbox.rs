//! The SQLite transactional inbox and durable inbox.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{LONG, SHORT, db};
use oncebox_core::consumer::{ConsumerOptions, DurableInbox, TxHandler};
use oncebox_core::spool::{ClaimRequest, LeaseToken, Settle, Settlement, SpoolOptions, SpoolStore};
use oncebox_core::store::{Accepted, DurableInboxStore, InboxStore, Recorded, Transactional};
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Bytes, Coordinates, Error, Message, Received, Result};
use oncebox_sqlite::{SqliteDurableInbox, SqliteStore};
use sqlx::{Sqlite, Transaction};

async fn effects_table(store: &SqliteStore) {
    sqlx::query("CREATE TABLE effects (id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create the effects table");
}

async fn count_effects(store: &SqliteStore, id: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE id = ?1")
        .bind(id.to_owned())
        .fetch_one(store.pool())
        .await
        .expect("count effects")
}

fn received(key: Option<&str>, label: &str, offset: u64) -> Received {
    let mut message = Message::new("payments", label.to_owned()).with_kind("Charge");
    message.key = key.map(str::to_owned);
    let coordinates = Coordinates {
        source: "payments".into(),
        partition: Some(3),
        position: offset.to_string(),
    };
    Received::from_message(&message, coordinates, 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_record_once_and_see_the_first_result() {
    let db = db().await;
    effects_table(&db.store).await;
    let inbox = db.store.inbox();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let inbox = inbox.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = inbox.begin().await.unwrap();
            match inbox.record(&mut tx, "billing", "msg-1").await.unwrap() {
                Recorded::New => {
                    sqlx::query("INSERT INTO effects (id) VALUES ('msg-1')")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inbox
                        .store_result(
                            &mut tx,
                            "billing",
                            "msg-1",
                            format!("charged by {i}").as_bytes(),
                        )
                        .await
                        .unwrap();
                    inbox.commit(tx).await.unwrap();
                    None
                }
                Recorded::Duplicate { result } => Some(result),
            }
        }));
    }
    let mut new = 0;
    let mut results = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            None => new += 1,
            Some(result) => results.push(result),
        }
    }
    assert_eq!(new, 1, "exactly one worker records the id");
    assert_eq!(count_effects(&db.store, "msg-1").await, 1);
    let first = &results[0];
    assert!(first.starts_with(b"charged by "));
    assert!(
        results.iter().all(|r| r == first),
        "every duplicate sees the first result"
    );

    // Another consumer has its own record.
    let mut tx = inbox.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "shipping", "msg-1").await.unwrap(),
        Recorded::New
    );
}

#[tokio::test]
async fn a_rolled_back_record_leaves_the_id_new() {
    let db = db().await;
    let inbox = db.store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "c", "id").await.unwrap(),
        Recorded::New
    );
    drop(tx);
    let mut tx = inbox.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "c", "id").await.unwrap(),
        Recorded::New
    );
    inbox.commit(tx).await.unwrap();
    let mut tx = inbox.begin().await.unwrap();
    assert_eq!(
        inbox.record(&mut tx, "c", "id").await.unwrap(),
        Recorded::Duplicate {
            result: Bytes::new()
        },
        "a record without a stored result answers an empty result"
    );
}

#[tokio::test]
async fn inbox_purge_is_bounded() {
    let db = db().await;
    let inbox = db.store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    for i in 0..5 {
        inbox
            .record(&mut tx, "c", &format!("id-{i}"))
            .await
            .unwrap();
    }
    inbox.commit(tx).await.unwrap();
    let past = SystemTime::now() - Duration::from_secs(60);
    assert_eq!(InboxStore::purge(&inbox, "c", past, 10).await.unwrap(), 0);
    let future = SystemTime::now() + Duration::from_secs(60);
    assert_eq!(InboxStore::purge(&inbox, "c", future, 2).await.unwrap(), 2);
    assert_eq!(InboxStore::purge(&inbox, "c", future, 10).await.unwrap(), 3);
}

#[tokio::test]
async fn durable_accept_dedups_per_consumer() {
    let db = db().await;
    let billing = db.store.durable_inbox("billing");
    let shipping = db.store.durable_inbox("shipping");
    let delivery = received(Some("order-1"), "charge", 7);
    assert_eq!(
        billing.accept("id-1", &delivery).await.unwrap(),
        Accepted::New
    );
    assert_eq!(
        billing.accept("id-1", &delivery).await.unwrap(),
        Accepted::Duplicate
    );
    assert_eq!(
        shipping.accept("id-1", &delivery).await.unwrap(),
        Accepted::New
    );

    // Each consumer claims only its rows, and gets the delivery back as stored.
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 10,
        lease: LONG,
    };
    let rows = billing.claim(&request).await.unwrap();
    assert_eq!(rows.len(), 1);
    let mut expected = delivery.clone();
    // Times are kept to the millisecond.
    expected.created_at = expected
        .created_at
        .map(|t| from_unix_millis(to_unix_millis(t)));
    assert_eq!(rows[0].item, expected);
    assert_eq!(rows[0].attempts, 0);
    let mut tx = billing.begin().await.unwrap();
    billing
        .complete(&mut tx, request.token, rows[0].seq, b"ok")
        .await
        .unwrap();
    billing.commit(tx).await.unwrap();
    assert_eq!(
        billing.accept("id-1", &delivery).await.unwrap(),
        Accepted::Duplicate,
        "done rows still dedup"
    );

    let other = shipping
        .claim(&ClaimRequest {
            token: LeaseToken::new(),
            limit: 10,
            lease: LONG,
        })
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_ne!(other[0].seq, rows[0].seq);
}

#[tokio::test]
async fn durable_complete_is_fenced_by_the_lease_token() {
    let db = db().await;
    let inbox = db.store.durable_inbox("billing");
    inbox
        .accept("id-1", &received(Some("k"), "a", 1))
        .await
        .unwrap();
    inbox
        .accept("id-2", &received(Some("k"), "b", 2))
        .await
        .unwrap();

    let old = ClaimRequest {
        token: LeaseToken::new(),
        limit: 1,
        lease: SHORT,
    };
    let rows = inbox.claim(&old).await.unwrap();
    assert_eq!(rows.len(), 1);
    let seq = rows[0].seq;

    // A token that never held the row.
    let mut tx = inbox.begin().await.unwrap();
    assert!(matches!(
        inbox.complete(&mut tx, LeaseToken::new(), seq, b"x").await,
        Err(Error::LeaseLost)
    ));
    drop(tx);

    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    let new = ClaimRequest {
        token: LeaseToken::new(),
        limit: 10,
        lease: LONG,
    };
    let again = inbox.claim(&new).await.unwrap();
    assert_eq!(again.len(), 2);
    assert_eq!(again[0].seq, seq);

    let mut tx = inbox.begin().await.unwrap();
    assert!(matches!(
        inbox.complete(&mut tx, old.token, seq, b"late").await,
        Err(Error::LeaseLost)
    ));
    drop(tx);
    let mut tx = inbox.begin().await.unwrap();
    inbox
        .complete(&mut tx, new.token, seq, b"ok")
        .await
        .unwrap();
    inbox.commit(tx).await.unwrap();

    // The spool's own Done for the completed row is a no-op; release the other.
    let settlements = vec![
        Settlement {
            seq,
            outcome: Settle::Done,
        },
        Settlement {
            seq: again[1].seq,
            outcome: Settle::Retry {
                at: SystemTime::now(),
                error: "later".into(),
            },
        },
    ];
    inbox.settle(new.token, &settlements).await.unwrap();
    let rows = inbox
        .claim(&ClaimRequest {
            token: LeaseToken::new(),
            limit: 10,
            lease: LONG,
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].attempts, 1);
    assert_eq!(
        inbox
            .purge(SystemTime::now() + Duration::from_secs(1), 10)
            .await
            .unwrap(),
        1
    );
}

struct RecordEffect;

impl TxHandler<Transaction<'static, Sqlite>> for RecordEffect {
    type Output = Bytes;

    async fn handle(
        &self,
        message: &Received,
        tx: &mut Transaction<'static, Sqlite>,
    ) -> Result<Bytes> {
        let id = message.id.map(|id| id.to_string()).unwrap_or_default();
        sqlx::query("INSERT INTO effects (id) VALUES (?1)")
            .bind(id)
            .execute(&mut **tx)
            .await
            .map_err(Error::handler)?;
        Ok(Bytes::from_static(b"done"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_processor_runs_each_effect_once() {
    let db = db().await;
    effects_table(&db.store).await;
    let store: SqliteDurableInbox = db.store.durable_inbox("billing");
    let inbox =
        Arc::new(DurableInbox::new(store.clone(), ConsumerOptions::new("billing")).unwrap());
    let deliveries: Vec<Received> = (0..6)
        .map(|i| received(Some(&format!("k{}", i % 2)), "x", i))
        .collect();
    for delivery in deliveries.iter().chain(&deliveries) {
        let id = delivery.id.unwrap().to_string();
        store.accept(&id, delivery).await.unwrap();
    }
    let processor = inbox
        .processor(RecordEffect, SpoolOptions::new().name("billing"))
        .unwrap();
    while processor.run_once().await.unwrap().claimed > 0 {}
    for delivery in &deliveries {
        assert_eq!(
            count_effects(&db.store, &delivery.id.unwrap().to_string()).await,
            1
        );
    }
}

async fn record_payload(message: &Received, tx: &mut Transaction<'static, Sqlite>) -> Result<()> {
    sqlx::query("INSERT INTO effects (id) VALUES (?1)")
        .bind(String::from_utf8_lossy(&message.payload).into_owned())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The id is the message's identity: a second message with the same id and another
/// payload is a duplicate, its handler never runs, the first effect stands.
#[tokio::test]
async fn the_same_id_with_another_payload_is_a_duplicate_of_the_first() {
    use oncebox_core::consumer::{Outcome, Process, TransactionalInbox, handler_fn};
    let db = db().await;
    effects_table(&db.store).await;
    let inbox = TransactionalInbox::new(
        db.store.inbox(),
        handler_fn(record_payload),
        ConsumerOptions::new("billing"),
    )
    .expect("options");
    let first = Message::new("payments", "first");
    let second = Message::new("payments", "second").with_id(first.id);
    let mut outcomes = Vec::new();
    for message in [&first, &second] {
        let received = Received::from_message(message, Coordinates::default(), 1);
        outcomes.push(inbox.process(&received).await.expect("processed"));
    }
    assert!(
        matches!(outcomes[..], [Outcome::Handled, Outcome::Duplicate]),
        "{outcomes:?}"
    );
    assert_eq!(count_effects(&db.store, "first").await, 1);
    assert_eq!(count_effects(&db.store, "second").await, 0);
}
