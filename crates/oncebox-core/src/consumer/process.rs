//! The processing step shared by the consumer engines, and what it reports.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use super::ConsumerOptions;
use crate::{Error, Received, Result};

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its result was recorded; the delivery was acked.
    Handled,
    /// A duplicate: the handler did not run, the first result stands; acked.
    Duplicate,
    /// Durable inbox: stored for processing and acked.
    Stored,
    /// Another worker is processing the same id right now; nacked to come back after
    /// `retry_after`.
    InProgress {
        /// Time left on the other worker's lease.
        retry_after: Duration,
    },
    /// Failed; nacked for redelivery after `delay`. The attempt counts toward the limit.
    Retrying {
        /// The redelivery delay asked of the broker.
        delay: Duration,
    },
    /// Given up and handed to the broker's dead-letter destination.
    DeadLettered {
        /// Why.
        reason: String,
    },
    /// Idempotent receiver failing open: the handler ran without a dedup check because
    /// the store failed.
    HandledUnguarded,
}

impl Outcome {
    /// The outcome's label in metrics (`oncebox_consumer_messages_total`) and spans:
    /// `handled`, `duplicate`, `stored`, `in_progress`, `retried`, `dead_lettered` or
    /// `unguarded`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Handled => "handled",
            Self::Duplicate => "duplicate",
            Self::Stored => "stored",
            Self::InProgress { .. } => "in_progress",
            Self::Retrying { .. } => "retried",
            Self::DeadLettered { .. } => "dead_lettered",
            Self::HandledUnguarded => "unguarded",
        }
    }
}

/// Processes one received message, without settling it with the broker: implemented by
/// the three consumer engines, run by [`Consumer`](super::Consumer), which acks, nacks,
/// holds or dead-letters the delivery by the result.
///
/// # Contract
///
/// - `Ok` is one of [`Outcome::Handled`], [`Outcome::Duplicate`], [`Outcome::Stored`],
///   [`Outcome::InProgress`] or [`Outcome::HandledUnguarded`]: the consumer acks the
///   delivery (nacks it for `InProgress`).
/// - `Err` is classified by [`Error::fault`]: permanent → dead letter, transient → nack
///   with backoff until the attempt limit, outage → the delivery is held and processed
///   again once the store answers, without spending an attempt. [`Error::Closed`] stops
///   the consumer.
/// - Nothing is committed when `Err` is returned.
pub trait Process: Send + Sync {
    /// The options: consumer name, id strategy, attempt limit, backoff.
    fn options(&self) -> &ConsumerOptions;

    /// Processes `received`.
    ///
    /// # Errors
    ///
    /// Why it could not be processed; see the trait docs.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: nothing is committed, and the message is
    /// delivered again.
    fn process(&self, received: &Received) -> impl Future<Output = Result<Outcome>> + Send;

    /// Deletes at most `limit` dedup records that outlived the dedup window; returns how
    /// many. The [`Consumer`](super::Consumer) calls it every
    /// [`cleanup_interval`](ConsumerOptions::cleanup_interval), until a call deletes fewer
    /// than `limit`. It must never delete a record younger than the dedup window. The
    /// default deletes nothing (an engine whose records are cleaned elsewhere).
    ///
    /// # Errors
    ///
    /// A store error; the next pass tries again.
    fn cleanup(&self, limit: usize) -> impl Future<Output = Result<u64>> + Send {
        let _ = limit;
        std::future::ready(Ok(0))
    }
}

impl<P: Process> Process for Arc<P> {
    fn options(&self) -> &ConsumerOptions {
        (**self).options()
    }

    fn process(&self, received: &Received) -> impl Future<Output = Result<Outcome>> + Send {
        (**self).process(received)
    }

    fn cleanup(&self, limit: usize) -> impl Future<Output = Result<u64>> + Send {
        (**self).cleanup(limit)
    }
}

/// Counts a skipped duplicate in the store for operators. The duplicate was skipped and
/// will be acked whatever happens here, so a failure to count is logged, not returned.
pub(crate) async fn count_duplicate(consumer: &str, counting: impl Future<Output = Result<()>>) {
    if let Err(error) = counting.await {
        tracing::warn!(%consumer, %error, "could not count a skipped duplicate");
    }
}

/// Runs `future`, turning a panic into a transient handler error: a failed attempt of
/// the message, dead-lettered after the attempt limit like any other.
pub(crate) async fn unwind_as_error<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(Error::handler(Panicked::from_payload(panic.as_ref()))),
    }
}

/// Runs a handler's `future` for at most `limit`: a panic is a transient handler error
/// ([`unwind_as_error`]), and so is a handler still running after `limit`, which is
/// dropped there ([`TimedOut`]).
pub(crate) async fn run_handler<T>(
    limit: Duration,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, unwind_as_error(future)).await {
        Ok(result) => result,
        Err(_) => Err(Error::handler(TimedOut(limit))),
    }
}

/// A handler ran past its [`handler_timeout`](ConsumerOptions::handler_timeout) and was
/// stopped.
#[derive(Debug, thiserror::Error)]
#[error("the handler did not finish within {0:?} (handler_timeout); it was stopped")]
pub struct TimedOut(pub Duration);

/// A handler panicked; the message of the panic, when it had one.
#[derive(Debug, thiserror::Error)]
#[error("the handler panicked: {0}")]
pub struct Panicked(String);

impl Panicked {
    fn from_payload(payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        Self(crate::error::excerpt(&message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_handler_past_its_limit_is_stopped_as_a_transient_error() {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Flag(Arc::clone(&dropped));
        let error = run_handler(Duration::from_secs(2), async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(matches!(error, Error::Handler { .. }), "{error}");
        assert!(error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("did not finish within 2s"),
            "{error}"
        );
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the handler was dropped"
        );
        let quick = run_handler(Duration::from_secs(2), async { Ok(7) }).await;
        assert_eq!(quick.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_panic_is_a_transient_handler_error() {
        let error = unwind_as_error(async {
            if true {
                panic!("boom");
            }
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(matches!(error, Error::Handler { .. }), "{error}");
        assert!(error.is_transient() && !error.is_outage());
        assert!(error.to_string().contains("boom"), "{error}");
    }
}
