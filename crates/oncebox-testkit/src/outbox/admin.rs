//! What operators read of an outbox beyond its listing ([`OutboxAdmin`]): counts, the
//! oldest pending age, dead letters, and messages published per minute. The
//! per-minute check is public for tables the harness does not cover (a Debezium-style
//! layout).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{MinuteCount, OutboxAdmin, RowFilter, RowStatus, Settle, SpoolStore};
use oncebox_core::{Message, MessageId, Result};

use super::capabilities::skipped;
use super::{LONG_LEASE, OutboxHarness, claim, fill_listed, label, message, outcome, settle};
use crate::support::ok;

/// [`OutboxAdmin::stats`] counts rows by status and, for the first pending row, the
/// time it has waited: from its enqueue if the store
/// [`keeps_enqueue_time`](super::Capabilities::keeps_enqueue_time), from its creation
/// otherwise. [`OutboxAdmin::dead_letters`] hands back a dead row's message as enqueued
/// (creation time to the store's
/// [`time_resolution`](super::Capabilities::time_resolution)), its reason and attempts;
/// [`OutboxAdmin::row`] shows it dead with a settlement time.
pub async fn stats_and_dead_letters<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    let capabilities = harness.capabilities();
    let store = harness.store();
    let empty = ok("stats of an empty outbox", store.stats().await);
    assert_eq!(
        (
            empty.pending,
            empty.done,
            empty.dead,
            empty.oldest_pending_age
        ),
        (0, 0, 0, None),
        "an empty outbox counts nothing"
    );
    let mut old = message(Some("k"), "old");
    old.created_at = SystemTime::now() - Duration::from_secs(60);
    ok(
        "enqueue",
        harness.enqueue(&[old, message(None, "new")]).await,
    );
    let stats = ok("stats", store.stats().await);
    assert_eq!(stats.pending, 2, "two rows pending");
    let age = stats.oldest_pending_age.expect("an oldest pending age");
    if capabilities.keeps_enqueue_time {
        assert!(
            age < Duration::from_secs(30),
            "a row created a minute back and enqueued just now has waited since its enqueue, not {age:?}"
        );
    } else {
        assert!(
            age >= Duration::from_secs(59) && age < Duration::from_secs(120),
            "a row created a minute back has waited a minute, not {age:?}"
        );
    }
    let (token, rows) = claim("claim both", &store, 10, LONG_LEASE).await;
    settle("publish both", &store, token, super::all_done(&rows)).await;

    let poison = message(Some("p"), "poison");
    ok("enqueue the poison", harness.enqueue_one(&poison).await);
    let (token, rows) = claim("claim the poison", &store, 10, LONG_LEASE).await;
    let refused = Settle::Dead {
        reason: "refused by the broker".into(),
    };
    settle(
        "dead-letter the poison",
        &store,
        token,
        vec![outcome(&rows, &poison, refused)],
    )
    .await;
    let stats = ok("stats", store.stats().await);
    assert_eq!(
        (
            stats.pending,
            stats.done,
            stats.dead,
            stats.oldest_pending_age
        ),
        (0, 2, 1, None),
        "two published, one dead"
    );
    let letters = ok("dead letters", store.dead_letters(None, 10).await);
    assert_eq!(letters.len(), 1, "one dead letter");
    let letter = &letters[0];
    assert_eq!(letter.id, poison.id, "the dead letter is the poison");
    let drift = poison
        .created_at
        .duration_since(letter.message.created_at)
        .unwrap_or_else(|early| early.duration());
    assert!(
        drift < capabilities.time_resolution,
        "created_at moved by {drift:?}, more than the store's resolution of {:?}",
        capabilities.time_resolution
    );
    let mut expected = poison.clone();
    expected.created_at = letter.message.created_at;
    assert_eq!(letter.message, expected, "the message as enqueued");
    assert_eq!(letter.reason, "refused by the broker", "the reason kept");
    assert_eq!(letter.attempts, 1, "the dead-lettering attempt counted");
    let row = ok("the dead row", store.row(poison.id).await).expect("the dead row is kept");
    assert_eq!(row.state.status, RowStatus::Dead);
    assert!(
        row.state.settled_at.is_some(),
        "a dead row has a settlement time"
    );

    let later = [message(None, "poison 2"), message(None, "poison 3")];
    ok("enqueue two more", harness.enqueue(&later).await);
    let (token, rows) = claim("claim them", &store, 10, LONG_LEASE).await;
    // A NUL byte in a reason is dropped on every store (PostgreSQL's text cannot hold
    // one), the rest kept.
    let dead = |m| {
        let reason = "refused\0 again".into();
        outcome(&rows, m, Settle::Dead { reason })
    };
    settle(
        "dead-letter them",
        &store,
        token,
        later.iter().map(dead).collect(),
    )
    .await;
    let letters = ok("dead letters", store.dead_letters(None, 10).await);
    assert_eq!(
        letters
            .iter()
            .skip(1)
            .map(|l| l.reason.as_str())
            .collect::<Vec<_>>(),
        ["refused again", "refused again"],
        "reasons kept without their NUL byte"
    );
    let ids: Vec<MessageId> = letters.iter().map(|letter| letter.id).collect();
    assert_eq!(
        ids,
        [poison.id, later[0].id, later[1].id],
        "dead letters come in commit order"
    );
    let mut paged = Vec::new();
    let mut after = None;
    while let Some(letter) = ok("a page of one", store.dead_letters(after, 1).await).pop() {
        assert!(paged.len() < ids.len(), "paging does not end: {paged:?}");
        after = Some(letter.seq);
        paged.push(letter.id);
    }
    assert_eq!(
        paged, ids,
        "pages of one, each after the last, list each once"
    );
}

/// [`OutboxAdmin::published_per_minute`] counts published rows by the minute of their
/// publication, oldest minute first, from the minute `since` falls in, leaving out
/// minutes with none. Needs
/// [`publication_times`](super::Capabilities::publication_times).
pub async fn published_per_minute_counts_done_rows_by_minute<H>(harness: &H)
where
    H: OutboxHarness,
    H::Store: OutboxAdmin,
{
    if !harness.capabilities().publication_times {
        return skipped(
            "published_per_minute_counts_done_rows_by_minute",
            "publication_times",
        );
    }
    let store = harness.store();
    fill_listed(&store, "", async |messages: &[Message]| {
        harness.enqueue(messages).await
    })
    .await;
    check_published_per_minute(&store, async |id, at| {
        harness.set_published_at(id, at).await
    })
    .await;
}

/// Sets the publication times of the published rows of an outbox
/// [`fill_listed`](super::fill_listed) filled (with `set`) around the current minute
/// `m`: two in `m - 10`, one in `m - 3`, one two hours back, the rest in `m - 2`; then
/// checks what [`OutboxAdmin::published_per_minute`] counts for the last hour, the last
/// five minutes and the future. The store's clock is taken to be this process's (a
/// local server).
///
/// # Panics
///
/// With the rule the count broke.
pub async fn check_published_per_minute<O, F>(outbox: &O, set: F)
where
    O: OutboxAdmin + SpoolStore<Item = Message>,
    F: AsyncFn(MessageId, SystemTime) -> Result<()>,
{
    let done_rows = RowFilter {
        status: Some(RowStatus::Done),
        ..RowFilter::default()
    };
    let done = ok("published rows", outbox.rows(&done_rows, None, 100).await);
    assert_eq!(done.len(), 7, "the fill publishes 7 rows");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    let minute = UNIX_EPOCH + Duration::from_secs(now.as_secs() / 60 * 60);
    let at = |minutes_ago: u64, ms: u64| {
        minute - Duration::from_secs(60 * minutes_ago) + Duration::from_millis(ms)
    };
    let times = [
        at(10, 5_000),
        at(10, 50_000),
        at(3, 59_500),
        at(120, 0),
        at(2, 1_000),
        at(2, 30_000),
        at(2, 59_999),
    ];
    for (row, time) in done.iter().zip(times) {
        let step = format!("set the publication time of {}", label(&row.message));
        ok(&step, set(row.message.id, time).await);
    }
    let count = |minutes_ago: u64, published: u64| MinuteCount {
        minute: at(minutes_ago, 0),
        published,
    };
    let since = |back: Duration| SystemTime::now() - back;
    let hour = ok(
        "published per minute in the last hour",
        outbox
            .published_per_minute(since(Duration::from_secs(3600)))
            .await,
    );
    assert_eq!(
        hour,
        [count(10, 2), count(3, 1), count(2, 3)],
        "the last hour, by minute"
    );
    let recent = ok(
        "published per minute in the last five minutes",
        outbox
            .published_per_minute(since(Duration::from_secs(300)))
            .await,
    );
    assert_eq!(
        recent,
        [count(3, 1), count(2, 3)],
        "the last five minutes, by minute"
    );
    let future = ok(
        "published per minute from a minute ahead",
        outbox
            .published_per_minute(SystemTime::now() + Duration::from_secs(60))
            .await,
    );
    assert!(
        future.is_empty(),
        "nothing is published in the future: {future:?}"
    );
}
