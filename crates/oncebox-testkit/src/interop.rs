//! The shared part of the interop tests with clients in other languages: the Python peer
//! (`interop/peer.py`, its clients installed by `scripts/interop-tools.sh`, found through
//! `ONCEBOX_PYTHON`), and a transactional inbox that records what a foreign producer's
//! messages became.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::consumer::{Consumer, ConsumerOptions, Outcome, TransactionalInbox, TxHandler};
use oncebox_core::{Received, Result, Subscriber};
use tokio::process::Command;

use crate::inbox::{InboxHarness, TxOf};
use crate::sqlite::SqliteHarness;
use crate::support::{ok, within};

/// Runs `interop/peer.py` with `args` and returns what it printed; panics with its
/// standard error if it fails, or if it takes more than a minute.
///
/// # Panics
///
/// When `ONCEBOX_PYTHON` is not set (the message says how to install the clients), or
/// the peer fails.
pub async fn peer(args: &[&str]) -> String {
    let python = std::env::var("ONCEBOX_PYTHON").unwrap_or_else(|_| {
        panic!(
            "ONCEBOX_PYTHON is not set: the interop tests need the Python clients; install \
             them with `export ONCEBOX_PYTHON=$(scripts/interop-tools.sh)` (scripts/test does)"
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../interop/peer.py");
    let run = Command::new(&python).arg(script).args(args).output();
    let output = within("peer.py", Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|error| panic!("run {python}: {error}"));
    assert!(
        output.status.success(),
        "peer.py {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("peer.py prints UTF-8")
}

/// The handler of the interop inboxes: one effect row named after the payload.
pub struct Effect;

impl TxHandler<TxOf<SqliteHarness>> for Effect {
    type Output = ();

    async fn handle(&self, message: &Received, tx: &mut TxOf<SqliteHarness>) -> Result<()> {
        SqliteHarness::insert_effect(tx, &String::from_utf8_lossy(&message.payload)).await
    }
}

/// What the consumer made of each delivery, in the order they were settled.
pub type Outcomes = Vec<(Received, Outcome)>;

/// Runs a transactional inbox (consumer `billing`, handler [`Effect`]) on a fresh SQLite
/// store under a one-lane [`Consumer`] on `subscriber`, runs `produce` (the foreign
/// producer), waits until `expected` deliveries are settled (30 s at most) and stops the
/// consumer. Returns the store, for its effects, and the outcomes.
pub async fn inbox_outcomes<S>(
    subscriber: S,
    produce: impl Future,
    expected: usize,
) -> (SqliteHarness, Outcomes)
where
    S: Subscriber + 'static,
{
    let store = SqliteHarness::new().await;
    let inbox = ok(
        "TransactionalInbox::new",
        TransactionalInbox::new(store.store(), Effect, ConsumerOptions::new("billing")),
    );
    let seen: Arc<Mutex<Outcomes>> = Arc::default();
    let record = Arc::clone(&seen);
    let consumer =
        Consumer::new(subscriber, inbox)
            .lanes(1)
            .on_outcome(move |received, outcome| {
                record
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((received.clone(), outcome.clone()));
            });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(consumer.run_until(async {
        let _ = stopped.await;
    }));

    produce.await;

    let settled = || seen.lock().unwrap_or_else(PoisonError::into_inner).len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while settled() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{expected} outcomes within 30 s: {:?}",
            seen.lock().unwrap_or_else(PoisonError::into_inner)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    ok("the consumer's run", ok("join the consumer", running.await));
    let outcomes = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    (store, outcomes)
}

/// The one delivery of `outcomes` whose payload is `payload`, and what became of it.
///
/// # Panics
///
/// When there is none, or more than one.
pub fn outcome_of(outcomes: &Outcomes, payload: &str) -> (Received, Outcome) {
    let found: Vec<_> = outcomes
        .iter()
        .filter(|(received, _)| &received.payload[..] == payload.as_bytes())
        .collect();
    assert_eq!(found.len(), 1, "{payload}: {outcomes:?}");
    found[0].clone()
}
