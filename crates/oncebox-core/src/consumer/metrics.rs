//! The consumers' metrics, through the `metrics` facade, registered once per lane.

use std::time::Duration;

use metrics::{Counter, Histogram};

use super::Outcome;

/// One consumer's handles, all labelled with `consumer` (its name: a setting, so the
/// label set is bounded).
pub(crate) struct ConsumerMetrics {
    handled: Counter,
    duplicate: Counter,
    stored: Counter,
    in_progress: Counter,
    retried: Counter,
    dead_lettered: Counter,
    unguarded: Counter,
    dedup_hit: Counter,
    dedup_miss: Counter,
    processing: Histogram,
}

impl ConsumerMetrics {
    pub(crate) fn new(consumer: &str) -> Self {
        let messages = |outcome: &'static str| metrics::counter!("oncebox_consumer_messages_total", "consumer" => consumer.to_owned(), "outcome" => outcome);
        let dedup = |result: &'static str| metrics::counter!("oncebox_dedup_lookups_total", "consumer" => consumer.to_owned(), "result" => result);
        Self {
            handled: messages("handled"),
            duplicate: messages("duplicate"),
            stored: messages("stored"),
            in_progress: messages("in_progress"),
            retried: messages("retried"),
            dead_lettered: messages("dead_lettered"),
            unguarded: messages("unguarded"),
            dedup_hit: dedup("hit"),
            dedup_miss: dedup("miss"),
            processing: metrics::histogram!("oncebox_consumer_processing_duration_seconds", "consumer" => consumer.to_owned()),
        }
    }

    /// A settled delivery: its outcome, what the dedup lookup found (a duplicate or an
    /// id in progress elsewhere is a hit, a first delivery handled or stored a miss;
    /// failures tell nothing) and how long processing took.
    pub(crate) fn settled(&self, outcome: &Outcome, took: Duration) {
        let (messages, dedup) = match outcome {
            Outcome::Handled => (&self.handled, Some(&self.dedup_miss)),
            Outcome::Stored => (&self.stored, Some(&self.dedup_miss)),
            Outcome::Duplicate => (&self.duplicate, Some(&self.dedup_hit)),
            Outcome::InProgress { .. } => (&self.in_progress, Some(&self.dedup_hit)),
            Outcome::Retrying { .. } => (&self.retried, None),
            Outcome::DeadLettered { .. } => (&self.dead_lettered, None),
            Outcome::HandledUnguarded => (&self.unguarded, None),
        };
        messages.increment(1);
        if let Some(dedup) = dedup {
            dedup.increment(1);
        }
        self.processing.record(took.as_secs_f64());
    }
}
