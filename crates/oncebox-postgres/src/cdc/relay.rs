//! The log-tailing relay: reads commits from the slot, publishes their messages (per key
//! in commit order, keys in parallel) and confirms each commit once the broker confirmed
//! all of it and everything before it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use oncebox_core::{Error, Message, Publisher, Result, trace};
use pgwire_replication::{FeedbackObserver, PgWireError, ReplicationClient, ReplicationEvent};
use sqlx::{Connection, PgConnection, PgPool};
use tracing::Instrument;

use super::encoding;
use super::metrics::CdcMetrics;
use super::progress::{CommitNo, Progress};
use super::row::{Change, RowDecoder};
use super::snapshot::StartSnapshot;
use super::{CdcMode, CdcOptions, slot};
use crate::PgStore;
use crate::cdc::CdcConnection;
use crate::error::store_error;
use crate::ident::qualified;

/// `pg_try_advisory_lock(CDC_CLASS, hashtext(slot))`: held by the slot's reader for as
/// long as it reads ("oncd").
const CDC_CLASS: i32 = 0x6f6e_6364;

/// PostgreSQL's epoch, 2000-01-01, in Unix seconds.
const PG_EPOCH_SECS: u64 = 946_684_800;

/// Publishes the outbox from a logical replication slot; see the [module](super) for
/// what it guarantees.
pub struct CdcRelay<P> {
    pool: PgPool,
    connection: CdcConnection,
    publisher: P,
    options: CdcOptions,
    sql: Statements,
    metrics: CdcMetrics,
}

/// Statements and names, built once.
struct Statements {
    schema: String,
    message_prefix: String,
    heartbeat_prefix: String,
    table: String,
    insert_dead: String,
    mark_dead: String,
    delete_published: String,
}

/// A message to publish, and where it came from.
struct Job {
    commit: CommitNo,
    committed_at: SystemTime,
    message: Message,
    /// The outbox row (table mode).
    seq: Option<i64>,
    /// Whether its commit was visible before the session began: a reader before this
    /// one may have published it and deleted its row.
    replayed: bool,
}

type Publishing<'a> = Pin<Box<dyn Future<Output = (Job, Result<()>)> + Send + 'a>>;

/// How a session ended, short of an error.
enum Ended {
    /// The relay was asked to stop.
    Stopped,
    /// The lock that makes this relay the slot's one reader was lost (its connection
    /// failed): stand by again.
    LostLead,
}

impl<P: Publisher> CdcRelay<P> {
    /// A relay for `store`'s outbox that reads the slot through `connection` and
    /// publishes through `publisher`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` are not valid.
    pub fn new(
        store: &PgStore,
        connection: CdcConnection,
        publisher: P,
        options: CdcOptions,
    ) -> Result<Self> {
        options.validate()?;
        let schema = store.schema();
        let table = qualified(schema, "outbox");
        let sql = Statements {
            schema: schema.to_owned(),
            message_prefix: super::message_prefix(schema),
            heartbeat_prefix: super::heartbeat_prefix(schema),
            insert_dead: format!(
                "INSERT INTO {table} (id, topic, key, kind, headers, payload, created_at, \
                 status, attempts, last_error, dead_at, cdc_source) \
                 VALUES ($1::uuid, $2, $3, $4, $5::jsonb, $6, \
                 to_timestamp($7::float8 / 1e6), 'dead', $8, $9, now(), 'messages') \
                 ON CONFLICT (id) DO NOTHING"
            ),
            mark_dead: format!(
                "UPDATE {table} SET status = 'dead', attempts = $2, last_error = $3, \
                 dead_at = now(), cdc_source = 'table' WHERE seq = $1"
            ),
            delete_published: format!(
                "DELETE FROM {table} WHERE seq = ANY($1::bigint[]) RETURNING seq"
            ),
            table,
        };
        Ok(Self {
            pool: store.pool().clone(),
            connection,
            publisher,
            metrics: CdcMetrics::new(&options.slot),
            options,
            sql,
        })
    }

    /// The options.
    pub fn options(&self) -> &CdcOptions {
        &self.options
    }

    /// Checks the server and creates the publication and the slot if they are absent.
    /// [`run_until`](Self::run_until) does it too; call it first when producers start
    /// before the relay, since a slot only sees what is committed after its creation.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `wal_level` is not `logical` (saying how to fix
    /// it) or the slot's name is taken by another kind of slot; a permanent store error
    /// when the slot was invalidated and the policy is [`LostSlot::Fail`](super::LostSlot);
    /// store errors.
    pub async fn prepare(&self) -> Result<()> {
        slot::check_server(&self.pool, &self.options.slot).await?;
        let table = match self.options.mode {
            CdcMode::Table => Some(self.sql.table.as_str()),
            CdcMode::Messages => None,
        };
        slot::ensure_publication(&self.pool, &self.options.publication, table).await?;
        slot::ensure_slot(&self.pool, &self.options.slot, self.options.on_lost_slot).await
    }

    /// Runs until `shutdown` completes: waits to be the slot's one reader (a relay
    /// that finds another one reading stands by and takes over when it dies), then
    /// publishes. Transient failures (the database, the broker, the replication
    /// connection) are retried with backoff; a graceful stop lets the publications in
    /// flight finish, confirms what they covered and returns.
    ///
    /// # Errors
    ///
    /// The errors of [`prepare`](Self::prepare), and permanent errors of the
    /// replication connection (authentication, a missing publication).
    pub async fn run_until(&self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let shutdown = shutdown.boxed().shared();
        let mut failures = 0u32;
        loop {
            let Some(mut lead) = self.lead(shutdown.clone()).await? else {
                return Ok(());
            };
            loop {
                match self.session(&mut lead, shutdown.clone()).await {
                    Ok(Ended::Stopped) => return Ok(()),
                    Ok(Ended::LostLead) => break,
                    Err(error) if error.is_transient() => {
                        failures += 1;
                        let delay = self.options.backoff.delay(failures);
                        tracing::warn!(
                            slot = %self.options.slot,
                            error = %error,
                            retry_in = ?delay,
                            "CDC relay: the session failed; starting a new one"
                        );
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = shutdown.clone() => return Ok(()),
                        }
                    }
                    Err(error) => return Err(error),
                }
            }
        }
    }

    /// Waits until this relay holds the slot's lock, on a connection of its own; `None`
    /// once `shutdown` completed first.
    async fn lead(
        &self,
        shutdown: impl Future<Output = ()> + Unpin,
    ) -> Result<Option<PgConnection>> {
        let mut shutdown = shutdown;
        let mut said = false;
        loop {
            let attempt = async {
                let mut conn = PgConnection::connect_with(&self.pool.connect_options())
                    .await
                    .map_err(store_error)?;
                let held: bool =
                    sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
                        .bind(CDC_CLASS)
                        .bind(&self.options.slot)
                        .fetch_one(&mut conn)
                        .await
                        .map_err(store_error)?;
                Ok::<_, Error>(held.then_some(conn))
            };
            match attempt.await {
                Ok(Some(conn)) => {
                    if said {
                        tracing::info!(slot = %self.options.slot, "CDC relay: taking over the slot");
                    }
                    return Ok(Some(conn));
                }
                Ok(None) if !said => {
                    said = true;
                    tracing::info!(
                        slot = %self.options.slot,
                        "CDC relay: another relay reads the slot; standing by"
                    );
                }
                Ok(None) => {}
                Err(error) if error.is_transient() => {
                    tracing::warn!(slot = %self.options.slot, %error, "CDC relay: cannot reach the database");
                }
                Err(error) => return Err(error),
            }
            tokio::select! {
                () = tokio::time::sleep(self.options.standby_poll) => {}
                () = &mut shutdown => return Ok(None),
            }
        }
    }

    /// One replication session: from the slot's confirmed position until a stop, a
    /// lost lead or an error.
    async fn session(
        &self,
        lead: &mut PgConnection,
        shutdown: impl Future<Output = ()> + Unpin,
    ) -> Result<Ended> {
        self.prepare().await?;
        // A reader that just died may still hold the slot for a moment.
        slot::wait_until_inactive(&self.pool, &self.options.slot, Duration::from_secs(30)).await?;
        let config = self
            .connection
            .replication(&self.options.slot, &self.options.publication)
            .with_status_interval(self.options.status_interval)
            .with_wakeup_interval(self.options.status_interval)
            .with_buffer_size(self.options.max_in_flight.max(64))
            .with_feedback_observer(FeedbackObserver::new(|_| {}));
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(wire_error)?;
        let mut session = Session::new(self, StartSnapshot::take(&self.pool).await?);
        let ended = session.run(&mut client, lead, shutdown).await;
        session.finish(&client).await;
        client.stop();
        ended
    }

    /// Publishes `job.message`, retrying transient failures with backoff: an outage
    /// (the broker unreachable) is retried without counting against the message.
    async fn publish(&self, job: Job) -> (Job, Result<()>) {
        let span = trace::send(
            self.publisher.messaging_system(),
            std::iter::once(&job.message),
        );
        let result = async {
            let mut failures = 0u32;
            loop {
                let error = match tokio::time::timeout(
                    self.options.publish_timeout,
                    self.publisher.publish(&job.message),
                )
                .await
                {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(error)) => error,
                    Err(_) => Error::Timeout(self.options.publish_timeout),
                };
                if !error.is_outage() {
                    failures += 1;
                }
                if !error.is_transient() || failures >= self.options.max_attempts {
                    return Err(error);
                }
                tracing::debug!(message_id = %job.message.id, %error, failures, "CDC relay: publish failed; retrying");
                tokio::time::sleep(self.options.backoff.delay(failures.max(1))).await;
            }
        }
        .instrument(span.clone())
        .await;
        if let Err(error) = &result {
            trace::record_error(&span, error);
        }
        (job, result)
    }

    /// Records a message that will not be published, with `reason`: as a dead outbox
    /// row, where `oncebox dead-letters` lists, replays and purges it.
    async fn dead_letter(&self, message: &Message, seq: Option<i64>, reason: &str) -> Result<()> {
        tracing::error!(
            slot = %self.options.slot,
            message_id = %message.id,
            outbox_seq = ?seq,
            topic = %message.topic,
            reason,
            "CDC relay: dead-lettered"
        );
        self.metrics.dead.increment(1);
        let attempts = i32::try_from(self.options.max_attempts).unwrap_or(i32::MAX);
        let result = match seq {
            Some(seq) => {
                sqlx::query(sqlx::AssertSqlSafe(self.sql.mark_dead.as_str()))
                    .bind(seq)
                    .bind(attempts)
                    .bind(reason)
                    .execute(&self.pool)
                    .await
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(self.sql.insert_dead.as_str()))
                    .bind(message.id.to_string())
                    .bind(&message.topic)
                    .bind(message.key.as_deref())
                    .bind(&message.kind)
                    .bind(message.headers.to_json())
                    .bind(message.payload.to_vec())
                    .bind(crate::time::to_micros(message.created_at) as f64)
                    .bind(attempts)
                    .bind(reason)
                    .execute(&self.pool)
                    .await
            }
        };
        result.map(drop).map_err(store_error)
    }

    /// Deletes published rows (table mode); the seqs it did not find.
    async fn delete_published(&self, seqs: &[i64]) -> Result<Vec<i64>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let deleted: Vec<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql.delete_published.as_str()))
                .bind(seqs)
                .fetch_all(&self.pool)
                .await
                .map_err(store_error)?;
        let deleted: HashSet<i64> = deleted.into_iter().collect();
        Ok(seqs
            .iter()
            .copied()
            .filter(|seq| !deleted.contains(seq))
            .collect())
    }
}

/// The state of one session.
struct Session<'r, P> {
    relay: &'r CdcRelay<P>,
    progress: Progress,
    /// Which commits were visible before the session began.
    start: StartSnapshot,
    /// The commit being read.
    open: Option<Open>,
    rows: RowDecoder,
    in_flight: FuturesUnordered<Publishing<'r>>,
    /// For each key with a message in flight, its messages waiting behind it.
    waiting: HashMap<String, VecDeque<Job>>,
    /// Messages in flight or waiting.
    unsettled: usize,
    /// Published rows not yet deleted (table mode), and whether they were replayed.
    published: Vec<(i64, bool)>,
    /// Published rows of this session's commits a delete did not find, and when that
    /// first happened. A commit is decoded as soon as its record is in the WAL, a
    /// moment before the transaction becomes visible to other sessions: a delete in
    /// that moment misses the row, so it is tried again, for up to a second (a row
    /// that stays missing was deleted by someone else). A replayed row that is missing
    /// was deleted by the reader before, so it is not waited for (see
    /// [`StartSnapshot`]): waiting would hold back every confirmation after a
    /// takeover while the replay runs.
    unseen: Vec<(i64, tokio::time::Instant)>,
    /// The position that may be confirmed once the published rows are deleted (table
    /// mode: a row's commit is confirmed only after its row is gone, or a crash in
    /// between would leave it in the table for good).
    confirmable: Option<pgwire_replication::Lsn>,
}

/// The commit being read.
#[derive(Clone, Copy)]
struct Open {
    commit: CommitNo,
    committed_at: SystemTime,
    /// Visible before the session began.
    replayed: bool,
}

impl<'r, P: Publisher> Session<'r, P> {
    fn new(relay: &'r CdcRelay<P>, start: StartSnapshot) -> Self {
        Self {
            relay,
            progress: Progress::default(),
            start,
            open: None,
            rows: RowDecoder::new(&relay.sql.schema, "outbox"),
            in_flight: FuturesUnordered::new(),
            waiting: HashMap::new(),
            unsettled: 0,
            published: Vec::new(),
            unseen: Vec::new(),
            confirmable: None,
        }
    }

    async fn run(
        &mut self,
        client: &mut ReplicationClient,
        lead: &mut PgConnection,
        shutdown: impl Future<Output = ()> + Unpin,
    ) -> Result<Ended> {
        let options = &self.relay.options;
        let mut shutdown = shutdown;
        let mut heartbeat = tokio::time::interval(options.heartbeat);
        let mut stats = tokio::time::interval(options.stats_interval);
        let mut check_lead = tokio::time::interval(Duration::from_secs(5));
        let mut flush = tokio::time::interval(options.status_interval);
        tracing::info!(slot = %options.slot, mode = ?options.mode, "CDC relay: reading the slot");
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(Ended::Stopped),
                Some((job, result)) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.settle(job, result, client).await?;
                }
                event = client.recv(), if self.unsettled < options.max_in_flight => {
                    match event.map_err(wire_error)? {
                        Some(event) => self.read(event).await?,
                        None => return Err(Error::store_transient("the replication stream ended")),
                    }
                }
                _ = flush.tick() => self.flush(client).await?,
                _ = heartbeat.tick() => {
                    if let Err(error) = slot::heartbeat(&self.relay.pool, &self.relay.sql.heartbeat_prefix).await {
                        tracing::warn!(%error, "CDC relay: heartbeat failed");
                    }
                }
                _ = stats.tick() => self.relay.metrics.sample(&self.relay.pool).await,
                _ = check_lead.tick() => {
                    if lead.ping().await.is_err() {
                        tracing::warn!(slot = %options.slot, "CDC relay: lost the connection holding the slot's lock; standing by");
                        return Ok(Ended::LostLead);
                    }
                }
            }
        }
    }

    /// Takes one event of the stream.
    async fn read(&mut self, event: ReplicationEvent) -> Result<()> {
        let sql = &self.relay.sql;
        match event {
            ReplicationEvent::Begin {
                xid,
                commit_time_micros,
                ..
            } => {
                self.open = Some(Open {
                    commit: self.progress.begin(),
                    committed_at: committed_at(commit_time_micros),
                    replayed: self.start.saw(xid),
                });
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                if let Some(open) = self.open.take() {
                    self.progress.commit(open.commit, end_lsn);
                }
            }
            ReplicationEvent::Message {
                transactional,
                prefix,
                content,
                ..
            } if prefix == sql.message_prefix && self.relay.options.mode == CdcMode::Messages => {
                let open = match self.open {
                    Some(open) if transactional => open,
                    _ => {
                        let reason = "a logical decoding message emitted with transactional = \
                                      false: it is decoded even when its transaction rolls \
                                      back, so it is not published (emit with true)";
                        return self.dead_content(&content, reason).await;
                    }
                };
                match encoding::decode(&content, open.committed_at) {
                    Ok(message) => self.start(Job {
                        commit: open.commit,
                        committed_at: open.committed_at,
                        message,
                        seq: None,
                        replayed: open.replayed,
                    }),
                    Err(error) => self.dead_content(&content, &error.to_string()).await?,
                }
            }
            ReplicationEvent::XLogData { data, .. }
                if self.relay.options.mode == CdcMode::Table =>
            {
                let Some(open) = self.open else {
                    return Ok(());
                };
                match self.rows.decode(&data) {
                    Change::Inserted(row) if row.pending => match row.message {
                        Ok(message) => self.start(Job {
                            commit: open.commit,
                            committed_at: open.committed_at,
                            message,
                            seq: Some(row.seq),
                            replayed: open.replayed,
                        }),
                        Err(reason) => {
                            let placeholder = Message::new("", bytes::Bytes::new());
                            self.relay
                                .dead_letter(
                                    &placeholder,
                                    Some(row.seq),
                                    &format!("the row cannot be read: {reason}"),
                                )
                                .await?;
                        }
                    },
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

    /// Records undecodable content as a dead letter under a fresh id.
    async fn dead_content(&mut self, content: &bytes::Bytes, reason: &str) -> Result<()> {
        let raw = Message::new("", content.clone());
        self.relay.dead_letter(&raw, None, reason).await
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
        self.in_flight.push(Box::pin(self.relay.publish(job)));
    }

    /// Takes a finished publication: counts it, moves its key on, confirms what can be.
    async fn settle(
        &mut self,
        job: Job,
        result: Result<()>,
        client: &ReplicationClient,
    ) -> Result<()> {
        match result {
            Ok(()) => {
                self.relay.metrics.published(job.committed_at);
                if let Some(seq) = job.seq {
                    self.published.push((seq, job.replayed));
                }
            }
            Err(error) => {
                let reason = format!("publish failed: {error}");
                self.relay
                    .dead_letter(&job.message, job.seq, &reason)
                    .await?;
            }
        }
        if let Some(key) = &job.message.key {
            match self.waiting.get_mut(key).and_then(VecDeque::pop_front) {
                Some(next) => self.in_flight.push(Box::pin(self.relay.publish(next))),
                None => {
                    self.waiting.remove(key);
                }
            }
        }
        self.unsettled -= 1;
        self.progress.done(job.commit);
        if let Some(confirmable) = self.progress.advance() {
            self.confirmable = Some(confirmable);
            if self.relay.options.mode == CdcMode::Messages {
                self.confirm(client);
            }
        }
        if self.published.len() >= self.relay.options.delete_batch {
            self.flush(client).await?;
        }
        Ok(())
    }

    /// Deletes the published rows (table mode), then confirms what may be: only once
    /// no published row is left to delete.
    async fn flush(&mut self, client: &ReplicationClient) -> Result<()> {
        let now = tokio::time::Instant::now();
        let published = std::mem::take(&mut self.published);
        let replayed: HashSet<i64> = published
            .iter()
            .filter_map(|&(seq, replayed)| replayed.then_some(seq))
            .collect();
        let mut seqs: Vec<i64> = published.into_iter().map(|(seq, _)| seq).collect();
        seqs.extend(self.unseen.iter().map(|(seq, _)| *seq));
        let missed = self.relay.delete_published(&seqs).await?;
        let first_missed: HashMap<i64, tokio::time::Instant> = self.unseen.drain(..).collect();
        self.unseen = missed
            .into_iter()
            .filter(|seq| !replayed.contains(seq))
            .map(|seq| (seq, first_missed.get(&seq).copied().unwrap_or(now)))
            .filter(|(_, since)| now.duration_since(*since) < Duration::from_secs(1))
            .collect();
        if self.unseen.is_empty() {
            self.confirm(client);
        }
        Ok(())
    }

    fn confirm(&mut self, client: &ReplicationClient) {
        if let Some(confirmed) = self.confirmable.take() {
            client.update_applied_lsn(confirmed);
            self.relay.metrics.confirmed(confirmed);
        }
    }

    /// After a stop: lets the publications in flight finish (each is bounded by the
    /// publish timeout and its retries), confirms what they covered and waits for the
    /// confirmation to reach the server. Failures here only mean more is published
    /// again by the next reader.
    async fn finish(&mut self, client: &ReplicationClient) {
        while let Some((job, result)) = self.in_flight.next().await {
            if self.settle(job, result, client).await.is_err() {
                return;
            }
        }
        if self.flush(client).await.is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + 2 * self.relay.options.status_interval;
        while client.feedback_pending_since().is_some() && tokio::time::Instant::now() < deadline {
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

/// A replication-connection error as a oncebox error: I/O failures, a slot still held
/// by a reader that just died and a stream that ended are transient; authentication,
/// TLS and other server refusals are permanent.
fn wire_error(error: PgWireError) -> Error {
    let slot_in_use = error.to_string().contains("is active for PID");
    if error.is_transient() || slot_in_use {
        Error::store_transient(error)
    } else if error.is_auth() || error.is_tls() || error.is_server() {
        Error::store_permanent(error)
    } else {
        Error::store_transient(error)
    }
}
