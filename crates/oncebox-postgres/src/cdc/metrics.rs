//! The CDC relay's metrics, labelled with its slot.

use std::time::SystemTime;

use metrics::{Counter, Gauge, Histogram};
use pgwire_replication::Lsn;
use sqlx::PgPool;

use super::slot;

pub(crate) struct CdcMetrics {
    published: Counter,
    pub(crate) dead: Counter,
    commit_to_publish: Histogram,
    confirmed: Gauge,
}

impl CdcMetrics {
    pub(crate) fn new(slot: &str) -> Self {
        let messages = |outcome: &'static str| metrics::counter!("oncebox_cdc_messages_total", "slot" => slot.to_owned(), "outcome" => outcome);
        Self {
            published: messages("published"),
            dead: messages("dead"),
            commit_to_publish: metrics::histogram!("oncebox_cdc_commit_to_publish_seconds", "slot" => slot.to_owned()),
            confirmed: metrics::gauge!("oncebox_cdc_confirmed_lsn", "slot" => slot.to_owned()),
        }
    }

    /// A message committed at `committed_at` was published.
    pub(crate) fn published(&self, committed_at: SystemTime) {
        self.published.increment(1);
        if let Ok(lag) = SystemTime::now().duration_since(committed_at) {
            self.commit_to_publish.record(lag.as_secs_f64());
        }
    }

    /// A lost slot was created again over `range`.
    pub(crate) fn lost(&self, range: &slot::LostRange) {
        let slot = range.slot.clone();
        metrics::counter!("oncebox_cdc_lost_slots_total", "slot" => slot.clone()).increment(1);
        metrics::counter!("oncebox_cdc_lost_wal_bytes_total", "slot" => slot)
            .increment(range.bytes);
    }

    pub(crate) fn confirmed(&self, lsn: Lsn) {
        self.confirmed.set(lsn.as_u64() as f64);
    }

    /// Samples every pgoutput slot of the database (not only this relay's: a slot left
    /// behind by a relay that is gone keeps WAL too, and shows here).
    pub(crate) async fn sample(&self, pool: &PgPool) {
        match slot::slots(pool).await {
            Ok(slots) => {
                for found in slots {
                    let labels = [("slot", found.name)];
                    metrics::gauge!("oncebox_cdc_slot_retained_wal_bytes", &labels)
                        .set(found.retained_wal_bytes as f64);
                    metrics::gauge!("oncebox_cdc_slot_lag_bytes", &labels)
                        .set(found.lag_bytes as f64);
                    metrics::gauge!("oncebox_cdc_slot_active", &labels).set(if found.active {
                        1.0
                    } else {
                        0.0
                    });
                }
            }
            Err(error) => tracing::warn!(%error, "CDC relay: cannot read the replication slots"),
        }
    }
}
