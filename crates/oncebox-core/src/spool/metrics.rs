//! The spool's metrics, through the `metrics` facade: whatever recorder the application
//! installed receives them (the `oncebox` binary serves them in the Prometheus format).
//!
//! The handles are registered once, when the spool is built, so the hot path only bumps
//! atomics: install the recorder before building relays.

use std::time::{Duration, SystemTime};

use metrics::{Counter, Gauge, Histogram};

use super::{Backlog, BatchReport};

/// One spool's handles, all labelled with `spool` (its name: a setting, so the label
/// set is bounded).
pub(crate) struct SpoolMetrics {
    done: Counter,
    retried: Counter,
    released: Counter,
    dead: Counter,
    claim: Histogram,
    delivery: Histogram,
    lag: Histogram,
    pending: Gauge,
    dead_rows: Gauge,
    oldest_pending: Gauge,
    backlog_failures: Counter,
    purged: Counter,
    cleanup_failures: Counter,
}

impl SpoolMetrics {
    pub(crate) fn new(spool: &str) -> Self {
        let rows = |outcome: &'static str| metrics::counter!("oncebox_spool_rows_total", "spool" => spool.to_owned(), "outcome" => outcome);
        // Counted where a lease is lost (lease.rs), for all spools together; registered
        // here so that it is exported, at 0, before the first loss.
        let _ = metrics::counter!("oncebox_spool_leases_lost_total");
        Self {
            done: rows("done"),
            retried: rows("retried"),
            released: rows("released"),
            dead: rows("dead"),
            claim: metrics::histogram!("oncebox_spool_claim_duration_seconds", "spool" => spool.to_owned()),
            delivery: metrics::histogram!("oncebox_spool_delivery_duration_seconds", "spool" => spool.to_owned()),
            lag: metrics::histogram!("oncebox_spool_lag_seconds", "spool" => spool.to_owned()),
            pending: metrics::gauge!("oncebox_spool_pending_rows", "spool" => spool.to_owned()),
            dead_rows: metrics::gauge!("oncebox_spool_dead_rows", "spool" => spool.to_owned()),
            oldest_pending: metrics::gauge!("oncebox_spool_oldest_pending_age_seconds", "spool" => spool.to_owned()),
            backlog_failures: metrics::counter!("oncebox_spool_backlog_errors_total", "spool" => spool.to_owned()),
            purged: metrics::counter!("oncebox_spool_purged_rows_total", "spool" => spool.to_owned()),
            cleanup_failures: metrics::counter!("oncebox_spool_cleanup_errors_total", "spool" => spool.to_owned()),
        }
    }

    /// Counts a settled batch's rows by outcome.
    pub(crate) fn settled(&self, report: &BatchReport) {
        for (counter, rows) in [
            (&self.done, report.done),
            (&self.retried, report.retried),
            (&self.released, report.released),
            (&self.dead, report.dead),
        ] {
            if rows > 0 {
                counter.increment(rows as u64);
            }
        }
    }

    /// One claim's store call (with the settlement it carried, if any).
    pub(crate) fn claimed(&self, took: Duration) {
        self.claim.record(took.as_secs_f64());
    }

    /// One delivery attempt (a publish, for the relay), whatever its result; and, when
    /// it succeeded, the time from the item's creation to now.
    pub(crate) fn delivered(&self, took: Duration, created_at: Option<SystemTime>) {
        self.delivery.record(took.as_secs_f64());
        if let Some(created_at) = created_at {
            // A producer clock ahead of ours reads as no lag at all.
            let lag = SystemTime::now()
                .duration_since(created_at)
                .unwrap_or_default();
            self.lag.record(lag.as_secs_f64());
        }
    }

    /// A fresh reading of the table's backlog.
    pub(crate) fn backlog(&self, backlog: &Backlog) {
        self.pending.set(backlog.pending as f64);
        self.dead_rows.set(backlog.dead as f64);
        self.oldest_pending.set(
            backlog
                .oldest_pending_age
                .map_or(0.0, |age| age.as_secs_f64()),
        );
    }

    /// The backlog could not be read.
    pub(crate) fn backlog_failed(&self) {
        self.backlog_failures.increment(1);
    }

    /// Done rows deleted by one cleanup statement.
    pub(crate) fn purged(&self, rows: u64) {
        self.purged.increment(rows);
    }

    /// A cleanup pass failed.
    pub(crate) fn cleanup_failed(&self) {
        self.cleanup_failures.increment(1);
    }
}
