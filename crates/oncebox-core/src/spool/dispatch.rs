//! Delivering a claimed batch: concurrently across keys, in order within a key, each
//! failure settled as [`Retries`] decides, while the claim's lease is kept.

use std::collections::HashMap;
use std::time::SystemTime;

use futures_util::StreamExt;
use futures_util::future::{Either, select};
use futures_util::stream;
use tokio::time::Instant;
use tracing::Instrument;

use super::engine::{Batch, BatchReport, Delivered, Spool};
use super::lease::Lease;
use super::{Claimed, Settle, Settlement, Sink, SpoolItem, SpoolStore};
use crate::Error;
use crate::retry::{Decision, Retries};

impl<S: SpoolStore, K: Sink<S::Item>> Spool<S, K> {
    /// Delivers a claimed batch: concurrently across keys, in order within a key, while
    /// the claim's lease is renewed beside it. No row goes out once the lease (less a
    /// safety margin) may have ended: the rows not delivered by then are handed back.
    pub(super) async fn dispatch(&self, batch: Batch<S::Item>) -> Delivered {
        let mut report = BatchReport {
            claimed: batch.rows.len(),
            ..BatchReport::default()
        };
        let lease = Lease::new(batch.claimed_at, self.options.lease);
        let outage = std::sync::Mutex::new(None);
        let seqs: Vec<i64> = batch.rows.iter().map(|row| row.seq).collect();
        let span = self.sink.batch_span(&batch.rows);
        let delivery = stream::iter(group_by_key(batch.rows))
            .map(|rows| self.dispatch_key(rows, &lease, &outage))
            .buffer_unordered(self.options.concurrency)
            .flat_map(stream::iter)
            .collect::<Vec<Settlement>>()
            .instrument(span.clone());
        let keeper = lease.keep(&self.store, batch.token, &seqs, self.options.lease);
        let settlements = match select(std::pin::pin!(delivery), std::pin::pin!(keeper)).await {
            Either::Left((settlements, keeper)) => {
                lease.delivered();
                keeper.await;
                settlements
            }
            // The lease is lost: the rest of the batch is handed back as it goes.
            Either::Right(((), delivery)) => delivery.await,
        };
        for s in &settlements {
            match s.outcome {
                Settle::Done => report.done += 1,
                Settle::Retry { .. } => report.retried += 1,
                Settle::Release => report.released += 1,
                Settle::Dead { .. } => report.dead += 1,
            }
        }
        crate::trace::record_batch(&span, &report);
        Delivered {
            token: batch.token,
            settlements,
            report,
            outage: outage
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }

    /// Delivers the claimed rows of one key in order; after a failure that will be
    /// retried, or an outage, once the lease is lost, or once the spool is stopping, the
    /// key's later rows are released unattempted.
    async fn dispatch_key(
        &self,
        rows: Vec<Claimed<S::Item>>,
        lease: &Lease,
        outage: &std::sync::Mutex<Option<String>>,
    ) -> Vec<Settlement> {
        let mut settlements = Vec::with_capacity(rows.len());
        let mut blocked = false;
        for row in rows {
            let stopping = self.stopping.load(std::sync::atomic::Ordering::Relaxed);
            let outcome = if blocked || stopping || lease.is_lost() {
                Settle::Release
            } else {
                let outcome = self.deliver(&row, lease, outage).await;
                blocked = matches!(outcome, Settle::Retry { .. } | Settle::Release);
                outcome
            };
            settlements.push(Settlement {
                seq: row.seq,
                outcome,
            });
        }
        settlements
    }

    async fn deliver(
        &self,
        row: &Claimed<S::Item>,
        lease: &Lease,
        outage: &std::sync::Mutex<Option<String>>,
    ) -> Settle {
        let timeout = self.options.dispatch_timeout;
        let started = Instant::now();
        let delivery = tokio::time::timeout(timeout, self.sink.deliver(row));
        let result = tokio::select! {
            result = delivery => match result {
                Ok(result) => result,
                Err(_) => Err(Error::Timeout(timeout)),
            },
            // Cut off: another spool may own the row from here on. Whether the broker
            // took it or not, it is delivered again (at least once).
            () = lease.lost() => return Settle::Release,
        };
        let Err(error) = result else {
            self.metrics
                .delivered(started.elapsed(), row.item.created_at());
            return Settle::Done;
        };
        self.metrics.delivered(started.elapsed(), None);
        let attempts = row.attempts.saturating_add(1);
        let retries = Retries::new(self.options.max_attempts, &self.options.backoff);
        let reason = match retries.decide(&error, attempts, 0) {
            // A sink closed (its process stopping) or out: no fault of the row. Hand it
            // back without counting an attempt, and make the loop back off before it
            // claims again (it counts the outages in a row, per batch).
            Decision::Stop | Decision::WaitOut { .. } => {
                tracing::debug!(
                    spool = %self.options.name, item = %row.item.describe(), %error,
                    "the sink is unreachable; handed back"
                );
                *outage
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
                return Settle::Release;
            }
            Decision::Retry { delay } => {
                tracing::debug!(
                    spool = %self.options.name, item = %row.item.describe(), attempts, ?delay, %error,
                    "delivery failed; will retry"
                );
                return Settle::Retry {
                    at: SystemTime::now() + delay,
                    error: error.to_string(),
                };
            }
            Decision::DeadLetter { reason } => reason,
        };
        tracing::warn!(
            spool = %self.options.name, item = %row.item.describe(), %reason,
            "dead-lettered"
        );
        if let Some(hook) = &self.on_dead {
            hook(&row.item, &reason);
        }
        Settle::Dead { reason }
    }
}

/// Splits a batch (in `seq` order) into per-key runs, keeping order within each run.
/// Rows without a key form runs of one.
fn group_by_key<T: SpoolItem>(batch: Vec<Claimed<T>>) -> Vec<Vec<Claimed<T>>> {
    let mut groups: Vec<Vec<Claimed<T>>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for row in batch {
        let slot = match row.item.ordering_key() {
            Some(key) => *index.entry(key.to_owned()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            }),
            None => {
                groups.push(Vec::new());
                groups.len() - 1
            }
        };
        groups[slot].push(row);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::spool::LeaseToken;

    fn row(seq: i64, key: Option<&str>) -> Claimed<Message> {
        let mut item = Message::new("t", "");
        item.key = key.map(str::to_owned);
        Claimed {
            seq,
            token: LeaseToken::new(),
            attempts: 0,
            item,
        }
    }

    #[test]
    fn groups_keep_order_within_a_key() {
        let batch = vec![
            row(1, Some("a")),
            row(2, Some("b")),
            row(3, None),
            row(4, Some("a")),
        ];
        let groups: Vec<Vec<i64>> = group_by_key(batch)
            .into_iter()
            .map(|g| g.into_iter().map(|r| r.seq).collect())
            .collect();
        assert_eq!(groups, vec![vec![1, 4], vec![2], vec![3]]);
    }
}
