//! Checks of [`DedupStore::inspect`]: what a store reports of one id, in every state.

use std::time::{Duration, SystemTime};

use oncebox_core::Result;
use oncebox_core::store::{DedupRecord, DedupState, DedupStore};

use super::{DedupHarness, LONG_LEASE, SHORT_LEASE, TTL, started};
use crate::support::ok;

/// How far a reported time may lie outside the window the check measured around the
/// call: stores keep milliseconds, and those on a server's clock convert the time left.
const SLACK: Duration = Duration::from_secs(1);

fn record(step: &str, inspected: Result<Option<DedupRecord>>) -> DedupRecord {
    match ok(step, inspected) {
        Some(record) => record,
        None => panic!("{step}: expected a record, got None"),
    }
}

fn assert_none(step: &str, inspected: Result<Option<DedupRecord>>) {
    if let Some(record) = ok(step, inspected) {
        panic!("{step}: expected no record, got {record:?}");
    }
}

/// Asserts that `at` lies `ahead` after some instant between `before` and now.
fn assert_about(step: &str, what: &str, at: SystemTime, before: SystemTime, ahead: Duration) {
    let earliest = before + ahead - SLACK;
    let latest = SystemTime::now() + ahead + SLACK;
    assert!(
        earliest <= at && at <= latest,
        "{step}: {what} is {at:?}, expected {ahead:?} after the call (between {earliest:?} and {latest:?})"
    );
}

/// `inspect` follows the id through its states: nothing for an id never seen; after
/// `begin`, in progress with the holder's token and the lease end ahead (and moved by
/// `extend`); after `complete`, completed with the result, the same token and the TTL
/// ahead; after `abandon`, nothing. It changes nothing itself: the holder still holds
/// the id afterwards.
pub async fn inspect_follows_each_state<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    assert_none("inspect an id never seen", store.inspect("acct-1").await);

    let before = SystemTime::now();
    let token = started("begin", store.begin("acct-1", LONG_LEASE).await);
    let held = record("inspect after begin", store.inspect("acct-1").await);
    assert_eq!(held.token, token, "inspect after begin: wrong token");
    let DedupState::InProgress { lease_until } = held.state else {
        panic!("inspect after begin: expected InProgress, got {held:?}");
    };
    assert_about(
        "inspect after begin",
        "lease_until",
        lease_until,
        before,
        LONG_LEASE,
    );
    assert_eq!(
        held.expires_at,
        Some(lease_until),
        "inspect after begin: an in-progress record expires with its lease"
    );
    assert_none(
        "inspect an id sharing a prefix with a held one",
        store.inspect("acct-10").await,
    );

    let before = SystemTime::now();
    ok(
        "extend",
        store.extend("acct-1", token, 2 * LONG_LEASE).await,
    );
    let extended = record("inspect after extend", store.inspect("acct-1").await);
    match extended.state {
        DedupState::InProgress { lease_until } => assert_about(
            "inspect after extend",
            "lease_until",
            lease_until,
            before,
            2 * LONG_LEASE,
        ),
        _ => panic!("inspect after extend: expected InProgress, got {extended:?}"),
    }

    let before = SystemTime::now();
    ok(
        "complete by the holder",
        store.complete("acct-1", token, b"opened", TTL).await,
    );
    let done = record("inspect after complete", store.inspect("acct-1").await);
    assert_eq!(done.token, token, "inspect after complete: wrong token");
    assert_eq!(
        done.state,
        DedupState::Completed {
            result: b"opened".as_slice().into()
        },
        "inspect after complete: wrong state or result"
    );
    let expires_at = done
        .expires_at
        .unwrap_or_else(|| panic!("inspect after complete: no expiry, got {done:?}"));
    assert_about(
        "inspect after complete",
        "expires_at",
        expires_at,
        before,
        TTL,
    );
    super::assert_completed(
        "begin after inspect (inspect changes nothing)",
        store.begin("acct-1", LONG_LEASE).await,
        b"opened",
    );

    let empty = started("begin another id", store.begin("acct-2", LONG_LEASE).await);
    ok(
        "complete with an empty result",
        store.complete("acct-2", empty, b"", TTL).await,
    );
    let done = record("inspect an empty result", store.inspect("acct-2").await);
    assert_eq!(
        done.state,
        DedupState::Completed {
            result: Default::default()
        },
        "inspect an empty result"
    );

    let abandoned = started("begin a third id", store.begin("acct-3", LONG_LEASE).await);
    record("inspect before abandon", store.inspect("acct-3").await);
    ok("abandon", store.abandon("acct-3", abandoned).await);
    assert_none("inspect after abandon", store.inspect("acct-3").await);
}

/// A record past its end is no record, even before any purge: an in-progress id whose
/// lease ended (the id is free, as `begin` would find it) and a completed id whose TTL
/// ended. A live record beside them is still reported.
pub async fn inspect_forgets_expired_records<H: DedupHarness>(harness: &H) {
    let store = harness.store();
    let short_ttl = Duration::from_millis(300);
    let live = started("begin a live id", store.begin("exp-live", LONG_LEASE).await);
    started(
        "begin a short lease",
        store.begin("exp-lease", SHORT_LEASE).await,
    );
    let done = started("begin", store.begin("exp-ttl", LONG_LEASE).await);
    ok(
        "complete with a short TTL",
        store
            .complete("exp-ttl", done, b"gone soon", short_ttl)
            .await,
    );
    tokio::time::sleep(SHORT_LEASE.max(short_ttl) + Duration::from_millis(200)).await;
    assert_none(
        "inspect after the lease ended",
        store.inspect("exp-lease").await,
    );
    assert_none(
        "inspect after the TTL ended",
        store.inspect("exp-ttl").await,
    );
    let still = record("inspect the live id", store.inspect("exp-live").await);
    assert_eq!(still.token, live, "inspect the live id: wrong token");
    started(
        "begin after the lease ended (inspect said the id is free)",
        store.begin("exp-lease", LONG_LEASE).await,
    );
}
