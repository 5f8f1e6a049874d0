//! The audit's report: what the charges, the broker's log and the slot show, the
//! violations among them, printed for a reader or as JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::cdc::{RelayKind, SlotAudit};
use super::shop::Ledger;
use super::soak::SoakReport;

/// The audit of a run.
#[derive(Debug, Serialize)]
pub(crate) struct ChaosReport {
    pub(crate) passed: bool,
    pub(crate) seed: u64,
    pub(crate) broker: &'static str,
    /// How the relays read the outbox.
    pub(crate) relay: RelayKind,
    pub(crate) orders: u64,
    pub(crate) relays: u32,
    pub(crate) consumers: u32,
    pub(crate) seconds: f64,
    /// What the charges show.
    pub(crate) ledger: Ledger,
    /// What the broker's log shows.
    pub(crate) published: Published,
    /// What the replication slot shows (log-tailing relays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) slot: Option<SlotAudit>,
    /// Faults injected, by kind.
    pub(crate) faults: BTreeMap<&'static str, u64>,
    /// Processes that exited by themselves and were started again.
    pub(crate) unplanned_exits: u64,
    /// Failed attempts of the order service (each retried until committed).
    pub(crate) order_retries: u64,
    /// A soak's samples and verdicts (`--soak`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) soak: Option<SoakReport>,
    /// Where the logs are, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) logs: Option<PathBuf>,
    /// The PostgreSQL schema of the run, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) schema: Option<String>,
}

/// The topic read back from the broker, in log order.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Published {
    /// Distinct orders found.
    pub(crate) orders: u64,
    /// Copies beyond the first (republished after a crash or a lost lease).
    pub(crate) duplicates: u64,
    /// Committed orders not found.
    pub(crate) missing: u64,
    /// Orders whose first copy came after a later order of the same customer.
    pub(crate) out_of_order: u64,
    /// Messages on the topic that are not orders.
    pub(crate) unreadable: u64,
    /// Orders published that the database does not have: their transaction was lost
    /// in a failover to a standby that never received it.
    pub(crate) not_in_database: u64,
}

impl ChaosReport {
    /// Everything the audit found wrong; the run passed if there is nothing.
    pub(crate) fn violations(&self) -> Vec<String> {
        let l = &self.ledger;
        let p = &self.published;
        let mut found = Vec::new();
        let mut check = |n: u64, what: &str| {
            if n > 0 {
                found.push(format!("{n} {what}"));
            }
        };
        check(l.never_charged, "orders never charged");
        check(l.charged_twice, "orders charged more than once");
        check(l.phantom_charges, "charges of orders never committed");
        check(p.missing, "committed orders missing from the broker");
        check(p.unreadable, "messages on the topic that are not orders");
        check(
            p.not_in_database,
            "orders published that the database does not have",
        );
        check(
            p.out_of_order,
            "orders published before an earlier order of their customer",
        );
        if l.committed != self.orders {
            found.push(format!(
                "{} orders committed, {} placed",
                l.committed, self.orders
            ));
        }
        if let Some(slot) = &self.slot {
            found.extend(slot.violations());
        }
        if let Some(soak) = &self.soak {
            found.extend(soak.violations());
        }
        found
    }
}

/// Prints `report` for a reader.
pub(crate) fn print(report: &ChaosReport) {
    let l = &report.ledger;
    let p = &report.published;
    println!(
        "chaos · {} · {} orders · {} relays ({}) · {} payment processes · seed {} · {:.1} s",
        report.broker,
        report.orders,
        report.relays,
        report.relay.name(),
        report.consumers,
        report.seed,
        report.seconds
    );
    let faults: Vec<String> = report
        .faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let faults = if faults.is_empty() {
        "none".to_owned()
    } else {
        faults.join(" · ")
    };
    println!("  faults: {faults}");
    println!(
        "  unplanned exits {} · order service retries {}",
        report.unplanned_exits, report.order_retries
    );
    println!(
        "  charges: {} committed · {} charged once · {} never · {} twice · {} phantom · {} out of order at the payment service",
        l.committed,
        l.charged_once,
        l.never_charged,
        l.charged_twice,
        l.phantom_charges,
        l.charged_out_of_order
    );
    println!(
        "  broker: {} orders · {} duplicates · {} missing · {} out of order · {} not orders · {} not in the database",
        p.orders, p.duplicates, p.missing, p.out_of_order, p.unreadable, p.not_in_database
    );
    if let Some(s) = &report.slot {
        let confirmed = s.confirmed_lsn.as_deref().unwrap_or("gone");
        let verdict = match (s.reached_last_order, s.reached_drained) {
            (true, true) => "passed both",
            (true, false) => "passed the last order only",
            (false, _) => "passed NEITHER",
        };
        println!(
            "  slot {}: confirmed {confirmed} · last order {} · drained {} · {verdict} in {:.1} s",
            s.name, s.last_order_lsn, s.drained_lsn, s.seconds
        );
        println!(
            "  {} walsenders terminated · outbox rows left: {} pending, {} dead",
            s.walsenders_terminated, s.outbox_pending, s.outbox_dead
        );
    }
    if let Some(soak) = &report.soak {
        soak.print();
    }
    let violations = report.violations();
    if violations.is_empty() {
        println!("  PASSED: every committed order charged exactly once, published in order");
    } else {
        println!("  FAILED: {}", violations.join("; "));
    }
    if let Some(logs) = &report.logs {
        println!("  logs: {}", logs.display());
    }
    if let Some(schema) = &report.schema {
        println!("  tables: schema {schema}");
    }
}
