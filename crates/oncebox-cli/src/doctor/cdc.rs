//! A log-tailing relay's checks (`relay.mode = "cdc"`): PostgreSQL's settings for
//! logical decoding, the role's `REPLICATION` attribute, and the state of `[cdc] slot`.

use sqlx::Row as _;

use super::Check;
use crate::config::Config;
use crate::service::backend::Database;

/// The checks of `[cdc]` on PostgreSQL.
pub(super) async fn checks(config: &Config, database: &Database) -> Vec<Check> {
    let Database::Postgres(store) = database else {
        return vec![Check::fail(
            "log tailing",
            format!(
                "relay.mode = \"cdc\" needs PostgreSQL, not {}",
                database.kind()
            ),
            "use relay.mode = \"poll\" on this store",
        )];
    };
    let pool = store.pool();
    let slot = config.cdc.slot.as_str();
    let settings = sqlx::query(
        "SELECT current_setting('wal_level') AS wal_level,
                current_setting('max_replication_slots')::int AS max_slots,
                current_setting('max_slot_wal_keep_size') AS keep_size,
                (SELECT count(*)::int FROM pg_replication_slots) AS used_slots,
                (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) AS replication",
    )
    .fetch_one(pool)
    .await;
    let row = match settings {
        Ok(row) => row,
        Err(error) => {
            return vec![Check::fail(
                "log tailing",
                format!("cannot read the server's settings: {error}"),
                "check that the store answers queries",
            )];
        }
    };
    let wal_level: String = row.get("wal_level");
    let max_slots: i32 = row.get("max_slots");
    let used: i32 = row.get("used_slots");
    let keep_size: String = row.get("keep_size");
    let replication: Option<bool> = row.get("replication");
    let mut checks = vec![if wal_level == "logical" {
        Check::pass("wal_level", "logical")
    } else {
        Check::fail(
            "wal_level",
            format!("{wal_level}: logical decoding needs logical"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        )
    }];

    let state = sqlx::query(
        "SELECT plugin, active, wal_status, database = current_database() AS here
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await;
    let remembered: Option<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT true FROM \"{}\".cdc_slots WHERE slot = $1",
        store.schema()
    )))
    .bind(slot)
    .fetch_optional(pool)
    .await
    .unwrap_or(None);
    let exists = matches!(state, Ok(Some(_)));
    checks.push(if exists || used < max_slots {
        Check::pass(
            "max_replication_slots",
            format!("{used} of {max_slots} in use"),
        )
    } else {
        Check::fail(
            "max_replication_slots",
            format!("{used} of {max_slots} in use: no slot is free for {slot:?}"),
            "raise max_replication_slots (and max_wal_senders) and restart PostgreSQL, or \
             drop a slot nobody reads (oncebox outbox drop-slot, pg_drop_replication_slot)",
        )
    });
    checks.push(if keep_size == "-1" {
        Check::fail(
            "max_slot_wal_keep_size",
            "unlimited: a slot nobody reads keeps WAL until the disk is full",
            "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB' (what your disk can spare); \
             SELECT pg_reload_conf()",
        )
    } else {
        Check::pass("max_slot_wal_keep_size", keep_size)
    });
    checks.push(if replication == Some(true) {
        Check::pass(
            "replication role",
            "the role may open a replication connection",
        )
    } else {
        Check::fail(
            "replication role",
            "the role has no REPLICATION attribute",
            "ALTER ROLE <role> REPLICATION (and allow it in pg_hba.conf: host replication)",
        )
    });
    checks.push(match state {
        Err(error) => Check::fail(
            "slot",
            format!("cannot read pg_replication_slots: {error}"),
            "check that the store answers queries",
        ),
        Ok(None) if remembered == Some(true) => Check::fail(
            "slot",
            format!(
                "{slot:?} is gone although this store's relays read it (a failover or a \
                 drop): the relay refuses to start, since messages it held may be lost"
            ),
            "see docs/service.md, \"The slot after a failover\": republish what may be lost, \
             then `oncebox outbox drop-slot --forget`, or set cdc.on_lost_slot = \"recreate\"",
        ),
        Ok(None) => Check::pass(
            "slot",
            format!("{slot:?} does not exist yet: the relay creates it at start"),
        ),
        Ok(Some(row)) => {
            let plugin: Option<String> = row.get("plugin");
            let active: bool = row.get("active");
            let wal_status: Option<String> = row.get("wal_status");
            let here: Option<bool> = row.get("here");
            if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
                Check::fail(
                    "slot",
                    format!(
                        "{slot:?} belongs to something else (plugin {}, another database: {})",
                        plugin.unwrap_or_default(),
                        here != Some(true)
                    ),
                    "name another slot in cdc.slot",
                )
            } else if wal_status.as_deref() == Some("lost") {
                Check::fail(
                    "slot",
                    format!("{slot:?} is invalidated (max_slot_wal_keep_size): its WAL is gone"),
                    "see docs/service.md, \"The slot after a failover\": the relay refuses it \
                     unless cdc.on_lost_slot = \"recreate\"",
                )
            } else {
                Check::pass(
                    "slot",
                    format!(
                        "{slot:?} exists ({}, WAL {})",
                        if active { "read now" } else { "not read now" },
                        wal_status.unwrap_or_default()
                    ),
                )
            }
        }
    });
    checks
}
