//! Running a service's relays, consumers and inbox processors together, and stopping
//! them together.
//!
//! ```
//! # use oncebox_core::{Result, memory::MemoryBroker};
//! # use oncebox_core::consumer::{Consumer, ConsumerOptions, IdempotentReceiver};
//! # use oncebox_core::memory::MemoryDedupStore;
//! use oncebox_core::run::Runner;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! # let broker = MemoryBroker::new();
//! # let receiver = IdempotentReceiver::new(
//! #     MemoryDedupStore::new(1000),
//! #     oncebox_core::consumer::handler_fn(|_: &oncebox_core::Received| async { Ok(()) }),
//! #     ConsumerOptions::new("mailer"),
//! # )?;
//! let consumer = Consumer::new(broker.subscribe("orders", "mailer"), receiver);
//! Runner::new()
//!     .spawn("mailer", consumer)
//!     // .spawn("relay", relay).spawn("inbox", processor) ...
//!     .run_until(async { /* tokio::signal::ctrl_c().await */ })
//!     .await
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::consumer::{Consumer, Process};
use crate::spool::{Relay, Spool, SpoolStore};
use crate::{Error, Message, Publisher, Result, Subscriber};

/// Tells the parts of a [`Runner`] to stop: a future that completes when they should.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Completes once the runner is stopping.
    pub async fn wait(mut self) {
        // An error means the runner is gone: stop as well.
        let _ = self.0.wait_for(|stopping| *stopping).await;
    }
}

/// A long-running part of a service that stops when told: a [`Relay`], a durable inbox
/// processor ([`Spool`]), a [`Consumer`], or a closure `FnOnce(Shutdown) -> impl Future<Output =
/// Result<()>>` for anything else.
pub trait Run: Send + 'static {
    /// Runs until `shutdown` completes, then finishes what it holds and returns.
    ///
    /// # Errors
    ///
    /// A failure that stopped the part before it was told to stop.
    fn run(self, shutdown: Shutdown) -> impl Future<Output = Result<()>> + Send;
}

impl<S, K> Run for Spool<S, K>
where
    S: SpoolStore + 'static,
    K: crate::spool::Sink<S::Item> + 'static,
{
    async fn run(self, shutdown: Shutdown) -> Result<()> {
        self.run_until(shutdown.wait()).await
    }
}

impl<S, P> Run for Relay<S, P>
where
    S: SpoolStore<Item = Message> + 'static,
    P: Publisher + 'static,
{
    async fn run(self, shutdown: Shutdown) -> Result<()> {
        self.run_until(shutdown.wait()).await
    }
}

impl<Sub, P> Run for Consumer<Sub, P>
where
    Sub: Subscriber + 'static,
    P: Process + 'static,
{
    fn run(self, shutdown: Shutdown) -> impl Future<Output = Result<()>> + Send {
        self.run_until(shutdown.wait())
    }
}

impl<F, Fut> Run for F
where
    F: FnOnce(Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    fn run(self, shutdown: Shutdown) -> impl Future<Output = Result<()>> + Send {
        self(shutdown)
    }
}

type Part = Box<dyn FnOnce(Shutdown) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send>;

/// Runs relays, consumers and inbox processors together, each on a task of its own, and
/// stops them together: on the signal, or as soon as one of them fails.
#[must_use]
#[derive(Default)]
pub struct Runner {
    parts: Vec<(String, Part)>,
}

impl Runner {
    /// A runner with nothing to run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `part`, called `name` in logs and errors.
    pub fn spawn(mut self, name: impl Into<String>, part: impl Run) -> Self {
        self.parts.push((
            name.into(),
            Box::new(move |shutdown| Box::pin(part.run(shutdown))),
        ));
        self
    }

    /// Runs every part until `signal` completes or a part fails, then tells all of them
    /// to stop and waits until each has finished what it holds. A part that ends on its
    /// own without error (a consumer whose subscription closed) lets the others run on.
    ///
    /// Must be called within a Tokio runtime: each part runs on a task of its own.
    ///
    /// # Errors
    ///
    /// The first error a part returned, or [`Error::TaskLost`] naming a part that
    /// panicked. The other parts are stopped and awaited before it returns.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts every part, as a crash would: claimed rows wait for
    /// their lease, unsettled deliveries for the broker's ack timeout.
    pub async fn run_until(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        let (stop, stopping) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for (name, part) in self.parts {
            let run = part(Shutdown(stopping.clone()));
            tasks.spawn(async move {
                let ended = std::panic::AssertUnwindSafe(run).catch_unwind().await;
                match ended {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => {
                        tracing::error!(part = %name, %error, "stopped with an error");
                        Err(error)
                    }
                    Err(_) => Err(Error::TaskLost(format!("{name} (panicked)"))),
                }
            });
        }
        let mut first_error = None;
        let mut signal = std::pin::pin!(signal);
        loop {
            tokio::select! {
                () = &mut signal => break,
                ended = tasks.join_next() => match ended {
                    None => break,
                    Some(Ok(Ok(()))) => {}
                    Some(Ok(Err(error))) => {
                        first_error = Some(error);
                        break;
                    }
                    Some(Err(join)) => {
                        first_error = Some(Error::TaskLost(join.to_string()));
                        break;
                    }
                },
            }
        }
        let _ = stop.send(true);
        while let Some(ended) = tasks.join_next().await {
            let ended = ended.unwrap_or_else(|join| Err(Error::TaskLost(join.to_string())));
            if let Err(error) = ended {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn waits(stopped: Arc<AtomicUsize>) -> impl Run {
        move |shutdown: Shutdown| async move {
            shutdown.wait().await;
            stopped.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_signal_stops_every_part() {
        let stopped = Arc::new(AtomicUsize::new(0));
        Runner::new()
            .spawn("a", waits(Arc::clone(&stopped)))
            .spawn("b", waits(Arc::clone(&stopped)))
            .run_until(tokio::time::sleep(std::time::Duration::from_millis(10)))
            .await
            .unwrap();
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failing_part_stops_the_others_and_its_error_returns() {
        let stopped = Arc::new(AtomicUsize::new(0));
        let error = Runner::new()
            .spawn("waits", waits(Arc::clone(&stopped)))
            .spawn("fails", |_: Shutdown| async {
                Err(Error::InvalidOptions("no table".into()))
            })
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("no table"), "{error}");
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_panicking_part_is_an_error_that_names_it() {
        let stopped = Arc::new(AtomicUsize::new(0));
        let error = Runner::new()
            .spawn("waits", waits(Arc::clone(&stopped)))
            .spawn("relay", |_: Shutdown| async {
                if true {
                    panic!("bug");
                }
                Ok(())
            })
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::TaskLost(what) if what.contains("relay")),
            "{error}"
        );
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_part_ending_on_its_own_lets_the_others_run() {
        let stopped = Arc::new(AtomicUsize::new(0));
        Runner::new()
            .spawn("done", |_: Shutdown| async { Ok(()) })
            .spawn("waits", waits(Arc::clone(&stopped)))
            .run_until(tokio::time::sleep(std::time::Duration::from_millis(20)))
            .await
            .unwrap();
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }
}
