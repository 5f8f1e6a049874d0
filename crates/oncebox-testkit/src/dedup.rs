//! The dedup conformance suite: the [`DedupStore`] state machine
//! `absent → in progress (lease, fencing token) → completed (result, ttl) → expired`,
//! checked against the real store, and the [`IdempotentReceiver`] running over it.
//!
//! A backend implements [`DedupHarness`] and calls every check from its own test, with a
//! fresh harness each time:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread")]
//! async fn dedup_concurrent_begins_start_once() {
//!     oncebox_testkit::dedup::concurrent_begins_start_once(&MyHarness::new().await).await;
//! }
//! ```
//!
//! Leases and TTLs are a few hundred milliseconds and the checks sleep in real time, so
//! stores that expire records by wall clock (Redis `PX`, SQL timestamps) are checked as
//! they run in production. Every wait is bounded; a check fails by panicking with a
//! message that says which rule the store broke.
//!
//! | check | proves |
//! |---|---|
//! | [`begin_on_fresh_id_starts`] | a free id is `Started`; ids do not interfere |
//! | [`concurrent_begins_start_once`] | `begin` is atomic: of 32 racing callers exactly one starts |
//! | [`complete_answers_duplicates`] | a completed id returns its result; the holder cannot overwrite or free it afterwards |
//! | [`expired_lease_is_fenced`] | a lease that ends frees the id with a larger token; the old token can neither complete nor abandon |
//! | [`abandon_frees_at_once`] | `abandon` frees the id immediately; tokens only grow |
//! | [`ttl_expiry_frees_id`] | a completed id is free again after its TTL |
//! | [`extend_is_fenced`] | `extend` moves the holder's lease; a stale token, an ended lease or a completed id cannot extend |
//! | [`inspect_follows_each_state`] | `inspect` reports nothing, then in progress (token, lease end), then completed (result, expiry), then nothing after `abandon` |
//! | [`inspect_forgets_expired_records`] | `inspect` reports no record once its lease or TTL ended, purged or not |
//! | [`receiver_runs_handler_once`] | [`IdempotentReceiver`] with concurrent duplicates on 8 workers runs the handler once |
//! | [`receiver_failure_frees_id`] | a failed handler frees the id, so the redelivery runs it again |
//! | [`receiver_keeps_its_lease_while_the_handler_runs`] | a handler slower than its lease keeps the id: a copy meanwhile waits, never runs beside it |
//! | [`receiver_handler_timeout_frees_the_id`] | a handler past its timeout is stopped and frees the id at once; retried, then dead-lettered with the timeout as reason |
//! | [`receiver_cleanup_keeps_the_window`] | a [`Consumer`] running ten dedup windows keeps the store's records under three windows' worth, and never forgets a record inside the window (stores that count their records) |
//!
//! [`IdempotentReceiver`]: oncebox_core::consumer::IdempotentReceiver
//! [`Consumer`]: oncebox_core::consumer::Consumer

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncebox_core::store::{Begin, DedupStore, FencingToken};
use oncebox_core::{Error, Result};
use tokio::sync::Barrier;

use crate::support::{ok, within};

mod inspect;
mod receiver;

pub use inspect::{inspect_follows_each_state, inspect_forgets_expired_records};
pub use receiver::{
    receiver_cleanup_keeps_the_window, receiver_failure_frees_id,
    receiver_handler_timeout_frees_the_id, receiver_keeps_its_lease_while_the_handler_runs,
    receiver_runs_handler_once,
};

/// How a backend gives the dedup suite a store.
///
/// Construct one harness per check, on an isolated namespace (a fresh database, a unique
/// key prefix, a new in-memory store): the checks reuse ids such as `"order-1"` and
/// assume nobody else touches them.
pub trait DedupHarness: Send + Sync {
    /// The store under test.
    type Store: DedupStore + 'static;

    /// A handle on this harness's store. Every call returns a handle on the same data.
    fn store(&self) -> Self::Store;

    /// How many records the store holds, expired ones not yet deleted included, for
    /// [`receiver_cleanup_keeps_the_window`]. Default: `None`, and that check skips
    /// itself.
    ///
    /// # Errors
    ///
    /// A store error.
    fn count_records(&self) -> impl Future<Output = Result<Option<u64>>> + Send {
        std::future::ready(Ok(None))
    }
}

const LONG_LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(250);
const TTL: Duration = Duration::from_secs(60);
/// Longest any single step may take before the check gives up.
const STEP: Duration = Duration::from_secs(10);

fn started(step: &str, begin: Result<Begin>) -> FencingToken {
    match ok(step, begin) {
        Begin::Started(token) => token,
        other => panic!("{step}: expected Started, got {other:?}"),
    }
}

fn assert_in_progress(step: &str, begin: Result<Begin>, lease: Duration) {
    match ok(step, begin) {
        Begin::InProgress { retry_after } => assert!(
            retry_after <= lease,
            "{step}: retry_after {retry_after:?} is longer than the lease {lease:?}"
        ),
        other => panic!("{step}: expected InProgress (another holder), got {other:?}"),
    }
}

fn assert_completed(step: &str, begin: Result<Begin>, expected: &[u8]) {
    match ok(step, begin) {
        Begin::Completed(result) => assert_eq!(
            result.as_ref(),
            expected,
            "{step}: Completed carries the wrong result"
        ),
        other => panic!("{step}: expected Completed, got {other:?}"),
    }
}

fn assert_lease_lost(step: &str, result: Result<()>) {
    match result {
        Err(Error::LeaseLost) => {}
        Ok(()) => panic!("{step}: a stale token was accepted; expected Error::LeaseLost"),
        Err(other) => panic!("{step}: expected Error::LeaseLost, got {other:?}"),
    }
}

/// `begin` on an id never seen is `Started`; a second id is independent of the first,
/// even while the first is held or completed.
pub async fn begin_on_fresh_id_starts<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let first = started(
        "begin on a fresh id",
        store.begin("order-1", LONG_LEASE).await,
    );
    started(
        "begin on another fresh id while the first is held",
        store.begin("order-2", LONG_LEASE).await,
    );
    ok(
        "complete order-1",
        store.complete("order-1", first, b"one", TTL).await,
    );
    started(
        "begin on a third id after the first completed",
        store.begin("order-3", LONG_LEASE).await,
    );
    // Ids that share a prefix are different ids.
    started(
        "begin on an id extending a completed one",
        store.begin("order-10", LONG_LEASE).await,
    );
}

/// Of 32 tasks calling `begin` on one id at once, exactly one gets `Started`; the others
/// get `InProgress` with a `retry_after` no longer than the lease.
pub async fn concurrent_begins_start_once<H: DedupHarness>(harness: &H) {
    const TASKS: usize = 32;
    let store = Arc::new(harness.store());
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        tasks.spawn(async move {
            barrier.wait().await;
            store.begin("contended", LONG_LEASE).await
        });
    }
    let mut winners = Vec::new();
    let mut waiting = 0;
    while let Some(joined) = within("32 concurrent begins", STEP, tasks.join_next()).await {
        match ok("begin task", ok("join begin task", joined)) {
            Begin::Started(token) => winners.push(token),
            Begin::InProgress { retry_after } => {
                assert!(
                    retry_after <= LONG_LEASE,
                    "retry_after {retry_after:?} exceeds the lease"
                );
                waiting += 1;
            }
            Begin::Completed(_) => panic!("nobody completed the id, yet begin said Completed"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {TASKS} concurrent begins must start; got tokens {winners:?}"
    );
    assert_eq!(waiting, TASKS - 1, "the other begins must see InProgress");
}

/// After `complete`, `begin` answers `Completed` with the stored result, every time. The
/// holder can neither overwrite the result with a second `complete` nor free the id with
/// a late `abandon`: either would let a duplicate run the effect again.
pub async fn complete_answers_duplicates<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let token = started("begin", store.begin("pay-7", LONG_LEASE).await);
    assert_in_progress(
        "begin while held",
        store.begin("pay-7", LONG_LEASE).await,
        LONG_LEASE,
    );
    ok(
        "complete by the holder",
        store.complete("pay-7", token, b"charged 42", TTL).await,
    );
    for attempt in 1..=3 {
        assert_completed(
            &format!("begin after complete (#{attempt})"),
            store.begin("pay-7", LONG_LEASE).await,
            b"charged 42",
        );
    }
    // A second completion must not replace the first result; an error is fine.
    match store.complete("pay-7", token, b"charged twice", TTL).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(other) => panic!("second complete: expected Ok or LeaseLost, got {other:?}"),
    }
    assert_completed(
        "begin after a second complete",
        store.begin("pay-7", LONG_LEASE).await,
        b"charged 42",
    );
    match store.abandon("pay-7", token).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(other) => panic!("abandon after complete: expected Ok or LeaseLost, got {other:?}"),
    }
    assert_completed(
        "begin after abandon of a completed id (abandon must not free a completed id)",
        store.begin("pay-7", LONG_LEASE).await,
        b"charged 42",
    );
    // An empty result is a result too.
    let token = started("begin another id", store.begin("pay-8", LONG_LEASE).await);
    ok(
        "complete with an empty result",
        store.complete("pay-8", token, b"", TTL).await,
    );
    assert_completed(
        "begin after an empty result",
        store.begin("pay-8", LONG_LEASE).await,
        b"",
    );
}

/// A lease that ends frees the id: the next `begin` is `Started` with a larger token.
/// The old holder is fenced: its `complete` and `abandon` fail with
/// [`Error::LeaseLost`] and change nothing, so the new holder keeps the id and its
/// result is the one that stands.
pub async fn expired_lease_is_fenced<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let lease_start = Instant::now();
    let old = started("first begin", store.begin("job-1", SHORT_LEASE).await);
    let during = store.begin("job-1", LONG_LEASE).await;
    if lease_start.elapsed() < SHORT_LEASE {
        assert_in_progress("begin during the lease", during, SHORT_LEASE);
    } else if let Ok(Begin::Started(late)) = during {
        // Too slow to tell: the lease had ended before the call returned. Free the id.
        ok("abandon a late begin", store.abandon("job-1", late).await);
    }
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(150)).await;
    let new = started(
        "begin after the lease ended",
        store.begin("job-1", LONG_LEASE).await,
    );
    assert!(
        new > old,
        "tokens must grow: the new holder got {new} after {old}"
    );

    assert_lease_lost(
        "complete with the expired token",
        store.complete("job-1", old, b"stale", TTL).await,
    );
    assert_in_progress(
        "begin after the stale complete (the new holder must still hold the id)",
        store.begin("job-1", LONG_LEASE).await,
        LONG_LEASE,
    );
    assert_lease_lost(
        "abandon with the expired token",
        store.abandon("job-1", old).await,
    );
    assert_in_progress(
        "begin after the stale abandon (the new holder must still hold the id)",
        store.begin("job-1", LONG_LEASE).await,
        LONG_LEASE,
    );
    ok(
        "complete by the new holder",
        store.complete("job-1", new, b"fresh", TTL).await,
    );
    assert_completed(
        "begin after the new holder completed",
        store.begin("job-1", LONG_LEASE).await,
        b"fresh",
    );
    assert_lease_lost(
        "complete with the expired token after the new holder completed",
        store.complete("job-1", old, b"stale", TTL).await,
    );
    assert_completed(
        "begin after the late stale complete",
        store.begin("job-1", LONG_LEASE).await,
        b"fresh",
    );
    // A token that never held the id is refused too.
    let other = started("begin a second id", store.begin("job-2", LONG_LEASE).await);
    let forged = FencingToken(other.0.wrapping_add(1_000_000));
    assert_lease_lost(
        "complete with a token never issued",
        store.complete("job-2", forged, b"x", TTL).await,
    );
    assert_lease_lost(
        "abandon with a token never issued",
        store.abandon("job-2", forged).await,
    );
    assert_in_progress(
        "begin after forged calls",
        store.begin("job-2", LONG_LEASE).await,
        LONG_LEASE,
    );
}

/// `abandon` by the holder frees the id at once (no waiting for the lease); the next
/// holder gets a larger token, and the first holder's token is dead from then on.
pub async fn abandon_frees_at_once<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let first = started("first begin", store.begin("mail-1", LONG_LEASE).await);
    ok(
        "abandon by the holder",
        store.abandon("mail-1", first).await,
    );
    let second = started(
        "begin right after abandon (30 s lease not waited for)",
        store.begin("mail-1", LONG_LEASE).await,
    );
    assert!(second > first, "tokens must grow: {second} after {first}");
    assert_lease_lost(
        "abandon with the first token again",
        store.abandon("mail-1", first).await,
    );
    assert_lease_lost(
        "complete with the first token",
        store.complete("mail-1", first, b"old", TTL).await,
    );
    assert_in_progress(
        "begin while the second holder holds it",
        store.begin("mail-1", LONG_LEASE).await,
        LONG_LEASE,
    );
    ok(
        "complete by the second holder",
        store.complete("mail-1", second, b"sent", TTL).await,
    );
    assert_completed(
        "begin after completion",
        store.begin("mail-1", LONG_LEASE).await,
        b"sent",
    );
}

/// A completed id answers `Completed` until its TTL ends and is free afterwards (a
/// `begin` is `Started` again, with a larger token).
pub async fn ttl_expiry_frees_id<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let ttl = Duration::from_millis(300);
    let long = started(
        "begin an id with a long TTL",
        store.begin("evt-2", LONG_LEASE).await,
    );
    ok(
        "complete with a long TTL",
        store.complete("evt-2", long, b"kept", TTL).await,
    );
    let first = started("begin", store.begin("evt-1", LONG_LEASE).await);
    let ttl_start = Instant::now();
    ok(
        "complete with a short TTL",
        store.complete("evt-1", first, b"done", ttl).await,
    );
    let within_ttl = store.begin("evt-1", LONG_LEASE).await;
    if ttl_start.elapsed() < ttl {
        assert_completed("begin within the TTL", within_ttl, b"done");
    } else if let Ok(Begin::Started(late)) = within_ttl {
        // Too slow to tell: the TTL had ended before the call returned. Free the id.
        ok("abandon a late begin", store.abandon("evt-1", late).await);
    }
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let again = started(
        "begin after the TTL ended",
        store.begin("evt-1", LONG_LEASE).await,
    );
    assert!(again > first, "tokens must grow: {again} after {first}");
    assert_completed(
        "the long-TTL id is still completed",
        store.begin("evt-2", LONG_LEASE).await,
        b"kept",
    );
}

/// Compile-time check that the suite's futures can be spawned on a multi-threaded
/// runtime for any harness.
#[allow(dead_code)]
fn futures_are_send<H: DedupHarness>(harness: &'static H) {
    fn send<F: Future + Send>(_: F) {}
    send(concurrent_begins_start_once(harness));
    send(receiver_runs_handler_once(harness));
}

/// `extend` moves the end of the holder's lease: a `begin` after the original lease
/// ended still finds the id in progress. It is fenced like `complete`: a stale token, an
/// ended lease and a completed id all answer [`Error::LeaseLost`] and change nothing.
pub async fn extend_is_fenced<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let token = started("begin", store.begin("job-ext", SHORT_LEASE).await);
    ok(
        "extend by the holder",
        store.extend("job-ext", token, LONG_LEASE).await,
    );
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(150)).await;
    assert_in_progress(
        "begin after the first lease would have ended",
        store.begin("job-ext", LONG_LEASE).await,
        LONG_LEASE,
    );
    assert_lease_lost(
        "extend with another token",
        store
            .extend("job-ext", FencingToken(token.0 + 1_000_000), LONG_LEASE)
            .await,
    );
    ok(
        "complete by the holder",
        store.complete("job-ext", token, b"done", TTL).await,
    );
    assert_lease_lost(
        "extend after complete",
        store.extend("job-ext", token, LONG_LEASE).await,
    );
    assert_completed(
        "begin after the refused extend",
        store.begin("job-ext", LONG_LEASE).await,
        b"done",
    );

    let ended = started("begin", store.begin("job-ended", SHORT_LEASE).await);
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(150)).await;
    assert_lease_lost(
        "extend after the lease ended",
        store.extend("job-ended", ended, LONG_LEASE).await,
    );
    started(
        "begin after the refused extend (the id is free)",
        store.begin("job-ended", LONG_LEASE).await,
    );
}
