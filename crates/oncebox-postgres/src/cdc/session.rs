//! One replication session: reads commits from the slot, publishes their messages (per
//! key in commit order, keys in parallel) once other sessions can see the commit, and
//! confirms each commit once the broker confirmed all of it and everything before it.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use oncebox_core::{Error, Limits, Message, Publisher, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use sqlx::PgConnection;
use tokio::time::Instant;

use super::dead::position_id;
use super::encoding;
use super::progress::{CommitNo, Progress};
use super::relay::{CdcRelay, Published, wire_error};
use super::row::{Change, RowDecoder};
use super::snapshot::Snapshot;
use super::{CdcMode, slot};

/// PostgreSQL's epoch, 2000-01-01, in Unix seconds.
const PG_EPOCH_SECS: u64 = 946_684_800;

/// How often the session checks that it still holds the slot's lock.
const LEAD_CHECK: Duration = Duration::from_secs(5);

/// How long a commit that is not visible yet is looked at again without a pause.
const EAGER_LOOKS: Duration = Duration::from_millis(5);

/// The longest wait between two looks at whether a commit became visible.
const MAX_VISIBILITY_WAIT: Duration = Duration::from_millis(50);

/// After this long, a commit that is still not visible is worth a warning.
const VISIBILITY_WARNING: Duration = Duration::from_secs(5);

/// How a session ended, short of an error.
pub(super) enum Ended {
    /// The relay was asked to stop.
    Stopped,
    /// The lock that makes this relay the slot's one reader was lost (its connection
    /// failed): stand by again.
    LostLead,
}

/// A message to publish, and where it came from.
struct Job {
    commit: CommitNo,
    committed_at: SystemTime,
    message: Message,
    /// The outbox row (table mode).
    seq: Option<i64>,
}

type Publishing<'a> = Pin<Box<dyn Future<Output = (Job, Published)> + Send + 'a>>;

/// The commit being read.
#[derive(Clone, Copy)]
struct Open {
    commit: CommitNo,
    committed_at: SystemTime,
}

/// A commit whose transaction other sessions cannot see yet: reading stops before its
/// first change until they can.
struct Invisible {
    xid: u32,
    since: Instant,
    next_look: Instant,
    wait: Duration,
    warned: bool,
}

/// The state of one session.
pub(super) struct Session<'r, P> {
    relay: &'r CdcRelay<P>,
    progress: Progress,
    /// The newest snapshot taken: every commit it shows may be published.
    visible: Snapshot,
    invisible: Option<Invisible>,
    /// The commit being read.
    open: Option<Open>,
    rows: RowDecoder,
    limits: Limits,
    in_flight: FuturesUnordered<Publishing<'r>>,
    /// For each key with a message in flight, its messages waiting behind it.
    waiting: HashMap<String, VecDeque<Job>>,
    /// Messages in flight or waiting.
    unsettled: usize,
    /// Published rows not yet deleted (table mode).
    published: Vec<i64>,
    /// The position that may be confirmed (in table mode, once the published rows are
    /// deleted: a row's commit is confirmed only after its row is gone, or a crash in
    /// between would leave it in the table for good).
    confirmable: Option<Lsn>,
    /// The last position confirmed, and the last one the store remembers.
    confirmed: Lsn,
    remembered: Lsn,
    winding_down: bool,
}

impl<'r, P: Publisher> Session<'r, P> {
    pub(super) fn new(relay: &'r CdcRelay<P>) -> Self {
        Self {
            relay,
            progress: Progress::default(),
            visible: Snapshot::default(),
            invisible: None,
            open: None,
            rows: RowDecoder::new(&relay.sql.schema, "outbox"),
            limits: relay.options.limits.clone(),
            in_flight: FuturesUnordered::new(),
            waiting: HashMap::new(),
            unsettled: 0,
            published: Vec::new(),
            confirmable: None,
            confirmed: Lsn(0),
            remembered: Lsn(0),
            winding_down: false,
        }
    }

    pub(super) async fn run(
        &mut self,
        client: &mut ReplicationClient,
        lead: &mut PgConnection,
        shutdown: impl Future<Output = ()> + Unpin,
    ) -> Result<Ended> {
        let options = &self.relay.options;
        let mut shutdown = shutdown;
        // A tick that comes late (a heartbeat that waited for a database going down)
        // is not made up in a burst: the others still get their turn.
        let every = |period| {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        };
        let mut heartbeat = every(options.heartbeat);
        let mut stats = every(options.stats_interval);
        let mut check_lead = every(LEAD_CHECK);
        let mut flush = every(options.status_interval);
        tracing::info!(slot = %options.slot, mode = ?options.mode, "CDC relay: reading the slot");
        loop {
            let next_look = self.invisible.as_ref().map(|invisible| invisible.next_look);
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(Ended::Stopped),
                Some((job, published)) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.settle(job, published, client).await?;
                }
                () = tokio::time::sleep_until(next_look.unwrap_or_else(Instant::now)), if next_look.is_some() => {
                    self.look_again().await?;
                }
                _ = check_lead.tick() => {
                    if !super::relay::answers(lead).await {
                        tracing::warn!(slot = %options.slot, "CDC relay: lost the connection holding the slot's lock; standing by");
                        return Ok(Ended::LostLead);
                    }
                }
                _ = flush.tick() => self.flush(client).await?,
                _ = heartbeat.tick() => {
                    if let Err(error) = slot::heartbeat(&self.relay.pool, &self.relay.sql.heartbeat_prefix).await {
                        tracing::warn!(%error, "CDC relay: heartbeat failed");
                    }
                }
                _ = stats.tick() => self.relay.metrics.sample(&self.relay.pool).await,
                event = client.recv(), if self.invisible.is_none() && self.unsettled < options.max_in_flight => {
                    match event.map_err(wire_error)? {
                        Some(event) => self.read(event, client).await?,
                        None => return Err(Error::store_transient("the replication stream ended")),
                    }
                }
            }
        }
    }

    /// Takes one event of the stream.
    async fn read(&mut self, event: ReplicationEvent, client: &ReplicationClient) -> Result<()> {
        let sql = &self.relay.sql;
        let mode = self.relay.options.mode;
        match event {
            ReplicationEvent::Begin {
                xid,
                commit_time_micros,
                ..
            } => {
                self.open = Some(Open {
                    commit: self.progress.begin(),
                    committed_at: committed_at(commit_time_micros),
                });
                self.wait_until_visible(xid).await?;
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                if let Some(open) = self.open.take() {
                    self.progress.commit(open.commit, end_lsn);
                    // A commit with nothing (left) to publish is confirmable at once:
                    // the relay's heartbeats and other tables' commits move the slot.
                    self.advance(client);
                }
            }
            ReplicationEvent::Message {
                transactional,
                prefix,
                content,
                lsn,
                ..
            } if prefix == sql.message_prefix => {
                let open = match self.open {
                    Some(open) if transactional => open,
                    _ => {
                        let reason = "a logical decoding message emitted with transactional = \
                                      false: it is decoded even when its transaction rolls \
                                      back, so it is not published (emit with true)";
                        return self.dead_content(&content, lsn, reason).await;
                    }
                };
                let message = match encoding::decode(&content, open.committed_at) {
                    Ok(message) => message,
                    Err(error) => {
                        return self.dead_content(&content, lsn, &error.to_string()).await;
                    }
                };
                if mode == CdcMode::Table {
                    let reason = "emitted as a logical decoding message, but this relay reads \
                                  the outbox table (source = table): insert outbox rows, or \
                                  run a relay with source = messages";
                    return self
                        .relay
                        .dead_letter(&message, None, &content, reason)
                        .await;
                }
                if let Err(invalid) = message.validate(&self.limits) {
                    let reason = format!("the message is not valid: {invalid}");
                    return self
                        .relay
                        .dead_letter(&message, None, &content, &reason)
                        .await;
                }
                self.start(Job {
                    commit: open.commit,
                    committed_at: open.committed_at,
                    message,
                    seq: None,
                });
            }
            ReplicationEvent::XLogData { data, .. } if mode == CdcMode::Table => {
                let Some(open) = self.open else {
                    return Ok(());
                };
                match self.rows.decode(&data) {
                    Change::Inserted(row) if row.pending => {
                        let message = row.message.and_then(|message| {
                            message
                                .validate(&self.limits)
                                .map(|()| message)
                                .map_err(|invalid| format!("the message is not valid: {invalid}"))
                        });
                        match message {
                            Ok(message) => self.start(Job {
                                commit: open.commit,
                                committed_at: open.committed_at,
                                message,
                                seq: Some(row.seq),
                            }),
                            Err(reason) => {
                                let placeholder = Message::new("", bytes::Bytes::new());
                                let reason = format!("the row cannot be published: {reason}");
                                self.relay
                                    .dead_letter(
                                        &placeholder,
                                        Some(row.seq),
                                        &bytes::Bytes::new(),
                                        &reason,
                                    )
                                    .await?;
                            }
                        }
                    }
                    Change::Unreadable(reason) => {
                        self.relay.metrics.dead.increment(1);
                        tracing::error!(
                            slot = %self.relay.options.slot,
                            reason,
                            "CDC relay: an insert into the outbox table cannot be read, not even its seq; it is not published"
                        );
                    }
                    Change::Inserted(_) | Change::Other => {}
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Lets the commit of transaction `xid` be read on only once other sessions can see
    /// it: at once if the newest snapshot shows it, else after a fresh one does.
    async fn wait_until_visible(&mut self, xid: u32) -> Result<()> {
        if self.visible.shows(xid) {
            return Ok(());
        }
        self.visible = Snapshot::take(&self.relay.pool).await?;
        if !self.visible.shows(xid) {
            let now = Instant::now();
            self.invisible = Some(Invisible {
                xid,
                since: now,
                next_look: now,
                wait: Duration::ZERO,
                warned: false,
            });
        }
        Ok(())
    }

    /// Looks again whether the commit read last is visible; reading goes on once it is.
    async fn look_again(&mut self) -> Result<()> {
        self.visible = Snapshot::take(&self.relay.pool).await?;
        let Some(invisible) = self.invisible.as_mut() else {
            return Ok(());
        };
        if self.visible.shows(invisible.xid) {
            if invisible.warned {
                tracing::info!(slot = %self.relay.options.slot, xid = invisible.xid, waited = ?invisible.since.elapsed(), "CDC relay: the commit is visible; publishing it");
            }
            self.invisible = None;
            return Ok(());
        }
        if !invisible.warned && invisible.since.elapsed() >= VISIBILITY_WARNING {
            invisible.warned = true;
            tracing::warn!(
                slot = %self.relay.options.slot,
                xid = invisible.xid,
                "CDC relay: a commit in the WAL is not visible to other sessions yet (is it \
                 waiting for a synchronous standby?); its messages wait until it is"
            );
        }
        // A commit usually becomes visible within moments of its WAL flush (a busy
        // machine may delay the producer's last step by a few milliseconds): look again
        // at once for a while, then back off (a synchronous standby may take long).
        invisible.wait = match invisible.since.elapsed() < EAGER_LOOKS {
            true => Duration::ZERO,
            false => (invisible.wait * 2).clamp(Duration::from_millis(1), MAX_VISIBILITY_WAIT),
        };
        invisible.next_look = Instant::now() + invisible.wait;
        Ok(())
    }

    /// Records content that cannot be published as a dead letter, under an id derived
    /// from its position (`lsn`).
    async fn dead_content(&mut self, content: &bytes::Bytes, lsn: Lsn, reason: &str) -> Result<()> {
        let raw = Message::new("", content.clone()).with_id(position_id(lsn));
        self.relay.dead_letter(&raw, None, content, reason).await
    }

    /// Publishes `job` now, or queues it behind its key's message in flight.
    fn start(&mut self, job: Job) {
        self.progress.add(job.commit);
        self.unsettled += 1;
        if let Some(key) = &job.message.key {
            if let Some(queue) = self.waiting.get_mut(key) {
                queue.push_back(job);
                return;
            }
            self.waiting.insert(key.clone(), VecDeque::new());
        }
        self.dispatch(job);
    }

    fn dispatch(&mut self, job: Job) {
        let relay = self.relay;
        self.in_flight.push(Box::pin(async move {
            let published = relay.publish(&job.message).await;
            (job, published)
        }));
    }

    /// Takes a finished publication: counts it, moves its key on, confirms what can be.
    async fn settle(
        &mut self,
        job: Job,
        published: Published,
        client: &ReplicationClient,
    ) -> Result<()> {
        self.unsettled -= 1;
        match published {
            Published::Confirmed => {
                self.relay.metrics.published(job.committed_at);
                if let Some(seq) = job.seq {
                    self.published.push(seq);
                }
            }
            Published::Failed(reason) => {
                self.relay
                    .dead_letter(&job.message, job.seq, &bytes::Bytes::new(), &reason)
                    .await?;
            }
            // Never confirmed: the next reader publishes it again. Outside a wind-down,
            // the publisher was closed: the session, and the relay, end.
            Published::Abandoned if self.winding_down => return Ok(()),
            Published::Abandoned => return Err(Error::Closed),
        }
        if let Some(key) = &job.message.key {
            match self.waiting.get_mut(key).and_then(VecDeque::pop_front) {
                Some(next) if !self.winding_down => self.dispatch(next),
                Some(_) => {}
                None => {
                    self.waiting.remove(key);
                }
            }
        }
        self.progress.done(job.commit);
        self.advance(client);
        if self.published.len() >= self.relay.options.delete_batch {
            self.flush(client).await?;
        }
        Ok(())
    }

    /// Moves the confirmable position past the finished commits; in message mode
    /// confirms it at once.
    fn advance(&mut self, client: &ReplicationClient) {
        if let Some(confirmable) = self.progress.advance() {
            self.confirmable = Some(confirmable);
            if self.relay.options.mode == CdcMode::Messages {
                self.confirm(client);
            }
        }
    }

    /// Deletes the published rows (table mode), confirms what may be, and remembers
    /// the confirmed position in the store.
    async fn flush(&mut self, client: &ReplicationClient) -> Result<()> {
        // The rows are forgotten only once deleted: after a failed delete, nothing they
        // cover may be confirmed (a session's finish flushes them again).
        self.relay.delete_published(&self.published).await?;
        self.published.clear();
        self.confirm(client);
        // The store's record only names the range a lost slot may have lost: a failed
        // write is tried again at the next flush rather than ending the session.
        if self.confirmed > self.remembered {
            match self.relay.remember(self.confirmed).await {
                Ok(()) => self.remembered = self.confirmed,
                Err(error) => {
                    tracing::warn!(slot = %self.relay.options.slot, %error, "CDC relay: could not record the confirmed position");
                }
            }
        }
        Ok(())
    }

    fn confirm(&mut self, client: &ReplicationClient) {
        if let Some(confirmed) = self.confirmable.take() {
            client.update_applied_lsn(confirmed);
            self.relay.metrics.confirmed(confirmed);
            self.confirmed = confirmed;
        }
    }

    /// After the session ended (the relay has begun winding down, so no publication is
    /// retried any more): lets the attempts under way end, starts nothing new, confirms
    /// what they covered and waits for the confirmation to reach the server. Failures
    /// here only mean more is published again by the next reader.
    pub(super) async fn finish(&mut self, client: &ReplicationClient) {
        self.winding_down = true;
        let bound = self.relay.options.publish_timeout + Duration::from_secs(5);
        let slot = &self.relay.options.slot;
        let settle = async {
            while let Some((job, published)) = self.in_flight.next().await {
                self.settle(job, published, client).await?;
            }
            self.flush(client).await
        };
        match tokio::time::timeout(bound, settle).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%slot, %error, "CDC relay: could not settle what was in flight; the next reader publishes it again");
                return;
            }
            Err(_) => {
                tracing::warn!(%slot, "CDC relay: publications still in flight after {bound:?}; the next reader publishes them again");
                return;
            }
        }
        let deadline = Instant::now() + 2 * self.relay.options.status_interval;
        while client.feedback_pending_since().is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A commit time as pgoutput sends it (microseconds since 2000-01-01).
pub(crate) fn committed_at(micros: i64) -> SystemTime {
    let since = Duration::from_micros(micros.unsigned_abs());
    let epoch = SystemTime::UNIX_EPOCH + Duration::from_secs(PG_EPOCH_SECS);
    if micros >= 0 {
        epoch + since
    } else {
        epoch - since
    }
}
