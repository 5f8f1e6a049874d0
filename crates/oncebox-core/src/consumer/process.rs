//! The processing step shared by the consumer engines, and what it reports.

use std::future::Future;
use std::time::Duration;

use super::ConsumerOptions;
use crate::{Delivery, Error, Result};

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
    /// Another worker is processing the same id right now; nacked to come back later.
    InProgress,
    /// Failed (handler or store); nacked for redelivery after `delay`.
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

/// Turns one delivery into an [`Outcome`], settling it with the broker. Implemented by
/// the three consumer engines; run by [`Consumer`](super::Consumer).
pub trait Process<D: Delivery>: Send + Sync {
    /// Processes and settles `delivery`.
    ///
    /// # Errors
    ///
    /// Only when settling with the broker failed; the broker then redelivers.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: the delivery is redelivered after the broker's ack
    /// timeout, and the dedup record makes that harmless.
    fn process(&self, delivery: D) -> impl Future<Output = Result<Outcome>> + Send;
}

/// Settles a delivery whose processing failed with `error`: dead-letter a permanent
/// failure or one past the attempt limit, otherwise nack with backoff. Failures of the
/// store are never the message's fault, so they are always retried.
pub(crate) async fn settle_failure<D: Delivery>(
    delivery: D,
    error: Error,
    options: &ConsumerOptions,
) -> Result<Outcome> {
    let attempts = delivery.received().delivery_count.max(1);
    let store_fault = matches!(error, Error::Store { .. } | Error::LeaseLost);
    let give_up = !store_fault && (!error.is_transient() || attempts >= options.max_attempts);
    if give_up {
        let reason = if error.is_transient() {
            format!("gave up after {attempts} deliveries: {error}")
        } else {
            format!("permanent failure: {error}")
        };
        tracing::warn!(consumer = %options.consumer, message = ?delivery.received(), %reason, "dead-lettered");
        metrics::counter!("oncebox_consumer_dead_letters_total", "consumer" => options.consumer.clone())
            .increment(1);
        delivery.dead_letter(&reason).await?;
        return Ok(Outcome::DeadLettered { reason });
    }
    let delay = options.backoff.delay(attempts);
    tracing::debug!(consumer = %options.consumer, %error, ?delay, "processing failed; nacked");
    delivery.nack(delay).await?;
    Ok(Outcome::Retrying { delay })
}

/// Settles a delivery without a usable dedup id: it can never be processed safely.
pub(crate) async fn reject_unidentified<D: Delivery>(
    delivery: D,
    error: crate::InvalidMessage,
    options: &ConsumerOptions,
) -> Result<Outcome> {
    let reason = format!("no dedup id: {error}");
    tracing::warn!(consumer = %options.consumer, message = ?delivery.received(), %reason, "dead-lettered");
    delivery.dead_letter(&reason).await?;
    Ok(Outcome::DeadLettered { reason })
}
