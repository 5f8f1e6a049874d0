//! The outbox conformance suite: the [`SpoolStore`] contract of an outbox table, atomic
//! enqueue, typed errors for bad input, and the [`Relay`](oncebox_core::spool::Relay)
//! end to end over the in-process [`MemoryBroker`].
//!
//! A backend implements [`OutboxHarness`] and calls every check from its own test, with
//! a fresh harness (a fresh, empty outbox table) each time:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread")]
//! async fn outbox_per_key_prefix() {
//!     oncebox_testkit::outbox::per_key_prefix(&MyHarness::new().await).await;
//! }
//! ```
//!
//! The harness declares what the store does beyond the contract every outbox keeps
//! with one [`Capabilities`] value; a check that needs more prints that it is skipped
//! and passes.
//!
//! Leases are a few hundred milliseconds and the checks sleep in real time where the
//! store keeps wall-clock times. Every wait is bounded; a check fails by panicking with a
//! message that says which rule the store broke.
//!
//! | check | proves |
//! |---|---|
//! | [`claim_in_commit_order`] | claim returns due rows in commit order, with the token, up to the limit; leased rows are not claimed twice |
//! | [`per_key_prefix`] | each key's claimed rows are a prefix of its pending rows; a retrying head blocks only its key; rows without a key are independent |
//! | [`concurrent_claimers_never_overlap`] | 4 claimers racing never hold the same row or the same key at once, and see each key in order |
//! | [`expired_lease_is_fenced`] | a crashed claim's rows come back after the lease with a new token; the old token's settlements change nothing |
//! | [`retry_counts_and_waits`] | retry counts the attempt, records the error, and the row is not due before its time |
//! | [`dead_stores_reason_and_unblocks`] | dead counts the attempt, stores the reason, is never claimed again and unblocks its key |
//! | [`release_counts_nothing`] | release ends the lease without counting an attempt |
//! | [`purge_is_bounded_and_selective`] | purge deletes only done rows settled before `before`, at most `limit` per call |
//! | [`delete_on_publish_deletes_done_rows_only`] | with delete on publish, done rows are deleted at settle, retried and dead rows kept, stale tokens fenced |
//! | [`rolled_back_enqueue_is_never_claimed`] | atomic enqueue: a rolled-back transaction leaves no row |
//! | [`bad_input_is_a_typed_error`] | duplicate ids and invalid messages are typed errors and store nothing |
//! | [`broker_outage_spends_no_attempts`] | publishes refused for an outage of the broker are handed back without counting attempts: nothing is dead-lettered |
//! | [`slow_broker_past_the_lease_never_overlaps`] | with a broker slower than the lease, two relays never have one key in flight at once: the holder renews its lease |
//! | [`claimed_ahead_batch_past_its_lease_is_handed_back`] | a batch claimed ahead whose lease ended while the batch before it was published is handed back, not published beside the relay that took its rows over |
//! | [`stop_hands_back_unstarted_rows`] | a relay told to stop finishes the publish under way and hands back the rows it did not start: unattempted, due at once, nothing published twice |
//! | [`relay_keeps_commit_order`] | two relays drain the table into the broker, each message once, in commit order per key |
//! | [`relay_backs_off_then_dead_letters`] | failed publishes back off, dead-letter after the limit (or at once if permanent) with the reason stored, and block only their key |
//! | [`relay_cleanup_purges_published`] | [`Spool::cleanup`] with zero retention deletes every published row and nothing else |
//! | [`rows_listed_newest_first_filtered_and_paged`] | [`OutboxAdmin::rows`](oncebox_core::spool::OutboxAdmin::rows) lists newest first; each filter alone and combined selects what it says; pages by position list every match once |
//! | [`scheduled_messages_wait_for_their_time`] | under a relay, a message scheduled 2 s ahead goes out after 2 s and not before; a due message behind a scheduled one of its key waits for it; a cancelled one never goes out; stats count scheduled apart from pending |
//! | [`cancel_never_takes_a_claimed_message`] | a cancel of a message a relay has claimed finds nothing to cancel, and the message ends published |
//! | [`cancel_in_an_open_transaction_holds`] | a cancel whose transaction stays open while a relay claims: committed, the message is never published and its key's next one goes out after the commit; rolled back, the message goes out after the rollback, before its key's next one |
//! | [`batch_commits_with_the_business_row`] | a batch of 1,000 messages commits with the business row and is published once each, with its ids, in slice order per key, between the key's one-by-one messages before and after it |
//! | [`batch_rolls_back_with_the_business_row`] | a batch of 1,000 rolled back with the business row leaves no row; enqueued again and committed, its rows are in slice order |
//! | [`batch_refusal_writes_nothing`] | a duplicate id (in the table or twice in the batch) and an invalid message in the middle refuse the whole batch with the typed error naming it, write nothing of it and leave the transaction usable; an empty batch does nothing |
//! | [`refusals_keep_the_transaction_usable`] | a duplicate id, an oversized payload and a NUL in the key, refused in one producer transaction, write nothing and leave it usable |
//! | [`a_commit_wakes_a_waiting_relay`] | a commit ends a relay's wait for work in the same process at once |
//! | [`settle_and_claim_sees_its_settlements`] | `settle_and_claim`'s claim sees its settlements (done moves a key on, a retry blocks it), a stale token settles nothing; with delete on publish too |
//! | [`stats_and_dead_letters`] | counts by status, the oldest pending age (from the enqueue or the creation, as the store keeps), a dead letter's message, reason and attempts |
//! | [`published_per_minute_counts_done_rows_by_minute`] | published rows counted by minute, oldest first, from the minute asked for (needs `publication_times`) |
//! | [`producers_of_a_key_commit_in_seq_order`] | a producer of a key waits for an open one of the same key, so `seq` order is commit order; other keys do not wait (needs `producer_key_locks`) |
//! | [`claim_finds_free_keys_behind_a_held_backlog`] | behind a window of held keys, a claim finds the free keys, each as a prefix of its rows (needs `claim_window`) |
//! | [`claim_step_two_reaches_every_key`] | successive claims reach all of 600 keys beyond the window, none twice (needs `claim_window`) |
//! | [`replay_waits_for_the_relay_holding_its_key`] | a dead row replayed while a relay holds its key waits for that relay (its settlement with `held_claims`, its lease without), then goes first |
//!
//! [`Spool::cleanup`]: oncebox_core::spool::Spool::cleanup
//! [`MemoryBroker`]: oncebox_core::memory::MemoryBroker

use std::future::Future;
use std::time::{Duration, SystemTime};

use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement, SpoolStore};
use oncebox_core::{Limits, Message, MessageId, Result, Schedule};

use crate::support::{ok, within};

mod admin;
mod batch;
mod broker_faults;
mod capabilities;
mod claiming;
mod foreign_rows;
mod key_order;
mod listing;
mod producing;
mod relay;
mod scheduling;
mod settle_and_claim;
mod settling;

pub use admin::{
    check_published_per_minute, published_per_minute_counts_done_rows_by_minute,
    stats_and_dead_letters,
};

pub use batch::{
    batch_commits_with_the_business_row, batch_refusal_writes_nothing,
    batch_rolls_back_with_the_business_row,
};
pub use broker_faults::{
    broker_outage_spends_no_attempts, claimed_ahead_batch_past_its_lease_is_handed_back,
    slow_broker_past_the_lease_never_overlaps, stop_hands_back_unstarted_rows,
};
pub use capabilities::Capabilities;
pub use claiming::{
    claim_in_commit_order, concurrent_claimers_never_overlap, expired_lease_is_fenced,
    per_key_prefix,
};
pub use foreign_rows::undecodable_rows_are_dead_lettered_not_handed_out;
pub use key_order::{
    batch_takes_key_locks_in_a_fixed_order, claim_finds_free_keys_behind_a_held_backlog,
    claim_step_two_reaches_every_key, producers_of_a_key_commit_in_seq_order,
    replay_waits_for_the_relay_holding_its_key,
};
pub use listing::{
    LISTED, check_listing, fill_listed, rows_listed_newest_first_filtered_and_paged,
};
pub use producing::{a_commit_wakes_a_waiting_relay, refusals_keep_the_transaction_usable};
pub use relay::{
    Attempt, FailingPublisher, Failure, relay_backs_off_then_dead_letters,
    relay_cleanup_purges_published, relay_keeps_commit_order,
};
pub use scheduling::{
    cancel_in_an_open_transaction_holds, cancel_never_takes_a_claimed_message,
    scheduled_messages_wait_for_their_time,
};
pub use settle_and_claim::settle_and_claim_sees_its_settlements;
pub use settling::{
    bad_input_is_a_typed_error, dead_stores_reason_and_unblocks,
    delete_on_publish_deletes_done_rows_only, purge_is_bounded_and_selective,
    release_counts_nothing, retry_counts_and_waits, rolled_back_enqueue_is_never_claimed,
};

/// How a backend gives the outbox suite a store and writes into it.
///
/// Construct one harness per check, on an isolated, empty outbox table (a fresh
/// database, schema or table prefix).
pub trait OutboxHarness: Send + Sync {
    /// The outbox table as the relay sees it.
    type Store: SpoolStore<Item = Message> + Clone + 'static;

    /// A producer's open transaction.
    type Producer: ProducerTx;

    /// A handle on this harness's outbox. Every call returns a handle on the same table;
    /// the suite uses several to stand for several relay processes.
    fn store(&self) -> Self::Store;

    /// What the store does beyond the contract every outbox keeps. Default:
    /// [`Capabilities::new`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
    }

    /// Begins a producer's transaction on the backend's own connection type, the way an
    /// application begins the transaction of its business writes.
    ///
    /// # Errors
    ///
    /// A store error if no transaction could be begun.
    fn begin(&self) -> impl Future<Output = Result<Self::Producer>> + Send;

    /// Enqueues `messages`, in order, in one producer transaction ([`begin`](Self::begin)),
    /// and commits.
    ///
    /// # Errors
    ///
    /// The store's error for the first message it refused (the transaction is then rolled
    /// back): [`Error::Duplicate`](oncebox_core::Error::Duplicate) for an id already in the table,
    /// [`Error::InvalidMessage`](oncebox_core::Error::InvalidMessage) for a message failing [`Message::validate`].
    fn enqueue(&self, messages: &[Message]) -> impl Future<Output = Result<()>> + Send {
        async move {
            let mut producer = self.begin().await?;
            for message in messages {
                if let Err(refused) = producer.enqueue(message).await {
                    producer.rollback().await?;
                    return Err(refused);
                }
            }
            producer.commit().await
        }
    }

    /// Enqueues `messages` in one producer transaction and rolls it back instead of
    /// committing.
    ///
    /// # Errors
    ///
    /// The store's error for a refused message.
    fn enqueue_rolled_back(&self, messages: &[Message]) -> impl Future<Output = Result<()>> + Send {
        async move {
            let mut producer = self.begin().await?;
            for message in messages {
                if let Err(refused) = producer.enqueue(message).await {
                    producer.rollback().await?;
                    return Err(refused);
                }
            }
            producer.rollback().await
        }
    }

    /// Enqueues one message in its own committed transaction, returning the store's
    /// typed error as it is.
    ///
    /// # Errors
    ///
    /// As [`OutboxHarness::enqueue`].
    fn enqueue_one(&self, message: &Message) -> impl Future<Output = Result<()>> + Send {
        self.enqueue(std::slice::from_ref(message))
    }

    /// The stored state of the row of message `id`, or `None` if there is no such row.
    ///
    /// # Errors
    ///
    /// A store error.
    fn row_state(&self, id: MessageId) -> impl Future<Output = Result<Option<RowState>>> + Send;

    /// A handle on the same table that deletes rows as they are published, instead of
    /// marking them done, if the store has that option. Default: `None`, and
    /// [`delete_on_publish_deletes_done_rows_only`] skips itself.
    fn deleting_on_publish(&self) -> Option<Self::Store> {
        None
    }

    /// A handle on the same table whose claims read a window of `rows` pending rows
    /// before looking for free keys beyond it. Called only if
    /// [`Capabilities::claim_window`]; the default refuses.
    ///
    /// # Errors
    ///
    /// When the store has no claim window.
    fn windowed(&self, rows: usize) -> Result<Self::Store> {
        let _ = rows;
        Err(oncebox_core::Error::InvalidOptions(
            "this harness declares no claim window".into(),
        ))
    }

    /// Sets the time the published row of message `id` was published. Called only if
    /// [`Capabilities::publication_times`]; the default refuses.
    ///
    /// # Errors
    ///
    /// A store error; the default's when the harness cannot.
    fn set_published_at(
        &self,
        id: MessageId,
        at: SystemTime,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (id, at);
        std::future::ready(Err(oncebox_core::Error::InvalidOptions(
            "this harness cannot set publication times".into(),
        )))
    }

    /// Two keys, the lower first, in the order a transaction of this store takes their
    /// locks (a batch of both takes the lower's first). Called only if
    /// [`Capabilities::producer_key_locks`]; the default refuses.
    ///
    /// # Errors
    ///
    /// A store error; the default's when the harness cannot.
    fn keys_in_lock_order(&self) -> impl Future<Output = Result<(String, String)>> + Send {
        std::future::ready(Err(oncebox_core::Error::InvalidOptions(
            "this harness does not say in which order keys are locked".into(),
        )))
    }

    /// Writes rows into the outbox table by hand, committed and pending, as something
    /// other than oncebox might, that the store cannot decode into a message (headers
    /// that are not strings, say); returns their ids in commit order, each with the words
    /// its dead-letter reason must contain (the column at fault). The default writes none
    /// (the check that needs them is skipped).
    ///
    /// # Errors
    ///
    /// A store error.
    fn write_undecodable_rows(
        &self,
    ) -> impl Future<Output = Result<Vec<(MessageId, Vec<&'static str>)>>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// Enqueues `message` with the store's `enqueue_scheduled`, due as `when` says, in a
    /// transaction of its own, committed.
    ///
    /// # Errors
    ///
    /// As [`OutboxHarness::enqueue`].
    fn enqueue_scheduled(
        &self,
        message: &Message,
        when: Schedule,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Cancels message `id` with the store's `cancel`, in a transaction of its own,
    /// committed; whether it was cancelled.
    ///
    /// # Errors
    ///
    /// A store error.
    fn cancel(&self, id: MessageId) -> impl Future<Output = Result<bool>> + Send;

    /// Cancels message `id` with the store's `cancel` in a transaction of its own, as an
    /// application would beside its business writes, keeps that transaction open for
    /// `open_for` once the cancel has returned, then commits it if `commit`, else rolls
    /// it back; whether the cancel returned `true`.
    ///
    /// # Errors
    ///
    /// A store error.
    fn cancel_kept_open(
        &self,
        id: MessageId,
        open_for: Duration,
        commit: bool,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The limits the store enforces at enqueue. Default: [`Limits::new`].
    fn limits(&self) -> Limits {
        Limits::new()
    }

    /// In one transaction on the backend's own connection type, writes one business row
    /// marked `business` (in a table of the harness's own), then enqueues `messages`
    /// with the store's batch enqueue (`enqueue_batch`), and commits if `commit`, else
    /// rolls back. A refused batch ends the transaction as asked all the same (the
    /// business row is committed if `commit`: the refusal must leave the transaction
    /// usable), and the refusal is returned.
    ///
    /// # Errors
    ///
    /// The batch's refusal ([`Error::Duplicate`](oncebox_core::Error::Duplicate),
    /// [`Error::InvalidMessage`](oncebox_core::Error::InvalidMessage)) once the
    /// transaction has ended; a store error if the transaction could not begin, take the
    /// business row or end.
    fn enqueue_batch(
        &self,
        business: &str,
        messages: &[Message],
        commit: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    /// How many committed business rows [`OutboxHarness::enqueue_batch`] wrote marked
    /// `business`.
    ///
    /// # Errors
    ///
    /// A store error.
    fn business_rows(&self, business: &str) -> impl Future<Output = Result<u64>> + Send;
}

/// A producer's transaction on the backend's own connection type, open: what an
/// application holds between its first write and its commit. Dropped without an end, it
/// rolls back.
pub trait ProducerTx: Send + 'static {
    /// Enqueues `message` in this transaction with the store's `enqueue`.
    ///
    /// # Errors
    ///
    /// The store's refusal ([`Error::Duplicate`](oncebox_core::Error::Duplicate),
    /// [`Error::InvalidMessage`](oncebox_core::Error::InvalidMessage), a store error). A
    /// refusal must leave the transaction usable.
    fn enqueue(&mut self, message: &Message) -> impl Future<Output = Result<()>> + Send;

    /// Commits, then wakes the relays of this process (the store's `wake`), as an
    /// application does after its commit.
    ///
    /// # Errors
    ///
    /// A store error if the commit failed.
    fn commit(self) -> impl Future<Output = Result<()>> + Send;

    /// Rolls back.
    ///
    /// # Errors
    ///
    /// A store error if the rollback failed.
    fn rollback(self) -> impl Future<Output = Result<()>> + Send;
}

/// Where a row is in its life, as far as the suite needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowStatus {
    /// Waiting to be published (leased or not, due or not).
    Pending,
    /// Published; kept until retention purges it.
    Done,
    /// Dead-lettered.
    Dead,
}

/// The stored state of one outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// Where the row is.
    pub status: RowStatus,
    /// Attempts counted so far (retries and the dead-lettering attempt).
    pub attempts: u32,
    /// The last recorded error; for a dead row, the dead-letter reason.
    pub last_error: Option<String>,
}

const TOPIC: &str = "conformance.orders";
const LONG_LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(250);
/// Longest any single step may take before the check gives up.
const STEP: Duration = Duration::from_secs(10);

/// A message whose payload is its `label`, so failures can name rows.
fn message(key: Option<&str>, label: &str) -> Message {
    let message = Message::new(TOPIC, label.to_owned())
        .with_kind("OrderPlaced")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
    let message = ok("building a test message", message);
    match key {
        Some(key) => message.with_key(key),
        None => message,
    }
}

/// The payload as text, cut short: the label the message was built with, or a mark for
/// the oversized payloads of the limit checks.
fn label(message: &Message) -> String {
    let text = String::from_utf8_lossy(&message.payload);
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…({} bytes)", &text[..cut], message.payload.len()),
        None => text.into_owned(),
    }
}

fn labels(rows: &[Claimed<Message>]) -> Vec<String> {
    rows.iter().map(|row| label(&row.item)).collect()
}

async fn claim<S: SpoolStore<Item = Message>>(
    step: &str,
    store: &S,
    limit: usize,
    lease: Duration,
) -> (LeaseToken, Vec<Claimed<Message>>) {
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit,
        lease,
    };
    let rows = ok(step, within(step, STEP, store.claim(&request)).await);
    assert!(
        rows.len() <= limit,
        "{step}: claimed {} rows with a limit of {limit}",
        rows.len()
    );
    for row in &rows {
        assert_eq!(
            row.token,
            request.token,
            "{step}: row {} carries a token other than the claim's",
            label(&row.item)
        );
    }
    assert!(
        rows.windows(2).all(|pair| pair[0].seq < pair[1].seq),
        "{step}: rows not in seq order: {:?}",
        rows.iter()
            .map(|r| (r.seq, label(&r.item)))
            .collect::<Vec<_>>()
    );
    (request.token, rows)
}

async fn settle<S: SpoolStore<Item = Message>>(
    step: &str,
    store: &S,
    token: LeaseToken,
    settlements: Vec<Settlement>,
) {
    ok(
        step,
        within(step, STEP, store.settle(token, &settlements)).await,
    );
}

fn seq_of(rows: &[Claimed<Message>], message: &Message) -> i64 {
    match rows.iter().find(|row| row.item.id == message.id) {
        Some(row) => row.seq,
        None => panic!(
            "row {} was expected among the claimed rows {:?}",
            label(message),
            labels(rows)
        ),
    }
}

fn outcome(rows: &[Claimed<Message>], message: &Message, outcome: Settle) -> Settlement {
    Settlement {
        seq: seq_of(rows, message),
        outcome,
    }
}

fn released(rows: &[Claimed<Message>]) -> Vec<Settlement> {
    rows.iter()
        .map(|row| Settlement {
            seq: row.seq,
            outcome: Settle::Release,
        })
        .collect()
}

fn all_done(rows: &[Claimed<Message>]) -> Vec<Settlement> {
    rows.iter()
        .map(|row| Settlement {
            seq: row.seq,
            outcome: Settle::Done,
        })
        .collect()
}

async fn state<H: OutboxHarness>(harness: &H, message: &Message) -> RowState {
    let step = format!("row_state of {}", label(message));
    match ok(&step, harness.row_state(message.id).await) {
        Some(state) => state,
        None => panic!("{step}: the row is missing"),
    }
}

fn assert_state(step: &str, state: &RowState, status: RowStatus, attempts: u32) {
    assert_eq!(
        (state.status, state.attempts),
        (status, attempts),
        "{step}: expected status {status:?} with {attempts} attempts, found {state:?}"
    );
}

/// Compile-time check that the suite's futures can be spawned on a multi-threaded
/// runtime for any harness.
#[allow(dead_code)]
fn futures_are_send<H: OutboxHarness>(harness: &'static H) {
    fn send<F: Future + Send>(_: F) {}
    send(concurrent_claimers_never_overlap(harness));
    send(relay_keeps_commit_order(harness));
    send(relay_backs_off_then_dead_letters(harness));
}
