//! The log-tailing relay: waits to be the slot's one reader, then runs sessions that
//! read commits from the slot and publish their messages ([`session`](super::session)).

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use oncebox_core::retry::{Decision, Retries};
use oncebox_core::{Error, Fault, Message, Publisher, Result, trace};
use pgwire_replication::{FeedbackObserver, PgWireError, ReplicationClient};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::watch;
use tracing::Instrument;

use super::dead::DeadLetters;
use super::metrics::CdcMetrics;
use super::session::{Ended, Session};
use super::{CdcMode, CdcOptions, slot};
use crate::PgStore;
use crate::cdc::CdcConnection;
use crate::error::store_error;
use crate::ident::qualified;

/// `pg_try_advisory_lock(CDC_CLASS, hashtext(slot))`: held by the slot's reader for as
/// long as it reads ("oncd").
const CDC_CLASS: i32 = 0x6f6e_6364;

/// Publishes the outbox from a logical replication slot; see the [module](super) for
/// what it guarantees.
pub struct CdcRelay<P> {
    pub(super) pool: PgPool,
    connection: CdcConnection,
    pub(super) publisher: P,
    pub(super) options: CdcOptions,
    pub(super) sql: Statements,
    pub(super) metrics: CdcMetrics,
    /// Set while a session winds down: publications stop retrying, so that a stop
    /// (or a failed session) never waits on a broker that is down.
    winding_down: watch::Sender<bool>,
}

/// Statements and names, built once.
pub(super) struct Statements {
    pub(super) schema: String,
    pub(super) message_prefix: String,
    pub(super) heartbeat_prefix: String,
    table: String,
    slots: String,
    pub(super) dead: DeadLetters,
    delete_published: String,
}

/// How a publication ended.
pub(super) enum Published {
    /// The broker confirmed it.
    Confirmed,
    /// It will not be published: dead-letter it with this reason.
    Failed(String),
    /// The session wound down, or the publisher was closed, before the broker
    /// confirmed it: the next reader publishes it again.
    Abandoned,
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
            dead: DeadLetters::new(&table, options.max_attempts),
            delete_published: format!("DELETE FROM {table} WHERE seq = ANY($1::bigint[])"),
            slots: qualified(schema, "cdc_slots"),
            table,
        };
        Ok(Self {
            pool: store.pool().clone(),
            connection,
            publisher,
            metrics: CdcMetrics::new(&options.slot),
            options,
            sql,
            winding_down: watch::Sender::new(false),
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
    /// A slot this store's relays read before (the store remembers each slot and its
    /// confirmed position) that is gone or was invalidated is *lost*: what was committed
    /// after its confirmed position cannot be read any more. [`LostSlot`](super::LostSlot)
    /// decides what then happens.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `wal_level` is not `logical` (saying how to fix
    /// it) or the slot's name is taken by another kind of slot; a permanent store error
    /// naming the range of positions that may be lost, when the slot was lost and the
    /// policy is [`LostSlot::Fail`](super::LostSlot); store errors.
    pub async fn prepare(&self) -> Result<()> {
        slot::check_server(&self.pool, &self.options.slot).await?;
        let table = match self.options.mode {
            CdcMode::Table => Some(self.sql.table.as_str()),
            CdcMode::Messages => None,
        };
        slot::ensure_publication(&self.pool, &self.options.publication, table).await?;
        let records = slot::Records::new(&self.sql.slots);
        if let Some(lost) = slot::ensure_slot(
            &self.pool,
            &self.options.slot,
            self.options.on_lost_slot,
            &records,
        )
        .await?
        {
            self.metrics.lost(&lost);
        }
        Ok(())
    }

    /// Runs until `shutdown` completes: waits to be the slot's one reader (a relay
    /// that finds another one reading stands by and takes over when it dies), then
    /// publishes. Transient failures (the database, the broker, the replication
    /// connection, the server ending the connection) are retried with backoff.
    ///
    /// A stop is bounded: no publication is retried any more, the ones under way get
    /// their current attempt (at most [`CdcOptions::publish_timeout`]), what they
    /// covered is confirmed, and the call returns. What was not confirmed is published
    /// again by the next reader.
    ///
    /// # Errors
    ///
    /// The errors of [`prepare`](Self::prepare), and permanent errors of the
    /// replication connection (authentication, a missing publication).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: the next reader starts from the slot's last
    /// confirmed position and publishes again what came after it.
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
                        // A failed session may have lost the lock too (a cut link, a
                        // restarted server): a new session starts only under the lock.
                        if !answers(&mut lead).await {
                            tracing::warn!(slot = %self.options.slot, "CDC relay: lost the connection holding the slot's lock; standing by");
                            break;
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
            let attempt = tokio::select! {
                attempt = attempt => attempt,
                () = &mut shutdown => return Ok(None),
            };
            match attempt {
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
        let mut shutdown = shutdown;
        let setup = async {
            self.prepare().await?;
            // A reader that just died may still hold the slot for a moment.
            slot::wait_until_inactive(&self.pool, &self.options.slot, Duration::from_secs(30))
                .await?;
            let config = self
                .connection
                .replication(&self.options.slot, &self.options.publication)
                .with_status_interval(self.options.status_interval)
                .with_wakeup_interval(self.options.status_interval)
                .with_buffer_size(self.options.max_in_flight.max(64))
                .with_feedback_observer(FeedbackObserver::new(|_| {}));
            ReplicationClient::connect(config).await.map_err(wire_error)
        };
        let mut client = tokio::select! {
            client = setup => client?,
            () = &mut shutdown => return Ok(Ended::Stopped),
        };
        self.winding_down.send_replace(false);
        let mut session = Session::new(self);
        let ended = session.run(&mut client, lead, shutdown).await;
        self.winding_down.send_replace(true);
        session.finish(&client).await;
        client.stop();
        ended
    }

    /// Publishes `message`, retrying as [`Retries`] decides: transient failures with
    /// backoff up to the attempt limit, an outage (the broker unreachable) without
    /// counting against the message. Once the session winds down, or the publisher is
    /// closed, nothing is retried.
    pub(super) async fn publish(&self, message: &Message) -> Published {
        let span = trace::send(self.publisher.messaging_system(), std::iter::once(message));
        let mut winding_down = self.winding_down.subscribe();
        let retries = Retries::new(self.options.max_attempts, &self.options.backoff);
        async {
            let (mut attempts, mut outages) = (0u32, 0u32);
            loop {
                let error = match tokio::time::timeout(
                    self.options.publish_timeout,
                    self.publisher.publish(message),
                )
                .await
                {
                    Ok(Ok(())) => return Published::Confirmed,
                    Ok(Err(error)) => error,
                    Err(_) => Error::Timeout(self.options.publish_timeout),
                };
                if !error.is_outage() {
                    attempts += 1;
                }
                let delay = match retries.decide(&error, attempts, outages) {
                    Decision::Stop => return Published::Abandoned,
                    Decision::WaitOut { delay } => {
                        outages += 1;
                        delay
                    }
                    Decision::Retry { delay } => {
                        outages = 0;
                        delay
                    }
                    Decision::DeadLetter { reason } => {
                        trace::record_error(&span, &error);
                        return Published::Failed(reason);
                    }
                };
                tracing::debug!(message_id = %message.id, %error, attempts, outages, "CDC relay: publish failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = winding_down.wait_for(|down| *down) => return Published::Abandoned,
                }
                if *winding_down.borrow() {
                    return Published::Abandoned;
                }
            }
        }
        .instrument(span.clone())
        .await
    }

    /// Records a message that will not be published, with `reason`: as a dead outbox
    /// row, where `oncebox dead-letters` lists, replays and purges it. `content` is
    /// what the slot held (message mode), stored raw if the message's fields cannot be.
    pub(super) async fn dead_letter(
        &self,
        message: &Message,
        seq: Option<i64>,
        content: &bytes::Bytes,
        reason: &str,
    ) -> Result<()> {
        tracing::error!(
            slot = %self.options.slot,
            message_id = %message.id,
            outbox_seq = ?seq,
            topic = %message.topic.escape_debug(),
            reason,
            "CDC relay: dead-lettered"
        );
        self.metrics.dead.increment(1);
        match seq {
            Some(seq) => self.sql.dead.mark(&self.pool, seq, reason).await,
            None => {
                self.sql
                    .dead
                    .insert(&self.pool, message, content, reason)
                    .await
            }
        }
    }

    /// Deletes published rows (table mode). A row that is not there any more was
    /// deleted by the reader before this one (which published it, then died before
    /// confirming) or by an operator: each session publishes only commits that other
    /// sessions can see, so a missing row is never one still on its way.
    pub(super) async fn delete_published(&self, seqs: &[i64]) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(self.sql.delete_published.as_str()))
            .bind(seqs)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Remembers in the store that the slot was confirmed up to `confirmed`.
    pub(super) async fn remember(&self, confirmed: pgwire_replication::Lsn) -> Result<()> {
        slot::Records::new(&self.sql.slots)
            .advance(&self.pool, &self.options.slot, confirmed)
            .await
    }
}

/// Whether the connection holding the slot's lock still answers, within a few seconds
/// (a partitioned network would otherwise hold the check until TCP gives up).
pub(super) async fn answers(lead: &mut PgConnection) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), lead.ping()).await,
        Ok(Ok(()))
    )
}

/// A replication-connection error as a oncebox error. Server errors are classified by
/// their SQLSTATE as the pool's are (`oncebox_core::sql::sqlstate_fault`): the server
/// shutting down or ending the connection (`57P01`), no connection slot to be had
/// (`53300`: `max_wal_senders` during a takeover) are outages, retried; a slot still
/// held by a reader that just died (`55006`) is transient; authentication, TLS and
/// the other server refusals (a missing publication) are permanent. I/O failures and a
/// stream that ended are transient.
pub(super) fn wire_error(error: PgWireError) -> Error {
    let fault = match &error {
        PgWireError::Server(text) => oncebox_core::sql::sqlstate_fault(sqlstate(text)),
        PgWireError::Auth(_) | PgWireError::Tls(_) => Fault::Permanent,
        error if error.is_transient() => Fault::Outage,
        _ => Fault::Transient,
    };
    Error::store(error, fault)
}

/// The SQLSTATE of a server error as `pgwire-replication` words it: `… (SQLSTATE
/// XXXXX)` at the end of its text.
fn sqlstate(text: &str) -> Option<&str> {
    let code = text
        .trim_end()
        .strip_suffix(')')?
        .rsplit_once("(SQLSTATE ")?
        .1;
    (code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_classified_by_sqlstate() {
        let server = |text: &str| wire_error(PgWireError::Server(text.into()));
        let terminated =
            server("ERROR: terminating connection due to administrator command (SQLSTATE 57P01)");
        assert!(terminated.is_outage(), "{terminated}");
        // A localised message: only the code counts.
        assert!(server("FATAL: Verbindungen ausgeschöpft (SQLSTATE 53300)").is_outage());
        assert!(
            server("ERROR: replication slot \"s\" is active for PID 7 (SQLSTATE 55006)")
                .is_transient()
        );
        let missing = server("ERROR: publication \"p\" does not exist (SQLSTATE 42704)");
        assert!(!missing.is_transient(), "{missing}");
        assert!(!server("no code at all").is_transient());
        assert!(!wire_error(PgWireError::Auth("password".into())).is_transient());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(wire_error(PgWireError::from(io)).is_outage());
    }

    #[test]
    fn sqlstates_are_read_from_the_end_of_the_text() {
        assert_eq!(sqlstate("x (SQLSTATE 57P01)"), Some("57P01"));
        assert_eq!(sqlstate("x (SQLSTATE 57P01) "), Some("57P01"));
        assert_eq!(sqlstate("x (SQLSTATE 5)"), None);
        assert_eq!(sqlstate("x"), None);
    }
}
