//! The lease of a received message: its visibility timeout extended while it is held.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

use crate::options::seconds;
use crate::subscriber::Queue;

/// Keeps a received message invisible while its delivery is held: every third of the
/// visibility timeout, `ChangeMessageVisibility` to one more timeout, never past
/// `max_lease` after the receipt. Dropping (or [`stop`](Lease::stop)ping) it ends the
/// extensions; the message then becomes visible when its last timeout runs out.
pub(crate) struct Lease(AbortHandle);

impl Lease {
    /// Starts extending the message received at `received_at` under `receipt`.
    pub(crate) fn start(queue: Arc<Queue>, receipt: String, received_at: Instant) -> Self {
        let options = &queue.transport.shared.options.subscriber;
        let (timeout, max_lease) = (options.visibility_timeout, options.max_lease);
        let task = tokio::spawn(async move {
            let until = received_at + max_lease;
            loop {
                sleep((timeout / 3).max(Duration::from_millis(100))).await;
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                let extended = queue
                    .transport
                    .shared
                    .client
                    .change_message_visibility()
                    .queue_url(&queue.url)
                    .receipt_handle(&receipt)
                    .visibility_timeout(seconds(timeout.min(left)))
                    .send()
                    .await;
                if let Err(error) = extended {
                    let error = crate::error::sdk("extending a lease", &queue.url, error);
                    if !error.is_transient() {
                        // The receipt is gone (settled meanwhile, or redelivered).
                        tracing::debug!(%error, "stopped extending a delivery's visibility");
                        return;
                    }
                    tracing::warn!(%error, "could not extend a delivery's visibility; trying again");
                }
            }
        });
        Self(task.abort_handle())
    }

    /// Stops the extensions (the delivery is being settled).
    pub(crate) fn stop(&self) {
        self.0.abort();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.abort();
    }
}
