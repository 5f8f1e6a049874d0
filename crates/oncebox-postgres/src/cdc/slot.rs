//! The replication slot and publication: checked, created when absent, dropped on
//! request, watched.

use std::time::Duration;

use oncebox_core::{Error, Result};
use sqlx::{PgPool, Row};

use crate::error::{has_code, store_error};

/// `duplicate_object`: another relay created the slot or publication first.
const DUPLICATE_OBJECT: &str = "42710";

/// A logical replication slot of the database, as `oncebox outbox stats` and the metrics
/// show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotStats {
    /// The slot's name.
    pub name: String,
    /// Whether a relay (or another client) is reading it now.
    pub active: bool,
    /// WAL the server keeps for the slot: from the slot's restart point to the current
    /// WAL position, in bytes. A slot nobody reads keeps all WAL written since it was
    /// last read: watch this.
    pub retained_wal_bytes: u64,
    /// From the slot's confirmed position to the current WAL position, in bytes: what
    /// its reader has yet to confirm.
    pub lag_bytes: u64,
    /// PostgreSQL's `wal_status`: `reserved`, `extended`, `unreserved`, or `lost` once
    /// the slot was invalidated (`max_slot_wal_keep_size` exceeded).
    pub wal_status: String,
}

/// What the relay does when it finds its slot *lost*: invalidated (`wal_status =
/// 'lost'`: the server removed WAL the slot still needed, because
/// `max_slot_wal_keep_size` was exceeded), or gone although this store's relays read it
/// before (a failover to a standby, which carries no logical slot before PostgreSQL 17;
/// a slot dropped while a relay stood by). Either way, what was committed between the
/// slot's last confirmed position and now cannot be read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LostSlot {
    /// Refuse to start, with an error that names the range of positions that may be
    /// lost (the default): an operator decides.
    #[default]
    Fail,
    /// Log that range, count it in `oncebox_cdc_lost_slots_total` and
    /// `oncebox_cdc_lost_wal_bytes_total`, create the slot again and go on from the
    /// current WAL position. Messages committed in the range are not published by the
    /// relay: in table mode their rows are still in the outbox table (a polling relay,
    /// `oncebox relay` with `mode = "poll"`, publishes them); in message mode they are
    /// lost.
    Recreate,
}

/// A lost slot: the range of WAL positions whose messages it can no longer hand out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRange {
    /// The slot's name.
    pub slot: String,
    /// Why it is lost: `"invalidated"` or `"gone"`.
    pub why: &'static str,
    /// The last position known to be confirmed (PostgreSQL's `X/X` form).
    pub from: String,
    /// The server's WAL position when the loss was found.
    pub to: String,
    /// The bytes of WAL between the two.
    pub bytes: u64,
}

impl std::fmt::Display for LostRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replication slot {:?} is {}: messages committed between WAL positions {} and {} \
             ({} bytes of WAL) may be lost",
            self.slot, self.why, self.from, self.to, self.bytes
        )
    }
}

/// The error for a server whose `wal_level` is not `logical`.
pub(crate) fn wal_level_error(found: &str) -> Error {
    Error::InvalidOptions(format!(
        "PostgreSQL's wal_level is '{found}', and the CDC relay reads logical decoding: run \
         `ALTER SYSTEM SET wal_level = logical` as a superuser and restart PostgreSQL \
         (a reload is not enough)"
    ))
}

/// Checks the server's settings: `wal_level` must be `logical`; an unlimited
/// `max_slot_wal_keep_size` is worth a warning.
pub(crate) async fn check_server(pool: &PgPool, slot: &str) -> Result<()> {
    let wal_level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await
        .map_err(store_error)?;
    if wal_level != "logical" {
        return Err(wal_level_error(&wal_level));
    }
    let keep: String = sqlx::query_scalar("SELECT current_setting('max_slot_wal_keep_size')")
        .fetch_one(pool)
        .await
        .map_err(store_error)?;
    if keep == "-1" {
        tracing::warn!(
            slot,
            "max_slot_wal_keep_size is unlimited: a slot nobody reads keeps WAL until the \
             disk is full; set a limit (ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; \
             SELECT pg_reload_conf()) and watch oncebox_cdc_slot_retained_wal_bytes"
        );
    }
    Ok(())
}

/// Creates the publication if it does not exist: on `table` (inserts only) for the
/// table mode, on no table for the message mode.
pub(crate) async fn ensure_publication(
    pool: &PgPool,
    publication: &str,
    table: Option<&str>,
) -> Result<()> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)")
            .bind(publication)
            .fetch_one(pool)
            .await
            .map_err(store_error)?;
    if exists {
        return Ok(());
    }
    let quoted = crate::ident::quote(publication);
    let create = match table {
        Some(table) => {
            format!("CREATE PUBLICATION {quoted} FOR TABLE {table} WITH (publish = 'insert')")
        }
        None => format!("CREATE PUBLICATION {quoted}"),
    };
    ignore_duplicate(
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(pool)
            .await
            .map(drop),
    )
}

/// The store's record of the slots its relays read (`<schema>.cdc_slots`), and the
/// position each was last confirmed at.
pub(crate) struct Records<'t> {
    table: &'t str,
}

impl<'t> Records<'t> {
    pub(crate) fn new(table: &'t str) -> Self {
        Self { table }
    }

    /// The slot's remembered position, if the store remembers it.
    async fn get(&self, pool: &PgPool, slot: &str) -> Result<Option<String>> {
        let select = format!(
            "SELECT confirmed_lsn::text FROM {} WHERE slot = $1",
            self.table
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(select))
            .bind(slot)
            .fetch_optional(pool)
            .await
            .map_err(store_error)
    }

    /// Remembers the slot at its present confirmed position: `keep` keeps a position
    /// already remembered, else it is replaced (a slot made anew).
    async fn set_from_slot(&self, pool: &PgPool, slot: &str, keep: bool) -> Result<()> {
        let conflict = match keep {
            true => "DO NOTHING",
            false => "DO UPDATE SET confirmed_lsn = EXCLUDED.confirmed_lsn, updated_at = now()",
        };
        let upsert = format!(
            "INSERT INTO {} (slot, confirmed_lsn) \
             SELECT slot_name, coalesce(confirmed_flush_lsn, restart_lsn, pg_current_wal_lsn()) \
             FROM pg_replication_slots WHERE slot_name = $1 \
             ON CONFLICT (slot) {conflict}",
            self.table
        );
        sqlx::query(sqlx::AssertSqlSafe(upsert))
            .bind(slot)
            .execute(pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Forgets the slot; whether it was remembered.
    pub(crate) async fn forget(&self, pool: &PgPool, slot: &str) -> Result<bool> {
        let delete = format!("DELETE FROM {} WHERE slot = $1", self.table);
        let deleted = sqlx::query(sqlx::AssertSqlSafe(delete))
            .bind(slot)
            .execute(pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected() > 0)
    }

    /// Remembers that the slot was confirmed up to `confirmed` (a position never moves
    /// back).
    pub(crate) async fn advance(
        &self,
        pool: &PgPool,
        slot: &str,
        confirmed: pgwire_replication::Lsn,
    ) -> Result<()> {
        let upsert = format!(
            "INSERT INTO {table} (slot, confirmed_lsn) VALUES ($1, $2::text::pg_lsn) \
             ON CONFLICT (slot) DO UPDATE SET \
             confirmed_lsn = greatest({table}.confirmed_lsn, EXCLUDED.confirmed_lsn), \
             updated_at = now()",
            table = self.table
        );
        sqlx::query(sqlx::AssertSqlSafe(upsert))
            .bind(slot)
            .bind(confirmed.to_string())
            .execute(pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

/// Creates the slot if it does not exist, and checks one that does: `pgoutput`, in this
/// database, not lost (else `lost` decides; see [`LostSlot`]). The store remembers every
/// slot that exists after this call. Returns the range a re-created slot lost.
pub(crate) async fn ensure_slot(
    pool: &PgPool,
    slot: &str,
    lost: LostSlot,
    records: &Records<'_>,
) -> Result<Option<LostRange>> {
    let found = sqlx::query(
        "SELECT plugin::text, database::text = current_database() AS here, \
                coalesce(wal_status, '') AS wal_status, \
                coalesce(confirmed_flush_lsn, restart_lsn)::text AS confirmed \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await
    .map_err(store_error)?;
    let lost_from = match found {
        Some(row) => {
            let plugin: Option<String> = row.get("plugin");
            let here: Option<bool> = row.get("here");
            let wal_status: String = row.get("wal_status");
            if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
                return Err(Error::InvalidOptions(format!(
                    "replication slot {slot:?} exists but is not a pgoutput slot of this \
                     database (plugin {plugin:?}): name another slot"
                )));
            }
            if wal_status != "lost" {
                records.set_from_slot(pool, slot, true).await?;
                return Ok(None);
            }
            // The slot's own position is the latest; the store's is a fallback.
            let confirmed: Option<String> = row.get("confirmed");
            let confirmed = match confirmed {
                Some(confirmed) => Some(confirmed),
                None => records.get(pool, slot).await?,
            };
            ("invalidated", confirmed)
        }
        None => match records.get(pool, slot).await? {
            Some(remembered) => ("gone", Some(remembered)),
            None => {
                create_slot(pool, slot).await?;
                records.set_from_slot(pool, slot, false).await?;
                return Ok(None);
            }
        },
    };
    let range = lost_range(pool, slot, lost_from).await?;
    match lost {
        LostSlot::Fail => Err(Error::store_permanent(format!(
            "{range}. The relay does not create the slot again over them: find what was \
             committed in that range (in table mode, the pending rows of the outbox table, \
             which a polling relay publishes), then start the relay once with \
             on_lost_slot = \"recreate\", which creates the slot again at the current \
             position and counts the loss"
        ))),
        LostSlot::Recreate => {
            tracing::error!(
                slot,
                lost = %range,
                "CDC relay: the replication slot was lost; creating it again at the current \
                 position (in table mode the range's rows are still in the outbox table)"
            );
            drop_slot(pool, slot).await?;
            create_slot(pool, slot).await?;
            records.set_from_slot(pool, slot, false).await?;
            Ok(Some(range))
        }
    }
}

async fn lost_range(
    pool: &PgPool,
    slot: &str,
    (why, from): (&'static str, Option<String>),
) -> Result<LostRange> {
    let row = sqlx::query(
        "SELECT pg_current_wal_lsn()::text AS now, \
                greatest(coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn), 0), 0)::bigint AS bytes",
    )
    .bind(from.as_deref())
    .fetch_one(pool)
    .await
    .map_err(store_error)?;
    Ok(LostRange {
        slot: slot.to_owned(),
        why,
        from: from.unwrap_or_else(|| "(unknown)".into()),
        to: row.get("now"),
        bytes: row.get::<i64, _>("bytes").unsigned_abs(),
    })
}

async fn create_slot(pool: &PgPool, slot: &str) -> Result<()> {
    ignore_duplicate(
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(slot)
            .execute(pool)
            .await
            .map(drop),
    )
}

/// Drops the slot if it exists (the server refuses while a reader holds it).
pub(crate) async fn drop_slot(pool: &PgPool, slot: &str) -> Result<()> {
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1",
    )
    .bind(slot)
    .execute(pool)
    .await
    .map_err(store_error)?;
    Ok(())
}

/// Drops the publication if it exists.
pub(crate) async fn drop_publication(pool: &PgPool, publication: &str) -> Result<()> {
    let drop = format!(
        "DROP PUBLICATION IF EXISTS {}",
        crate::ident::quote(publication)
    );
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(())
}

/// The database's pgoutput slots, by name.
pub(crate) async fn slots(pool: &PgPool) -> Result<Vec<SlotStats>> {
    let rows = sqlx::query(
        "SELECT slot_name::text AS name, active, coalesce(wal_status, '') AS wal_status, \
                greatest(coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0), 0)::bigint AS retained, \
                greatest(coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0), 0)::bigint AS lag \
         FROM pg_replication_slots \
         WHERE database = current_database() AND plugin = 'pgoutput' \
         ORDER BY slot_name",
    )
    .fetch_all(pool)
    .await
    .map_err(store_error)?;
    Ok(rows
        .iter()
        .map(|row| SlotStats {
            name: row.get("name"),
            active: row.get("active"),
            retained_wal_bytes: row.get::<i64, _>("retained").unsigned_abs(),
            lag_bytes: row.get::<i64, _>("lag").unsigned_abs(),
            wal_status: row.get("wal_status"),
        })
        .collect())
}

/// Emits a heartbeat: an empty transactional logical decoding message, so that the slot
/// moves on while the outbox is idle (WAL written by other databases or tables would
/// otherwise stay pinned).
pub(crate) async fn heartbeat(pool: &PgPool, prefix: &str) -> Result<()> {
    sqlx::query("SELECT pg_logical_emit_message(true, $1, ''::bytea)")
        .bind(prefix)
        .execute(pool)
        .await
        .map_err(store_error)?;
    Ok(())
}

/// Waits for a slot that its last reader has not let go of yet (a reader that died
/// is noticed by the server within moments, a stalled one after `wal_sender_timeout`).
pub(crate) async fn wait_until_inactive(pool: &PgPool, slot: &str, wait: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let active: Option<bool> =
            sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                .bind(slot)
                .fetch_optional(pool)
                .await
                .map_err(store_error)?;
        if active != Some(true) || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ignore_duplicate(result: std::result::Result<(), sqlx::Error>) -> Result<()> {
    match result {
        Err(error) if has_code(&error, DUPLICATE_OBJECT) => Ok(()),
        other => other.map_err(store_error),
    }
}
