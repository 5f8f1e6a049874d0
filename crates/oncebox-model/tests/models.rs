//! Every interleaving of the small worlds of `docs/model-checking.md`, checked: the
//! properties hold as the code implements the protocols, and each seeded bug gives a
//! counterexample. The larger bounds run with
//! `cargo test --release -p oncebox-model -- --ignored --nocapture`.

use oncebox_model::{DedupModel, InboxModel, SpoolBug, SpoolModel};
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
#[ignore = "larger bounds: cargo test --release -p oncebox-model -- --ignored"]
fn larger_worlds() {
    holds("spool, large", SpoolModel::large());
    holds("inbox, large", InboxModel::large());
    holds("dedup, large", DedupModel::large());
}
