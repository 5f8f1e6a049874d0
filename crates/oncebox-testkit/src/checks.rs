//! Every check of each suite, by name, for a backend's test runner: a check added to a
//! suite then runs against every backend without touching their tests.
//!
//! Each macro takes a macro call of the backend's own and calls it with the given
//! tokens followed by the check names, comma-separated. The backend's macro decides how
//! a check runs (its harness, its clean-up):
//!
//! ```ignore
//! macro_rules! suite {
//!     ($suite:ident: $($check:ident),* $(,)?) => {
//!         mod $suite {
//!             $(
//!                 #[tokio::test(flavor = "multi_thread")]
//!                 async fn $check() {
//!                     oncebox_testkit::$suite::$check(&super::MyHarness::new().await).await;
//!                 }
//!             )*
//!         }
//!     };
//! }
//!
//! oncebox_testkit::outbox_checks!(suite!(outbox:));
//! ```
//!
//! A check a backend cannot run is not left out of the list: the check skips itself, by
//! the harness's capabilities, and says so.
//!
//! [`store_contracts`] checks, at compile time, what every store must be.

use oncebox_core::Message;
use oncebox_core::spool::SpoolStore;
use oncebox_core::store::{DedupStore, DurableInboxStore, InboxStore};

/// Calls `callback!(tokens… <every check of [`outbox`](crate::outbox)>)`.
#[macro_export]
macro_rules! outbox_checks {
    ($callback:ident ! ($($tokens:tt)*)) => {
        $callback!($($tokens)*
            claim_in_commit_order,
            per_key_prefix,
            concurrent_claimers_never_overlap,
            expired_lease_is_fenced,
            retry_counts_and_waits,
            dead_stores_reason_and_unblocks,
            release_counts_nothing,
            purge_is_bounded_and_selective,
            delete_on_publish_deletes_done_rows_only,
            rolled_back_enqueue_is_never_claimed,
            bad_input_is_a_typed_error,
            relay_keeps_commit_order,
            slow_broker_past_the_lease_never_overlaps,
            stop_hands_back_unstarted_rows,
            claimed_ahead_batch_past_its_lease_is_handed_back,
            broker_outage_spends_no_attempts,
            relay_backs_off_then_dead_letters,
            relay_cleanup_purges_published,
            rows_listed_newest_first_filtered_and_paged,
            batch_commits_with_the_business_row,
            batch_rolls_back_with_the_business_row,
            batch_refusal_writes_nothing,
            scheduled_messages_wait_for_their_time,
            cancel_never_takes_a_claimed_message,
            cancel_in_an_open_transaction_holds,
            refusals_keep_the_transaction_usable,
            a_commit_wakes_a_waiting_relay,
            settle_and_claim_sees_its_settlements,
            stats_and_dead_letters,
            published_per_minute_counts_done_rows_by_minute,
            producers_of_a_key_commit_in_seq_order,
            claim_finds_free_keys_behind_a_held_backlog,
            claim_step_two_reaches_every_key,
            replay_waits_for_the_relay_holding_its_key,
            batch_takes_key_locks_in_a_fixed_order,
            undecodable_rows_are_dead_lettered_not_handed_out,
        );
    };
}

/// Calls `callback!(tokens… <every check of [`inbox`](crate::inbox)>)`, the durable
/// inbox's included.
#[macro_export]
macro_rules! inbox_checks {
    ($callback:ident ! ($($tokens:tt)*)) => {
        $callback!($($tokens)*
            duplicate_returns_first_result,
            failure_rolls_back_record_and_effect,
            concurrent_duplicates_have_one_effect,
            many_concurrent_duplicates_have_one_effect,
            purge_is_bounded_and_selective,
            purge_respects_dedup_window,
            hostile_ids_round_trip,
            durable_accept_dedups,
            durable_processor_runs_each_effect_once,
            durable_stale_complete_is_lease_lost,
            durable_retention_is_the_dedup_window,
            consumer_figures,
            inbox_rows_listed_newest_first_filtered_and_paged,
            handler_timeout_rolls_back_and_dead_letters,
            durable_handler_timeout_fails_the_attempt,
            stop_hands_back_queued_deliveries,
            cleanup_keeps_the_window,
        );
    };
}

/// Calls `callback!(tokens… <every check of [`dedup`](crate::dedup)>)`.
#[macro_export]
macro_rules! dedup_checks {
    ($callback:ident ! ($($tokens:tt)*)) => {
        $callback!($($tokens)*
            begin_on_fresh_id_starts,
            concurrent_begins_start_once,
            complete_answers_duplicates,
            expired_lease_is_fenced,
            abandon_frees_at_once,
            ttl_expiry_frees_id,
            extend_is_fenced,
            inspect_follows_each_state,
            inspect_forgets_expired_records,
            receiver_runs_handler_once,
            receiver_failure_frees_id,
            receiver_keeps_its_lease_while_the_handler_runs,
            receiver_handler_timeout_frees_the_id,
            receiver_cleanup_keeps_the_window,
        );
    };
}

/// Calls `callback!(tokens… <every check of [`transport`](crate::transport)>)`, but
/// [`survives_restart`](crate::transport::survives_restart), which needs a broker the
/// test may restart, and so a harness of its own.
#[macro_export]
macro_rules! transport_checks {
    ($callback:ident ! ($($tokens:tt)*)) => {
        $callback!($($tokens)*
            publish_confirm_and_receive,
            received_fields_round_trip,
            ack_stops_redelivery,
            nack_redelivers_after_delay,
            unacked_delivery_redelivered_after_timeout,
            late_ack_is_harmless,
            dead_letter_stops_delivery,
            per_key_order,
            consumer_settles_by_fault,
            groups_share_work,
            late_group_receives_history,
        );
    };
}

/// Compile-time contracts of a backend's stores: each can be cloned and moved between
/// threads, and implements its core trait. Call it from a `#[test]` with the backend's
/// types; it does nothing at run time (a store that breaks a contract does not compile).
pub fn store_contracts<Store, Outbox, Inbox, Durable, Dedup>()
where
    Store: Send + Sync + Clone + 'static,
    Outbox: SpoolStore<Item = Message> + Send + Sync + Clone + 'static,
    Inbox: InboxStore + Send + Sync + Clone + 'static,
    Durable: DurableInboxStore + Send + Sync + Clone + 'static,
    Dedup: DedupStore + Send + Sync + Clone + 'static,
{
}
