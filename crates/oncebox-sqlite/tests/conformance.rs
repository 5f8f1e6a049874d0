//! The `oncebox-testkit` conformance suites against the SQLite stores: outbox, inbox,
//! durable inbox and dedup. Every check runs on a fresh database file of its own.

use oncebox_testkit::sqlite::SqliteHarness;

/// One `#[tokio::test]` per check, in a module named after the suite, each on a fresh
/// database.
macro_rules! suite {
    ($suite:ident: $($check:ident),* $(,)?) => {
        mod $suite {
            use super::SqliteHarness;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    oncebox_testkit::$suite::$check(&SqliteHarness::new().await).await;
                }
            )*
        }
    };
}

suite!(outbox:
    claim_in_commit_order,
    per_key_prefix,
    concurrent_claimers_never_overlap,
    expired_lease_is_fenced,
    retry_counts_and_waits,
    dead_stores_reason_and_unblocks,
    release_counts_nothing,
    purge_is_bounded_and_selective,
    rolled_back_enqueue_is_never_claimed,
    bad_input_is_a_typed_error,
    relay_keeps_commit_order,
    relay_backs_off_then_dead_letters,
    relay_cleanup_purges_published,
);

suite!(inbox:
    duplicate_returns_first_result,
    failure_rolls_back_record_and_effect,
    concurrent_duplicates_have_one_effect,
    many_concurrent_duplicates_have_one_effect,
    purge_is_bounded_and_selective,
    purge_respects_dedup_window,
    durable_accept_dedups,
    durable_processor_runs_each_effect_once,
    durable_stale_complete_is_lease_lost,
);

suite!(dedup:
    begin_on_fresh_id_starts,
    concurrent_begins_start_once,
    complete_answers_duplicates,
    expired_lease_is_fenced,
    abandon_frees_at_once,
    ttl_expiry_frees_id,
    receiver_runs_handler_once,
    receiver_failure_frees_id,
);
