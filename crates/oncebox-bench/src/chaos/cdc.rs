//! The chaos run with log-tailing relays (`--relay cdc-messages|cdc-table`): every relay
//! process reads the same replication slot, one at a time (the reader holds the slot's
//! lock, the others stand by). The run makes the slot before the first order, tells
//! the reader from the standbys when a fault strikes one of them, terminates the
//! slot's walsender, audits the slot once the run drained and drops it at the end.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use oncebox::memory::MemoryBroker;
use oncebox::postgres::PgStore;
use oncebox::postgres::cdc::{CdcConnection, CdcRelay};
use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::fleet::Fleet;
use super::plan::{Fault, Role};
use oncebox_cli::Config;

/// How long one look at the server may take: PostgreSQL may be restarting.
const LOOK: Duration = Duration::from_secs(2);

/// How long the slot's confirmed position may take to pass the end of the drain: a
/// heartbeat (1 s) and a status report (500 ms) suffice, a takeover of the slot by a
/// standby (a fault late in the run) takes a few seconds more.
const SLOT_WAIT: Duration = Duration::from_secs(30);

/// How `oncebox-bench chaos` relays the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RelayKind {
    /// Relays that claim the outbox table's rows (`relay.mode = "poll"`).
    Poll,
    /// Relays that tail the log for logical decoding messages: the order service writes
    /// no outbox row (`relay.mode = "cdc"`, `cdc.source = "messages"`).
    CdcMessages,
    /// Relays that tail the log for the outbox table's inserts, and delete the rows they
    /// published (`relay.mode = "cdc"`, `cdc.source = "table"`).
    CdcTable,
}

impl RelayKind {
    /// The flag's value: `poll`, `cdc-messages`, `cdc-table`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::CdcMessages => "cdc-messages",
            Self::CdcTable => "cdc-table",
        }
    }

    /// Whether the relays tail the log.
    pub(crate) fn is_cdc(self) -> bool {
        self != Self::Poll
    }

    /// The lines of `[relay]` and the `[cdc]` section for the relays, reading `slot`.
    ///
    /// The heartbeat (1 s) and the status interval (500 ms) are short so that, once the
    /// orders stop, the slot's confirmed position passes the last order within moments:
    /// a heartbeat committed after it is read, and confirmed with nothing to publish, at
    /// the next status report.
    pub(crate) fn config(self, slot: &str) -> (&'static str, String) {
        let source = match self {
            Self::Poll => return ("poll", String::new()),
            Self::CdcMessages => "messages",
            Self::CdcTable => "table",
        };
        let section = format!(
            "\n[cdc]\nsource = \"{source}\"\nslot = \"{slot}\"\nheartbeat = \"1s\"\nstatus_interval = \"500ms\"\n"
        );
        ("cdc", section)
    }
}

/// Creates the relays' publication and slot before the first order: a slot only sees
/// what is committed after it was made.
pub(crate) async fn prepare(config: &Config, store: &PgStore, url: &str) -> anyhow::Result<()> {
    let options = config.cdc_options().context("[cdc] settings")?;
    let connection = CdcConnection::from_url(url).context("the PostgreSQL URL")?;
    // Preparing publishes nothing: any publisher will do.
    let relay = CdcRelay::new(store, connection, MemoryBroker::new().publisher(), options)?;
    relay
        .prepare()
        .await
        .context("creating the replication slot and its publication")
}

/// The index of the relay that holds `slot`'s lock (its application name is `prefix`
/// then the index), if one does.
///
/// The reader holds a session advisory lock whose second key is `hashtext(slot)`, on a
/// connection named as its pool's.
pub(crate) async fn reader(store: &PgStore, slot: &str, prefix: &str) -> Option<usize> {
    let holders = sqlx::query_scalar::<_, String>(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
           AND l.objid = hashtext($1)::oid AND starts_with(a.application_name, $2)",
    )
    .bind(slot)
    .bind(prefix)
    .fetch_all(store.pool());
    let holders = tokio::time::timeout(LOOK, holders).await.ok()?.ok()?;
    holders
        .iter()
        .find_map(|name| name.strip_prefix(prefix)?.parse().ok())
}

/// `fault` with its [`Role::Reader`] or [`Role::Standby`] made the relay it strikes now,
/// given the relay that reads (`reader`, of `relays`), and the kind it counts as: its
/// own, or the plain relay's (`kill_relay`, `pause_relay`) when no relay read the slot.
pub(crate) fn resolve(fault: Fault, reader: Option<usize>, relays: usize) -> (Fault, &'static str) {
    let Some((role @ (Role::Reader | Role::Standby), index)) = fault.process() else {
        return (fault, fault.kind());
    };
    let struck = reader.and_then(|reader| match role {
        Role::Reader => Some(reader),
        _ => {
            let standbys: Vec<usize> = (0..relays).filter(|i| *i != reader).collect();
            standbys.get(index % standbys.len().max(1)).copied()
        }
    });
    match struck {
        Some(relay) => (fault.striking(Role::Relay, relay), fault.kind()),
        None => {
            let plain = fault.striking(Role::Relay, index % relays.max(1));
            (plain, plain.kind())
        }
    }
}

/// Terminates the walsender reading `slot`, if one does; how many were terminated.
pub(crate) async fn terminate_walsender(store: &PgStore, slot: &str) -> anyhow::Result<u64> {
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
         WHERE slot_name = $1 AND active_pid IS NOT NULL",
    )
    .bind(slot)
    .fetch_all(store.pool())
    .await
    .context("terminating the slot's walsender")?;
    Ok(terminated.into_iter().filter(|done| *done).count() as u64)
}

/// The server's WAL position now (`pg_current_wal_lsn`), retried while PostgreSQL does
/// not answer. Read once the last order committed, it is at or past that commit's end.
pub(crate) async fn wal_position(store: &PgStore) -> String {
    loop {
        let position =
            sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(store.pool());
        if let Ok(Ok(position)) = tokio::time::timeout(LOOK, position).await {
            return position;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the audit found of the slot once the run drained.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SlotAudit {
    /// The slot (and publication) of the run.
    pub(crate) name: String,
    /// The WAL position read once the last order committed: at or past its commit.
    pub(crate) last_order_lsn: String,
    /// The WAL position read once every order was charged: past the payment service's
    /// commits and whatever else the server wrote, none of which the relays publish.
    pub(crate) drained_lsn: String,
    /// The slot's `confirmed_flush_lsn` at its last reading; none if the slot is gone.
    pub(crate) confirmed_lsn: Option<String>,
    /// Whether the confirmed position reached `last_order_lsn`: every order's commit
    /// confirmed.
    pub(crate) reached_last_order: bool,
    /// Whether it reached `drained_lsn` too: nothing pinned, the heartbeats move the
    /// slot past WAL that holds no message.
    pub(crate) reached_drained: bool,
    /// Seconds from the end of the drain until it reached both, or until the audit gave
    /// up ([`SLOT_WAIT`]).
    pub(crate) seconds: f64,
    /// Walsenders the faults terminated.
    pub(crate) walsenders_terminated: u64,
    /// Pending rows of the outbox table at the end. The table source deletes each row it
    /// published before it confirms its commit: none may be left once the slot passed
    /// the last order (the message source writes no row).
    pub(crate) outbox_pending: u64,
    /// Dead rows of the outbox table: messages the relays gave up on.
    pub(crate) outbox_dead: u64,
}

impl SlotAudit {
    /// What is wrong with the slot, for the report's violations.
    pub(crate) fn violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        let confirmed = self.confirmed_lsn.as_deref().unwrap_or_default();
        if self.confirmed_lsn.is_none() {
            found.push(format!("the replication slot {} is gone", self.name));
        } else if !self.reached_last_order {
            found.push(format!(
                "the slot's confirmed position {confirmed} stayed behind the last order's commit {} after {:.1} s",
                self.last_order_lsn, self.seconds
            ));
        } else if !self.reached_drained {
            found.push(format!(
                "the slot stayed pinned at {confirmed}, behind the WAL position {} of the end of the drain, after {:.1} s",
                self.drained_lsn, self.seconds
            ));
        }
        if self.outbox_pending > 0 {
            found.push(format!(
                "{} outbox rows left pending after the slot passed them",
                self.outbox_pending
            ));
        }
        found
    }
}

/// Waits until `slot`'s confirmed position passes `last_order_lsn` and the WAL position
/// now, or [`SLOT_WAIT`] passed; the fleet goes on meanwhile.
pub(crate) async fn audit_slot(
    store: &PgStore,
    slot: &str,
    last_order_lsn: String,
    fleet: &mut Fleet,
) -> anyhow::Result<SlotAudit> {
    let began = Instant::now();
    let mut audit = SlotAudit {
        name: slot.to_owned(),
        drained_lsn: wal_position(store).await,
        last_order_lsn,
        ..SlotAudit::default()
    };
    loop {
        // PostgreSQL may not answer for a moment: read again.
        if let Ok(read) = confirmed(store, slot, &audit.last_order_lsn, &audit.drained_lsn).await {
            audit.confirmed_lsn = read.as_ref().map(|(lsn, ..)| lsn.clone());
            (audit.reached_last_order, audit.reached_drained) = read
                .map(|(_, last_order, drained)| (last_order, drained))
                .unwrap_or_default();
        }
        audit.seconds = began.elapsed().as_secs_f64();
        if audit.reached_drained || began.elapsed() >= SLOT_WAIT {
            return Ok(audit);
        }
        tokio::task::block_in_place(|| fleet.tick())?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `slot`'s confirmed position, and whether it reached `first` and `second`; `None` if
/// the slot is gone.
async fn confirmed(
    store: &PgStore,
    slot: &str,
    first: &str,
    second: &str,
) -> anyhow::Result<Option<(String, bool, bool)>> {
    let read = sqlx::query_as::<_, (Option<String>, Option<bool>, Option<bool>)>(
        "SELECT confirmed_flush_lsn::text, confirmed_flush_lsn >= $2::pg_lsn, \
                confirmed_flush_lsn >= $3::pg_lsn \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .bind(first)
    .bind(second)
    .fetch_optional(store.pool());
    let row = tokio::time::timeout(LOOK, read)
        .await
        .context("reading the slot: no answer")?
        .context("reading the slot")?;
    Ok(row.map(|(lsn, first, second)| {
        (
            lsn.unwrap_or_default(),
            first.unwrap_or(false),
            second.unwrap_or(false),
        )
    }))
}

/// The pending and dead rows of the run's outbox table.
pub(crate) async fn outbox_rows(store: &PgStore) -> anyhow::Result<(u64, u64)> {
    let schema = store.schema();
    let (pending, dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        r#"SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'dead')
           FROM "{schema}".outbox"#
    )))
    .fetch_one(store.pool())
    .await
    .context("counting the outbox's rows")?;
    Ok((pending.unsigned_abs(), dead.unsigned_abs()))
}

/// Drops the run's slot and publication (both named `slot`), ending a walsender that
/// still reads it (a relay killed at the end leaves its walsender a moment); tries for
/// up to 30 s, PostgreSQL may be down.
pub(crate) async fn drop_slot(store: &PgStore, slot: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = async {
            terminate_walsender(store, slot).await?;
            store.drop_cdc(slot, slot).await?;
            anyhow::Ok(())
        };
        let error = match tokio::time::timeout(LOOK * 2, attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => error,
            Err(_) => anyhow::anyhow!("PostgreSQL did not answer"),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(error).with_context(|| {
                format!("dropping replication slot {slot} (drop it by hand: it keeps WAL)")
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::plan::{Link, Trouble};

    #[test]
    fn the_reader_and_the_standbys_are_the_relays_that_are_so_now() {
        let kill = |role, index| Fault::Kill { role, index };
        assert_eq!(
            resolve(kill(Role::Reader, 0), Some(2), 3),
            (kill(Role::Relay, 2), "kill_reader")
        );
        // The standbys of relay 1 among three: relays 0 and 2.
        assert_eq!(
            resolve(kill(Role::Standby, 0), Some(1), 3),
            (kill(Role::Relay, 0), "kill_standby")
        );
        assert_eq!(
            resolve(kill(Role::Standby, 1), Some(1), 3),
            (kill(Role::Relay, 2), "kill_standby")
        );
        assert_eq!(
            resolve(kill(Role::Standby, 3), Some(0), 2),
            (kill(Role::Relay, 1), "kill_standby")
        );
        // Nobody reads: a relay is struck all the same, and counted as a plain relay.
        let pause = Fault::Pause {
            role: Role::Reader,
            index: 0,
            millis: 8000,
        };
        let (struck, kind) = resolve(pause, None, 2);
        assert_eq!(kind, "pause_relay");
        assert_eq!(struck.process(), Some((Role::Relay, 0)));
        let cut = Fault::Link {
            role: Role::Standby,
            index: 0,
            link: Link::Database,
            trouble: Trouble::Cut,
            millis: 3000,
        };
        let (struck, kind) = resolve(cut, Some(0), 2);
        assert_eq!(
            (struck.process(), kind),
            (Some((Role::Relay, 1)), "cut_database")
        );
        // Faults of no relay, and of consumers, are left as they are.
        for fault in [Fault::TerminateWalsender, kill(Role::Consumer, 1)] {
            assert_eq!(resolve(fault, Some(0), 2), (fault, fault.kind()));
        }
    }

    #[test]
    fn the_relays_configuration_names_the_slot_and_short_intervals() {
        assert_eq!(RelayKind::Poll.config("s"), ("poll", String::new()));
        let (mode, section) = RelayKind::CdcTable.config("chaos_1");
        assert_eq!(mode, "cdc");
        for line in [
            "source = \"table\"",
            "slot = \"chaos_1\"",
            "heartbeat = \"1s\"",
            "status_interval = \"500ms\"",
        ] {
            assert!(section.contains(line), "{line}: {section}");
        }
        let (_, section) = RelayKind::CdcMessages.config("chaos_1");
        assert!(section.contains("source = \"messages\""), "{section}");
        for kind in [RelayKind::Poll, RelayKind::CdcMessages, RelayKind::CdcTable] {
            let flag = clap::ValueEnum::to_possible_value(&kind).expect("a value");
            assert_eq!(flag.get_name(), kind.name());
            assert_eq!(serde_json::to_value(kind).expect("JSON"), kind.name());
        }
    }
}
