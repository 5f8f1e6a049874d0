//! Where the spool delivers claimed items.

use std::future::Future;

use tracing::Span;

use super::Claimed;
use crate::{Message, Publisher, Result, trace};

/// Delivers one claimed item: the outbox relay publishes it, the durable inbox runs the
/// handler.
///
/// # Contract
///
/// `Ok` means the item's delivery is durable (broker confirmed, handler committed); the
/// spool then marks it done. Errors are classified by
/// [`Error::is_transient`](crate::Error::is_transient): transient ones are retried with
/// backoff, others dead-letter the item at once. Calls for different keys run
/// concurrently.
pub trait Sink<T>: Send + Sync {
    /// Delivers `claimed.item`.
    ///
    /// # Errors
    ///
    /// Why the delivery failed.
    fn deliver(&self, claimed: &Claimed<T>) -> impl Future<Output = Result<()>> + Send;

    /// The span a claimed batch is delivered in ([`Span::none`] by default): the relay's
    /// `send` span (see [`trace`](crate::trace)).
    fn batch_span(&self, batch: &[Claimed<T>]) -> Span {
        let _ = batch;
        Span::none()
    }
}

/// The outbox relay's sink: publishes each message through a [`Publisher`].
#[derive(Debug, Clone)]
pub struct PublishSink<P>(pub P);

impl<P: Publisher> Sink<Message> for PublishSink<P> {
    fn deliver(&self, claimed: &Claimed<Message>) -> impl Future<Output = Result<()>> + Send {
        self.0.publish(&claimed.item)
    }

    fn batch_span(&self, batch: &[Claimed<Message>]) -> Span {
        trace::send(
            self.0.messaging_system(),
            batch.iter().map(|claimed| &claimed.item),
        )
    }
}
