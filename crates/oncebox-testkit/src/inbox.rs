//! The inbox conformance suite: the transactional inbox ([`InboxStore`] under
//! [`TransactionalInbox`]) and the durable inbox ([`DurableInboxStore`] under
//! [`DurableInbox`]), checked against the real store.
//!
//! The exactly-once claims are checked on an *effect*: a row the handler writes into a
//! harness-owned table inside the inbox's transaction. The effects table must have no
//! unique constraint, so that a second effect is counted rather than refused.
//!
//! A backend implements [`InboxHarness`] (and [`DurableInboxHarness`] if it has a
//! durable inbox) and calls every check from its own test, with a fresh harness each
//! time:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread")]
//! async fn inbox_concurrent_duplicates_have_one_effect() {
//!     oncebox_testkit::inbox::concurrent_duplicates_have_one_effect(&MyHarness::new().await).await;
//! }
//! ```
//!
//! | check | proves |
//! |---|---|
//! | [`duplicate_returns_first_result`] | a duplicate skips the handler and returns the first result; records are scoped per consumer |
//! | [`failure_rolls_back_record_and_effect`] | a failed handler leaves neither record nor effect; the retry processes the message |
//! | [`concurrent_duplicates_have_one_effect`] | 8 workers receiving each message 3 times at once: one effect per message, every duplicate sees the stored result |
//! | [`many_concurrent_duplicates_have_one_effect`] | the same with 2,000 messages on 50 keys |
//! | [`purge_is_bounded_and_selective`] | purge deletes one consumer's records processed before `before`, at most `limit` per call, never another consumer's |
//! | [`hostile_ids_round_trip`] | consumer names and ids full of quotes, backslashes, dollar quotes and NUL are data, found again exactly |
//! | [`purge_respects_dedup_window`] | [`TransactionalInbox::purge_older_than`] refuses an age below the dedup window |
//! | [`durable_retention_is_the_dedup_window`] | the processor keeps processed deliveries for the dedup window, and refuses a shorter retention |
//! | [`durable_accept_dedups`] | durable accept stores a delivery once per consumer, and keeps refusing it once done or dead |
//! | [`durable_processor_runs_each_effect_once`] | two [`DurableInbox::processor`] spools with failing handler calls run each effect once |
//! | [`durable_stale_complete_is_lease_lost`] | `complete` with a stale token is [`Error::LeaseLost`] and the rollback undoes the effect |
//! | [`inbox_rows_listed_newest_first_filtered_and_paged`] | [`InboxAdmin::inbox_rows`] lists every consumer's durable rows newest first with their state and result; each filter selects what it says; pages list every match once |
//! | [`consumer_figures`] | [`InboxAdmin::consumers`] counts what the engine did: handled, pending, dead, duplicates skipped by either inbox, last handled time |
//! | [`handler_timeout_rolls_back_and_dead_letters`] | a handler sleeping past its timeout under a [`Consumer`]: retried, then dead-lettered with the timeout as reason; no effect, and every connection back in the pool |
//! | [`durable_handler_timeout_fails_the_attempt`] | a durable inbox's processor stops a handler past its timeout: retried, then dead with the timeout as reason, no effect |
//! | [`stop_hands_back_queued_deliveries`] | a [`Consumer`] stopped behind a slow handler finishes the deliveries it started, starts no other, and hands the rest back to the broker at once: the next run has each effect once, no failure counted |
//! | [`cleanup_keeps_the_window`] | a [`Consumer`] running ten dedup windows keeps its inbox records under three windows' worth, and never deletes a record inside the window |
//!
//! [`DurableInbox`]: oncebox_core::consumer::DurableInbox
//! [`Consumer`]: oncebox_core::consumer::Consumer
//! [`InboxAdmin::consumers`]: oncebox_core::consumer::InboxAdmin::consumers
//! [`InboxAdmin::inbox_rows`]: oncebox_core::consumer::InboxAdmin::inbox_rows
//! [`DurableInbox::processor`]: oncebox_core::consumer::DurableInbox::processor

use std::collections::HashSet;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{ConsumerOptions, InboxAdmin, Outcome, TransactionalInbox, TxHandler};
use oncebox_core::store::{DurableInboxStore, InboxStore, Transactional};
use oncebox_core::{Bytes, Coordinates, Error, Message, Received, Result};

use crate::support::{ok, within};

mod durable;
mod figures;
mod listing;
mod stop;
mod transactional;
mod upkeep;

pub use durable::{
    durable_accept_dedups, durable_processor_runs_each_effect_once,
    durable_retention_is_the_dedup_window, durable_stale_complete_is_lease_lost,
};
pub use figures::consumer_figures;
pub use listing::inbox_rows_listed_newest_first_filtered_and_paged;
pub use stop::stop_hands_back_queued_deliveries;
pub use transactional::{
    concurrent_duplicates_have_one_effect, duplicate_returns_first_result,
    failure_rolls_back_record_and_effect, hostile_ids_round_trip,
    many_concurrent_duplicates_have_one_effect, purge_is_bounded_and_selective,
    purge_respects_dedup_window,
};
pub use upkeep::{
    cleanup_keeps_the_window, durable_handler_timeout_fails_the_attempt,
    handler_timeout_rolls_back_and_dead_letters,
};

/// The transaction type of a harness's inbox store.
pub type TxOf<H> = <<H as InboxHarness>::Store as Transactional>::Tx;

/// How a backend gives the inbox suite a transactional inbox store and an effects table.
///
/// Construct one harness per check, on an isolated database (or schema) holding the
/// inbox tables and the harness's effects table, empty.
pub trait InboxHarness: Send + Sync {
    /// The transactional inbox store, with its figures for operators.
    type Store: InboxStore + InboxAdmin + Clone + 'static;

    /// A handle on this harness's inbox store. Every call returns a handle on the same
    /// tables.
    fn store(&self) -> Self::Store;

    /// Writes one effect row for `key` into the harness's effects table, inside `tx`
    /// (so it commits or rolls back with the inbox record).
    ///
    /// # Errors
    ///
    /// A store error.
    fn insert_effect(tx: &mut TxOf<Self>, key: &str) -> impl Future<Output = Result<()>> + Send;

    /// How many committed effect rows `key` has.
    ///
    /// # Errors
    ///
    /// A store error.
    fn count_effects(&self, key: &str) -> impl Future<Output = Result<u64>> + Send;

    /// The store's connection pool as it stands, if it has one: checks that stop a
    /// handler mid-transaction see its connection come back. Default: `None`, and those
    /// checks leave that part out.
    fn connections(&self) -> Option<Connections> {
        None
    }
}

/// A connection pool's state: connections open, and how many of them are idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// Connections the pool holds open.
    pub open: u32,
    /// Of those, the ones in the pool, lent to nobody.
    pub idle: usize,
}

/// The durable inbox of an [`InboxHarness`] backend, sharing its transaction type and
/// effects table.
pub trait DurableInboxHarness: InboxHarness {
    /// The durable inbox store, scoped to one consumer.
    type Durable: DurableInboxStore<Tx = TxOf<Self>> + 'static;

    /// The durable inbox table of `consumer` in this harness's database. Every call
    /// with the same consumer returns a handle on the same rows.
    fn durable(&self, consumer: &str) -> Self::Durable;
}

/// Longest any single step may take before the check gives up.
const STEP: Duration = Duration::from_secs(10);
const LONG_LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(250);

/// A received message whose payload is `label`.
fn received(key: Option<&str>, label: &str) -> Received {
    let message = Message::new("conformance.payments", label.to_owned())
        .with_kind("PaymentRequested")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
    let mut message = ok("building a test message", message);
    message.key = key.map(str::to_owned);
    let at = Coordinates {
        source: "conformance.payments".to_owned(),
        partition: Some(0),
        position: label.to_owned(),
    };
    Received::from_message(&message, at, 1)
}

fn label(received: &Received) -> String {
    String::from_utf8_lossy(&received.payload).into_owned()
}

fn dedup_id(received: &Received) -> String {
    received.id.map(|id| id.to_string()).unwrap_or_default()
}

fn effect_key(consumer: &str, received: &Received) -> String {
    format!("{consumer}:{}", label(received))
}

async fn effects<H: InboxHarness>(harness: &H, consumer: &str, received: &Received) -> u64 {
    let key = effect_key(consumer, received);
    ok(
        &format!("count_effects({key})"),
        harness.count_effects(&key).await,
    )
}

/// A handler that writes one effect per run, optionally waits, fails its first
/// `failures` runs (after writing the effect, so the rollback must undo it), and returns
/// a result naming the run.
struct EffectHandler<H> {
    consumer: String,
    runs: Arc<AtomicU32>,
    failures: Arc<AtomicU32>,
    delay: Duration,
    succeeded: Arc<Mutex<HashSet<String>>>,
    harness: PhantomData<fn() -> H>,
}

impl<H> EffectHandler<H> {
    fn new(consumer: &str) -> Self {
        Self {
            consumer: consumer.to_owned(),
            runs: Arc::default(),
            failures: Arc::default(),
            delay: Duration::ZERO,
            succeeded: Arc::default(),
            harness: PhantomData,
        }
    }

    fn failing(self, runs: u32) -> Self {
        self.failures.store(runs, Ordering::SeqCst);
        self
    }

    fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// A handler sharing this one's counters.
    fn share(&self) -> Self {
        Self {
            consumer: self.consumer.clone(),
            runs: Arc::clone(&self.runs),
            failures: Arc::clone(&self.failures),
            delay: self.delay,
            succeeded: Arc::clone(&self.succeeded),
            harness: PhantomData,
        }
    }
}

impl<H: InboxHarness> TxHandler<TxOf<H>> for EffectHandler<H> {
    type Output = Bytes;

    async fn handle(&self, message: &Received, tx: &mut TxOf<H>) -> Result<Bytes> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        H::insert_effect(tx, &effect_key(&self.consumer, message)).await?;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
        {
            return Err(Error::handler("injected handler failure"));
        }
        self.succeeded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(label(message));
        Ok(Bytes::from(format!(
            "{} run {run} of {}",
            self.consumer,
            label(message)
        )))
    }
}

fn inbox<H: InboxHarness>(
    harness: &H,
    handler: EffectHandler<H>,
    options: ConsumerOptions,
) -> TransactionalInbox<H::Store, EffectHandler<H>> {
    ok(
        "TransactionalInbox::new",
        TransactionalInbox::new(harness.store(), handler, options),
    )
}

async fn handle<H: InboxHarness>(
    step: &str,
    inbox: &TransactionalInbox<H::Store, EffectHandler<H>>,
    received: &Received,
) -> (Outcome, Bytes) {
    ok(step, within(step, STEP, inbox.handle(received)).await)
}

/// Compile-time check that the suite's futures can be spawned on a multi-threaded
/// runtime for any harness.
#[allow(dead_code)]
fn futures_are_send<H: DurableInboxHarness>(harness: &'static H) {
    fn send<F: Future + Send>(_: F) {}
    send(concurrent_duplicates_have_one_effect(harness));
    send(durable_processor_runs_each_effect_once(harness));
}
