//! Wake-ups for waiting relays: in-process ones, and `LISTEN` on a notification channel
//! that producers `NOTIFY` in their transactions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// First and longest pause before the listener reconnects after a failure.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The wake-up channel of one outbox table: a counter that moves on every notification
/// (or in-process [`Wakeup::wake`]); waiters wait for it to move.
#[derive(Debug)]
pub(crate) struct Wakeup {
    pool: PgPool,
    channel: String,
    counter: watch::Sender<u64>,
    /// The `LISTEN` task, once started.
    listener: Mutex<Option<AbortOnDrop>>,
}

/// Stops the listener task when the last handle on the table goes away.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Wakeup {
    pub(crate) fn new(pool: PgPool, channel: String) -> Self {
        Self {
            pool,
            channel,
            counter: watch::Sender::new(0),
            listener: Mutex::new(None),
        }
    }

    /// The notification channel.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// A receiver that has seen every wake-up so far.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.counter.subscribe()
    }

    /// Wakes every waiter.
    pub(crate) fn wake(&self) {
        self.counter.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Starts the `LISTEN` task on the current tokio runtime, once.
    pub(crate) fn listen(&self) {
        let mut listener = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if listener.is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // A pool of its own with one connection, so that listening never takes a
        // connection from the application's pool.
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(options);
        let task = runtime.spawn(listen(pool, self.channel.clone(), self.counter.clone()));
        *listener = Some(AbortOnDrop(task));
    }
}

/// Listens on `channel` until aborted, moving `counter` on every notification, and on
/// every reconnection (notifications sent while disconnected are lost, so waiters look).
async fn listen(pool: PgPool, channel: String, counter: watch::Sender<u64>) {
    let mut pause = RETRY_MIN;
    loop {
        match listen_once(&pool, &channel, &counter).await {
            Ok(()) => pause = RETRY_MIN,
            Err(error) => {
                tracing::warn!(
                    %channel, %error, retry_in = ?pause,
                    "LISTEN failed; relays fall back to polling until it works again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
        counter.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// One listening session; returns when the connection was lost and re-established.
async fn listen_once(
    pool: &PgPool,
    channel: &str,
    counter: &watch::Sender<u64>,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    tracing::debug!(%channel, "listening for outbox notifications");
    loop {
        match listener.try_recv().await? {
            Some(_) => counter.send_modify(|n| *n = n.wrapping_add(1)),
            None => return Ok(()),
        }
    }
}

/// Waits until `seen` sees a wake-up it has not seen, or `timeout` passed.
pub(crate) async fn wait(seen: &mut watch::Receiver<u64>, timeout: Duration) {
    match tokio::time::timeout(timeout, seen.changed()).await {
        Ok(Ok(())) | Err(_) => {}
        // The sender is gone (cannot happen while a handle lives): poll.
        Ok(Err(_)) => tokio::time::sleep(timeout).await,
    }
}

/// The receiver a handle keeps, marked as seen when a claim starts: a notification that
/// arrives during the claim then ends the next wait at once.
#[derive(Debug)]
pub(crate) struct Seen(Mutex<watch::Receiver<u64>>);

impl Seen {
    pub(crate) fn new(wakeup: &Arc<Wakeup>) -> Self {
        Self(Mutex::new(wakeup.subscribe()))
    }

    /// Marks every wake-up so far as seen.
    pub(crate) fn mark(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .borrow_and_update();
    }

    /// A receiver in the same state, to wait on without holding the lock.
    pub(crate) fn snapshot(&self) -> watch::Receiver<u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Clone for Seen {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.snapshot()))
    }
}
