//! `oncebox doctor`: the configuration's setup checked end to end, one line per check,
//! each failure with what to do about it. Exit status 0 when every check passes, 1
//! otherwise (2, as for every command, when the configuration itself cannot work).
//!
//! The checks, in order: the store answers; its migrations are current; the role may
//! read and write oncebox's tables (PostgreSQL, MySQL); the database's clock against
//! this host's (PostgreSQL, MySQL); for a log-tailing relay (`relay.mode = "cdc"`),
//! PostgreSQL's `wal_level`, `max_replication_slots`, `max_slot_wal_keep_size`, the
//! role's `REPLICATION` attribute and the slot's state; the broker answers, and the
//! destinations it needs exist (NATS: a stream capturing the subjects; Kafka: the
//! topics; SQS: the queues); the dashboard's token. A check that cannot run because an
//! earlier one failed (nothing answers) is not reported: fix the first failure first.
//!
//! Doctor changes nothing: it creates no table, slot, stream, topic, queue or exchange.

mod broker;
mod cdc;
mod store;

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::config::{Config, RelayMode, Span};
use crate::service::backend::Database;

/// Flags of `oncebox doctor`.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// One JSON object on stdout: `{"ok": …, "checks": [{"check", "ok", "detail", "fix"}]}`.
    #[arg(long)]
    json: bool,
    /// The largest clock difference between this host and the database that passes
    /// (leases, retention and the lag metrics compare the two clocks).
    #[arg(long, default_value = "1s")]
    max_clock_difference: Span,
}

/// One check's result.
#[derive(Debug, Serialize)]
pub(crate) struct Check {
    /// What was checked: `store`, `migrations`, `rights`, …
    check: &'static str,
    ok: bool,
    /// What was found.
    detail: String,
    /// What to do, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Check {
    pub(crate) fn pass(check: &'static str, detail: impl Into<String>) -> Self {
        Self {
            check,
            ok: true,
            detail: detail.into(),
            fix: None,
        }
    }

    pub(crate) fn fail(
        check: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            check,
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Runs `oncebox doctor` on `config`.
pub(crate) async fn doctor(config: &Config, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let checks = run(config, args.max_clock_difference.get()).await;
    let ok = checks.iter().all(|check| check.ok);
    if args.json {
        println!("{}", serde_json::json!({ "ok": ok, "checks": checks }));
    } else {
        for check in &checks {
            let mark = if check.ok { "ok  " } else { "FAIL" };
            println!("{mark} {:<22} {}", check.check, check.detail);
            if let Some(fix) = &check.fix {
                println!("{}fix: {fix}", " ".repeat(28));
            }
        }
        let failed = checks.iter().filter(|check| !check.ok).count();
        if failed == 0 {
            println!("all {} checks passed", checks.len());
        } else {
            println!("{failed} of {} checks failed", checks.len());
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every check that can run, in order.
async fn run(config: &Config, max_clock_difference: Duration) -> Vec<Check> {
    let mut checks = Vec::new();
    match Database::connect(config).await {
        Err(error) => checks.push(Check::fail(
            "store",
            format!("{error}"),
            "check store.url and store.password, and that the database server runs and \
             accepts this host (connecting was tried for store.connect_timeout)",
        )),
        Ok(database) => {
            checks.push(Check::pass("store", format!("{} answers", database.kind())));
            checks.extend(store::checks(&database, max_clock_difference).await);
            if config.relay.mode == RelayMode::Cdc {
                checks.extend(cdc::checks(config, &database).await);
            }
        }
    }
    checks.extend(broker::checks(config).await);
    if config.dashboard.token.is_some() || config.dashboard.address().ok().flatten().is_some() {
        checks.push(match config.dashboard.checked_token() {
            Ok(_) => Check::pass("dashboard token", "long enough"),
            Err(error) => Check::fail(
                "dashboard token",
                error.to_string(),
                "set ONCEBOX_DASHBOARD__TOKEN_FILE to a file holding a random token of \
                 16 characters or more (for instance `openssl rand -base64 24`)",
            ),
        });
    }
    checks
}
