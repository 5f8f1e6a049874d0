//! How a running consumer fares, for readiness checks.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

/// What a [`Consumer`](super::Consumer)'s receiving loop last saw: read it through a
/// [`ConsumerHealthHandle`] while the consumer runs.
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerHealth {
    /// When the subscriber last handed over a delivery; `None` before the first.
    pub last_delivery: Option<Instant>,
    /// The error of the last receive, if it failed (cleared by the next delivery).
    pub receive_error: Option<String>,
    /// When a receive last failed.
    pub last_failure: Option<Instant>,
    /// Receives that failed in a row (0 after a delivery).
    pub failures_in_a_row: u32,
}

/// A shared view of a consumer's [`ConsumerHealth`], taken with
/// [`Consumer::health`](super::Consumer::health) before the consumer runs; clones share
/// it.
#[derive(Debug, Clone, Default)]
pub struct ConsumerHealthHandle(Arc<Mutex<ConsumerHealth>>);

impl ConsumerHealthHandle {
    /// The current figures.
    pub fn get(&self) -> ConsumerHealth {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn delivered(&self) {
        let mut health = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        health.last_delivery = Some(Instant::now());
        health.receive_error = None;
        health.failures_in_a_row = 0;
    }

    pub(super) fn failed(&self, error: &crate::Error) {
        let mut health = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        health.receive_error = Some(error.to_string());
        health.last_failure = Some(Instant::now());
        health.failures_in_a_row = health.failures_in_a_row.saturating_add(1);
    }
}
