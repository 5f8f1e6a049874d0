//! Batch enqueue: a whole batch commits or rolls back with the business row, is
//! published as if enqueued one by one, and is refused whole.

use std::collections::HashMap;
use std::time::Duration;

use oncebox_core::memory::MemoryBroker;
use oncebox_core::spool::Relay;
use oncebox_core::{Bytes, Error, InvalidMessage, Message, MessageId};

use super::relay::{relay_options, run_relays_until};
use super::{LONG_LEASE, OutboxHarness, TOPIC, claim, label, labels, message, released, settle};
use crate::support::ok;

/// Messages in the large batches.
const BATCH: usize = 1000;
/// Keys the large batches spread their keyed messages over.
const KEYS: usize = 10;

/// Key number `k` of the large batches (the first not ASCII).
fn key_name(k: usize) -> String {
    match k % KEYS {
        0 => "clé-🦀".to_owned(),
        k => format!("batch-{k}"),
    }
}

/// The key of message `i` of a large batch: one of [`KEYS`] keys, or none for every
/// seventh message.
fn batch_key(i: usize) -> Option<String> {
    (i % 7 != 3).then(|| key_name(i))
}

/// A large batch, labelled `{prefix}{i}`, with a binary payload, an empty one and a kind
/// not ASCII among them.
fn large_batch(prefix: &str) -> Vec<Message> {
    (0..BATCH)
        .map(|i| {
            let mut m = message(batch_key(i).as_deref(), &format!("{prefix}{i}"));
            match i {
                500 => m.payload = Bytes::from_static(&[0, 0xff, 0xfe, b'\n', 0x80]),
                501 => m.payload = Bytes::new(),
                502 => m = m.with_kind("Bestellung-✓-🦀"),
                _ => {}
            }
            m
        })
        .collect()
}

/// A batch of 1,000 messages on 10 keys and none (one key and one kind not ASCII; a
/// binary payload and an empty one among them), enqueued with a business row in one transaction that
/// commits, between one-by-one enqueues of the first key before and after it: the
/// business row is there; two relays publish every message once, with its id, topic,
/// key, kind, headers and payload, and each key's messages in the order of the
/// one-by-one message before, the batch's slice, the one after.
pub async fn batch_commits_with_the_business_row<H: OutboxHarness>(harness: &H) {
    let first_key = Some(key_name(0));
    let before = message(first_key.as_deref(), "before");
    ok(
        "enqueue one before the batch",
        harness.enqueue_one(&before).await,
    );
    let batch = large_batch("b");
    ok(
        "enqueue a batch of 1,000 with a business row, committed",
        harness.enqueue_batch("batch-commit", &batch, true).await,
    );
    let after = message(first_key.as_deref(), "after");
    ok(
        "enqueue one after the batch",
        harness.enqueue_one(&after).await,
    );
    assert_eq!(
        ok("business rows", harness.business_rows("batch-commit").await),
        1,
        "the business row of the batch's transaction must be committed"
    );

    let mut sent = vec![before];
    sent.extend(batch);
    sent.push(after);
    let broker = MemoryBroker::new();
    let relay = |name: &str| {
        ok(
            name,
            Relay::new(
                harness.store(),
                broker.publisher(),
                relay_options(name).batch_size(128),
            ),
        )
    };
    let relays = [relay("relay-a"), relay("relay-b")];
    run_relays_until(
        "two relays draining the batch",
        &relays,
        Duration::from_secs(30),
        || broker.published(TOPIC).len() >= sent.len(),
    )
    .await;

    let published = broker.published(TOPIC);
    assert_eq!(
        published.len(),
        sent.len(),
        "every message of the batch and around it must be published exactly once"
    );
    let by_id: HashMap<MessageId, &Message> = published.iter().map(|m| (m.id, m)).collect();
    for m in &sent {
        let Some(got) = by_id.get(&m.id) else {
            panic!("{} was never published under its id", label(m));
        };
        assert_eq!(
            (&got.topic, &got.key, &got.kind, &got.payload),
            (&m.topic, &m.key, &m.kind, &m.payload),
            "{} was published with other contents",
            label(m)
        );
        assert_eq!(
            got.headers.get("traceparent"),
            m.headers.get("traceparent"),
            "{} lost its traceparent",
            label(m)
        );
    }
    // Messages without a key are published in no particular order.
    for k in 0..KEYS {
        let key = Some(key_name(k));
        let want: Vec<String> = sent.iter().filter(|m| m.key == key).map(label).collect();
        let got: Vec<String> = published
            .iter()
            .filter(|m| m.key == key)
            .map(label)
            .collect();
        assert_eq!(
            got, want,
            "key {key:?}: publish order differs from the order of enqueue"
        );
    }
}

/// A batch of 1,000 messages enqueued with a business row in one transaction that rolls
/// back leaves neither: no row of the batch, nothing claimable. Its ids are free: the
/// same batch enqueued again and committed is claimed whole, in slice order.
pub async fn batch_rolls_back_with_the_business_row<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let batch = large_batch("ghost");
    ok(
        "enqueue a batch of 1,000 with a business row, rolled back",
        harness.enqueue_batch("batch-rollback", &batch, false).await,
    );
    assert_eq!(
        ok(
            "business rows",
            harness.business_rows("batch-rollback").await
        ),
        0,
        "the rolled-back business row is gone"
    );
    for m in &batch {
        assert_eq!(
            ok("row_state", harness.row_state(m.id).await),
            None,
            "rolled-back {} left a row",
            label(m)
        );
    }
    let (_, rows) = claim("claim after the rollback", &store, 2 * BATCH, LONG_LEASE).await;
    assert!(
        rows.is_empty(),
        "rolled-back messages are claimable: {:?}",
        labels(&rows)
    );

    ok(
        "enqueue the same batch again, committed",
        harness.enqueue_batch("batch-again", &batch, true).await,
    );
    let (token, rows) = claim("claim the batch", &store, 2 * BATCH, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        batch.iter().map(label).collect::<Vec<_>>(),
        "the batch's rows must be claimed whole, in slice order"
    );
    settle("release the batch", &store, token, released(&rows)).await;
}

/// A batch is refused whole, with the error `enqueue` gives, and nothing of it is
/// written, while the transaction stays usable (its business row commits): an id
/// already in the table, in the middle of the batch, is [`Error::Duplicate`] naming it;
/// an id twice in the batch too; an invalid message in the middle is
/// [`Error::InvalidMessage`]. An empty batch does nothing. The refused batch, mended,
/// then commits.
pub async fn batch_refusal_writes_nothing<H: OutboxHarness>(harness: &H) {
    let store = harness.store();
    let present = message(Some("k"), "present");
    ok("enqueue one", harness.enqueue_one(&present).await);
    let fresh = |prefix: &str| -> Vec<Message> {
        (0..20)
            .map(|i| message(Some(["k", "j"][i % 2]), &format!("{prefix}{i}")))
            .collect()
    };
    let assert_nothing_written = |what: &str, batch: &[Message], skip: Option<MessageId>| {
        let what = what.to_owned();
        let ids: Vec<(MessageId, String)> = batch
            .iter()
            .filter(|m| Some(m.id) != skip)
            .map(|m| (m.id, label(m)))
            .collect();
        async move {
            for (id, name) in ids {
                assert_eq!(
                    ok("row_state", harness.row_state(id).await),
                    None,
                    "{what}: {name} was written"
                );
            }
        }
    };

    ok(
        "enqueue an empty batch",
        harness.enqueue_batch("empty", &[], true).await,
    );
    assert_eq!(
        ok("business rows", harness.business_rows("empty").await),
        1,
        "an empty batch must leave the transaction usable"
    );

    let mut in_table = fresh("in-table-");
    in_table[10] = message(Some("other"), "copy").with_id(present.id);
    match harness.enqueue_batch("in-table", &in_table, true).await {
        Err(Error::Duplicate { id }) => assert_eq!(
            id, present.id,
            "a batch with an id in the table: Duplicate must name it"
        ),
        other => panic!(
            "a batch with an id already in the table: expected Error::Duplicate, got {other:?}"
        ),
    }
    assert_nothing_written(
        "a batch with an id in the table",
        &in_table,
        Some(present.id),
    )
    .await;
    assert_eq!(
        ok("business rows", harness.business_rows("in-table").await),
        1,
        "a batch refused for an id in the table must leave the transaction usable"
    );

    let mut twice = fresh("twice-");
    let repeated = twice[2].id;
    twice[12] = message(Some("j"), "repeat").with_id(repeated);
    match harness.enqueue_batch("twice", &twice, true).await {
        Err(Error::Duplicate { id }) => assert_eq!(
            id, repeated,
            "a batch with an id twice: Duplicate must name it"
        ),
        other => panic!("a batch with an id twice: expected Error::Duplicate, got {other:?}"),
    }
    assert_nothing_written("a batch with an id twice", &twice, None).await;
    assert_eq!(
        ok("business rows", harness.business_rows("twice").await),
        1,
        "a batch refused for an id twice must leave the transaction usable"
    );

    let mut invalid = fresh("invalid-");
    invalid[9].topic.clear();
    match harness.enqueue_batch("invalid", &invalid, true).await {
        Err(Error::InvalidMessage(InvalidMessage::EmptyTopic)) => {}
        other => {
            panic!("a batch with an empty topic in the middle: expected EmptyTopic, got {other:?}")
        }
    }
    assert_nothing_written("a batch with an invalid message", &invalid, None).await;
    assert_eq!(
        ok("business rows", harness.business_rows("invalid").await),
        1,
        "a batch refused for an invalid message must leave the transaction usable"
    );
    let mut nul_key = fresh("nul-key-");
    nul_key[15] = message(Some("k\0ey"), "nul-key");
    match harness.enqueue_batch("nul-key", &nul_key, true).await {
        Err(Error::InvalidMessage(InvalidMessage::InvalidKey { .. })) => {}
        other => {
            panic!("a batch with a NUL in a key in the middle: expected InvalidKey, got {other:?}")
        }
    }
    assert_nothing_written("a batch with a NUL in a key", &nul_key, None).await;

    let (token, rows) = claim("claim after the refusals", &store, 1000, LONG_LEASE).await;
    assert_eq!(
        labels(&rows),
        ["present"],
        "refused batches left claimable rows"
    );
    settle("release", &store, token, released(&rows)).await;

    in_table.remove(10);
    ok(
        "enqueue the mended batch",
        harness.enqueue_batch("mended", &in_table, true).await,
    );
    let (_, rows) = claim("claim the mended batch", &store, 1000, LONG_LEASE).await;
    let mut want = vec!["present".to_owned()];
    want.extend(in_table.iter().map(label));
    assert_eq!(
        labels(&rows),
        want,
        "the mended batch must be claimable whole, in order"
    );
}
