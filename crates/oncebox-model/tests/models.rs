//! Every interleaving of the small worlds of `docs/model-checking.md`, checked: the
//! properties hold as the code implements the protocols, and each seeded bug gives a
//! counterexample. The larger bounds run with
//! `cargo test --release -p oncebox-model -- --ignored --nocapture`.

use oncebox_model::{CdcBug, CdcModel, DedupModel, InboxModel, SpoolBug, SpoolModel};
use stateright::{Checker, Model};

/// Checks `model` exhaustively, fails on any counterexample, and prints the states seen.
fn holds<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

/// Checks `model` and returns the counterexample found for `property`.
fn counterexample<M>(model: M, property: &'static str) -> String
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let checker = model.checker().spawn_bfs().join();
    match checker.discovery(property) {
        Some(path) => format!("{:?}", path.into_actions()),
        None => panic!("the seeded bug went unnoticed: no counterexample to {property:?}"),
    }
}

/// The shortest counterexample to `property`: its steps, and the state it ends in.
///
/// A checker records the last violating state it visits, often deep in the state
/// space; bounding the depth one step more each time finds one of the shortest
/// paths, which reads better. The models checked this way are small.
fn shortest_counterexample<M>(model: M, property: &'static str) -> (String, M::State)
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    for depth in 2..=200 {
        let checker = model
            .clone()
            .checker()
            .target_max_depth(depth)
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(property) {
            let last = path.last_state().clone();
            println!(
                "{property}: {:?}\n  ending in {last:?}",
                path.clone().into_actions()
            );
            return (format!("{:?}", path.into_actions()), last);
        }
        if checker.max_depth() < depth {
            break;
        }
    }
    panic!("the seeded bug went unnoticed: no counterexample to {property:?}")
}

#[test]
fn spool_claims_leases_and_settlements_keep_their_promises() {
    holds("spool", SpoolModel::small());
}

#[test]
fn transactional_inbox_has_one_effect() {
    holds("inbox", InboxModel::small());
}

#[test]
fn dedup_store_fences_and_keeps_the_first_result() {
    holds("dedup", DedupModel::small());
}

#[test]
fn without_fencing_a_stale_settlement_applies() {
    let trace = counterexample(
        SpoolModel::small().with_bug(SpoolBug::NoFencing),
        "a settlement never applies to a row another claim took since",
    );
    assert!(
        trace.matches("Claim(").count() >= 2,
        "another claim took the rows: {trace}"
    );
}

#[test]
fn without_the_lease_test_a_key_is_in_flight_on_two_relays() {
    let trace = counterexample(
        SpoolModel::small().with_bug(SpoolBug::NoLeaseTest),
        "no key in flight on two relays at once",
    );
    assert!(
        trace.contains("Tick") && trace.matches("Publish(").count() >= 2,
        "{trace}"
    );
}

#[test]
fn releasing_the_key_before_the_settle_commits_lets_a_stale_outcome_in() {
    let trace = counterexample(
        SpoolModel::small().with_bug(SpoolBug::ReleaseBeforeSettle),
        "a settlement never applies to a row another claim took since",
    );
    assert!(trace.contains("WriteOutcomes"), "{trace}");
}

#[test]
fn recording_outside_the_handlers_transaction_loses_the_effect() {
    let model = InboxModel {
        record_outside_the_transaction: true,
        ..InboxModel::small()
    };
    let trace = counterexample(model, "exactly one committed effect per (consumer, id)");
    assert!(trace.contains("Crash"), "{trace}");
}

#[test]
fn without_fencing_a_late_completion_overwrites_the_first_result() {
    let model = DedupModel {
        no_fencing: true,
        ..DedupModel::small()
    };
    counterexample(
        model.clone(),
        "a completion by a holder whose lease ended never applies",
    );
    counterexample(
        model,
        "a duplicate within the TTL always sees the first result",
    );
}

#[test]
fn without_the_per_key_prefix_a_key_goes_out_of_order() {
    counterexample(
        SpoolModel::small().with_bug(SpoolBug::NoKeyPrefix),
        "per-key order",
    );
}

#[test]
fn without_lease_keeping_two_handlers_run_at_once() {
    let model = DedupModel {
        no_lease_keeping: true,
        ..DedupModel::small()
    };
    counterexample(model, "at most one handler runs per id at a time");
}

#[test]
fn cdc_relay_confirms_behind_the_broker_and_never_pins_the_wal() {
    holds("cdc", CdcModel::small());
}

#[test]
fn confirming_only_when_a_publish_settles_never_confirms_a_trailing_empty_commit() {
    let model = CdcModel::tiny().with_bug(CdcBug::ConfirmOnlyOnSettle);
    for property in [
        "an idle relay has confirmed every commit",
        "every finished commit is confirmed",
    ] {
        let (trace, last) = shortest_counterexample(model.clone(), property);
        let unconfirmed = &last.wal[usize::from(last.slot_confirmed)..];
        assert!(
            unconfirmed
                .last()
                .is_some_and(|commit| commit.keys.is_empty()),
            "the WAL ends with an unconfirmed commit without messages: {trace}"
        );
    }
}

#[test]
fn confirming_only_when_a_publish_settles_pins_a_commit_its_broker_confirmed_before_it_ended() {
    // No empty commit at all: one message, confirmed by the broker before the relay
    // reads its Commit event. No later settlement comes to confirm it.
    let model = CdcModel {
        commits: vec![vec![0]],
        heartbeats: 0,
        crashes: 0,
        max_in_flight: 1,
        bug: Some(CdcBug::ConfirmOnlyOnSettle),
    };
    let (trace, last) = shortest_counterexample(model, "an idle relay has confirmed every commit");
    assert_eq!(
        trace, "[Produce, Read, Read, BrokerConfirm(0, 0), Read]",
        "{last:?}"
    );
}

#[test]
fn confirming_a_commit_when_it_is_read_confirms_unpublished_messages() {
    let (trace, last) = shortest_counterexample(
        CdcModel::tiny().with_bug(CdcBug::ConfirmAtCommit),
        "nothing is confirmed before the broker confirmed every message at or before it",
    );
    assert!(!trace.contains("BrokerConfirm"), "{trace}");
    assert!(last.slot_confirmed > 0, "{last:?}");
}

#[test]
fn advancing_past_a_done_commit_behind_an_outstanding_one_confirms_too_far() {
    let (trace, last) = shortest_counterexample(
        CdcModel::tiny().with_bug(CdcBug::NoFrontWait),
        "nothing is confirmed before the broker confirmed every message at or before it",
    );
    // A commit is confirmed past an earlier one whose message is still out.
    let confirmed = &last.wal[..usize::from(last.slot_confirmed)];
    assert!(
        confirmed
            .iter()
            .any(|commit| commit.published.contains(&false)),
        "{trace}"
    );
    assert!(
        confirmed
            .last()
            .is_some_and(|commit| commit.published.iter().all(|&p| p)),
        "{trace}"
    );
}

#[test]
fn without_the_per_key_queue_a_key_goes_out_of_order() {
    let model = CdcModel::tiny().with_bug(CdcBug::NoKeyQueue);
    shortest_counterexample(model.clone(), "per-key order within a session");
    shortest_counterexample(model, "per-key order of first publishes");
}

#[test]
#[ignore = "larger bounds: cargo test --release -p oncebox-model -- --ignored"]
fn larger_worlds() {
    holds("spool, large", SpoolModel::large());
    holds("inbox, large", InboxModel::large());
    holds("dedup, large", DedupModel::large());
    holds("cdc, large", CdcModel::large());
}
