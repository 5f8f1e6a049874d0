//! The SQLite dedup store of the idempotent receiver.

mod common;

use std::time::Duration;

use common::{LONG, SHORT, db};
use oncebox_core::store::{Begin, DedupStore, FencingToken};
use oncebox_core::{Bytes, Error};

const TTL: Duration = Duration::from_secs(3600);

fn started(begin: Begin) -> FencingToken {
    match begin {
        Begin::Started(token) => token,
        other => panic!("expected Started, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_begins_start_once() {
    let db = db().await;
    let dedup = db.store.dedup();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let dedup = dedup.clone();
        tasks.push(tokio::spawn(async move {
            dedup.begin("id", LONG).await.unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let started = outcomes
        .iter()
        .filter(|b| matches!(b, Begin::Started(_)))
        .count();
    assert_eq!(started, 1, "{outcomes:?}");
    for outcome in &outcomes {
        if let Begin::InProgress { retry_after } = outcome {
            assert!(*retry_after <= LONG && *retry_after > LONG - Duration::from_secs(10));
        }
    }
}

#[tokio::test]
async fn complete_answers_duplicates_until_the_ttl_ends() {
    let db = db().await;
    let dedup = db.store.dedup();
    let token = started(dedup.begin("id", LONG).await.unwrap());
    dedup
        .complete("id", token, b"receipt", SHORT)
        .await
        .unwrap();
    assert_eq!(
        dedup.begin("id", LONG).await.unwrap(),
        Begin::Completed(Bytes::from_static(b"receipt"))
    );
    // Completing twice is refused: the token no longer holds the id.
    assert!(matches!(
        dedup.complete("id", token, b"again", TTL).await,
        Err(Error::LeaseLost)
    ));

    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    let next = started(dedup.begin("id", LONG).await.unwrap());
    assert!(next > token, "tokens only grow");
}

#[tokio::test]
async fn an_expired_lease_frees_the_id_with_a_larger_token_and_fences_the_old_one() {
    let db = db().await;
    let dedup = db.store.dedup();
    let old = started(dedup.begin("id", SHORT).await.unwrap());
    assert!(matches!(
        dedup.begin("id", SHORT).await.unwrap(),
        Begin::InProgress { .. }
    ));

    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    let new = started(dedup.begin("id", LONG).await.unwrap());
    assert!(new > old);
    assert!(matches!(
        dedup.complete("id", old, b"late", TTL).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        dedup.abandon("id", old).await,
        Err(Error::LeaseLost)
    ));
    assert!(
        matches!(
            dedup.begin("id", LONG).await.unwrap(),
            Begin::InProgress { .. }
        ),
        "stale calls changed nothing"
    );
    dedup.complete("id", new, b"ok", TTL).await.unwrap();
    assert_eq!(
        dedup.begin("id", LONG).await.unwrap(),
        Begin::Completed(Bytes::from_static(b"ok"))
    );
}

#[tokio::test]
async fn a_holder_whose_lease_ended_cannot_complete_even_if_nobody_took_over() {
    let db = db().await;
    let dedup = db.store.dedup();
    let token = started(dedup.begin("id", SHORT).await.unwrap());
    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    assert!(matches!(
        dedup.complete("id", token, b"late", TTL).await,
        Err(Error::LeaseLost)
    ));
}

#[tokio::test]
async fn abandon_frees_at_once_and_tokens_never_repeat() {
    let db = db().await;
    let dedup = db.store.dedup();
    let first = started(dedup.begin("id", LONG).await.unwrap());
    dedup.abandon("id", first).await.unwrap();
    let second = started(dedup.begin("id", LONG).await.unwrap());
    assert!(second > first);
    assert!(matches!(
        dedup.abandon("id", first).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        dedup.complete("other", second, b"", TTL).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        dedup.abandon("id", FencingToken(u64::MAX)).await,
        Err(Error::LeaseLost)
    ));
}

#[tokio::test]
async fn purge_expired_is_bounded_and_keeps_live_records() {
    let db = db().await;
    let dedup = db.store.dedup();
    for i in 0..5 {
        let token = started(dedup.begin(&format!("done-{i}"), LONG).await.unwrap());
        dedup
            .complete(&format!("done-{i}"), token, b"", Duration::from_millis(1))
            .await
            .unwrap();
    }
    let crashed = started(
        dedup
            .begin("crashed", Duration::from_millis(1))
            .await
            .unwrap(),
    );
    let live = started(dedup.begin("live", LONG).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;

    assert_eq!(dedup.purge_expired(4).await.unwrap(), 4);
    assert_eq!(dedup.purge_expired(0).await.unwrap(), 0);
    assert_eq!(dedup.purge_expired(10).await.unwrap(), 2);
    assert_eq!(dedup.purge_expired(10).await.unwrap(), 0);
    assert!(matches!(
        dedup.begin("live", LONG).await.unwrap(),
        Begin::InProgress { .. }
    ));
    dedup.complete("live", live, b"", TTL).await.unwrap();

    // A purged id starts again with a token larger than any issued before.
    let again = started(dedup.begin("crashed", LONG).await.unwrap());
    assert!(again > crashed && again > live);
}
